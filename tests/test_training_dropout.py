"""Dropout (minibert.core.dropout.Dropout): kept fraction and scaling, placement, and rate 0 = the inference
computation."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import minibert
from minibert.core.encoder import Dropout, explicit_attention
from minibert.core.hooks import HookPoints
from tests.conftest import make_hf_model, random_batch
from tests.tolerances import U32


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_kept_fraction_and_scale(rate):
    """Each value is kept with probability 1 − rate (binomial: within 6 standard deviations of n(1 − rate),
    a two-sided failure probability of 2e-9) and scaled by exactly 1/(1 − rate), as torch.nn.Dropout does."""
    n = 200_000
    x = jnp.full((n,), 3.0, jnp.float32)
    dropped = np.asarray(Dropout(jax.random.key(0), hidden=rate).hidden("site", x))
    kept = dropped != 0
    sigma = math.sqrt(n * rate * (1 - rate))
    assert abs(kept.sum() - n * (1 - rate)) <= 6 * sigma
    assert np.all(dropped[kept] == np.float32(3.0) / np.float32(1 - rate))
    assert abs(dropped.mean() / 3.0 - 1) <= 6 * math.sqrt(rate / ((1 - rate) * n))  # expectation unchanged


def test_masks_differ_by_site_and_key_and_repeat_for_the_same_ones():
    x = jnp.ones((1000,))
    drop = Dropout(jax.random.key(1), hidden=0.5)
    a, b = (np.asarray(drop.hidden(site, x)) != 0 for site in ("blocks.0.attn_out", "blocks.0.mlp_out"))
    again = np.asarray(Dropout(jax.random.key(1), hidden=0.5).hidden("blocks.0.attn_out", x)) != 0
    other_key = np.asarray(Dropout(jax.random.key(2), hidden=0.5).hidden("blocks.0.attn_out", x)) != 0
    assert np.array_equal(a, again) and not np.array_equal(a, b) and not np.array_equal(a, other_key)
    assert drop.attention("p", x) is x and drop.classifier("c", x) is x  # rates 0: the value itself


def test_attention_dropout_weighs_v_with_the_dropped_pattern_and_hooks_see_the_pattern():
    """z = (dropped pattern)·v, the dropped pattern = pattern·mask/(1 − p) with the mask the site draws;
    hook_pattern still holds softmax(scores) itself."""
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 5, 3, 4)), jnp.float32) for _ in range(3))
    key_mask = jnp.ones((2, 1, 1, 5), bool)
    drop = Dropout(jax.random.key(3), attention=0.3)
    hooks = HookPoints(frozenset({"a.hook_pattern"}), {}, 3, 4)
    z = explicit_attention(q, k, v, key_mask, hooks, "a", drop)
    pattern = hooks.captured["a.hook_pattern"]
    plain = HookPoints(frozenset({"a.hook_pattern"}), {}, 3, 4)
    explicit_attention(q, k, v, key_mask, plain, "a")
    np.testing.assert_array_equal(pattern, plain.captured["a.hook_pattern"])
    mask = np.asarray(drop.attention("a.pattern", jnp.ones(pattern.shape))) != 0
    weights = np.where(mask, np.asarray(pattern) / np.float32(0.7), 0)
    want = np.einsum("BHTS,BHSK->BTHK", weights, np.asarray(v).transpose(0, 2, 1, 3))
    # Two float32 sums of S = 5 products each: within 2·S·u·Σ|w·v| of each other (Higham's strict bound).
    magnitude = np.einsum("BHTS,BHSK->BTHK", np.abs(weights), np.abs(np.asarray(v)).transpose(0, 2, 1, 3))
    assert np.all(np.abs(np.asarray(z) - want) <= 2 * 5 * U32 * magnitude)


def test_rate_zero_is_the_inference_forward_and_dropout_changes_training_outputs(tmp_path):
    make_hf_model(tmp_path, "BertForSequenceClassification", num_labels=3)
    model = minibert.load(tmp_path)
    batch = random_batch(np.random.default_rng(0), 3, 9, 99)
    inputs = model.inputs(batch)
    arrays = (inputs.input_ids, inputs.token_type_ids, inputs.attention_mask)
    module = model.module
    forward = jax.jit(lambda drop_key, rate: module(*arrays, dropout=Dropout(drop_key, hidden=rate, attention=rate,
                                                                              classifier=rate)), static_argnums=1)
    plain = jax.jit(lambda: module(*arrays))()
    zero = forward(jax.random.key(0), 0.0)
    np.testing.assert_array_equal(zero.logits, plain.logits)
    np.testing.assert_array_equal(zero.last_hidden_state, plain.last_hidden_state)
    dropped = forward(jax.random.key(0), 0.2)
    assert not np.allclose(dropped.logits, plain.logits)
    np.testing.assert_array_equal(dropped.logits, forward(jax.random.key(0), 0.2).logits)  # the key decides


def test_masks_come_from_one_rbg_draw_not_a_threefry_hash_per_value():
    """A site's mask is one RngBitGenerator draw (rbg key, dropout.mask_key): the lowered program's only ops on the
    mask's n words are that draw and turning bits into uniforms (shifts, or, bitcast), never threefry's rounds
    (xor/rotations over n words), which the site key's 4 seed words alone go through."""
    n = 4096
    x = jnp.ones((n,), jnp.float32)
    text = jax.jit(lambda key: Dropout(key, hidden=0.1).hidden("site", x)).lower(jax.random.key(0)).as_text()
    assert text.count("stablehlo.rng_bit_generator") == 1
    mask_sized = [line for line in text.splitlines() if f"tensor<{n}xui32>" in line]
    assert any("rng_bit_generator" in line for line in mask_sized)
    assert not any("stablehlo.xor" in line for line in mask_sized)
    threefry = jax.jit(lambda key: jax.random.bernoulli(key, 0.9, (n,))).lower(jax.random.key(0)).as_text()
    assert any("stablehlo.xor" in line and f"{n}xui32" in line for line in threefry.splitlines())  # what it avoids
