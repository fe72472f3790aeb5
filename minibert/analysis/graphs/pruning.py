"""Pruning a graph by influence, and its replacement and completeness scores — circuit-tracer's definitions
(its graph.py: prune_graph, compute_graph_scores), restated in NumPy on our AttributionGraph (docs/graphs.md).

    Â         = |A| with each row divided by its sum (rows: targets of edges)
    influence = w Â + w Â² + …  = w ((I − Â)⁻¹ − I)    w: the target weights on the target rows, 0 elsewhere
                (Â is nilpotent — features only feed later layers — so the series ends)
    nodes kept: the fewest, by influence, whose influence covers node_threshold of the total; tokens and targets
                always. Edges: on Â restricted to the kept nodes, score(n ← s) = Â[n, s] (influence_n + w_n); kept:
                those covering edge_threshold of the total score. Then features and errors without a kept outgoing
                edge, and features without a kept incoming one, go, until nothing changes.
    replacement score  = token influence / (token influence + error influence)
    completeness score = Σ_n (1 − Σ_{s error} Â[n, s]) (influence_n + w_n) / Σ_n (influence_n + w_n)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from minibert.errors import AnalysisError


def normalized(adjacency: np.ndarray) -> np.ndarray:
    magnitude = np.abs(adjacency).astype(np.float64)
    return magnitude / np.maximum(magnitude.sum(1, keepdims=True), 1e-10)


def influence(matrix: np.ndarray, weights: np.ndarray, max_steps: int = 1000) -> np.ndarray:
    """w Â + w Â² + … until a term is all zeros (Â nilpotent)."""
    term = weights @ matrix
    total = term.copy()
    for _ in range(max_steps):
        if not term.any():
            return total
        term = term @ matrix
        total += term
    raise AnalysisError("the graph's influence did not converge: its adjacency has a cycle, which an attribution "
                        "graph cannot have; build it with graphs.attribute.")


def _threshold(scores: np.ndarray, fraction: float) -> float:
    """The score at which the largest scores first cover `fraction` of their sum (circuit-tracer's find_threshold)."""
    ranked = np.sort(scores)[::-1]
    covered = np.cumsum(ranked) / ranked.sum()
    return float(ranked[min(int(np.searchsorted(covered, fraction)), len(ranked) - 1)])


def _target_weights(graph) -> np.ndarray:
    weights = np.zeros(graph.adjacency.shape[0])
    weights[-graph.n_targets:] = graph.target_weights
    return weights


@dataclasses.dataclass
class PrunedGraph:
    """Which nodes [n] and edges [n, n] (rows: targets) survive, and each node's cumulative influence score (the
    fraction of total influence covered by the nodes at least as influential: circuit-tracer's node ranking)."""

    graph: object
    node_mask: np.ndarray
    edge_mask: np.ndarray
    cumulative_scores: np.ndarray

    @property
    def n_nodes(self) -> int:
        return int(self.node_mask.sum())

    @property
    def n_edges(self) -> int:
        return int(self.edge_mask.sum())

    def edges(self) -> list[tuple[str, str, float]]:
        """The kept edges (source label, target label, weight), largest |weight| first."""
        g = self.graph
        rows, cols = np.nonzero(self.edge_mask)
        ranked = sorted(zip(rows, cols), key=lambda rc: -abs(g.adjacency[rc]))
        return [(g.node_label(c), g.node_label(r), float(g.adjacency[r, c])) for r, c in ranked]


def _fraction(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating) or not 0.0 <= value <= 1.0:
        raise AnalysisError(f"{name} must be a fraction in [0, 1] of the target's influence; got {value!r}.")
    return float(value)


def prune(graph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> PrunedGraph:
    """circuit-tracer's prune_graph on our graph (module docstring); an empty graph (no edge kept into a target)
    is refused with the fix."""
    node_threshold, edge_threshold = _fraction("node_threshold", node_threshold), \
        _fraction("edge_threshold", edge_threshold)
    A, weights = graph.adjacency, _target_weights(graph)
    n_features, fixed = graph.n_features, graph.n_pos + graph.n_targets
    node_influence = influence(normalized(A), weights)
    if not node_influence.any():
        raise AnalysisError("the graph is empty: no node has any influence on the weighted targets (their edges are "
                            "all 0, or their weights are). Check that the target depends on the input, e.g. a "
                            "direction that is not 0, and give it a weight > 0.")
    node_mask = node_influence >= _threshold(node_influence, node_threshold)
    node_mask[-fixed:] = True
    kept = np.where(node_mask[:, None] & node_mask[None, :], A, 0.0)
    pruned = normalized(kept)
    edge_scores = pruned * (influence(pruned, weights) + weights)[:, None]
    edge_mask = edge_scores >= _threshold(edge_scores.ravel(), edge_threshold) if edge_scores.any() \
        else np.zeros_like(edge_scores, bool)
    def drop_unconnected():
        node_mask[:-fixed] &= edge_mask[:, :-fixed].any(0)  # features and errors feed something kept
        node_mask[:n_features] &= edge_mask[:n_features].any(1)  # features are fed by something kept

    before = node_mask.copy()
    drop_unconnected()
    while not (node_mask == before).all():  # each pass may leave new nodes unconnected: at most L + 1 passes
        before[:] = node_mask
        edge_mask &= node_mask[:, None] & node_mask[None, :]
        drop_unconnected()
    if not edge_mask[-graph.n_targets:].any():
        raise AnalysisError(f"pruning at node_threshold={node_threshold}, edge_threshold={edge_threshold} left no "
                            f"edge into the target: the graph is empty. Raise the thresholds (towards 1.0 keeps "
                            f"more), or check that the target depends on the input (its edges are all 0).")
    order = np.argsort(-node_influence, kind="stable")
    cumulative = np.empty_like(node_influence)
    total = node_influence.sum()
    cumulative[order] = np.cumsum(node_influence[order]) / (total if total > 0 else 1.0)
    return PrunedGraph(graph, node_mask, edge_mask, cumulative)


def unpruned(graph, what: str) -> None:
    """Refuse a PrunedGraph where the graph attribute() built is meant (`what` names the function)."""
    if isinstance(graph, PrunedGraph):
        raise AnalysisError(f"{what} take the graph attribute() built, not a PrunedGraph (they score or prune "
                            f"the whole graph themselves); pass pruned.graph.")


def graph_scores(graph) -> tuple[float, float]:
    """(replacement score, completeness score) as circuit-tracer's compute_graph_scores (module docstring)."""
    unpruned(graph, "graph_scores")
    weights = _target_weights(graph)
    matrix = normalized(graph.adjacency)
    node_influence = influence(matrix, weights)
    errors, tokens = graph.error_slice, graph.token_slice
    token_influence, error_influence = node_influence[tokens].sum(), node_influence[errors].sum()
    replacement = token_influence / (token_influence + error_influence)
    non_error = 1.0 - matrix[:, errors].sum(1)
    output = node_influence + weights
    return float(replacement), float((non_error * output).sum() / output.sum())
