"""How heads differ from one another: Jensen–Shannon divergence between heads, embedded in 2-D by
metric multidimensional scaling (Clark et al. 2019, Fig. 6).

    js = js_divergence([pattern[:, b, :, :n, :n] for b, n in ...])   # [L·H, L·H], heads layer-major
    coords, stress = mds(js)                                          # [L·H, 2]
    coords.reshape(L, H, 2)                                           # back to (layer, head)

Over a large corpus, `minibert.analysis.corpus.survey(..., js_divergence=True)` accumulates the same matrix on
the device batch by batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from minibert.analysis import heads
from minibert.errors import AnalysisError

_js_divergence_batch = jax.jit(heads.js_divergence_batch)


def js_divergence(attention: Sequence, batch_size: int = 16) -> np.ndarray:
    """Jensen–Shannon divergence between every pair of heads, summed over documents: [L·H, L·H].

    attention: one document's map [L, H, n, n] (real tokens only) or a sequence of them, lengths free
    to differ. Per document, with p = 0.999·A + 0.001/n (one head) and q likewise (another), m = (p+q)/2:
    Σ over query rows of ½Σ_s p ln(p/m) + ½Σ_s q ln(q/m) (docs/definitions.md). Heads are flattened
    layer-major (index = layer·H + head, 0-indexed). Documents run `batch_size` at a time, padded to the
    longest one, so one program is compiled.
    """
    single = getattr(attention, "ndim", None) == 4
    documents = [np.asarray(attention)] if single else [np.asarray(a) for a in attention]
    if not documents:
        raise AnalysisError("attention is empty; pass at least one document's map [L, H, n, n].")
    shapes = {a.shape[:2] for a in documents}
    bad = [i for i, a in enumerate(documents) if a.ndim != 4 or a.shape[-1] != a.shape[-2]]
    if bad or len(shapes) != 1:
        raise AnalysisError(f"every document's attention must be [L, H, n, n] with the same L and H; document "
                         f"{(bad or [0])[0]} has shape {documents[(bad or [0])[0]].shape} (all: "
                         f"{sorted({a.shape for a in documents})[:4]}). Crop each to its real tokens.")
    n_layers, n_heads = shapes.pop()
    length = max(a.shape[-1] for a in documents)
    total = np.zeros((n_layers * n_heads,) * 2)
    for start in range(0, len(documents), batch_size):
        chunk = documents[start:start + batch_size]
        pattern = np.zeros((n_layers, batch_size, n_heads, length, length), np.float32)
        mask = np.zeros((batch_size, length), np.float32)
        for b, a in enumerate(chunk):
            n = a.shape[-1]
            pattern[:, b, :, :n, :n] = a
            mask[b, :n] = 1
        doc_mask = (np.arange(batch_size) < len(chunk)).astype(np.float32)
        total += np.asarray(_js_divergence_batch(pattern, mask, doc_mask), np.float64)
    return total


def _check_dissimilarity(dissimilarity, n_components: int) -> np.ndarray:
    delta = np.asarray(dissimilarity, np.float64)
    if delta.ndim != 2 or delta.shape[0] != delta.shape[1] or delta.shape[0] <= n_components:
        raise AnalysisError(f"dissimilarity must be a square matrix [N, N] with N > n_components={n_components}; "
                         f"got shape {delta.shape}.")
    if not np.isfinite(delta).all() or (delta < 0).any():
        raise AnalysisError("dissimilarity must hold finite non-negative numbers (distances or divergences).")
    if np.abs(delta - delta.T).max() > 1e-6 * max(np.abs(delta).max(), 1e-300):
        raise AnalysisError("dissimilarity must be symmetric; pass (d + d.T) / 2 for a one-sided measure.")
    delta = 0.5 * (delta + delta.T)
    np.fill_diagonal(delta, 0.0)
    return delta


def _distances(x: np.ndarray) -> np.ndarray:
    """Euclidean distances [..., N, N] between the rows of x [..., N, C]."""
    squared = (x**2).sum(-1)
    gram = x @ np.swapaxes(x, -1, -2)
    return np.sqrt(np.maximum(squared[..., :, None] + squared[..., None, :] - 2.0 * gram, 0.0))


def _raw_stress(distances: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """Σ_{i<j} (d_ij − δ_ij)² over the last two axes; both are symmetric with zero diagonals."""
    return 0.5 * ((distances - delta) ** 2).sum((-2, -1))


def stress(coords, dissimilarity) -> float:
    """Raw stress Σ_{i<j} (‖x_i − x_j‖ − δ_ij)², the quantity metric MDS minimises. coords [N, C]."""
    return float(_raw_stress(_distances(np.asarray(coords, np.float64)), _check_dissimilarity(dissimilarity, 0)))


def _classical(delta: np.ndarray, n_components: int) -> np.ndarray:
    """Torgerson's classical scaling: the top eigenvectors of −½ J δ² J, scaled by √eigenvalue."""
    n = len(delta)
    centre = np.eye(n) - 1.0 / n
    values, vectors = np.linalg.eigh(-0.5 * centre @ (delta**2) @ centre)
    top = np.argsort(values)[::-1][:n_components]
    return vectors[:, top] * np.sqrt(np.maximum(values[top], 0.0))


def _smacof(delta: np.ndarray, x: np.ndarray, max_iter: int, tolerance: float) -> tuple[np.ndarray, np.ndarray]:
    """SMACOF (de Leeuw) from several starts at once, x [R, N, C] → (x [R, N, C], stress [R]).

    Repeats the Guttman transform x ← B(x)·x / N, B_ij = −δ_ij / d_ij (i ≠ j), B_ii = −Σ_{j≠i} B_ij,
    which never increases the stress, until no start's stress falls by more than `tolerance`
    (relative) in one step, or for max_iter steps.
    """
    n = delta.shape[0]
    d = _distances(x)
    current = _raw_stress(d, delta)
    for _ in range(max_iter):
        ratio = np.divide(delta, d, out=np.zeros_like(d), where=d > 0)
        b = ratio.sum(-1)[..., None] * np.eye(n) - ratio
        x = b @ x / n
        d = _distances(x)
        previous, current = current, _raw_stress(d, delta)
        if np.all(previous - current <= tolerance * current):
            break
    return x, current


def mds(dissimilarity, n_components: int = 2, seed: int = 0, n_init: int = 32, max_iter: int = 300,
        tolerance: float = 1e-6) -> tuple[np.ndarray, float]:
    """Metric MDS on a precomputed dissimilarity [N, N] → (coords [N, n_components], raw stress).

    Minimises the raw stress Σ_{i<j} (‖x_i − x_j‖ − δ_ij)² by SMACOF, from classical scaling and from
    n_init − 1 random starts (uniform in [0, 1), numpy seed `seed`), run together; the lowest stress
    wins. The stress has local minima, so more starts help. Coordinates are centred; like any MDS
    solution they are defined up to rotation and reflection.
    """
    delta = _check_dissimilarity(dissimilarity, n_components)
    if n_init < 1 or max_iter < 1:
        raise AnalysisError(f"n_init and max_iter must be at least 1; got n_init={n_init}, max_iter={max_iter}.")
    rng = np.random.default_rng(seed)
    starts = np.concatenate([_classical(delta, n_components)[None],
                             rng.uniform(size=(n_init - 1, len(delta), n_components))])
    coords, stresses = _smacof(delta, starts, max_iter, tolerance)
    best = int(np.argmin(stresses))
    return coords[best] - coords[best].mean(0), float(stresses[best])
