"""Logit lens and per-block logit changes against Hugging Face's own MLM head applied to its hidden states."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import random_batch
from tolerances import assert_close_to_scale, head_rtol

from minibert.analysis import lens
from minibert.errors import AnalysisError

EPS32 = float(np.finfo(np.float32).eps)


def batch():
    return random_batch(np.random.default_rng(2), 3, 9, 99)


def hf_lens(hf, fields) -> np.ndarray:
    """transformers: hidden_states (embedding output, then each layer's) each read by `hf.cls`: [L + 1, B, T, V]."""
    tensors = {k: torch.as_tensor(np.asarray(v)) for k, v in fields.items()}
    with torch.no_grad():
        hidden = hf(**tensors, output_hidden_states=True).hidden_states
        return np.stack([hf.cls(h).numpy() for h in hidden])


def tolerance(model, scale) -> float:
    """Two float32 programs through L + 1 stages (embedding, blocks) and the head, each stage ≈ 16 eps of the
    stream's scale (as in test_analysis_mixing.block_noise), both programs: 2 · 16 eps · (L + 2) · scale."""
    return 2 * 16 * EPS32 * (model.config.num_hidden_layers + 2) * scale


def test_logit_lens_matches_transformers_head_on_hidden_states(tiny_mlm):
    model, hf = tiny_mlm
    fields = batch()
    expected = hf_lens(hf, fields)
    got = lens.logit_lens(model, fields)
    assert got.shape == expected.shape == (3, 3, 9, 99)
    real = fields["attention_mask"] > 0
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got[:, real], expected[:, real], atol=tolerance(model, scale), rtol=0)
    # The last stream is the model's own logits, computed by another program (the lens's head over the stacked
    # streams): two programs' rounding, tolerances.head_rtol (the real positions; padding rows are read by no one).
    assert_close_to_scale(got[-1], np.asarray(model(fields).logits), head_rtol(model.config, S=9), "last stream",
                          where=real)


def test_top_k_is_the_k_largest(tiny_mlm):
    model, _ = tiny_mlm
    fields = batch()
    full = lens.logit_lens(model, fields)
    ids, values = lens.logit_lens(model, fields, top_k=4)
    assert ids.shape == values.shape == (3, 3, 9, 4)
    np.testing.assert_array_equal(values, np.take_along_axis(full, ids, axis=-1))
    np.testing.assert_array_equal(values, -np.sort(-full, axis=-1)[..., :4])


def test_logit_contributions_telescope_to_the_final_logit(tiny_mlm):
    model, hf = tiny_mlm
    fields = batch()
    targets = np.random.default_rng(3).integers(0, 99, size=fields["input_ids"].shape)
    steps = lens.logit_contributions(model, fields, targets)
    index = np.broadcast_to(targets[None, ..., None], (3, 3, 9, 1))
    expected = np.take_along_axis(hf_lens(hf, fields), index, -1)[..., 0]
    real = fields["attention_mask"] > 0
    tol = tolerance(model, np.abs(expected).max())
    np.testing.assert_allclose(steps[0][real], expected[0][real], atol=tol, rtol=0)
    np.testing.assert_allclose(np.diff(expected, axis=0)[:, real], steps[1:][:, real], atol=2 * tol, rtol=0)
    final = np.take_along_axis(np.asarray(model(fields).logits), targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(steps.sum(0), final, atol=len(steps) * EPS32 * np.abs(expected).max(), rtol=0)
    one = lens.logit_contributions(model, fields, 7)  # one id for every position
    np.testing.assert_allclose(one, lens.logit_contributions(model, fields, np.full_like(targets, 7)), rtol=0, atol=0)


def test_lens_needs_an_mlm_head_and_valid_targets(tiny_mlm, bundled):
    with pytest.raises(AnalysisError, match="masked-LM head"):
        lens.logit_lens(bundled, ["hello"])
    model, _ = tiny_mlm
    with pytest.raises(AnalysisError, match="targets"):
        lens.logit_contributions(model, batch(), np.zeros((2, 2), int))
    with pytest.raises(AnalysisError, match="vocabulary"):
        lens.logit_contributions(model, batch(), "notaword")
    with pytest.raises(AnalysisError, match="top_k"):
        lens.logit_lens(model, batch(), top_k=0)
