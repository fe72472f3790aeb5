"""Seed 000's views: attention paid to a word (analysis/words.py) and sentence vectors (analysis/embeddings.py)
against transformers' own attention maps and hidden states, PCA against scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from sklearn.decomposition import PCA

from minibert.analysis import embeddings, words

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


@pytest.mark.slow  # transformers runs the bundled model per text
def test_attention_to_word_matches_transformers_attentions(bundled, hf_bundled):
    """Σ over query rows of the word's columns, mean over heads, from transformers' own attention maps."""
    hf_model, hf_tokenizer = hf_bundled
    for texts, pairs, word, occurrence, expected_positions in WORD_GROUPS:
        got = words.attention_to_word(bundled, texts, word, pairs=pairs, occurrence=occurrence)
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
        words.attention_to_word(bundled, ["I made the mistake.", "You erred."], "mistake")
    with pytest.raises(ValueError, match="2 times"):
        words.attention_to_word(bundled, ["I made the mistake."], "mistake", occurrence=1)


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


