"""minibert/analysis/words.py: word groups from the tokenizer's word ids, word labels, and word-level
attention against brute-force loops and by hand (NumPy and JAX)."""

from __future__ import annotations

import numpy as np
import pytest

from minibert.analysis import words

# ---- word groups and word-level attention -------------------------------------------------------------


def test_word_groups_of_a_padded_pair():
    # [CLS] em ##bed ding [SEP] the embed ##ding [SEP] [PAD]; sentence B's word ids restart at 0
    word_ids = [None, 0, 0, 1, None, 0, 1, 1, None, None]
    sequence_ids = [None, 0, 0, 0, None, 1, 1, 1, None, None]
    mask = [1] * 9 + [0]
    expected = [[0], [1, 2], [3], [4], [5], [6, 7], [8]]
    assert words.word_groups(word_ids, sequence_ids, mask) == expected
    assert words.word_groups(word_ids, attention_mask=mask) == expected  # [SEP] alone keeps A and B apart
    assert words.word_groups(word_ids[:9]) == expected
    # a word id repeated across the sequence boundary stays two words when sequence ids differ
    assert words.word_groups([0, 0, 0], [0, 0, 1]) == [[0, 1], [2]]


def test_word_groups_from_the_tokenizer(bundled):
    batch = bundled.tokenize(["Tokenization splits words.", "Hi"], ["Embeddings, again", "there"])
    groups = words.word_groups(batch.word_ids[0], batch.sequence_ids[0], batch.attention_mask[0])
    labels = words.word_labels(batch.tokens[0], groups)
    assert labels == ["[CLS]", "tokenization", "splits", "words", ".", "[SEP]", "embeddings", ",", "again", "[SEP]"]
    short = words.word_groups(batch.word_ids[1], batch.sequence_ids[1], batch.attention_mask[1])
    assert words.word_labels(batch.tokens[1], short) == ["[CLS]", "hi", "[SEP]", "there", "[SEP]"]


def test_word_labels():
    tokens = ["[CLS]", "em", "##bed", "##ding", "is", "[SEP]"]
    assert words.word_labels(tokens, [[0], [1, 2, 3], [4], [5]]) == ["[CLS]", "embedding", "is", "[SEP]"]


def reference_word_attention(A, groups, mode):
    """Loops: TO word b = Σ over b's token columns; FROM word a = mean (or first) over a's token rows."""
    W = len(groups)
    out = np.zeros(A.shape[:-2] + (W, W))
    for index in np.ndindex(*A.shape[:-2]):
        for a, rows in enumerate(groups):
            sources = rows if mode == "mean" else rows[:1]
            for b, columns in enumerate(groups):
                total = 0.0
                for t in sources:
                    for s in columns:
                        total += A[index + (t, s)]
                out[index + (a, b)] = total / len(sources)
    return out


@pytest.mark.parametrize("mode", ["mean", "first"])
def test_word_attention_matches_loops(mode):
    rng = np.random.default_rng(0)
    T, n = 12, 10  # two padding positions
    logits = rng.normal(size=(2, 3, T, T))
    logits[..., n:] = -np.inf
    A = np.exp(logits - logits.max(-1, keepdims=True))
    A /= A.sum(-1, keepdims=True)
    groups = [[0], [1, 2, 3], [4], [5, 6], [7], [8], [9]]
    got = words.word_attention(A, groups, mode)
    assert got.shape == (2, 3, 7, 7) and isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, reference_word_attention(A, groups, mode), rtol=1e-12)
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-12)


def test_word_attention_by_hand_and_in_jax():
    import jax.numpy as jnp

    A = np.array([[0.5, 0.25, 0.25],
                  [0.0, 0.5, 0.5],
                  [1.0, 0.0, 0.0]])
    groups = [[0], [1, 2]]
    np.testing.assert_allclose(words.word_attention(A, groups, "mean"), [[0.5, 0.5], [0.5, 0.5]])
    np.testing.assert_allclose(words.word_attention(A, groups, "first"), [[0.5, 0.5], [0.0, 1.0]])
    out = words.word_attention(jnp.asarray(A), groups)
    assert not isinstance(out, np.ndarray)
    np.testing.assert_allclose(np.asarray(out), [[0.5, 0.5], [0.5, 0.5]], rtol=1e-6)
    with pytest.raises(ValueError, match="mode"):
        words.word_attention(A, groups, "max")
