"""Sentence vectors and their PCA map, for a group of similar sentences (seed 000).

    coords, ratio, _ = pca(sentence_vectors(model, texts))       # [N, 2]

(The attention paid to a chosen word, the group's other view, is words.attention_to_word.)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from minibert.errors import AnalysisError


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
