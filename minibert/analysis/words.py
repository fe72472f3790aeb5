"""Word-level attention: token-to-token maps turned into word-to-word maps (docs/definitions.md).

A word split into wordpieces has several rows and columns in the token map. Attention TO a word is
the sum over its tokens' columns (the mass the word receives); attention FROM a word is the mean over
its tokens' rows (Clark et al.'s paper) or its first token's row (their released code). Either way
each row of the word map still sums to 1. [CLS] and every [SEP] stay words of their own.

    curves = attention_to_word(model, ["I made the mistake.", "This was my mistake."], "mistake")  # [N, L]
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from minibert.core.site_names import PATTERN
from minibert.core.sites import PATTERNS
from minibert.errors import AnalysisError
from minibert.runtime.accounting import EXACT

MODES = ("mean", "first")


def word_groups(word_ids: Sequence[int | None], sequence_ids: Sequence[int | None] | None = None,
                attention_mask: Sequence[int] | None = None) -> list[list[int]]:
    """Token positions of each word of one document, in order: [[0], [1, 2], [3], ...].

    word_ids: the tokenizer's word index per token (None for [CLS], [SEP] and padding), as
    `batch.word_ids[b]`. A word is a run of consecutive tokens with the same word id (and the same
    sequence id, when sequence_ids is given); tokens with word id None are one-token words, so
    sentence B's words never merge with sentence A's even where its word ids restart at 0.
    attention_mask: 1 for real tokens; positions marked 0 (padding) are left out. Without it every
    position counts, so pass it when word_ids are padded.
    """
    n = len(word_ids)
    real = [True] * n if attention_mask is None else [bool(m) for m in attention_mask]
    if len(real) != n or (sequence_ids is not None and len(sequence_ids) != n):
        raise AnalysisError(f"word_ids has {n} positions but sequence_ids/attention_mask have "
                         f"{len(sequence_ids or ())}/{len(real)}; pass one document's lists.")
    groups: list[list[int]] = []
    previous = None
    for position, word in enumerate(word_ids):
        if not real[position]:
            previous = None
            continue
        key = None if word is None else (word, None if sequence_ids is None else sequence_ids[position])
        if key is not None and key == previous:
            groups[-1].append(position)
        else:
            groups.append([position])
        previous = key
    return groups


def _pooling_matrices(groups: Sequence[Sequence[int]], length: int, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """(rows [W, T]: how each word's row is made from token rows, columns [S, W]: 1 where token s is in word w)."""
    if mode not in MODES:
        raise AnalysisError(f"mode must be one of {MODES} ('mean': the paper, 'first': Clark et al.'s code), "
                         f"not {mode!r}.")
    rows = np.zeros((len(groups), length))
    columns = np.zeros((length, len(groups)))
    for w, group in enumerate(groups):
        if not group or max(group) >= length:
            raise AnalysisError(f"word {w} has token positions {list(group)}, outside the map's {length} positions.")
        columns[group, w] = 1.0
        if mode == "mean":
            rows[w, group] = 1.0 / len(group)
        else:
            rows[w, group[0]] = 1.0
    return rows, columns


def word_attention(attention, groups: Sequence[Sequence[int]], mode: str = "mean"):
    """Word-to-word attention [..., W, W] from token attention [..., T, S] (e.g. [L, H, T, S]).

    groups: token positions per word (word_groups). TO a word: sum over its tokens' columns. FROM a
    word: "mean" of its tokens' rows (the paper) or the "first" token's row (Clark et al.'s code).
    NumPy in, NumPy out; a JAX array in gives a JAX array (differentiable).
    """
    if not isinstance(attention, jax.Array):
        attention = np.asarray(attention)
    shape = attention.shape
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise AnalysisError(f"attention must be [..., T, T] (queries × keys of one document); got shape {shape}.")
    rows, columns = _pooling_matrices(groups, shape[-1], mode)
    dtype = attention.dtype if np.issubdtype(attention.dtype, np.floating) else np.float32
    rows, columns = rows.astype(dtype), columns.astype(dtype)
    if isinstance(attention, jax.Array):
        return jnp.einsum("WT,...TS,SV->...WV", rows, attention, columns, precision=EXACT)
    return np.einsum("WT,...TS,SV->...WV", rows, attention, columns)


def word_labels(tokens: Sequence[str], groups: Sequence[Sequence[int]]) -> list[str]:
    """Each word's text: its wordpieces joined, "##" stripped ("em", "##bed", "##ding" → "embedding")."""
    return ["".join(tokens[t].removeprefix("##") for t in group) for group in groups]


# ---- attention paid to one word (seed 000) -------------------------------------------------------------------

def target_words(model, word: str) -> list[str]:
    """The lower-cased words the tokenizer makes of `word`: "e-recorded" → ["e", "-", "recorded"]."""
    batch = model.tokenize([word])
    sequence = batch.sequence_ids[0]
    groups = [g for g in word_groups(batch.word_ids[0], sequence) if sequence[g[0]] == 0]  # no [CLS], [SEP]
    return [w.lower() for w in word_labels(batch.tokens[0], groups)]


def word_positions(tokens: Sequence[str], groups: Sequence[Sequence[int]], word: list[str],
                   occurrence: int = 0) -> list[int] | None:
    """Token positions of the `occurrence`-th run of whole words whose texts equal `word` (lower-cased
    words, as target_words gives), or None. groups: word_groups of the document."""
    texts = [w.lower() for w in word_labels(tokens, groups)]
    starts = [i for i in range(len(groups) - len(word) + 1) if texts[i:i + len(word)] == word]
    if occurrence >= len(starts):
        return None
    first = starts[occurrence]
    return [position for group in groups[first:first + len(word)] for position in group]


def attention_to_word(model, texts: Sequence[str], word: str, pairs: Sequence[str] | None = None,
                      occurrence: int = 0) -> np.ndarray:
    """Attention paid to `word` in each text, per layer: [N, L] (docs/definitions.md, seed 000).

    value[n, l] = mean over heads of Σ over real query rows t of Σ over the word's tokens s of A[l, h, t, s]
    — the attention the word receives, in "tokens' worth" (1.0 = one row's whole attention). The word
    is found case-insensitively as whole words of the text (all its wordpieces count; "e-recorded"
    matches the three words e, -, recorded), its `occurrence`-th appearance (0: the first), in the text
    or its pair. [CLS] and [SEP] can be chosen by name. Layers are 0-indexed.
    """
    texts = [texts] if isinstance(texts, str) else list(texts)
    target = target_words(model, word)
    if not target:
        raise AnalysisError(f"word {word!r} has no tokens; pass a word that appears in the texts.")
    batch = model.tokenize(texts, pairs)
    columns = np.zeros(batch.attention_mask.shape, np.float32)
    for row in range(len(texts)):
        groups = word_groups(batch.word_ids[row], batch.sequence_ids[row], batch.attention_mask[row])
        positions = word_positions(batch.tokens[row], groups, target, occurrence)
        if positions is None:
            where = f"{texts[row]!r}" + (f" / {pairs[row]!r}" if pairs is not None else "")
            raise AnalysisError(f"text {row} ({where}) does not contain the word {word!r} "
                             f"{'at all' if occurrence == 0 else f'{occurrence + 1} times'}; its words are "
                             f"{word_labels(batch.tokens[row], groups)}. Fix the text or choose another word.")
        columns[row, positions] = 1.0
    _, cache = model.run_with_cache(batch, names=PATTERNS)
    pattern = np.asarray(cache.stack(PATTERN), np.float64)  # [L, B, H, T, S]
    rows = batch.attention_mask.astype(np.float64)
    return np.einsum("LBHTS,BT,BS->BL", pattern, rows, columns) / pattern.shape[2]
