"""Parity with Hugging Face transformers (PyTorch, eager attention), fp32.

Tiny random models are built and saved here with save_pretrained, loaded with minibert.load,
and compared on padded batches with sentence-B segments: every layer's hidden state, every
attention map, the pooler and the logits, at real tokens (padding query rows are read by no output),
within tolerances.forward_rtol of each tensor's scale: two fp32 programs (minibert and PyTorch) that
round differently, carried through the embedding LayerNorm and every block.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import make_hf_model, random_batch
from tolerances import U_BF16, assert_close_to_scale, forward_rtol

import minibert


def _tiny_config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37):
    return SimpleNamespace(hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                           intermediate_size=intermediate_size, head_dim=hidden_size // num_attention_heads)


# Relative to scale, for the tiny random models (conftest.make_hf_model, ≤ 12 tokens): forward_rtol of the
# largest of them (4 layers, D = 64, F = 128), which bounds every smaller one.
TINY = forward_rtol(_tiny_config(64, 4, 4, 128), S=12)
CAPTURE = ["hook_full_embed", "blocks.*.hook_normalized_resid_post", "blocks.*.attn.hook_pattern"]


def hf_outputs(hf_model, batch):
    with torch.no_grad():
        return hf_model(**{k: torch.tensor(v) for k, v in batch.items()},
                        output_hidden_states=True, output_attentions=True)


def assert_close(ours, theirs, tol, what, rows=None):
    """max |ours − theirs| ≤ tol × max |theirs|, over the [B, T] positions where `rows` is True (default: all)."""
    assert_close_to_scale(ours, theirs, tol, what, where=rows)


def parity_rtol(model, batch) -> float:
    return forward_rtol(model.config, S=np.asarray(batch["input_ids"]).shape[1])


def assert_parity(model, hf_model, batch, tol=None):
    """Every hidden state and attention map at real tokens within tol (default: parity_rtol) of its scale."""
    tol = parity_rtol(model, batch) if tol is None else tol
    out, cache = model.run_with_cache(batch, names=CAPTURE)
    ref = hf_outputs(hf_model, batch)
    hidden = [cache["hook_full_embed"], *cache.stack("hook_normalized_resid_post"), out.last_hidden_state]
    assert len(hidden) == len(ref.hidden_states) + 1
    real = np.asarray(batch["attention_mask"]) > 0
    for layer, (ours, theirs) in enumerate(zip(hidden, [*ref.hidden_states, ref.hidden_states[-1]])):
        assert_close(ours, theirs, tol, f"hidden state {layer}, real tokens", rows=real)
    patterns = np.asarray(cache.stack("hook_pattern"))
    rows = np.broadcast_to(real[:, None, :, None], patterns.shape[1:])  # real query rows, every key
    for layer, theirs in enumerate(ref.attentions):
        assert_close(patterns[layer], theirs, tol, f"attention {layer}", rows=rows)
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
    real = np.asarray(batch["attention_mask"]) > 0
    for field, theirs in HEADS[architecture](ref).items():
        ours = getattr(out, field)
        rows = real if np.ndim(ours) == 3 else None  # per-token logits: real tokens
        assert_close(ours, theirs, TINY, f"{architecture} {field}", rows=rows)


def test_bfloat16_compute_stays_close(tmp_path):
    hf_model = make_hf_model(tmp_path, "BertModel", scale=0.1)
    import jax.numpy as jnp

    model = minibert.load(tmp_path, dtype=jnp.bfloat16)
    batch = random_batch(np.random.default_rng(6), 2, 8, 99)
    ours = np.asarray(model(batch).last_hidden_state, np.float32)
    theirs = hf_outputs(hf_model, batch).last_hidden_state.numpy()
    # bf16 keeps 8 significant bits (u = 2^-8). To first order each stored bf16 value adds one rounding
    # relative to the residual stream's scale: per stage 14 stored intermediates (q, k, v, scores, pattern,
    # z, attn_out, resid_mid, ln1, pre, post, mlp_out, resid_post, ln2) and 9 matmuls whose weights were
    # rounded to bf16; LayerNorm carries the error from stage to stage (tolerances.py).
    stages = model.config.num_hidden_layers + 1
    real = np.broadcast_to(np.asarray(batch["attention_mask"], bool)[..., None], ours.shape)
    assert_close(ours, theirs, stages * (14 + 9) * U_BF16, "bf16 last hidden state", rows=real)


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
        # Padding positions (a [PAD] query over the real keys) are read by no output and not compared.
        fields = {k: np.asarray(v) for k, v in ours.items()}
        out, ref = assert_parity(bundled, hf_model, fields)
        assert_close(out.pooler_output, ref.pooler_output, parity_rtol(bundled, fields), "pooler")


def test_bundled_sentence_embeddings_match_sentence_transformers_recipe(bundled, bundled_dir):
    """Mean pooling over real tokens then L2 normalisation, as modules.json of all-MiniLM-L6-v2 says."""
    import transformers

    assert bundled.pooling == {"mode": "mean", "normalize": True, "max_seq_length": 256}
    hf_model = transformers.BertModel.from_pretrained(bundled_dir).eval()
    batch = bundled.tokenize(SENTENCES)
    ref = hf_outputs(hf_model, batch.to_dict()).last_hidden_state.numpy()
    mask = batch.attention_mask[..., None]
    mean = (ref * mask).sum(1) / mask.sum(1)
    expected = mean / np.linalg.norm(mean, axis=-1, keepdims=True)
    # Mean pooling and normalising add a few roundings, far below the forward's own bound.
    assert_close(bundled.sentence_embeddings(batch), expected, parity_rtol(bundled, batch.to_dict()),
                 "sentence embeddings")
