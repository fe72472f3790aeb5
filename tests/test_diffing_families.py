"""Model diffing on a pair of each family of one shape (a tiny random base and a fine-tune of it, every weight
moved by 5% noise): weight change per head against NumPy on transformers' own state dict, CKA per stream against
NumPy on transformers' hidden states; and a crosscoder trained a few steps on a model and a second load of it,
whose what_changed report keeps both decoders equal, labels nothing exclusive, moves no weight and has CKA 1."""

from __future__ import annotations

import copy
import inspect
import shutil

import numpy as np
import pytest
import torch
from test_families import HF_CLASSES, make_family_model, write_tokenizer

import minibert
from minibert.analysis import diffing

TEXTS = ["Hello world, this is a test.", "the lazy dog!", "café and naïve", "it's 3:45pm"]  # from test_families'
# CORPUS, which the families' tokenizers were made from; short, for the families' 40 positions
BERT_LAYOUT = ("encoder.layer.{l}.attention.self.query.weight", "encoder.layer.{l}.attention.output.dense.weight")
QUERY_AND_OUTPUT = {  # transformers' keys of each family's (query, attention output) weights in block l
    "roberta": BERT_LAYOUT, "xlm-roberta": BERT_LAYOUT, "camembert": BERT_LAYOUT, "electra": BERT_LAYOUT,
    "distilbert": ("transformer.layer.{l}.attention.q_lin.weight", "transformer.layer.{l}.attention.out_lin.weight"),
    "albert": ("encoder.albert_layer_groups.0.albert_layers.0.attention.query.weight",  # one block, shared
               "encoder.albert_layer_groups.0.albert_layers.0.attention.dense.weight"),
}
def _tuned_copy(hf_a, dir_a, dir_b):
    """dir_a's checkpoint with every weight moved by 5% noise (scaled by the weight's mean size), saved in dir_b."""
    shutil.copytree(dir_a, dir_b)
    hf_b = copy.deepcopy(hf_a)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in hf_b.parameters():
            p.add_(0.05 * p.abs().mean() * torch.randn_like(p))
    hf_b.save_pretrained(dir_b)
    return hf_b


def _numpy_cka(x, y):
    x, y = x - x.mean(0), y - y.mean(0)
    return np.linalg.norm(y.T @ x) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y))


@pytest.mark.slow  # ~14 s of CPU a family (measured on RoBERTa): a tokenizer trained, ~9 programs compiled
@pytest.mark.parametrize("family", list(HF_CLASSES))
def test_a_family_pair_diffs_as_numpy_on_transformers_says_and_a_model_against_itself_has_no_exclusive_latent(
        family, tmp_path):
    (tmp_path / "scratch").mkdir()
    vocabulary = write_tokenizer(tmp_path / "scratch", family)  # the embedding table must cover its ids
    hf_a = make_family_model(tmp_path / "base", family, vocab_size=vocabulary)
    hf_b = _tuned_copy(hf_a, tmp_path / "base", tmp_path / "tuned")
    model_a, model_b, again = (minibert.load(tmp_path / name) for name in ("base", "tuned", "base"))
    L, H = model_a.config.num_hidden_layers, model_a.config.num_attention_heads
    site = f"blocks.{L - 1}.{model_a.config.family.block_output}"

    config = diffing.CrosscoderConfig(d_in=model_a.config.hidden_size, d_sae=16, k=2)
    trainer = diffing.CrosscoderTrainer(config, learning_rate=1e-2, dead_tokens=64)
    trainer.train(diffing.paired_activations(model_a, again, TEXTS, site, batch_size=8, buffer_tokens=16,
                                             batch_tokens=64))
    assert trainer.steps >= 2 and trainer.config.hook_name == site
    itself = diffing.what_changed(model_a, again, TEXTS, trainer.config, trainer.params, source=trainer.source)
    # two loads of one checkpoint: both halves of every pair and of each update are the same arithmetic on the
    # same numbers (see test_diffing's BERT case), so the decoders stay equal; no weight moved; CKA 1 up to float32
    assert np.max(np.abs(itself.latents.relative_norm - 0.5)) < 1e-3
    assert not np.isin(itself.latents.labels, ["A-only", "B-only"]).any() and (itself.latents.labels != "dead").any()
    assert all(np.all(v == 0) for v in [*itself.weights.per_head.values(), *itself.weights.per_matrix.values()])
    np.testing.assert_allclose(itself.cka, 1, rtol=1e-5)
    assert itself.hook_name == site and itself.names[0] != itself.names[1]

    found = diffing.weight_change(model_a, model_b)
    a, b = hf_a.state_dict(), hf_b.state_dict()
    K = model_a.config.hidden_size // H
    rel = lambda x, y: np.linalg.norm(y - x) / np.linalg.norm(x)
    query, output = QUERY_AND_OUTPUT[family]
    for layer in range(L):
        q_a, q_b, o_a, o_b = (s[key.format(l=layer)].numpy() for key in (query, output) for s in (a, b))
        for h in range(H):  # query rows and output columns h·K … (h + 1)·K: the head's slice
            np.testing.assert_allclose(found.per_head["W_Q"][layer, h],
                                       rel(q_a[h * K:(h + 1) * K], q_b[h * K:(h + 1) * K]), rtol=1e-4)
            np.testing.assert_allclose(found.per_head["W_O"][layer, h],
                                       rel(o_a[:, h * K:(h + 1) * K], o_b[:, h * K:(h + 1) * K]), rtol=1e-4)
        np.testing.assert_allclose(found.per_matrix["attn.W_Q"][layer], rel(q_a, q_b), rtol=1e-4)

    # CKA by the formula in float64 on transformers' hidden states at the real tokens; float32 sums of N·D²
    # products of values O(1): relative error ≲ 1e-5, checked at 1e-4
    batch = model_a.tokenize(TEXTS)
    real = np.asarray(batch.attention_mask) > 0
    accepted = inspect.signature(hf_a.forward).parameters
    inputs = {name: torch.tensor(np.asarray(value)) for name, value in batch.to_dict().items() if name in accepted}
    with torch.no_grad():
        states = [hf(**inputs, output_hidden_states=True).hidden_states for hf in (hf_a, hf_b)]
    expected = [_numpy_cka(s_a.numpy()[real].astype(np.float64), s_b.numpy()[real].astype(np.float64))
                for s_a, s_b in zip(*states, strict=True)]
    cka = diffing.representation_similarity(model_a, model_b, TEXTS)
    np.testing.assert_allclose(cka, expected, rtol=1e-4)
    assert cka.shape == (L + 1,) and np.all(cka < 1)  # the fine-tune moved every stream a little
