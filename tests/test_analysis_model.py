"""Analyses that run the model: attention norms (Kobayashi et al.), gradients with respect to attention
and the masked-LM loss, attention paid to a word, sentence vectors and PCA — each against an independent
reference: NumPy loops from the checkpoint's tensors, finite differences, transformers, scikit-learn."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file
from sklearn.decomposition import PCA

import minibert
from conftest import make_hf_model, random_batch
from minibert.analysis import embeddings, gradients, norms
from minibert.hooks import HookFn

TEXTS = ["I made the mistake.", "Sorry, this will get e-recorded instead."]


# ---- attention norms ---------------------------------------------------------------------------------

def reference_norms(tensors, resid_pre, pattern, n_heads):
    """f_h(x_s) = (x_s W_V + b_V)[head h] · W_O[head h rows], from the Hugging Face tensors, by loops."""
    n_layers, batch, length, _ = resid_pre.shape
    f_norm = np.zeros((n_layers, batch, n_heads, length))
    weighted = np.zeros((n_layers, batch, n_heads, length, length))
    summed = np.zeros((n_layers, batch, length, length))
    attn_out = np.zeros(resid_pre.shape)
    for layer in range(n_layers):
        p = f"encoder.layer.{layer}.attention."
        w_v, b_v = tensors[p + "self.value.weight"], tensors[p + "self.value.bias"]  # [D_out, D_in]
        w_o, b_o = tensors[p + "output.dense.weight"], tensors[p + "output.dense.bias"]
        k = w_v.shape[0] // n_heads
        for b in range(batch):
            f = np.zeros((length, n_heads, w_o.shape[0]))
            for s in range(length):
                v = w_v @ resid_pre[layer, b, s] + b_v
                for h in range(n_heads):
                    f[s, h] = w_o[:, h * k:(h + 1) * k] @ v[h * k:(h + 1) * k]
                    f_norm[layer, b, h, s] = np.linalg.norm(f[s, h])
            for t in range(length):
                for s in range(length):
                    vectors = [pattern[layer, b, h, t, s] * f[s, h] for h in range(n_heads)]
                    weighted[layer, b, :, t, s] = [np.linalg.norm(x) for x in vectors]
                    summed[layer, b, t, s] = np.linalg.norm(np.sum(vectors, axis=0))
                attn_out[layer, b, t] = sum(pattern[layer, b, h, t, s] * f[s, h]
                                            for h in range(n_heads) for s in range(length)) + b_o
    return f_norm, weighted, summed, attn_out


def test_attention_norms_match_loops_over_checkpoint_tensors(bundled, bundled_dir):
    batch = bundled.tokenize(TEXTS)  # the first text is padded
    result = norms.attention_norms(bundled, batch)
    _, cache = bundled.run_with_cache(batch)  # every hook: the same program as test_hooks.py's
    resid_pre = np.asarray(cache.stack("hook_resid_pre"), np.float64)
    pattern = np.asarray(cache.stack("attn.hook_pattern"), np.float64)
    tensors = {k: v.astype(np.float64) for k, v in load_file(bundled_dir / "model.safetensors").items()}
    f_norm, weighted, summed, attn_out = reference_norms(tensors, resid_pre, pattern, 12)
    real = batch.attention_mask.astype(bool)
    np.testing.assert_allclose(result["f_norm"], f_norm, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(result["weighted_norm"], weighted, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(result["summed_norm"], summed, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(result["pattern"], pattern, atol=1e-5)  # two compiled programs: rounding differs
    # Σ_s Σ_h α f(x) + b_O is the attention output: f carries b_V, and b_O belongs to no head
    ours = np.asarray(cache.stack("hook_attn_out"))
    np.testing.assert_allclose(ours[:, real], attn_out[:, real], atol=2e-4)
    assert result["summed_norm"].shape == (6, 2, batch.input_ids.shape[1], batch.input_ids.shape[1])
    # the summed norm never exceeds the sum of the heads' norms (triangle inequality), and is often far below
    assert (result["summed_norm"] <= result["weighted_norm"].sum(2) + 1e-4).all()


# ---- gradients with respect to attention, on a tiny random BertForMaskedLM ----------------------------

@pytest.fixture(scope="module")
def tiny_mlm(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-mlm")
    hf_model = make_hf_model(directory, "BertForMaskedLM", scale=0.2)
    return minibert.load(directory), hf_model


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
    with pytest.raises(minibert.InputError, match="BertModel.*masked-LM head|masked-LM head.*BertModel"):
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


# ---- attention to a word, sentence vectors, PCA (seed 000) ---------------------------------------------

@pytest.fixture(scope="module")
def hf_bundled(bundled_dir):
    model = transformers.BertModel.from_pretrained(bundled_dir, attn_implementation="eager").eval()
    return model, transformers.BertTokenizerFast.from_pretrained(bundled_dir)


# One call per group (texts, pairs, word, occurrence); per text, the word's positions in its own unpadded
# encoding and the tokens found there. The first group is padded; the word's case differs from the text's.
WORD_GROUPS = [
    (["I made the mistake.", "This was a very big mistake, sadly."], None, "MISTAKE", 0,
     [([4], ["mistake"]), ([6], ["mistake"])]),
    (["This e-recorded copy is the e-recorded one."], None, "E-Recorded", 1,
     [([8, 9, 10], ["e", "-", "recorded"])]),
    (["It's fine."], ["Sorry about the embeddings."], "embeddings", 0,
     [([10, 11, 12, 13], ["em", "##bed", "##ding", "##s"])]),
]


def test_attention_to_word_matches_transformers_attentions(bundled, hf_bundled):
    """Σ over query rows of the word's columns, mean over heads, from transformers' own attention maps."""
    hf_model, hf_tokenizer = hf_bundled
    for texts, pairs, word, occurrence, expected_positions in WORD_GROUPS:
        got = embeddings.attention_to_word(bundled, texts, word, pairs=pairs, occurrence=occurrence)
        assert got.shape == (len(texts), 6)
        for row, (positions, tokens) in enumerate(expected_positions):
            encoded = hf_tokenizer(texts[row], None if pairs is None else pairs[row], return_tensors="pt")
            assert hf_tokenizer.convert_ids_to_tokens(encoded["input_ids"][0][positions]) == tokens
            with torch.no_grad():
                attentions = hf_model(**encoded, output_attentions=True).attentions  # L × [1, H, T, S]
            expected = [a[0][:, :, positions].sum((1, 2)).mean().item() for a in attentions]
            np.testing.assert_allclose(got[row], expected, atol=2e-5, err_msg=f"{texts[row]!r} / {word!r}")


def test_attention_to_word_error_names_the_text(bundled):
    with pytest.raises(ValueError, match=r"text 1 \('You erred\.'\) does not contain the word 'mistake'"):
        embeddings.attention_to_word(bundled, ["I made the mistake.", "You erred."], "mistake")
    with pytest.raises(ValueError, match="2 times"):
        embeddings.attention_to_word(bundled, ["I made the mistake."], "mistake", occurrence=1)


def test_sentence_vectors_match_transformers_pooling(bundled, hf_bundled):
    hf_model, hf_tokenizer = hf_bundled
    texts = ["It's acceptable.", "It's correct.", "Sorry I will over night it tomorrow morning."]
    encoded = hf_tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = hf_model(**encoded).last_hidden_state.numpy()
    mask = encoded["attention_mask"].numpy()[..., None]
    np.testing.assert_allclose(embeddings.sentence_vectors(bundled, texts, "cls"), hidden[:, 0], atol=1e-4)
    np.testing.assert_allclose(embeddings.sentence_vectors(bundled, texts), (hidden * mask).sum(1) / mask.sum(1),
                               atol=1e-4)
    with pytest.raises(ValueError, match="pooling mode .* is not one of"):
        embeddings.sentence_vectors(bundled, texts, "first")


def test_pca_matches_scikit_learn_up_to_sign():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(15, 6)) @ rng.normal(size=(6, 6)) + 3.0
    coords, ratio, components = embeddings.pca(x, n_components=3)
    reference = PCA(n_components=3).fit(x)
    signs = np.sign((components * reference.components_).sum(1))
    assert np.all(np.abs(signs) == 1)
    np.testing.assert_allclose(components, reference.components_ * signs[:, None], atol=1e-10)
    np.testing.assert_allclose(coords, reference.transform(x) * signs, atol=1e-10)
    np.testing.assert_allclose(ratio, reference.explained_variance_ratio_, atol=1e-12)
    with pytest.raises(ValueError, match="n_components must lie in"):
        embeddings.pca(x, n_components=7)
