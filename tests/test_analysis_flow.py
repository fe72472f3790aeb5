"""minibert/analysis/flow.py: attention rollout and flow against brute-force path sums and networkx."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from tolerances import U64

from minibert.analysis import flow


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
    # float64 sums of non-negative terms ≤ 1: each of the 3 products sums 4 terms, plus ~4 roundings to form
    # Â (mean, mix, renormalise), so (3·4 + 4)·u64 bounds every entry (tolerances.sum_rtol).
    atol = (3 * 4 + 4) * U64
    np.testing.assert_allclose(rollout[0], mixing[0], atol=atol)
    for t in range(4):
        for s in range(4):
            total = sum(mixing[2, t, u] * mixing[1, u, v] * mixing[0, v, s] for u in range(4) for v in range(4))
            assert rollout[2, t, s] == pytest.approx(total, abs=2 * atol)
    np.testing.assert_allclose(rollout.sum(-1), 1.0, atol=atol + 4 * U64)


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
        # Padding keys hold exact zeros, so the padded sums differ only in order: (2·5 + 4)·u64 (as above).
        np.testing.assert_allclose(rollout[:, b, :n, :n], flow.attention_rollout(batch[:, b, :, :n, :n]),
                                   atol=2 * (2 * 5 + 4) * U64)


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
    # Max-flow values are sums and differences of capacities ≤ 1 along augmenting paths: at most one
    # rounding per edge of the layered graph per augmentation, and at most one augmentation per edge.
    edges = n_layers * length * length
    atol = 2 * edges * edges * U64 * float(expected.max())
    np.testing.assert_allclose(flow.attention_flow(a, normalize=False), expected, atol=atol)
    normalized = flow.attention_flow(a)
    np.testing.assert_allclose(normalized, expected / expected.sum(-1, keepdims=True), atol=2 * length * atol)


def test_max_flow_on_a_graph_that_needs_a_reverse_edge():
    """The textbook case where the first greedy path must be undone: 0→1→2→3 plus 0→2, 1→3."""
    capacity = np.zeros((4, 4))
    capacity[0, 1] = capacity[0, 2] = capacity[1, 3] = capacity[2, 3] = 1.0
    capacity[1, 2] = 1.0
    assert flow.max_flow(capacity, 0, 3) == 2.0  # sums of 1.0: exact in float64
    graph = nx.from_numpy_array(capacity, create_using=nx.DiGraph, edge_attr="capacity")
    rng = np.random.default_rng(3)
    dense = rng.uniform(size=(9, 9)) * (rng.uniform(size=(9, 9)) < 0.4)
    np.fill_diagonal(dense, 0)
    graph = nx.from_numpy_array(dense, create_using=nx.DiGraph, edge_attr="capacity")
    for sink in range(1, 9):
        # As above: ≤ one rounding per edge per augmentation, ≤ 81 edges (capacities < 1).
        assert flow.max_flow(dense, 0, sink) == pytest.approx(nx.maximum_flow_value(graph, 0, sink),
                                                              abs=2 * 81 * 81 * U64)


def test_flow_and_rollout_errors_name_the_fix():
    with pytest.raises(ValueError, match=r"\[L, H, T, T\].*\[:, b, :, :n, :n\]"):
        flow.attention_flow(np.ones((2, 1, 3, 2, 2)))
    with pytest.raises(ValueError, match="residual must lie in"):
        flow.attention_rollout(np.ones((1, 1, 2, 2)) / 2, residual=1.5)
    with pytest.raises(ValueError, match="negative"):
        flow.attention_rollout(-np.ones((1, 1, 2, 2)))
    with pytest.raises(ValueError, match="two different nodes"):
        flow.max_flow(np.ones((3, 3)), 1, 1)
