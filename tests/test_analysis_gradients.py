"""minibert/analysis/gradients.py: the masked-LM loss against transformers, random masking, gradients with
respect to attention against finite differences, and gradients grouped by target against loops."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from conftest import random_batch
from test_analysis_norms import TEXTS

import minibert
from minibert.analysis import gradients
from minibert.core.hooks import HookFn
from minibert.errors import AnalysisError

# ---- gradients with respect to attention, on a tiny random BertForMaskedLM ----------------------------

@pytest.fixture(scope="module")
def masked(tiny_mlm):
    model, _ = tiny_mlm
    ids = random_batch(np.random.default_rng(0), 3, 8, 99)
    positions = np.zeros_like(ids["input_ids"], bool)
    positions[0, [2, 5]] = positions[1, 1] = positions[2, 1] = True
    return gradients.mask_tokens(model, ids, positions), ids


def test_mlm_loss_matches_transformers(tiny_mlm, masked):
    model, hf_model = tiny_mlm
    (batch, labels), ids = masked
    assert (batch["input_ids"][labels != -100] == model.tokenizer.mask_token_id).all()
    np.testing.assert_array_equal(labels[labels != -100], ids["input_ids"][labels != -100])
    with torch.no_grad():
        expected = hf_model(**{k: torch.tensor(np.asarray(v), dtype=torch.long) for k, v in batch.items()},
                            labels=torch.tensor(labels, dtype=torch.long)).loss.item()
    assert float(gradients.mlm_loss_fn(labels)(model(batch))) == pytest.approx(expected, abs=1e-5)
    positions = labels != -100
    assert gradients.mlm_loss(model, ids, positions) == pytest.approx(expected, abs=1e-5)


def test_random_masking_skips_special_tokens_and_padding(tiny_mlm):
    model, _ = tiny_mlm
    ids = random_batch(np.random.default_rng(1), 4, 12, 99)
    ids["input_ids"][:, 3] = model.tokenizer.sep_token_id
    batch, labels = gradients.mask_tokens(model, ids, rate=0.3, seed=7)
    chosen = labels != -100
    candidates = (ids["attention_mask"] > 0) & ~np.isin(ids["input_ids"], [2, 3, 0])
    assert not (chosen & ~candidates).any()
    for row in range(4):
        assert chosen[row].sum() == max(1, round(0.3 * candidates[row].sum()))
    again, _ = gradients.mask_tokens(model, ids, rate=0.3, seed=7)
    np.testing.assert_array_equal(again["input_ids"], batch["input_ids"])


def _perturb(pattern, ctx, delta):
    return pattern + delta[ctx.layer]


@pytest.mark.slow  # 12 forward passes, one per perturbed entry
def test_attention_gradients_match_finite_differences(tiny_mlm, masked):
    model, _ = tiny_mlm
    (batch, labels), _ = masked
    loss_fn = gradients.mlm_loss_fn(labels)
    grad = gradients.attention_gradients(model, batch, loss_fn)
    assert grad.shape == (2, 3, 4, 8, 8)
    real = batch["attention_mask"].astype(bool)
    candidates = np.argwhere(real[None, :, None, :, None] & real[None, :, None, None, :] & (np.abs(grad) > 0))
    rng = np.random.default_rng(2)
    picked = [np.unravel_index(np.abs(grad).argmax(), grad.shape)] + [tuple(c) for c in rng.permutation(candidates)[:5]]
    eps = 1e-2
    for index in picked:
        delta = np.zeros(grad.shape, np.float32)
        delta[index] = eps
        hooks = [{gradients.PATTERNS: HookFn(_perturb, delta=sign * jnp.asarray(delta))} for sign in (1, -1)]
        losses = [float(loss_fn(model.run_with_hooks(batch, h))) for h in hooks]
        numeric = (losses[0] - losses[1]) / (2 * eps)
        assert grad[index] == pytest.approx(numeric, rel=2e-2, abs=2e-4), index


def test_gradient_by_target_matches_loops():
    rng = np.random.default_rng(3)
    grad = rng.normal(size=(2, 3, 2, 5, 5))
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
    cls = np.zeros((3, 5), bool)
    cls[:, 0] = True
    sep = np.zeros((3, 5), bool)
    sep[0, 4] = sep[1, 2] = sep[2, 3] = True
    sep[1, 4] = True  # on padding: must not count
    result = gradients.gradient_by_target(grad, {"cls": cls, "sep": sep}, mask)
    for name, keys in (("cls", cls), ("sep", sep), ("other", ~cls & ~sep)):
        for layer in range(2):
            for head in range(2):
                values = [abs(grad[layer, b, head, t, s]) for b in range(3) for t in range(5) for s in range(5)
                          if mask[b, t] and mask[b, s] and keys[b, s]]
                assert result[name][layer, head] == pytest.approx(np.mean(values), rel=1e-12)
    empty = gradients.gradient_by_target(grad, {"none": np.zeros((3, 5), bool)}, mask)
    assert np.isnan(empty["none"]).all()
    attention = rng.uniform(size=grad.shape)
    np.testing.assert_array_equal(gradients.gradient_times_attention(grad, attention), grad * attention)
    with pytest.raises(ValueError, match=r"must be \[B, S\]"):
        gradients.gradient_by_target(grad, {"cls": cls[:, :3]}, mask)


def test_token_targets_on_the_bundled_tokenizer(bundled):
    batch = bundled.tokenize(TEXTS)
    targets = gradients.token_targets(bundled, batch)
    for name, token in (("cls", "[CLS]"), ("sep", "[SEP]")):
        np.testing.assert_array_equal(targets[name], np.array([[t == token for t in row] for row in batch.tokens]))
    np.testing.assert_array_equal(targets["punct"], np.array([[t in ".," for t in row] for row in batch.tokens]))


def test_mlm_errors_name_the_missing_head(bundled):
    with pytest.raises(AnalysisError, match="BertModel.*masked-LM head|masked-LM head.*BertModel"):
        gradients.mask_tokens(bundled, TEXTS)
    with pytest.raises(minibert.InputError, match="masked-LM logits"):
        gradients.mlm_loss_fn(np.zeros((2, 12)))(minibert.Output(last_hidden_state=jnp.zeros((2, 12, 384))))


def test_mask_tokens_rejects_padding_positions(tiny_mlm):
    model, _ = tiny_mlm
    ids = random_batch(np.random.default_rng(4), 2, 6, 99)
    ids["attention_mask"][1, 5] = 0
    positions = np.zeros((2, 6), bool)
    positions[1, 5] = True
    with pytest.raises(minibert.InputError, match="row 1, position 5"):
        gradients.mask_tokens(model, ids, positions)
    with pytest.raises(minibert.InputError, match=r"bool \[B, T\]"):
        gradients.mask_tokens(model, ids, positions[:, :3])
