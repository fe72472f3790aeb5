"""The three attention paths give one z: explicit (every step a hook site), unwatched (the CPU branch) and
fused (jax.nn.dot_product_attention, the GPU/TPU branch, called directly here so it runs on CPU too),
in float32 and bfloat16, with padding, fully masked rows and rows with a single real token."""

from __future__ import annotations

import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerances import U32, U_BF16, assert_close_to_scale, dot_rtol, sum_rtol

from minibert.core import attention
from minibert.core.encoder import (
    NO_HOOKS,
    Dropout,
    attend,
    attention_softmax,
    explicit_attention,
    fused_attention,
    unwatched_attention,
)
from minibert.core.hooks import HookFn, HookPoints

B, T, H, K = 3, 9, 4, 16


def inputs(seed=0, lengths=(9, 5, 1), dtype=jnp.float32):
    """q, k, v [B, T, H, K] ~ N(0, 1) and the key mask [B, 1, 1, S] of rows with the given real lengths."""
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.normal(size=(B, T, H, K)), dtype) for _ in range(3))
    mask = np.arange(T)[None] < np.asarray(lengths)[:, None]
    return q, k, v, jnp.asarray(mask)[:, None, None, :]


def explicit(q, k, v, key_mask):
    return explicit_attention(q, k, v, key_mask, NO_HOOKS, "blocks.0.attn")


def z_rtol(q, k, u=U32):
    """Error of z relative to max |v|, for two implementations that round differently. Scores are length-K
    dot products (dot_rtol(K)·max|s| absolute); softmax turns a score error δ into a relative pattern error
    ≤ 2δ; the row sum is a sum of S non-negative terms; z is a length-S combination of v."""
    K, S = q.shape[-1], k.shape[1]
    s_max = float(jnp.abs(jnp.einsum("BTHK,BSHK->BHTS", q, k)).max()) / np.sqrt(K)
    one = 2 * s_max * dot_rtol(K, u) + sum_rtol(S, u) + dot_rtol(S, u)
    return 2 * one


@pytest.mark.parametrize("path", [fused_attention, unwatched_attention], ids=["fused", "unwatched"])
def test_float32_paths_equal_explicit(path):
    q, k, v, mask = inputs()
    assert_close_to_scale(path(q, k, v, mask), explicit(q, k, v, mask), z_rtol(q, k), path.__name__)


def test_bfloat16_fused_against_float32_explicit():
    """bf16 inputs through the fused kernel against the float32 explicit path on the same (rounded) inputs.
    In bf16 the scores, the scaled scores, the pattern and z are each rounded once (u = 2^-8): the two score
    roundings move the pattern by ≤ 2·2u·max|s| relative, the pattern and z roundings add 2u."""
    q, k, v, mask = inputs(1, dtype=jnp.bfloat16)
    got = fused_attention(q, k, v, mask)
    assert got.dtype == jnp.bfloat16
    q32, k32, v32 = (x.astype(jnp.float32) for x in (q, k, v))
    want = explicit(q32, k32, v32, mask)
    s_max = float(jnp.abs(jnp.einsum("BTHK,BSHK->BHTS", q32, k32)).max()) / np.sqrt(K)
    rtol = U_BF16 * (4 * s_max + 2) + z_rtol(q32, k32)
    assert_close_to_scale(got.astype(jnp.float32), want, rtol, "bf16 fused")


def test_fully_masked_rows_average_every_value():
    """A row whose keys are all masked (a hook blocked them, or a batch row of padding only): every score is
    −inf, the pattern is uniform over all S keys (attention_softmax's rule, Hugging Face's result), and z is
    the mean of v over S — explicit, unwatched and fused alike (finite, never NaN)."""
    q, k, v, mask = inputs(2, lengths=(9, 0, 4))
    mean_v = np.asarray(v[1]).mean(0)  # [H, K]
    for path in (explicit, unwatched_attention, fused_attention):
        z = np.asarray(path(q, k, v, mask))
        assert np.isfinite(z).all(), path.__name__
        assert_close_to_scale(z[1], np.broadcast_to(mean_v, z[1].shape), dot_rtol(T), path.__name__)


def test_single_real_token_rows_copy_its_value():
    """Row 2 has one real token: every query of it attends to that key only (pattern 1 there, exactly 0 on
    the masked keys), so z is that token's v for every query position, in every path."""
    q, k, v, mask = inputs(3, lengths=(9, 5, 1))
    for path in (explicit, unwatched_attention, fused_attention):
        z = np.asarray(path(q, k, v, mask))[2]  # [T, H, K]
        assert_close_to_scale(z, np.broadcast_to(np.asarray(v)[2, 0], z.shape), sum_rtol(T), path.__name__)


def captured_scores_and_pattern(q, k, v, mask, writers=None):
    hooks = HookPoints({"blocks.0.attn.hook_attn_scores", "blocks.0.attn.hook_pattern"}, writers or {}, H, K)
    z = explicit_attention(q, k, v, mask, hooks, "blocks.0.attn")
    return hooks.captured["blocks.0.attn.hook_attn_scores"], hooks.captured["blocks.0.attn.hook_pattern"], z


def test_scores_hold_minus_infinity_at_masked_keys():
    """attn.hook_attn_scores is q·k/√K at real keys and −inf at masked ones (TransformerLens' meaning); the
    pattern is exactly 0 there and its rows sum to 1 (S non-negative terms: sum_rtol(S))."""
    q, k, v, mask = inputs(4, lengths=(9, 5, 1))
    scores, pattern, _ = captured_scores_and_pattern(q, k, v, mask)
    keys = np.broadcast_to(np.asarray(mask), scores.shape)
    assert np.isneginf(np.asarray(scores)[~keys]).all()
    want = np.einsum("BTHK,BSHK->BHTS", np.asarray(q, np.float64), np.asarray(k, np.float64)) / np.sqrt(K)
    assert_close_to_scale(np.asarray(scores)[keys], want[keys], dot_rtol(K), "scores at real keys")
    assert (np.asarray(pattern)[~keys] == 0).all()
    np.testing.assert_allclose(np.asarray(pattern).sum(-1), 1.0, atol=sum_rtol(T))


def _block_every_key(scores, ctx):
    return jnp.full_like(scores, -jnp.inf)


def test_a_hook_that_blocks_every_key_gives_uniform_rows():
    """A hook writing −inf to every score leaves no real key: attention_softmax makes those rows uniform
    (1/S, finite) where jax.nn.softmax would give NaN, and z is the mean of v over S."""
    q, k, v, mask = inputs(5)
    writers = {"blocks.0.attn.hook_attn_scores": (HookFn(_block_every_key),)}
    _, pattern, z = captured_scores_and_pattern(q, k, v, mask, writers)
    np.testing.assert_allclose(np.asarray(pattern), 1 / T, rtol=sum_rtol(T))
    mean_v = np.asarray(v).mean(1)[:, None]  # [B, 1, H, K]
    assert_close_to_scale(z, np.broadcast_to(mean_v, z.shape), dot_rtol(T), "z of blocked rows")
    assert np.isnan(np.asarray(jax.nn.softmax(jnp.full((T,), -jnp.inf)))).all()  # why attention_softmax exists
    assert np.isfinite(np.asarray(attention_softmax(jnp.full((T,), -jnp.inf)))).all()


def test_gradients_through_masked_scores_are_finite():
    """−inf scores must not turn gradients into NaN: ∂(Σ z·w)/∂q through the explicit path is finite and
    equals the unwatched path's (the same function), for rows with padding and a row of one real token."""
    q, k, v, mask = inputs(6, lengths=(9, 5, 1))
    w = jnp.asarray(np.random.default_rng(7).normal(size=(B, T, H, K)), jnp.float32)

    def loss(path):
        return lambda q: (path(q, k, v, mask) * w).sum()

    got = jax.grad(loss(explicit))(q)
    assert np.isfinite(np.asarray(got)).all()
    assert_close_to_scale(got, jax.grad(loss(unwatched_attention))(q), 2 * z_rtol(q, k), "∂/∂q")


# ---- which kernel runs where (minibert.core.attention) -------------------------------------------------------------

CHOICES = [  # (platform, dtype, K, T, mask form, watched, dropout, cuDNN present) → backend, by attention.py's rules
    ("cpu", "float32", 64, 128, "keys", False, False, False, "unwatched"),
    ("cpu", "bfloat16", 64, 128, "keys", False, False, True, "unwatched"),
    ("cpu", "float32", 64, 128, "keys", False, True, False, "explicit"),
    ("cpu", "float32", 64, 128, "keys", True, False, False, "explicit"),
    ("cuda", "bfloat16", 64, 128, "keys", False, False, True, "cudnn"),
    ("cuda", "float16", 128, 512, "keys", False, True, True, "cudnn"),
    ("cuda", "float32", 64, 128, "keys", False, False, True, "xla"),
    ("cuda", "float32", 64, 128, "keys", False, True, True, "explicit"),
    ("cuda", "bfloat16", 64, 128, "keys", True, False, True, "explicit"),
    ("cuda", "bfloat16", 64, 128, "keys", False, False, False, "xla"),
    ("cuda", "bfloat16", 12, 128, "keys", False, False, True, "xla"),
    ("cuda", "bfloat16", 256, 128, "keys", False, False, True, "xla"),
    ("cuda", "bfloat16", 64, 9, "keys", False, False, True, "xla"),
    ("cuda", "bfloat16", 64, 128, "per-query", False, False, True, "xla"),
    ("cuda", "bfloat16", 64, 128, "per-query", False, True, True, "explicit"),
    ("tpu", "bfloat16", 64, 128, "keys", False, False, False, "xla"),
    ("rocm", "bfloat16", 64, 128, "keys", False, True, False, "explicit"),
]


def choice(platform, dtype="bfloat16", K=64, T=128, form="keys", **flags):
    """attention.choose for a batch of 4 rows of T tokens, 12 heads of width K."""
    mask = (4, 1, 1 if form == "keys" else T, T)
    return attention.choose(platform, dtype, (4, T, 12, K), (4, T, 12, K), mask, **flags)


@pytest.mark.parametrize("platform, dtype, K, T, form, watched, dropout, cudnn, want", CHOICES)
def test_choose_follows_the_rules(platform, dtype, K, T, form, watched, dropout, cudnn, want):
    backend = choice(platform, dtype, K, T, form, watched=watched, dropout=dropout, cudnn=cudnn)
    assert backend.name == want
    assert backend.reason  # every answer says why


def test_reasons_name_what_decided():
    assert "head width" in choice("cuda", K=12, cudnn=True).reason
    assert "bfloat16/float16" in choice("cuda", "float32", cudnn=True).reason
    assert "per-query" in choice("cuda", form="per-query", cudnn=True).reason
    assert "even lengths" in choice("cuda", T=9, cudnn=True).reason
    assert "dropout fused" in choice("cuda", dropout=True, cudnn=True).reason
    assert attention.mask_form((3, 1, 1, 9)) == "keys" and attention.mask_form((3, 1, 9, 9)) == "per-query"


def brute_force_lengths(mask: np.ndarray):
    """Key lengths by a loop: a row is described by its length when it reads 1…1 0…0 with at least one 1."""
    lengths, described = [], []
    for row in mask:
        n = int(row.sum())
        lengths.append(n)
        described.append(n > 0 and all(row[:n]) and not any(row[n:]))
    return lengths, described


@pytest.mark.parametrize("rows", [
    [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]],  # right padding
    [[0, 1, 1, 1], [1, 1, 1, 1]],  # left padding
    [[1, 0, 1, 0]],  # a hole
    [[1, 1, 0, 0], [0, 0, 0, 0]],  # a row of padding only
])
def test_key_lengths_describe_right_padded_rows_only(rows):
    mask = np.asarray(rows, bool)
    want_lengths, want_described = brute_force_lengths(mask)
    for key_lengths in (attention.key_lengths, jax.jit(attention.key_lengths)):  # NumPy and traced alike
        lengths, described = key_lengths(mask[:, None, None, :])
        assert np.asarray(lengths).tolist() == want_lengths and np.asarray(described).tolist() == want_described


def lowered_ops(fn, *args, platform: str) -> collections.Counter:
    """The StableHLO ops (and custom-call targets) of fn lowered for `platform`, counted."""
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()
    ops = collections.Counter(re.findall(r"stablehlo\.([a-z_]+)", text))
    ops.update(f"custom_call {t}" for t in re.findall(r'custom_call @?"?([\w$]+)', text))
    return ops


def computed(ops: collections.Counter) -> collections.Counter:
    """ops without the platform switch's own: lax.platform_dependent lowers, for one platform, to a case on a
    constant index (case, its regions' returns, the index constants)."""
    return collections.Counter({op: n for op, n in ops.items() if op not in ("case", "return", "constant")})


def attend_unwatched(q, k, v, mask):
    return attend(q, k, v, mask, NO_HOOKS, "blocks.0.attn")


def test_cuda_lowering_takes_the_xla_kernel_and_the_cpu_lowering_the_unwatched_one():
    """One traced attend, lowered for each platform (on this CPU): the CUDA program is fused_attention's
    (XLA's dot_product_attention, op for op), the CPU program unwatched_attention's, and neither calls cuDNN
    (float32: cuDNN flash attention takes half precision only)."""
    args = inputs(8)
    cuda = computed(lowered_ops(attend_unwatched, *args, platform="cuda"))
    assert cuda == computed(lowered_ops(fused_attention, *args, platform="cuda"))
    cpu = computed(lowered_ops(attend_unwatched, *args, platform="cpu"))
    assert cpu == computed(lowered_ops(unwatched_attention, *args, platform="cpu")) != cuda
    assert not any("cudnn" in op for op in cuda)


def even_length_inputs(seed):
    """bf16 q, k, v [2, 16, 4, 16] and a right-padded key mask (16 and 7 real keys): a call cuDNN can take."""
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 16, 4, 16)), jnp.bfloat16) for _ in range(3))
    return q, k, v, jnp.asarray(np.arange(16)[None] < np.array([[16], [7]]))[:, None, None, :]


@pytest.fixture
def cudnn_lowerable(monkeypatch):
    """Let this CPU lower cuDNN calls for CUDA. jax traces a cuDNN call only where jaxlib reports cuDNN's version
    (its private check_cudnn_version; the CPU jaxlib has none) and attention.choose picks cuDNN only where a CUDA
    device exists; both are patched for the test. The lowering itself, the custom call and its backend config,
    is jax's CUDA rule, unchanged."""
    from jax._src.cudnn import fused_attention_stablehlo

    monkeypatch.setattr(fused_attention_stablehlo, "check_cudnn_version", lambda: 90100)
    monkeypatch.setattr(attention, "cudnn_present", lambda: True)


def test_bf16_cuda_lowering_calls_cudnn_flash_attention_forward_and_backward(cudnn_lowerable):
    """bf16 on CUDA: the program holds cuDNN's fused attention (forward; with grad its backward too), behind the
    run-time check of key lengths whose other branch is XLA's kernel; the CPU lowering of the same trace none."""
    q, k, v, mask = even_length_inputs(9)
    forward = lowered_ops(attend_unwatched, q, k, v, mask, platform="cuda")
    assert forward["custom_call __cudnn$fmhaSoftmax"] == 1
    xla = lowered_ops(fused_attention, q, k, v, mask, platform="cuda")
    assert forward["dot_general"] == xla["dot_general"] == 2  # the fallback: XLA's q·k and pattern·v

    def loss(q, k, v, mask):
        return attend_unwatched(q, k, v, mask).astype(jnp.float32).sum()

    backward = lowered_ops(jax.grad(loss), q, k, v, mask, platform="cuda")
    assert backward["custom_call __cudnn$fmhaSoftmaxBackward"] == 1
    assert not any("cudnn" in op for op in lowered_ops(attend_unwatched, q, k, v, mask, platform="cpu"))


def test_attention_dropout_on_cuda_is_cudnns_fused_dropout(cudnn_lowerable):
    """With attention dropout, the bf16 CUDA program drops inside cuDNN's kernel (fmhaSoftmaxDropout and its
    backward) and draws no [B, H, T, S] mask of its own where key lengths describe the mask; the XLA fallback
    branch (not right-padded) drops on the explicit path with rbg bits."""
    q, k, v, mask = even_length_inputs(10)
    drop = Dropout(jax.random.key(0), attention=0.1)

    def loss(q, k, v, mask):
        return attend(q, k, v, mask, NO_HOOKS, "blocks.0.attn", drop).astype(jnp.float32).sum()

    ops = lowered_ops(jax.grad(loss), q, k, v, mask, platform="cuda")
    assert ops["custom_call __cudnn$fmhaSoftmaxDropout"] == 1
    assert ops["custom_call __cudnn$fmhaSoftmaxDropoutBackward"] == 1
    assert ops["rng_bit_generator"] == 1  # the fallback branch's one rbg draw; no threefry hash of a mask


def test_model_attention_backend_names_the_kernel_for_this_batch(tmp_path):
    """model.programs.attention_backend(batch): on this CPU the unwatched kernel; asked for CUDA, a bf16 model's
    right-padded batch gets cuDNN, the same model in float32 XLA, and a left-padded batch XLA, naming its rows."""
    import minibert
    from tests.conftest import make_hf_model

    make_hf_model(tmp_path, "BertModel")  # 4 heads of width 8
    bf16 = minibert.load(tmp_path, dtype=jnp.bfloat16)
    right = {"input_ids": np.full((2, 6), 7), "token_type_ids": np.zeros((2, 6), int),
             "attention_mask": np.array([[1] * 6, [1, 1, 1, 0, 0, 0]])}
    left = right | {"attention_mask": np.array([[1] * 6, [0, 0, 0, 1, 1, 1]])}
    assert bf16.programs.attention_backend(right).name == "unwatched"  # this machine is a CPU
    assert bf16.programs.attention_backend(right, platform="cuda").name == "cudnn"
    assert minibert.load(tmp_path).programs.attention_backend(right, platform="cuda").name == "xla"
    backend = bf16.programs.attention_backend(left, platform="cuda")
    assert backend.name == "xla" and "rows [1]" in backend.reason
    assert bf16.programs.attention_backend(right, platform="CUDA").name == "cudnn"  # a platform's name in any case
    from minibert.errors import InputError

    with pytest.raises(InputError, match="'gpu' is JAX's name for NVIDIA and AMD GPUs alike.*pass 'cuda'"):
        bf16.programs.attention_backend(right, platform="gpu")
    for bogus in ("bogus", 5, ""):  # issue 40: answered as a platform without cuDNN
        with pytest.raises(InputError, match="pass one of 'cpu', 'cuda', 'rocm', 'tpu', or None"):
            bf16.programs.attention_backend(right, platform=bogus)


def test_the_kernel_this_machine_picks_matches_float32_explicit():
    """attend in bf16 on this machine's platform — cuDNN flash attention on an NVIDIA GPU, the unwatched kernel on a
    CPU — against the float32 explicit path on the same rounded inputs, rows of 16 and 7 real keys. Bound as for
    the bf16 fused kernel above: two bf16 score roundings (2·2u·max|s|), the pattern's and z's (2u), plus the
    float32 paths' own difference."""
    q, k, v, mask = even_length_inputs(11)
    got = jax.jit(attend_unwatched)(q, k, v, mask)
    q32, k32, v32 = (x.astype(jnp.float32) for x in (q, k, v))
    want = explicit(q32, k32, v32, mask)
    s_max = float(jnp.abs(jnp.einsum("BTHK,BSHK->BHTS", q32, k32)).max()) / np.sqrt(q.shape[-1])
    rtol = U_BF16 * (4 * s_max + 2) + z_rtol(q32, k32)
    assert_close_to_scale(got.astype(jnp.float32), want, rtol, str(attention.platform()))
