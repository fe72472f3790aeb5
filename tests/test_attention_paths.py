"""The three attention paths give one z: explicit (every step a hook site), unwatched (the CPU branch) and
fused (jax.nn.dot_product_attention, the GPU/TPU branch, called directly here so it runs on CPU too),
in float32 and bfloat16, with padding, fully masked rows and rows with a single real token."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from tolerances import U32, U_BF16, assert_close_to_scale, dot_rtol, sum_rtol

from minibert.model import NO_HOOKS, explicit_attention, fused_attention, unwatched_attention

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
    s_max = float(jnp.abs(jnp.einsum("BTHK,BSHK->BHTS", q, k)).max()) / np.sqrt(K)
    one = 2 * s_max * dot_rtol(K, u) + sum_rtol(T, u) + dot_rtol(T, u)
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
    the most negative float, the softmax is uniform over all S keys, and z is the mean of v over S —
    explicit, unwatched and fused alike (finite, never NaN)."""
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
