"""Hooks on the bundled checkpoint: every captured value against an independent NumPy BERT,
writes (ablation, patching, attention scaling), gradients, compile counts, the two attention paths."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file
from scipy.special import erf
from tolerances import assert_close_to_scale, forward_rtol

import minibert
from minibert.analysis import interventions
from minibert.core.hooks import site_axes
from minibert.runtime.model import Model

TEXTS = ["I made the mistake.", "Sorry, this will get e-recorded instead."]


# ---- an independent NumPy BERT, written from the Hugging Face key names and the paper's equations ----

def _ln(x, w, b, eps=1e-12):
    mu = x.mean(-1, keepdims=True)
    sigma = np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    # TransformerLens' LayerNorm: hook_normalized is (x - mu)/sigma before the gain and bias.
    return {"scale": sigma, "normalized": (x - mu) / sigma, "out": (x - mu) / sigma * w + b}


def numpy_bert(t, ids, types, mask, n_heads, ablate=None):
    """Every intermediate, float64, keyed by minibert hook name. `ablate` = (layer, head) removes one head."""
    t = {k: v.astype(np.float64) for k, v in t.items()}
    B, T = ids.shape
    out = {"embed.hook_embed": t["embeddings.word_embeddings.weight"][ids],
           "embed.hook_pos_embed": np.broadcast_to(t["embeddings.position_embeddings.weight"][:T], (B, T, 384)),
           "embed.hook_token_type_embed": t["embeddings.token_type_embeddings.weight"][types]}
    x = out["embed.hook_embed"] + out["embed.hook_pos_embed"] + out["embed.hook_token_type_embed"]
    ln = _ln(x, t["embeddings.LayerNorm.weight"], t["embeddings.LayerNorm.bias"])
    out |= {f"embed.ln.hook_{k}": v for k, v in ln.items()}
    x = out["hook_full_embed"] = ln["out"]
    for i in range(6):
        p, n = f"encoder.layer.{i}.", f"blocks.{i}."
        out[n + "hook_resid_pre"] = x
        proj = {}
        for name in ("query", "key", "value"):
            y = x @ t[p + f"attention.self.{name}.weight"].T + t[p + f"attention.self.{name}.bias"]
            proj[name] = y.reshape(B, T, n_heads, -1)  # [B, T, H, K]
        q, k, v = proj["query"], proj["key"], proj["value"]
        qk = np.zeros((B, n_heads, T, T))
        for b in range(B):
            for h in range(n_heads):
                qk[b, h] = q[b, :, h] @ k[b, :, h].T
        scores = qk / np.sqrt(q.shape[-1])
        masked = np.where(mask[:, None, None, :] == 1, scores, -1e30)
        e = np.exp(masked - masked.max(-1, keepdims=True))
        pattern = e / e.sum(-1, keepdims=True)
        z = np.einsum("bhts,bshk->bthk", pattern, v)
        if ablate is not None and ablate[0] == i:
            z[:, :, ablate[1]] = 0
        W_O = t[p + "attention.output.dense.weight"].T.reshape(n_heads, -1, 384)  # [H, K, D]
        result = np.stack([z[:, :, h] @ W_O[h] for h in range(n_heads)], axis=2)
        attn_out = result.sum(2) + t[p + "attention.output.dense.bias"]
        out |= {n + "attn.hook_q": q, n + "attn.hook_k": k, n + "attn.hook_v": v, n + "attn.hook_qk": qk,
                n + "attn.hook_attn_scores": scores, n + "attn.hook_pattern": pattern, n + "attn.hook_z": z,
                n + "attn.hook_result": result, n + "hook_attn_out": attn_out}
        mid = out[n + "hook_resid_mid"] = x + attn_out
        ln1 = _ln(mid, t[p + "attention.output.LayerNorm.weight"], t[p + "attention.output.LayerNorm.bias"])
        out |= {n + f"ln1.hook_{k}": v for k, v in ln1.items()}
        W_in, b_in = t[p + "intermediate.dense.weight"].T, t[p + "intermediate.dense.bias"]
        pre = out[n + "mlp.hook_pre"] = ln1["out"] @ W_in + b_in
        post = out[n + "mlp.hook_post"] = 0.5 * pre * (1 + erf(pre / np.sqrt(2)))
        mlp_out = out[n + "hook_mlp_out"] = post @ t[p + "output.dense.weight"].T + t[p + "output.dense.bias"]
        resid_post = out[n + "hook_resid_post"] = ln1["out"] + mlp_out
        ln2 = _ln(resid_post, t[p + "output.LayerNorm.weight"], t[p + "output.LayerNorm.bias"])
        out |= {n + f"ln2.hook_{k}": v for k, v in ln2.items()}
        x = out[n + "hook_normalized_resid_post"] = ln2["out"]
    out["pooler.hook_pooler_out"] = np.tanh(x[:, 0] @ t["pooler.dense.weight"].T + t["pooler.dense.bias"])
    return out


@pytest.fixture(scope="module")
def reference(bundled, bundled_dir):
    batch = bundled.tokenize(TEXTS)
    tensors = load_file(bundled_dir / "model.safetensors")
    return batch, tensors, numpy_bert(tensors, batch.input_ids, batch.token_type_ids, batch.attention_mask, 12)


def _real(name, shape, mask):
    """Which entries of a hook value belong to real tokens, from the site's axes (hooks.site_axes): real query
    rows T and real keys S. Padding rows are read by no output; padding keys are masked."""
    real = np.asarray(mask) == 1  # [B, T]
    axes = site_axes(name, len(shape))
    keep = np.ones(shape, bool)
    for axis, letter in enumerate(axes):
        if letter in ("T", "S"):
            keep &= np.expand_dims(real, [i for i in range(len(shape)) if i not in (0, axis)])
    return keep


def _compare(name, ours, theirs, mask, model):
    """Our fp32 value against the float64 reference, relative to its scale (tolerances.forward_rtol: one
    fp32 program through every block; intermediate sites have seen fewer blocks, so the bound covers them)."""
    ours = np.asarray(ours, np.float64)
    if name.endswith("hook_attn_scores"):  # masked keys hold the most negative float32; compare the rest
        keys = np.broadcast_to(mask[:, None, None, :] == 1, ours.shape)
        assert (ours[~keys] <= np.finfo(np.float32).min / 2).all()
    rtol = forward_rtol(model.config, S=mask.shape[1], programs=1)
    assert_close_to_scale(ours, theirs, rtol, name, where=_real(name, ours.shape, mask))


def test_every_hook_matches_numpy_reference(bundled, reference):
    batch, _, ref = reference
    out, cache = bundled.run_with_cache(batch)
    assert set(cache) == set(bundled.hook_names) == set(ref), set(bundled.hook_names) ^ set(ref)
    for name in bundled.hook_names:
        _compare(name, cache[name], ref[name], batch.attention_mask, bundled)


def test_hook_names_are_in_forward_order_and_complete(bundled):
    names = bundled.hook_names
    assert names[:7] == ["embed.hook_embed", "embed.hook_pos_embed", "embed.hook_token_type_embed",
                         "embed.ln.hook_scale", "embed.ln.hook_normalized", "embed.ln.hook_out",
                         "hook_full_embed"]
    block = [n.split(".", 2)[2] for n in names if n.startswith("blocks.0.")]
    assert block == ["hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_qk",
                     "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z", "attn.hook_result",
                     "hook_attn_out", "hook_resid_mid", "ln1.hook_scale", "ln1.hook_normalized",
                     "ln1.hook_out", "mlp.hook_pre", "mlp.hook_post", "hook_mlp_out", "hook_resid_post",
                     "ln2.hook_scale", "ln2.hook_normalized", "ln2.hook_out", "hook_normalized_resid_post"]
    assert names[-1] == "pooler.hook_pooler_out"
    assert len(names) == 7 + 6 * len(block) + 1


def test_capture_only_what_is_asked(bundled, reference):
    batch = reference[0]
    assert list(bundled.run_with_cache(batch, names=["blocks.2.attn.hook_q"])[1]) == ["blocks.2.attn.hook_q"]
    globbed = bundled.run_with_cache(batch, names="blocks.*.attn.hook_pattern")[1]
    assert list(globbed) == [f"blocks.{i}.attn.hook_pattern" for i in range(6)]
    assert globbed.stack("hook_pattern").shape == (6, 2, 12, batch.input_ids.shape[1], batch.input_ids.shape[1])
    predicate = bundled.run_with_cache(batch, names=lambda n: n.endswith("hook_scale"))[1]
    assert len(predicate) == 1 + 2 * 6


def test_offload_streams_numpy_and_equals_device_capture(bundled, reference):
    batch = reference[0]
    out, on_device = bundled.run_with_cache(batch, names="blocks.*.attn.hook_*")
    out_host, on_host = bundled.run_with_cache(batch, names="blocks.*.attn.hook_*", offload=True)
    assert list(on_host) == list(on_device)
    # Block-by-block programs fuse and sum differently from the whole forward: two fp32 programs.
    rtol = forward_rtol(bundled.config, S=batch.input_ids.shape[1])
    for name in on_host:
        assert isinstance(on_host[name], np.ndarray)
        where = _real(name, on_host[name].shape, batch.attention_mask)  # real rows and keys
        assert_close_to_scale(on_host[name], on_device[name], rtol, name, where=where)
    real = np.broadcast_to(np.asarray(batch.attention_mask, bool)[..., None], out.last_hidden_state.shape)
    assert_close_to_scale(out_host.last_hidden_state, out.last_hidden_state, rtol, "last hidden state", where=real)


def test_fused_and_explicit_attention_paths_agree(bundled, reference):
    batch = reference[0]
    inputs = bundled.inputs(batch)
    fused = bundled(batch).last_hidden_state
    explicit, _ = bundled.run_with_cache(batch, names="blocks.*.attn.hook_pattern")
    # Two fp32 programs that sum in different orders (tolerances.forward_rtol), at the real tokens.
    real = np.broadcast_to(np.asarray(batch.attention_mask, bool)[..., None], fused.shape)
    assert_close_to_scale(fused, explicit.last_hidden_state, forward_rtol(bundled.config, S=real.shape[1]),
                          "last hidden state", where=real)
    # The plain forward really takes the platform-dependent unwatched/fused branch in every block (one
    # platform_index per block in the unrolled program); watching one block's pattern takes the explicit path
    # there. Scanned, the program holds one block, which takes the explicit path in every layer once any watches.
    no_writers = jax.tree_util.tree_structure({})
    unrolled = Model(bundled.config, bundled.params, scan=False)

    def branches(model, capture):
        jaxpr = jax.make_jaxpr(lambda s: model._forward(s, inputs, [], frozenset(capture), no_writers))(model.state)
        return str(jaxpr).count("platform_index")

    assert branches(unrolled, []) == 6
    assert branches(unrolled, ["blocks.0.attn.hook_pattern"]) == 5
    assert branches(bundled, []) == 1
    assert branches(bundled, ["blocks.0.attn.hook_pattern"]) == 0


def test_zero_ablation_of_a_head_matches_numpy(bundled, reference):
    batch, tensors, _ = reference
    ablated_ref = numpy_bert(tensors, batch.input_ids, batch.token_type_ids, batch.attention_mask, 12, ablate=(3, 7))
    hooks = interventions.ablate_heads(interventions.head_mask(3, 7, 6, 12))
    out, cache = bundled.run(batch, names=["blocks.3.attn.hook_z", "pooler.hook_pooler_out"], hooks=hooks)
    assert np.abs(np.asarray(cache["blocks.3.attn.hook_z"])[:, :, 7]).max() == 0
    last = "blocks.5.hook_normalized_resid_post"
    _compare(last, out.last_hidden_state, ablated_ref[last], batch.attention_mask, bundled)
    pooled = "pooler.hook_pooler_out"
    _compare(pooled, out.pooler_output, ablated_ref[pooled], batch.attention_mask, bundled)


def _nudged(value, ctx, d):
    return value + d


def test_gradient_wrt_pattern_matches_forward_mode(bundled, reference):
    """model.grad (reverse mode, through its own delta hooks) against jax.jvp of a plain hooked run (forward
    mode): the directional derivative along a random nudge, computed two independent ways."""
    batch = reference[0]
    direction = jax.random.normal(jax.random.PRNGKey(0), (2, 384))

    def loss_fn(out):
        return jnp.sum(out.pooler_output * direction)

    name = "blocks.2.attn.hook_pattern"
    loss, grads = bundled.grad(batch, loss_fn, [name])
    _, cache = bundled.run_with_cache(batch, names=[name])
    assert grads[name].shape == cache[name].shape
    nudge = jax.random.normal(jax.random.PRNGKey(1), cache[name].shape)

    def along(t):
        return loss_fn(bundled.run_with_hooks(batch, {name: minibert.HookFn(_nudged, d=t * nudge)}))

    _, forward_mode = jax.jvp(along, (jnp.float32(0.0),), (jnp.float32(1.0),))
    terms = grads[name] * nudge
    analytic = float(terms.sum())
    # Both linearise the same 4 remaining blocks and the pooler in fp32: two programs' errors relative to
    # the scale of what is summed (Σ|∂L/∂a · nudge|), as tolerances.forward_rtol bounds a forward.
    bound = forward_rtol(bundled.config, S=batch.input_ids.shape[1]) * float(jnp.abs(terms).sum())
    assert abs(float(forward_mode) - analytic) <= bound, (float(forward_mode), analytic, bound)
    # The loss itself: model.grad's run (unpadded, delta hooks) against model(batch) (padded to a bucket).
    loss_terms = float(jnp.abs(bundled(batch).pooler_output * direction).sum())
    bound = forward_rtol(bundled.config, S=batch.input_ids.shape[1]) * loss_terms
    assert abs(float(loss) - float(loss_fn(bundled(batch)))) <= bound


def test_unknown_and_absent_hook_names_say_what_to_do(bundled, reference):
    batch = reference[0]
    with pytest.raises(minibert.HookError, match="Did you mean 'blocks.3.attn.hook_pattern'"):
        bundled.run_with_cache(batch, names=["blocks.3.attn.hook_patern"])
    # what the head part needs is named from sites.HEAD_PARTS, the table docs/hooks.md shows too
    with pytest.raises(minibert.HookError, match=r"no unembed hooks; they need a masked-LM head \(BertForMaskedLM, "):
        bundled.run_with_hooks(batch, {"unembed.hook_out": lambda v, ctx: v})
    with pytest.raises(minibert.HookError, match="no hook point matches"):
        bundled.run_with_cache(batch, names="blocks.*.attn.hook_nothing")


def test_hook_returning_wrong_shape_or_dtype_fails_at_trace_time(bundled, reference):
    batch = reference[0]
    with pytest.raises(minibert.HookError, match=r"must return the shape of the value it replaces"):
        bundled.run_with_hooks(batch, {"blocks.0.attn.hook_pattern": lambda v, ctx: v[:, :1]})
    with pytest.raises(minibert.HookError, match="must return float32"):
        bundled.run_with_hooks(batch, {"blocks.0.attn.hook_pattern": lambda v, ctx: v.astype(jnp.int32)})


def test_hook_context_names_the_site(bundled, reference):
    seen = []

    def spy(value, ctx):
        seen.append((ctx.name, ctx.layer, ctx.n_heads, ctx.d_head))
        return value

    spy = minibert.any_length(spy)  # the mark skips the padding probe (buckets.pads_safely), which calls spy too
    bundled.run_with_hooks(reference[0], {"blocks.*.attn.hook_z": spy, "hook_full_embed": spy})
    assert seen[0] == ("hook_full_embed", None, 12, 32)
    assert seen[1:] == [(f"blocks.{i}.attn.hook_z", i, 12, 32) for i in range(6)]


# ---- TransformerLens habits ------------------------------------------------------------------------------

@pytest.mark.parametrize("args, name", [  # the examples of TransformerLens' utils.get_act_name docstring
    (("k", 6, "a"), "blocks.6.attn.hook_k"), (("pre", 2), "blocks.2.mlp.hook_pre"),
    (("normalized", 27, "ln2"), "blocks.27.ln2.hook_normalized"), (("k6",), "blocks.6.attn.hook_k"),
    (("scale4ln1",), "blocks.4.ln1.hook_scale"), (("pre5",), "blocks.5.mlp.hook_pre"),
    (("attn", 3), "blocks.3.attn.hook_pattern"), (("resid_pre", 2), "blocks.2.hook_resid_pre"),
    (("out", 1, "ln1"), "blocks.1.ln1.hook_out"), (("blocks.0.hook_resid_post",), "blocks.0.hook_resid_post"),
])
def test_get_act_name_follows_transformerlens(args, name):
    assert minibert.get_act_name(*args) == name


@pytest.mark.parametrize("args", [("q_input", 1), ("mlp_in", 2), ("embed",)])
def test_get_act_name_refuses_names_minibert_lacks(args):
    """TL builds these (hook_q_input, hook_mlp_in, a bare hook_embed); no minibert family has them."""
    with pytest.raises(minibert.HookError, match="minibert does not have"):
        minibert.get_act_name(*args)


def test_get_act_name_gives_the_pre_layernorm_families_sites():
    """ln_final and the rotary sites exist since ModernBERT's family module (names are model-free, as in TL)."""
    assert minibert.get_act_name("scale") == "ln_final.hook_scale"
    assert minibert.get_act_name("rot_q", 1) == "blocks.1.attn.hook_rot_q"


def test_cache_takes_transformerlens_keys(bundled, reference):
    _, cache = bundled.run_with_cache(reference[0], names_filter=lambda n: n.startswith("blocks."))
    assert cache["pattern", 3] is cache["blocks.3.attn.hook_pattern"]
    assert cache["resid_pre", 2] is cache["blocks.2.hook_resid_pre"]
    assert cache["scale", 2, "ln1"] is cache["blocks.2.ln1.hook_scale"]
    assert cache["resid_post", -1] is cache["blocks.5.hook_resid_post"]
    with pytest.raises(minibert.HookError, match="hook names"):
        cache[3]


def test_hooks_as_pairs_and_fwd_hooks(bundled, reference):
    batch = reference[0]

    def zero_head_0(value, ctx):
        return value.at[:, :, 0].set(0.0)

    as_dict = bundled.run_with_hooks(batch, {"blocks.1.attn.hook_z": zero_head_0}).last_hidden_state
    as_pairs = bundled.run_with_hooks(batch, [("blocks.1.attn.hook_z", zero_head_0)]).last_hidden_state
    as_tl = bundled.run_with_hooks(batch, fwd_hooks=[(lambda n: n == "blocks.1.attn.hook_z", zero_head_0)])
    np.testing.assert_array_equal(as_pairs, as_dict)  # the same program on the same inputs
    np.testing.assert_array_equal(as_tl.last_hidden_state, as_dict)


@pytest.mark.parametrize("call, message", [
    (lambda m, b: m.run_with_hooks(b, [("blocks.0.attn.hook_z",)]), "list of \\(name, fn\\) pairs"),
    (lambda m, b: m.run_with_hooks(b, "blocks.0.attn.hook_z"), "list of \\(name, fn\\) pairs"),
    (lambda m, b: m.run_with_hooks(b, [(("pattern", 0), lambda v, c: v)]), "get_act_name"),
    (lambda m, b: m.run_with_cache(b, names=[("pattern", 0)]), "get_act_name"),
    (lambda m, b: m.run_with_hooks(b, {"blocks.0.attn.hook_z": lambda v, ctx: None}), "returned None.*at\\[...\\]"),
])
def test_wrong_hook_forms_say_what_minibert_takes(bundled, reference, call, message):
    with pytest.raises(minibert.HookError, match=message) as error:
        call(bundled, reference[0])
    assert "\n" not in str(error.value)


# ---- hooks that read globals or closures ------------------------------------------------------------------

HEAD = 0


def _zero_global_head(value, ctx):
    return value.at[:, :, HEAD].set(0.0)


def test_hook_reading_a_global_sees_its_new_value(bundled, reference):
    global HEAD
    batch, name = reference[0], "blocks.2.attn.hook_z"
    z = {}
    for HEAD in (4, 5, 5):
        _, cache = bundled.run(batch, names=[name], hooks={name: _zero_global_head})
        z[HEAD] = np.asarray(cache[name])
        if HEAD == 5 and len(z) == 2:
            traces = bundled.programs.traces
    assert np.all(z[5][:, :, 5] == 0) and np.all(z[5][:, :, 4] != 0), "the hook kept HEAD = 4"
    assert bundled.programs.traces == traces, "an unchanged hook (same function, same HEAD) compiled again"


def test_hook_closing_over_a_rebound_array_sees_the_new_array(bundled, reference):
    batch, name = reference[0], "blocks.2.hook_resid_pre"
    delta = jnp.zeros(384)

    def shift(value, ctx):
        return value + delta

    first = bundled.run_with_hooks(batch, {name: shift}).last_hidden_state
    delta = jnp.ones(384)
    second = bundled.run_with_hooks(batch, {name: shift}).last_hidden_state
    assert np.abs(np.asarray(second) - np.asarray(first)).max() > 0.1, "the hook kept the first array"


# ---- sequence-length buckets --------------------------------------------------------------------------------

def test_lengths_share_bucketed_programs_and_values(bundled):
    words = "one two three four five six seven eight nine ten eleven twelve".split() * 4
    texts = [" ".join(words[:n]) for n in range(30, 42)]  # 12 lengths: 32 … 43 tokens, one row each: all run at 64
    batches = [bundled.tokenize([t]) for t in texts]
    lengths = {b.input_ids.shape[1] for b in batches}
    buckets = {bundled.programs.padded_length(n, rows=1) for n in lengths}
    bundled(batches[0])  # warm: the plain program of the first bucket
    before = bundled.programs.traces
    for batch in batches:
        bundled.run_with_cache(batch, names="blocks.*.attn.hook_pattern")
    assert len(lengths) == 12 and bundled.programs.traces - before == len(buckets) == 1
    # The padded run against an unpadded one (a writer hook keeps runs unpadded): equal up to fp32 rounding.
    batch = batches[-1]
    padded, cache = bundled.run_with_cache(batch, names="blocks.*.attn.hook_pattern")
    identity = {"hook_full_embed": lambda value, ctx: value}
    plain, plain_cache = bundled.run(batch, names="blocks.*.attn.hook_pattern", hooks=identity)
    T = batch.input_ids.shape[1]
    assert padded.last_hidden_state.shape == (1, T, 384) and cache["pattern", 0].shape == (1, 12, T, T)
    rtol = forward_rtol(bundled.config, S=bundled.programs.padded_length(T, rows=1))
    assert_close_to_scale(padded.last_hidden_state, plain.last_hidden_state, rtol, "last hidden state")
    assert_close_to_scale(cache.stack("hook_pattern"), plain_cache.stack("hook_pattern"), rtol, "patterns")


def test_a_hookfn_argument_that_is_no_array_is_named():
    """Issue 40: HookFn(fn, mode="zero") raised JAX's "not a valid JAX type" at the call; it is a HookError naming
    the argument when the HookFn is made. Numbers, NumPy and JAX arrays (and tuples of them) stay traced."""
    def fn(value, ctx, **_):
        return value

    with pytest.raises(minibert.HookError, match=r"HookFn\(fn, mode='zero'\): .* a str is not one; pass a number or an "
                                        r"array, or close over the value"):
        minibert.HookFn(fn, mode="zero")
    with pytest.raises(minibert.HookError, match="a object is not one"):
        minibert.HookFn(fn, patch=(np.zeros(2), object()))
    for value in (3, 0.5, True, np.int32(1), np.zeros(3), jnp.ones(2), (jnp.zeros(1), 2)):
        minibert.HookFn(fn, value=value)
