"""Value zeroing, ALTI and attention attribution against brute force written here: loops of literal forward
passes, a float64 NumPy re-derivation from the raw weights, and a per-step loop of model.grad."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_hf_model, random_batch

import minibert
from minibert import HookFn
from minibert.analysis import mixing
from minibert.core.contract import static_metric
from minibert.errors import AnalysisError
from minibert.runtime import accounting

EPS32 = float(np.finfo(np.float32).eps)  # 1.19e-7


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-bert")
    make_hf_model(directory, "BertModel")
    return minibert.load(directory)


def tiny_batch():
    """B = 3 rows of 7 tokens, rows 1 and 2 padded."""
    return random_batch(np.random.default_rng(4), 3, 7, 99)


def bundled_batch(model):
    """An aspect question paired with a review and a shorter pair (padding), as seed 002."""
    return model.tokenize(["what do you think of the food ?", "and the service ?"],
                          ["the food was great but the service was slow .", "slow ."])


@pytest.fixture(params=["tiny", "bundled"])
def case(request, tiny):
    if request.param == "tiny":
        return tiny, tiny_batch()
    model = request.getfixturevalue("bundled")
    return model, bundled_batch(model)


def real_mask(model, batch) -> np.ndarray:
    return np.asarray(model.inputs(batch).attention_mask) > 0


def block_noise(model) -> float:
    """Relative float32 rounding between two evaluations of one block's output, ‖δx̃‖/‖x̃‖, differently fused:
    about 8 chained operations (products, sums, two layernorms) each rounding at eps relative to O(1)
    normalised values (blocked sums grow their error like log n, not n), for each of the two runs: 16 eps."""
    return 16 * EPS32


# ---- value zeroing ----------------------------------------------------------------------------------------

def zero_value_at(v, ctx, token):
    return v * (jnp.arange(v.shape[1]) != token)[None, :, None, None].astype(v.dtype)


def reference_value_zeroing(model, batch) -> np.ndarray:
    """Raw 1 − cos [L, B, T, S] from L × T literal forward passes, the cosine in float64."""
    L, (B, T) = model.config.num_hidden_layers, np.asarray(model.inputs(batch).input_ids).shape
    outputs = [f"blocks.{layer}.hook_normalized_resid_post" for layer in range(L)]
    _, clean = model.run_with_cache(batch, names=outputs)
    real = real_mask(model, batch)
    distances = np.zeros((L, B, T, T))
    for layer in range(L):
        x = np.asarray(clean[outputs[layer]], np.float64)
        for token in range(T):
            hook = HookFn(zero_value_at, token=jnp.int32(token))
            _, cache = model.run(batch, names=[outputs[layer]], hooks={f"blocks.{layer}.attn.hook_v": hook})
            y = np.asarray(cache[outputs[layer]], np.float64)
            cos = (x * y).sum(-1) / np.linalg.norm(x, axis=-1) / np.linalg.norm(y, axis=-1)
            distances[layer, :, :, token] = np.where(real & real[:, token:token + 1], 1 - cos, 0.0)
    return distances


def test_value_zeroing_matches_a_loop_of_forward_passes(case, request):
    """Also near cos = 1: on the bundled model some [CLS] rows have distances below 1e-6, where
    1 − x·y/(‖x‖‖y‖) in float32 is noise (it rounds at ≈ 1e-7); the bound below is far tighter there."""
    model, batch = case
    expected = reference_value_zeroing(model, batch)
    if "bundled" in request.node.name:
        assert ((expected[:, :, 0] > 0) & (expected[:, :, 0] < 1e-6)).any(), "no [CLS] distance below 1e-6 to check"
    raw = mixing.value_zeroing(model, batch, normalize=False)
    assert raw.shape == expected.shape
    # 1 − cos = ½‖x̂ − ŷ‖²: a relative error ε in either output moves it by at most 2√d·ε + ε².
    eps = block_noise(model)
    np.testing.assert_array_less(np.abs(raw - expected), 2 * np.sqrt(expected) * eps + eps**2 + 1e-30)
    # Rows normalised over real keys, padding rows and columns 0.
    real = real_mask(model, batch)
    normalized = mixing.value_zeroing(model, batch)
    rows = expected.sum(-1, keepdims=True)
    reference = np.divide(expected, rows, out=np.zeros_like(expected), where=rows > 0)
    row_error = (2 * np.sqrt(expected) * eps + eps**2).sum(-1, keepdims=True)  # bound on each row sum's error
    bound = np.divide(2 * row_error, rows, out=np.zeros_like(expected), where=rows > 0) + 4 * EPS32
    np.testing.assert_array_less(np.abs(normalized - reference), bound)
    np.testing.assert_allclose(normalized.sum(-1), np.broadcast_to(real, normalized.shape[:-1]),
                               atol=real.shape[1] * EPS32)
    assert (normalized[:, ~real] == 0).all() and (normalized.transpose(0, 1, 3, 2)[:, ~real] == 0).all()


def zero_head_value_at(v, ctx, token, head):
    at_token, at_head = jnp.arange(v.shape[1]) == token, jnp.arange(v.shape[2]) == head
    return v * ~(at_token[None, :, None, None] & at_head[None, None, :, None])


def test_per_head_value_zeroing_matches_a_loop_of_forward_passes(tiny):
    """Zeroing token s's value in head h only, one literal forward per (layer, head, token), cosine in float64."""
    batch = tiny_batch()
    L, H, (B, T) = tiny.config.num_hidden_layers, tiny.config.num_attention_heads, np.asarray(batch["input_ids"]).shape
    outputs = [f"blocks.{layer}.hook_normalized_resid_post" for layer in range(L)]
    _, clean = tiny.run_with_cache(batch, names=outputs)
    real = real_mask(tiny, batch)
    expected = np.zeros((L, H, B, T, T))
    for layer, head, token in np.ndindex(L, H, T):
        hook = HookFn(zero_head_value_at, token=jnp.int32(token), head=jnp.int32(head))
        _, cache = tiny.run(batch, names=[outputs[layer]], hooks={f"blocks.{layer}.attn.hook_v": hook})
        x, y = (np.asarray(c[outputs[layer]], np.float64) for c in (clean, cache))
        cos = (x * y).sum(-1) / np.linalg.norm(x, axis=-1) / np.linalg.norm(y, axis=-1)
        expected[layer, head, :, :, token] = np.where(real & real[:, token:token + 1], 1 - cos, 0.0)
    raw = mixing.value_zeroing(tiny, batch, normalize=False, per_head=True)
    assert raw.shape == expected.shape
    eps = block_noise(tiny)  # as in the every-head test above
    np.testing.assert_array_less(np.abs(raw - expected), 2 * np.sqrt(expected) * eps + eps**2 + 1e-30)
    assert (np.abs(raw - mixing.value_zeroing(tiny, batch, normalize=False)[:, None]) > 10 * eps).any()  # not all heads


def test_alti_head_terms_add_up_to_the_terms_and_per_head_alti_follows_them(case):
    """Σ_h T^h_t(x_s) + [t = s] γ(x_s − mean x_s)/σ_t = T_t(x_s); per-head ALTI from a float64 NumPy evaluation of
    c^h_ts = max(0, ‖y_t‖₁ − ‖y_t − T^h_t(x_s)‖₁) on the captured values, rows normalised."""
    model, batch = case
    names = ["hook_resid_pre", "attn.hook_v", "attn.hook_pattern", "ln1.hook_scale", "ln1.hook_out"]
    _, cache = model.run_with_cache(batch, names=[f"blocks.*.{n}" for n in names])
    real = real_mask(model, batch)
    got = mixing.alti(model, batch, per_head=True)
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    assert got.shape == (L, H, *real.shape, real.shape[1])
    for layer in range(L):
        p = model.params["blocks"][layer]
        gamma, W_O = (np.asarray(a, np.float64) for a in (p["ln1"]["scale"], p["attn"]["W_O"]))
        for b in range(real.shape[0]):
            n = int(real[b].sum())
            x, v, pattern, scale, y = (np.asarray(cache[f"blocks.{layer}.{name}"][b], np.float64) for name in names)
            x, v, pattern, scale, y = x[:n], v[:n], pattern[:, :n, :n], scale[:n], y[:n]
            heads = mixing.alti_head_terms(*(jnp.asarray(a, jnp.float32) for a in (v, pattern, scale, gamma, W_O)))
            own = np.eye(n)[:, :, None] * gamma * (x - x.mean(-1, keepdims=True))[None] / scale[:, :, None]
            whole = np.asarray(mixing.alti_terms(*(jnp.asarray(a, jnp.float32) for a in (x, v, pattern, scale)),
                                                 jnp.asarray(gamma, jnp.float32), jnp.asarray(W_O, jnp.float32)))
            magnitude = np.abs(gamma).max() * (np.abs(x).max() + np.abs(v).max() * np.sqrt(v.shape[-1])) / scale.min()
            atol = 8 * EPS32 * magnitude * np.sqrt(model.config.hidden_size * n)  # as the terms-sum test above
            np.testing.assert_allclose(np.asarray(heads).sum(0) + own, whole, atol=atol, rtol=0)
            f = np.einsum("SHK,HKD->HSD", v, W_O)
            terms = gamma * (lambda z: z - z.mean(-1, keepdims=True))(np.einsum("HTS,HSD->HTSD", pattern, f)) \
                / scale[None, :, :, None]
            c = np.maximum(0, np.abs(y).sum(-1)[None, :, None] - np.abs(y[None, :, None] - terms).sum(-1))  # [H, n, n]
            rows = c.sum(-1, keepdims=True)
            reference = np.divide(c, rows, out=np.zeros_like(c), where=rows > 0)
            # The terms' rounding (atol per entry) moves ‖y − T‖₁ by ≤ D·atol, so each c and each row sum; after
            # dividing by the row sum Σ c, the ratio moves by ≤ 2·D·atol/Σ c.
            bound = 2 * model.config.hidden_size * atol / np.where(rows > 0, rows, np.inf) + 4 * EPS32
            np.testing.assert_array_less(np.abs(got[layer, :, b, :n, :n] - reference), np.broadcast_to(bound, c.shape))


def test_cosine_distance_is_accurate_where_the_naive_formula_cancels():
    """½‖x̂ − ŷ‖² agrees with float64 where 1 − x̂·ŷ in float32 does not (a 1e-5 relative nudge)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 384))
    y = x + 1e-5 * rng.normal(size=x.shape) * np.abs(x)
    exact = 1 - (x * y).sum(-1) / np.linalg.norm(x, axis=-1) / np.linalg.norm(y, axis=-1)
    ours = np.asarray(mixing.cosine_distance(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)))
    # Rounding the inputs to float32 moves each unit vector by ≤ eps·(1 + √D·eps): 2√d·that bounds the change.
    np.testing.assert_array_less(np.abs(ours - exact), 2 * np.sqrt(exact) * 2 * EPS32 + 4 * EPS32**2)
    x32, y32 = (a.astype(np.float32) for a in (x, y))
    naive = 1 - (x32 * y32).sum(-1) / np.linalg.norm(x32, axis=-1) / np.linalg.norm(y32, axis=-1)
    assert np.abs(naive - exact).max() > 10 * np.abs(ours - exact).max()


# ---- ALTI -------------------------------------------------------------------------------------------------

def reference_alti(model, batch) -> tuple[np.ndarray, np.ndarray, float]:
    """ALTI in float64 NumPy from the raw weights, one layer's input x taken from the captured forward pass.
    Also returns ‖y_t‖₁ / Σ_s c_ts per row [L, B, T] (how much the cancellation in c amplifies rounding)
    and the largest |score| (softmax turns a score's absolute rounding into α's relative rounding)."""
    params = model.params
    cfg = model.config
    inputs = model.inputs(batch)
    ids, mask = np.asarray(inputs.input_ids), np.asarray(inputs.attention_mask)
    _, cache = model.run_with_cache(batch, names="blocks.*.hook_resid_pre")
    H, K = cfg.num_attention_heads, cfg.head_dim
    result = np.zeros((cfg.num_hidden_layers, *ids.shape, ids.shape[1]))
    amplification = np.zeros((cfg.num_hidden_layers, *ids.shape))
    largest_score = 0.0
    for layer in range(cfg.num_hidden_layers):
        p = {k: {n: np.asarray(v, np.float64) for n, v in part.items()} for k, part in params["blocks"][layer].items()}
        attn, ln1 = p["attn"], p["ln1"]
        for b in range(len(ids)):
            n = int(mask[b].sum())
            x = np.asarray(cache[f"blocks.{layer}.hook_resid_pre"][b, :n], np.float64)  # [n, D]
            q = np.einsum("SD,DHK->HSK", x, attn["W_Q"]) + attn["b_Q"][:, None]
            k = np.einsum("SD,DHK->HSK", x, attn["W_K"]) + attn["b_K"][:, None]
            v = np.einsum("SD,DHK->HSK", x, attn["W_V"]) + attn["b_V"][:, None]
            scores = np.einsum("HTK,HSK->HTS", q, k) / np.sqrt(K)
            largest_score = max(largest_score, np.abs(scores).max())
            alpha = np.exp(scores - scores.max(-1, keepdims=True))
            alpha /= alpha.sum(-1, keepdims=True)
            f = np.einsum("HSK,HKD->HSD", v, attn["W_O"])  # f^h(x_s), b_O excluded
            resid_mid = x + np.einsum("HTS,HSD->TD", alpha, f) + attn["b_O"]
            sigma = np.sqrt(resid_mid.var(-1) + cfg.layer_norm_eps)
            y = ln1["scale"] * (resid_mid - resid_mid.mean(-1, keepdims=True)) / sigma[:, None] + ln1["bias"]
            for t in range(n):
                terms = []
                for s in range(n):
                    z = sum(alpha[h, t, s] * f[h, s] for h in range(H)) + (x[s] if s == t else 0.0)
                    terms.append(ln1["scale"] * (z - z.mean()) / sigma[t])
                # The whole is LN1's real output y_t (β and the b_O term included), as the authors' code has it.
                c = [max(0.0, np.abs(y[t]).sum() - np.abs(y[t] - term).sum()) for term in terms]
                result[layer, b, t, :n] = np.array(c) / np.sum(c)
                amplification[layer, b, t] = np.abs(y[t]).sum() / np.sum(c)
    return result, amplification, largest_score


def test_alti_matches_a_float64_rederivation(case):
    model, batch = case
    expected, amplification, largest_score = reference_alti(model, batch)
    got = mixing.alti(model, batch)
    assert got.shape == expected.shape
    # The float32 captures carry 16 eps of relative rounding (as block_noise), α also eps·|score| per score
    # (×4: q, k, the product, the softmax); c = ‖y‖₁ − ‖y − T‖₁ cancels, so relative to ‖y‖₁ that error
    # becomes, after dividing by the row sum, × ‖y‖₁/Σ_s c_s.
    real = real_mask(model, batch)
    bound = np.broadcast_to((block_noise(model) + 4 * EPS32 * largest_score) * amplification[..., None] + EPS32,
                            got.shape)
    np.testing.assert_array_less(np.abs(got - expected), bound)
    np.testing.assert_allclose(got.sum(-1), np.broadcast_to(real, got.shape[:-1]), atol=real.shape[1] * EPS32)


@pytest.mark.parametrize("per_head", [False, True])
def test_alti_chunks_documents_by_the_accounting_estimate(tiny, monkeypatch, per_head):
    """alti sizes its chunks of documents with accounting's one estimator and budget: items_per_chunk is asked
    with accounting.alti_bytes of one document at the batch's T, over the batch's B documents."""
    asked = []

    def spy(bytes_per_item, n_items):
        asked.append((bytes_per_item, n_items))
        return accounting.items_per_chunk(bytes_per_item, n_items)

    monkeypatch.setattr(mixing, "items_per_chunk", spy)
    batch = tiny_batch()  # B = 3, T = 7
    mixing.alti(tiny, batch, per_head=per_head)
    assert asked == [(accounting.alti_bytes(tiny.config, 7, per_head=per_head), 3)]


def test_alti_terms_sum_to_the_layernorm_output_without_bias(case):
    """Σ_s T_t(x_s) = LN1 output − β − γ ⊙ (b_O − mean b_O)/σ_t, from the captured hook values."""
    model, batch = case
    names = ["hook_resid_pre", "attn.hook_v", "attn.hook_pattern", "ln1.hook_scale", "ln1.hook_out"]
    _, cache = model.run_with_cache(batch, names=[f"blocks.*.{n}" for n in names])
    real = real_mask(model, batch)
    for layer in range(model.config.num_hidden_layers):
        p = model.params["blocks"][layer]
        gamma, beta, b_O = (np.asarray(a) for a in (p["ln1"]["scale"], p["ln1"]["bias"], p["attn"]["b_O"]))
        for b in range(real.shape[0]):
            n = int(real[b].sum())
            x, v, pattern, scale, ln1 = (np.asarray(cache[f"blocks.{layer}.{name}"][b]) for name in names)
            terms = mixing.alti_terms(x[:n], v[:n], pattern[:, :n, :n], scale[:n], gamma, p["attn"]["W_O"])
            expected = ln1[:n] - beta - gamma * (b_O - b_O.mean()) / scale[:n]
            # Both sides are LN-scaled sums of S + 1 vectors of size ≈ |γ|·√D·|x|/σ: eps × that × √S.
            magnitude = np.abs(gamma).max() * (np.abs(x).max() + np.abs(v).max() * np.sqrt(v.shape[-1])) / scale.min()
            np.testing.assert_allclose(np.asarray(terms.sum(1)), expected,
                                       atol=8 * EPS32 * magnitude * np.sqrt(model.config.hidden_size * n), rtol=0)


# ---- attention attribution --------------------------------------------------------------------------------

def readout(model):
    """F(output) per row: [CLS]'s last hidden state on a fixed random direction."""
    direction = jnp.asarray(np.random.default_rng(1).normal(size=model.config.hidden_size), jnp.float32)
    return lambda out: out.last_hidden_state[:, 0] @ direction


def replace_with(pattern, ctx, new):
    return new


def reference_attribution(model, batch, target_fn, steps, first_step=1) -> np.ndarray:
    """A_l ⊙ mean over k of ∂F/∂A_l at (k/m)·A_l, k = first_step..first_step + m − 1 (1: the paper's sum; 0: Hao
    et al.'s released code, whose loop runs α = 0, 1/m, …, (m−1)/m), one model.grad call per layer and step."""
    _, cache = model.run_with_cache(batch, names="blocks.*.attn.hook_pattern")
    loss = lambda out: target_fn(out).sum()
    result = []
    for layer in range(model.config.num_hidden_layers):
        name = f"blocks.{layer}.attn.hook_pattern"
        pattern = np.asarray(cache[name], np.float64)
        total = np.zeros_like(pattern)
        for k in range(first_step, first_step + steps):
            scaled = jnp.asarray(k / steps * pattern, jnp.float32)
            _, grads = model.grad(batch, loss, [name], hooks={name: HookFn(replace_with, new=scaled)})
            total += np.asarray(grads[name], np.float64)
        result.append(pattern * total / steps)
    return np.stack(result)


def test_attention_attribution_matches_a_loop_of_gradients(case, request):
    model, batch = case
    steps = 4 if "bundled" in request.node.name else 20  # the paper's m on the tiny model; fewer calls on the big one
    target_fn = readout(model)
    expected = reference_attribution(model, batch, target_fn, steps)
    got = mixing.attention_attribution(model, batch, target_fn, steps=steps)
    assert got.shape == expected.shape
    # A gradient through L blocks in float32: relative rounding ≈ L × block_noise of the largest entry.
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got, expected, atol=model.config.num_hidden_layers * block_noise(model) * scale, rtol=0)
    real = real_mask(model, batch)
    assert (got.transpose(0, 1, 3, 4, 2)[:, ~real] == 0).all()  # padding keys carry no attention, so no attribution


def test_left_riemann_sum_reproduces_the_authors_code(tiny):
    """riemann="left" sums the gradients at α = 0, 1/m, …, (m−1)/m, as Hao et al.'s released code does; it
    differs from the paper's sum by A ⊙ (∂F(A) − ∂F(0))/m, so the two must not agree."""
    batch, target_fn, steps = tiny_batch(), readout(tiny), 5
    expected = reference_attribution(tiny, batch, target_fn, steps, first_step=0)
    got = mixing.attention_attribution(tiny, batch, target_fn, steps=steps, riemann="left")
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got, expected, atol=tiny.config.num_hidden_layers * block_noise(tiny) * scale, rtol=0)
    right = mixing.attention_attribution(tiny, batch, target_fn, steps=steps)
    assert np.abs(right - got).max() > 100 * tiny.config.num_hidden_layers * block_noise(tiny) * scale
    with pytest.raises(AnalysisError, match="riemann must be 'right'"):
        mixing.attention_attribution(tiny, batch, target_fn, steps=steps, riemann="middle")


def test_attention_attribution_sums_its_steps_in_bounded_memory(tiny, monkeypatch):
    """steps=10**9 used to stop with RESOURCE_EXHAUSTED (1.7 TB): the m gradients were stacked [m, B, H, T, S]
    before their mean. Now `chunk` steps run side by side and add into one sum. XLA's buffers for 600 steps
    exceed those for 6 by at most two copies of the α's (600 floats: the list and its reshaped slice), where
    the stack grew by 594 patterns (1.4 MB here, against 2.4 kB of α's); and
    7 steps in chunks of 3 (two chunks and a remainder of one) give the loop of gradients' values."""
    batch, target_fn = tiny_batch(), readout(tiny)
    inputs = tiny.inputs(batch)
    _, cache = tiny.run_with_cache(inputs, names=["blocks.0.attn.hook_pattern", "blocks.0.hook_resid_pre"])
    pattern, resid = cache["blocks.0.attn.hook_pattern"], cache["blocks.0.hook_resid_pre"]
    program = tiny.jit(mixing._integrated_gradient, static_argnames=("target_fn", "riemann", "chunk"))
    temp = {steps: program.lower(tiny.state, inputs, resid, pattern, jnp.int32(0), jnp.int32(steps),
                                 target_fn=static_metric(target_fn), riemann="right",
                                 chunk=3).compile().memory_analysis().temp_size_in_bytes
            for steps in (6, 600)}
    assert temp[600] - temp[6] <= 2 * 600 * 4, (temp, pattern.nbytes)
    monkeypatch.setattr(mixing, "live_chunk", lambda bytes_per_item, n_items: 3)
    expected = reference_attribution(tiny, batch, target_fn, 7)
    got = mixing.attention_attribution(tiny, batch, target_fn, steps=7)
    scale = np.abs(expected).max()  # as in test_attention_attribution_matches_a_loop_of_gradients
    np.testing.assert_allclose(got, expected, atol=tiny.config.num_hidden_layers * block_noise(tiny) * scale, rtol=0)


def test_attention_attribution_shares_one_program_across_the_steps_of_a_bucket(tiny):
    """A new steps compiled the gradient program again (steps was static); now 3, 5 and 16 steps (one bucket of
    counts, analysis.sweeps.padded_count) share one, each still equal to the loop of gradients' values."""
    batch, target_fn = tiny_batch(), readout(tiny)
    expected = {steps: reference_attribution(tiny, batch, target_fn, steps) for steps in (5, 16)}  # model.grad's
    mixing.attention_attribution(tiny, batch, target_fn, steps=3)
    before = tiny.programs.traces
    got = {steps: mixing.attention_attribution(tiny, batch, target_fn, steps=steps) for steps in (5, 16)}
    assert tiny.programs.traces == before, "a new steps in the same bucket compiled again"
    for steps in (5, 16):
        scale = np.abs(expected[steps]).max()  # as in test_attention_attribution_matches_a_loop_of_gradients
        np.testing.assert_allclose(got[steps], expected[steps], rtol=0,
                                   atol=tiny.config.num_hidden_layers * block_noise(tiny) * scale)
    with pytest.raises(AnalysisError, match="steps=4294967296 is more than"):
        mixing.attention_attribution(tiny, batch, target_fn, steps=2**32)


def test_attention_attribution_compiles_one_program_for_every_layer(tiny):
    batch = tiny_batch()
    mixing.attention_attribution(tiny, batch, readout(tiny), steps=2)  # compiles the capture of patterns and streams
    target_fn = readout(tiny)  # a new function, so its gradient program is traced afresh
    before = tiny.programs.traces
    mixing.attention_attribution(tiny, batch, target_fn, steps=2)
    assert tiny.programs.traces == before + 1, "one compiled program must serve every layer"
    mixing.attention_attribution(tiny, batch, target_fn, steps=2)
    assert tiny.programs.traces == before + 1, "a repeated attribution recompiled"


FEATURE = 0  # read by target_from_global: changing it must give a new program, not the old answer


def target_from_global(out):
    return out.last_hidden_state[:, 0, FEATURE]


def test_attention_attribution_follows_a_changed_global(tiny, monkeypatch):
    batch = tiny_batch()
    first = mixing.attention_attribution(tiny, batch, target_from_global, steps=2)
    monkeypatch.setitem(globals(), "FEATURE", 1)
    second = mixing.attention_attribution(tiny, batch, target_from_global, steps=2)
    monkeypatch.setitem(globals(), "FEATURE", 0)
    again = mixing.attention_attribution(tiny, batch, target_from_global, steps=2)
    assert np.abs(first - second).max() > 1e-3 * np.abs(first).max()  # another feature, another attribution
    np.testing.assert_array_equal(first, again)  # the same program for the same global value


def test_attention_attribution_of_one_target_for_the_whole_batch(tiny):
    """The metric contract: a () target is the batch's one F (it used to be refused). Rows do not interact,
    so F = mean over rows of the per-row targets attributes to each row 1/B of that row's own attribution."""
    batch, per_row = tiny_batch(), readout(tiny)
    expected = mixing.attention_attribution(tiny, batch, per_row, steps=2) / 3
    got = mixing.attention_attribution(tiny, batch, lambda out: per_row(out).mean(), steps=2)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got, expected, atol=tiny.config.num_hidden_layers * block_noise(tiny) * scale, rtol=0)
    with pytest.raises(AnalysisError, match=r"one value per batch row, shape \(3,\), or one value for the whole"):
        mixing.attention_attribution(tiny, batch, lambda out: out.last_hidden_state[:, 0], steps=2)
    for steps in (0, True, 2.0):  # True is an int to Python, not a number of steps
        with pytest.raises(AnalysisError, match="steps must be a positive int"):
            mixing.attention_attribution(tiny, tiny_batch(), readout(tiny), steps=steps)
