"""minibert/analysis/clustering.py: the Jensen–Shannon matrix between heads against loops over documents,
MDS against a known configuration and scikit-learn's stress."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import orthogonal_procrustes
from sklearn.manifold import MDS
from test_analysis_flow import random_attention

from minibert.analysis import clustering

# ---- Jensen–Shannon between heads -------------------------------------------------------------------

def reference_js(documents):
    """ANALYSIS.md by loops: p = 0.999·a + 0.001/n; Σ docs Σ rows ½Σ p ln(p/m) + ½Σ q ln(q/m)."""
    n_layers, n_heads = documents[0].shape[:2]
    heads_ = n_layers * n_heads
    js = np.zeros((heads_, heads_))
    for doc in documents:
        n = doc.shape[-1]
        p_all = 0.999 * doc.reshape(heads_, n, n) + 0.001 / n
        for i in range(heads_):
            for j in range(heads_):
                for row in range(n):
                    p, q = p_all[i, row], p_all[j, row]
                    m = (p + q) / 2
                    js[i, j] += 0.5 * np.sum(p * np.log(p / m)) + 0.5 * np.sum(q * np.log(q / m))
    return js


def test_js_divergence_matches_loops_over_documents_of_different_lengths():
    rng = np.random.default_rng(4)
    documents = [random_attention(rng, 2, 3, n) for n in (5, 3, 7)]
    js = clustering.js_divergence(documents, batch_size=2)
    expected = reference_js(documents)
    assert js.shape == (6, 6)
    np.testing.assert_allclose(js, expected, rtol=2e-5, atol=1e-6)
    single = documents[2]  # the longest: same padded shape, no second compile
    np.testing.assert_allclose(clustering.js_divergence(single, batch_size=2), reference_js([single]),
                               rtol=2e-5, atol=1e-6)


def test_js_divergence_errors():
    with pytest.raises(ValueError, match="same L and H"):
        clustering.js_divergence([np.ones((2, 3, 4, 4)), np.ones((2, 2, 4, 4))])
    with pytest.raises(ValueError, match="empty"):
        clustering.js_divergence([])


# ---- metric MDS -------------------------------------------------------------------------------------

def independent_stress(coords, delta):
    n = len(delta)
    return sum((np.linalg.norm(coords[i] - coords[j]) - delta[i, j]) ** 2 for i in range(n) for j in range(i + 1, n))


def test_mds_recovers_a_planar_configuration():
    rng = np.random.default_rng(5)
    points = rng.normal(size=(12, 2)) * [3.0, 1.0]
    delta = np.linalg.norm(points[:, None] - points[None], axis=-1)
    coords, stress = clustering.mds(delta)
    assert stress < 1e-8 and independent_stress(coords, delta) == pytest.approx(stress, abs=1e-12)
    centred = points - points.mean(0)
    rotation, _ = orthogonal_procrustes(coords, centred)  # rotation or reflection only
    np.testing.assert_allclose(coords @ rotation, centred, atol=1e-4)


@pytest.mark.parametrize("power", [1.0, 1.5])
def test_mds_stress_as_good_as_scikit_learn(power):
    """On points in 5-D (not embeddable in 2-D) and a non-Euclidean power of their distances."""
    rng = np.random.default_rng(6)
    points = rng.normal(size=(20, 5))
    delta = np.linalg.norm(points[:, None] - points[None], axis=-1) ** power
    coords, stress = clustering.mds(delta)
    assert independent_stress(coords, delta) == pytest.approx(stress, rel=1e-9)
    reference = MDS(n_components=2, metric_mds=True, metric="precomputed", n_init=4, init="random",
                    random_state=0).fit(delta).embedding_
    assert stress <= independent_stress(reference, delta) * (1 + 1e-3)
    assert np.allclose(coords.mean(0), 0, atol=1e-9)


def test_mds_errors():
    with pytest.raises(ValueError, match="symmetric"):
        clustering.mds(np.array([[0, 1, 2], [3, 0, 1], [2, 1, 0.0]]))
    with pytest.raises(ValueError, match=r"square matrix \[N, N\]"):
        clustering.mds(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="non-negative"):
        clustering.mds(-np.ones((3, 3)))
