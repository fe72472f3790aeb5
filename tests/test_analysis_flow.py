"""Rollout, flow, Jensen–Shannon between heads and MDS, against brute-force loops, networkx and scikit-learn."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from scipy.linalg import orthogonal_procrustes
from sklearn.manifold import MDS

from minibert.analysis import clustering, flow


def random_attention(rng, n_layers, n_heads, length, concentration=0.5):
    """Row-stochastic maps [L, H, T, T], peaky enough that the residual and the heads matter."""
    return rng.dirichlet(np.full(length, concentration), size=(n_layers, n_heads, length))


def reference_mixing(a, residual):
    """Â per layer by explicit loops: (1 − r)·mean over heads + r·I, rows renormalised."""
    n_layers, n_heads, length, _ = a.shape
    mixing = np.zeros((n_layers, length, length))
    for layer in range(n_layers):
        for t in range(length):
            for s in range(length):
                mean = sum(a[layer, h, t, s] for h in range(n_heads)) / n_heads
                mixing[layer, t, s] = (1 - residual) * mean + residual * (t == s)
            mixing[layer, t] /= mixing[layer, t].sum()
    return mixing


# ---- rollout ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("residual", [0.5, 0.2])
def test_rollout_matches_brute_force_paths(residual):
    """rollout[l, t, s] = Σ over every path t = u_{l+1} → u_l → … → u_0 = s of the product of Â weights."""
    rng = np.random.default_rng(0)
    a = random_attention(rng, 3, 2, 4)
    mixing = reference_mixing(a, residual)
    rollout = flow.attention_rollout(a, residual)
    assert rollout.shape == (3, 4, 4)
    np.testing.assert_allclose(rollout[0], mixing[0], atol=1e-12)
    for t in range(4):
        for s in range(4):
            total = sum(mixing[2, t, u] * mixing[1, u, v] * mixing[0, v, s] for u in range(4) for v in range(4))
            assert rollout[2, t, s] == pytest.approx(total, abs=1e-12)
    np.testing.assert_allclose(rollout.sum(-1), 1.0, atol=1e-12)


def test_rollout_of_a_batch_equals_each_document_cropped():
    """[L, B, H, T, T] with padding gives each document's own rollout on its real tokens."""
    rng = np.random.default_rng(1)
    lengths = [5, 3]
    batch = np.zeros((2, 2, 3, 5, 5))
    for b, n in enumerate(lengths):
        batch[:, b, :, :n, :n] = random_attention(rng, 2, 3, n)
        batch[:, b, :, n:, :n] = 1.0 / n  # padding query rows still attend over the real keys
    rollout = flow.attention_rollout(batch)
    assert rollout.shape == (2, 2, 5, 5)
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(rollout[:, b, :n, :n], flow.attention_rollout(batch[:, b, :, :n, :n]), atol=1e-12)


# ---- flow ------------------------------------------------------------------------------------------

def networkx_flow(a, residual=0.5):
    """Abnar & Zuidema's construction with networkx: flow[l, t, s] = max flow (l+1, t) → (0, s)."""
    mixing = reference_mixing(a, residual)
    n_layers, length = mixing.shape[0], mixing.shape[1]
    graph = nx.DiGraph()
    for k in range(n_layers):
        for t in range(length):
            for s in range(length):
                graph.add_edge((k + 1, t), (k, s), capacity=mixing[k, t, s])
    return np.array([[[nx.maximum_flow_value(graph, (layer + 1, t), (0, s)) for s in range(length)]
                      for t in range(length)] for layer in range(n_layers)])


@pytest.mark.parametrize("seed, n_layers, length", [(0, 3, 4), (1, 4, 6)])
def test_flow_matches_networkx(seed, n_layers, length):
    rng = np.random.default_rng(seed)
    a = random_attention(rng, n_layers, 3, length)
    expected = networkx_flow(a)
    np.testing.assert_allclose(flow.attention_flow(a, normalize=False), expected, atol=1e-10)
    normalized = flow.attention_flow(a)
    np.testing.assert_allclose(normalized, expected / expected.sum(-1, keepdims=True), atol=1e-10)


def test_max_flow_on_a_graph_that_needs_a_reverse_edge():
    """The textbook case where the first greedy path must be undone: 0→1→2→3 plus 0→2, 1→3."""
    capacity = np.zeros((4, 4))
    capacity[0, 1] = capacity[0, 2] = capacity[1, 3] = capacity[2, 3] = 1.0
    capacity[1, 2] = 1.0
    assert flow.max_flow(capacity, 0, 3) == pytest.approx(2.0)
    graph = nx.from_numpy_array(capacity, create_using=nx.DiGraph, edge_attr="capacity")
    rng = np.random.default_rng(3)
    dense = rng.uniform(size=(9, 9)) * (rng.uniform(size=(9, 9)) < 0.4)
    np.fill_diagonal(dense, 0)
    graph = nx.from_numpy_array(dense, create_using=nx.DiGraph, edge_attr="capacity")
    for sink in range(1, 9):
        assert flow.max_flow(dense, 0, sink) == pytest.approx(nx.maximum_flow_value(graph, 0, sink), abs=1e-12)


def test_flow_and_rollout_errors_name_the_fix():
    with pytest.raises(ValueError, match=r"\[L, H, T, T\].*\[:, b, :, :n, :n\]"):
        flow.attention_flow(np.ones((2, 1, 3, 2, 2)))
    with pytest.raises(ValueError, match="residual must lie in"):
        flow.attention_rollout(np.ones((1, 1, 2, 2)) / 2, residual=1.5)
    with pytest.raises(ValueError, match="negative"):
        flow.attention_rollout(-np.ones((1, 1, 2, 2)))
    with pytest.raises(ValueError, match="two different nodes"):
        flow.max_flow(np.ones((3, 3)), 1, 1)


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
