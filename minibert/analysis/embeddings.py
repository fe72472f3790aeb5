"""The views of a group of similar sentences (seed 000): attention paid to a chosen word, layer by
layer, and a PCA map of the sentence vectors.

    curves = attention_to_word(model, ["I made the mistake.", "This was my mistake."], "mistake")  # [N, L]
    coords, ratio, _ = pca(sentence_vectors(model, texts))                                         # [N, 2]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from minibert.analysis import words
from minibert.errors import AnalysisError


def _target_words(model, word: str) -> list[str]:
    """The lower-cased words the tokenizer makes of `word`: "e-recorded" → ["e", "-", "recorded"]."""
    batch = model.tokenize([word])
    sequence = batch.sequence_ids[0]
    groups = [g for g in words.word_groups(batch.word_ids[0], sequence) if sequence[g[0]] == 0]  # no [CLS], [SEP]
    return [w.lower() for w in words.word_labels(batch.tokens[0], groups)]


def word_positions(tokens: Sequence[str], groups: Sequence[Sequence[int]], word: list[str],
                   occurrence: int = 0) -> list[int] | None:
    """Token positions of the `occurrence`-th run of whole words whose texts equal `word` (lower-cased
    words, as _target_words gives), or None. groups: words.word_groups of the document."""
    texts = [w.lower() for w in words.word_labels(tokens, groups)]
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
    target = _target_words(model, word)
    if not target:
        raise AnalysisError(f"word {word!r} has no tokens; pass a word that appears in the texts.")
    batch = model.tokenize(texts, pairs)
    columns = np.zeros(batch.attention_mask.shape, np.float32)
    for row in range(len(texts)):
        groups = words.word_groups(batch.word_ids[row], batch.sequence_ids[row], batch.attention_mask[row])
        positions = word_positions(batch.tokens[row], groups, target, occurrence)
        if positions is None:
            where = f"{texts[row]!r}" + (f" / {pairs[row]!r}" if pairs is not None else "")
            raise AnalysisError(f"text {row} ({where}) does not contain the word {word!r} "
                             f"{'at all' if occurrence == 0 else f'{occurrence + 1} times'}; its words are "
                             f"{words.word_labels(batch.tokens[row], groups)}. Fix the text or choose another word.")
        columns[row, positions] = 1.0
    _, cache = model.run_with_cache(batch, names="blocks.*.attn.hook_pattern")
    pattern = np.asarray(cache.stack("attn.hook_pattern"), np.float64)  # [L, B, H, T, S]
    rows = batch.attention_mask.astype(np.float64)
    return np.einsum("LBHTS,BT,BS->BL", pattern, rows, columns) / pattern.shape[2]


def sentence_vectors(model, texts: Sequence[str], pooling: str = "mean", pairs: Sequence[str] | None = None,
                     normalize: bool = False) -> np.ndarray:
    """Sentence vectors [N, D] from the last hidden state: "mean" over real tokens, the "cls" token's, or
    "max" over real tokens; L2-normalised if `normalize` (NumPy float32)."""
    return np.asarray(model.sentence_embeddings(model.tokenize(texts, pairs), mode=pooling, normalize=normalize))


def pca(x, n_components: int = 2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Principal components of the rows of x [N, D] → (coords [N, k], explained_variance_ratio [k],
    components [k, D]), k = n_components, by SVD of the centred data.

    Each component's sign is fixed so that its largest-magnitude loading is positive (deterministic
    across runs; scikit-learn's PCA may differ by a sign per component).
    """
    x = np.asarray(x, np.float64)
    if x.ndim != 2 or len(x) < 2:
        raise AnalysisError(f"x must be [N, D] with at least 2 rows; got shape {x.shape}.")
    if not 1 <= n_components <= min(x.shape):
        raise AnalysisError(f"n_components must lie in [1, {min(x.shape)}] for x of shape {x.shape}; "
                            f"got {n_components}.")
    centred = x - x.mean(0)
    _, singular, vt = np.linalg.svd(centred, full_matrices=False)
    components = vt[:n_components]
    largest = np.abs(components).argmax(1)
    components = components * np.sign(components[np.arange(n_components), largest])[:, None]
    variance = singular**2
    ratio = variance[:n_components] / variance.sum() if variance.sum() > 0 else np.zeros(n_components)
    return centred @ components.T, ratio, components
