"""Parity with Hugging Face transformers (PyTorch, eager attention), fp32.

Tiny random models are built and saved here with save_pretrained, loaded with minibert.load,
and compared on padded batches with sentence-B segments: every layer's hidden state, every
attention map, the pooler and the logits within 1e-5. The bundled checkpoint within 1e-4 at real
tokens; its padding rows (which no output reads) drift further, see test_bundled_checkpoint_parity.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import minibert
from conftest import make_hf_model, random_batch

TINY = 1e-5
REAL = 1e-4
PADDING_ROWS = 1e-3  # bundled checkpoint, hidden states of padding positions only (see below)
CAPTURE = ["hook_full_embed", "blocks.*.hook_normalized_resid_post", "blocks.*.attn.hook_pattern"]


def hf_outputs(hf_model, batch):
    with torch.no_grad():
        return hf_model(**{k: torch.tensor(v) for k, v in batch.items()},
                        output_hidden_states=True, output_attentions=True)


def assert_close(ours, theirs, tol, what, rows=None):
    """max |ours − theirs| ≤ tol, over the [B, T] positions where `rows` is True (default: everywhere)."""
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape} vs {theirs.shape}"
    if rows is not None:
        ours, theirs = ours[rows], theirs[rows]
        if not ours.size:
            return
    err = np.abs(ours - theirs).max()
    assert err <= tol, f"{what}: max abs difference {err:.2e} > {tol:.0e}"


def assert_parity(model, hf_model, batch, tol, padding_tol=None):
    """Every hidden state and attention map within tol; hidden states at padding positions within
    padding_tol when given (else tol)."""
    out, cache = model.run_with_cache(batch, names=CAPTURE)
    ref = hf_outputs(hf_model, batch)
    hidden = [cache["hook_full_embed"], *cache.stack("hook_normalized_resid_post"), out.last_hidden_state]
    assert len(hidden) == len(ref.hidden_states) + 1
    real = np.asarray(batch["attention_mask"]) > 0
    for layer, (ours, theirs) in enumerate(zip(hidden, [*ref.hidden_states, ref.hidden_states[-1]])):
        assert_close(ours, theirs, tol, f"hidden state {layer}, real tokens", rows=real)
        assert_close(ours, theirs, padding_tol or tol, f"hidden state {layer}, padding positions", rows=~real)
    patterns = cache.stack("hook_pattern")
    for layer, theirs in enumerate(ref.attentions):
        assert_close(patterns[layer], theirs, tol, f"attention {layer}")
    return out, ref


VARIANTS = [
    dict(num_hidden_layers=1, num_attention_heads=1, hidden_size=16),
    dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=32, hidden_act="gelu_new"),
    dict(num_hidden_layers=3, num_attention_heads=2, hidden_size=24, hidden_act="relu", layer_norm_eps=1e-5),
    dict(num_hidden_layers=2, num_attention_heads=8, hidden_size=64, hidden_act="gelu_pytorch_tanh", type_vocab_size=3),
    dict(num_hidden_layers=2, num_attention_heads=3, hidden_size=48, type_vocab_size=1, intermediate_size=20),
]


@pytest.mark.parametrize("config", VARIANTS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_encoder_parity(tmp_path, config):
    hf_model = make_hf_model(tmp_path, "BertModel", **config)
    model = minibert.load(tmp_path)
    batch = random_batch(np.random.default_rng(1), 3, 11, 99, config.get("type_vocab_size", 2))
    out, ref = assert_parity(model, hf_model, batch, TINY)
    assert_close(out.pooler_output, ref.pooler_output, TINY, "pooler")


HEADS = {
    "BertForMaskedLM": lambda ref: {"logits": ref.logits},
    "BertForPreTraining": lambda ref: {"logits": ref.prediction_logits, "nsp_logits": ref.seq_relationship_logits},
    "BertForSequenceClassification": lambda ref: {"logits": ref.logits},
    "BertForTokenClassification": lambda ref: {"logits": ref.logits},
}


@pytest.mark.parametrize("architecture", list(HEADS))
def test_head_parity(tmp_path, architecture):
    hf_model = make_hf_model(tmp_path, architecture, num_labels=3)
    model = minibert.load(tmp_path)
    assert model.config.architecture == architecture
    batch = random_batch(np.random.default_rng(2), 4, 9, 99)
    out, ref = assert_parity(model, hf_model, batch, TINY)
    for field, theirs in HEADS[architecture](ref).items():
        assert_close(getattr(out, field), theirs, TINY, f"{architecture} {field}")


def test_bfloat16_compute_stays_close(tmp_path):
    hf_model = make_hf_model(tmp_path, "BertModel", scale=0.1)
    import jax.numpy as jnp

    model = minibert.load(tmp_path, dtype=jnp.bfloat16)
    batch = random_batch(np.random.default_rng(6), 2, 8, 99)
    ours = np.asarray(model(batch).last_hidden_state, np.float32)
    theirs = hf_outputs(hf_model, batch).last_hidden_state.numpy()
    # bf16 keeps 8 bits of mantissa: relative agreement to a few percent is what it can give.
    assert np.abs(ours - theirs).max() < 0.1 * np.abs(theirs).max()


SENTENCES = ["I made the mistake.", "This was my mistake.", "Sorry I will over night it tomorrow morning.",
             "It's acceptable."]
PAIRS = [("The company reported higher profits.", "Profits rose at the company, it said."),
         ("He said the foodservice pie business doesn't fit.", "The pie business does not fit the company's strategy.")]


def test_bundled_checkpoint_parity(bundled, bundled_dir):
    import transformers

    hf_model = transformers.BertModel.from_pretrained(bundled_dir, attn_implementation="eager").eval()
    hf_tokenizer = transformers.BertTokenizerFast.from_pretrained(bundled_dir)
    for batch in (bundled.tokenize(SENTENCES), bundled.tokenize(*map(list, zip(*PAIRS)))):
        ours = batch.to_dict()
        texts = (batch.texts,) if batch.pairs is None else (batch.texts, batch.pairs)
        theirs = hf_tokenizer(*texts, padding=True, return_tensors="np")
        for key in ours:
            np.testing.assert_array_equal(ours[key], theirs[key])
        # At padding positions (a [PAD] query over the real keys, read by nothing downstream) fp32 rounding
        # differences grow through the layers to ~1.4e-4 on this checkpoint (real tokens: ≤ 5e-6).
        out, ref = assert_parity(bundled, hf_model, {k: np.asarray(v) for k, v in ours.items()}, REAL, PADDING_ROWS)
        assert_close(out.pooler_output, ref.pooler_output, REAL, "pooler")


def test_bundled_sentence_embeddings_match_sentence_transformers_recipe(bundled, bundled_dir):
    """Mean pooling over real tokens then L2 normalisation, as modules.json of all-MiniLM-L6-v2 says."""
    import transformers

    assert bundled.pooling == {"mode": "mean", "normalize": True}
    hf_model = transformers.BertModel.from_pretrained(bundled_dir).eval()
    batch = bundled.tokenize(SENTENCES)
    ref = hf_outputs(hf_model, batch.to_dict()).last_hidden_state.numpy()
    mask = batch.attention_mask[..., None]
    mean = (ref * mask).sum(1) / mask.sum(1)
    expected = mean / np.linalg.norm(mean, axis=-1, keepdims=True)
    assert_close(bundled.sentence_embeddings(batch), expected, REAL, "sentence embeddings")
