"""Attention rollout and attention flow (Abnar & Zuidema 2020): how much of each input token reaches
each position after several layers, counting the residual connection.

Both start from the same per-layer mixing matrix, for one document's attention A [L, H, T, S]:

    Â_l = (1 − r)·mean_h A_l + r·I, rows renormalised        (r = `residual`, 0.5 in the paper)

Rollout multiplies them: rollout_0 = Â_0, rollout_l = Â_l · rollout_{l−1}; row t of rollout_l is how
position t after block l (0-indexed) mixes the input tokens. Flow instead treats Â as capacities of a
layered graph — node (k, t) is position t entering block k, node (L, t) the output — with an edge
(k+1, t) → (k, s) of capacity Â_k[t, s], and reports the maximum flow from (l+1, t) to input (0, s).
Rollout sums products of weights over all paths; flow is bounded by the narrowest cut between the two
nodes. Tokens, positions and layers are 0-indexed.
"""

from __future__ import annotations

import numpy as np

from minibert.core.site_names import PATTERN
from minibert.errors import AnalysisError

_TOLERANCE = 1e-12  # residual capacities at or below this count as saturated


def _check_attention(attention, ndims: tuple[int, ...]) -> np.ndarray:
    a = np.asarray(attention, np.float64)
    if a.ndim not in ndims or a.shape[-1] != a.shape[-2]:
        shapes = " or ".join({4: "[L, H, T, T]", 5: "[L, B, H, T, T]"}[n] for n in ndims)
        raise AnalysisError(f"attention must be {shapes} (a square map per head); got shape {a.shape}. "
                         f"Stack the layers with cache.stack({PATTERN!r}) and take one document "
                         f"with [:, b, :, :n, :n] (n its real tokens).")
    if not np.isfinite(a).all() or (a < 0).any():
        raise AnalysisError(f"attention must hold non-negative finite attention weights; found "
                         f"{'non-finite values' if not np.isfinite(a).all() else 'negative values'}.")
    return a


def mixing_matrices(attention, residual: float = 0.5) -> np.ndarray:
    """Â_l = (1 − residual)·mean over heads of A_l + residual·I, rows renormalised: [L, (B,) T, T].

    attention: [L, H, T, T] for one document or [L, B, H, T, T] (cache.stack("attn.hook_pattern")).
    Padding keys hold zero attention, so padded positions never mix into real rows.
    """
    if not 0.0 <= residual <= 1.0:
        raise AnalysisError(f"residual must lie in [0, 1] (the weight of the identity); got {residual}.")
    a = _check_attention(attention, (4, 5))
    mixed = (1.0 - residual) * a.mean(axis=-3) + residual * np.eye(a.shape[-1])
    rows = mixed.sum(-1, keepdims=True)
    return mixed / np.where(rows > 0, rows, 1.0)


def attention_rollout(attention, residual: float = 0.5) -> np.ndarray:
    """Rollout per layer: [L, T, T] for attention [L, H, T, T] ([L, B, T, T] for [L, B, H, T, T]).

    rollout[l, t, s]: how much of input token s is in position t after block l (0-indexed), as the
    product Â_l · Â_{l−1} ··· Â_0 (module docstring). Each row sums to 1.
    """
    mixing = mixing_matrices(attention, residual)
    rollout = np.empty_like(mixing)
    rollout[0] = mixing[0]
    for layer in range(1, len(mixing)):
        rollout[layer] = mixing[layer] @ rollout[layer - 1]
    return rollout


def attention_flow(attention, residual: float = 0.5, normalize: bool = True) -> np.ndarray:
    """Attention flow per layer: [L, T, T] for one document's attention [L, H, T, T].

    flow[l, t, s]: the maximum flow from position t after block l to input token s through the layered
    graph with capacities Â (module docstring). normalize=True divides each row by its sum, as Abnar &
    Zuidema's code does; False keeps the raw max-flow values (each ≤ 1). Cost: L·T² max-flow problems
    on graphs of up to (L+1)·T nodes, in NumPy on one core: meant for short texts (timings in
    benchmarks/RESULTS.md, "Attention flow").
    """
    mixing = mixing_matrices(_check_attention(attention, (4,)), residual)  # [L, T, T]
    n_layers, length = mixing.shape[0], mixing.shape[-1]
    flow = np.zeros((n_layers, length, length))
    for layer in range(n_layers):
        network = FlowNetwork(_layered_capacity(mixing[: layer + 1]))
        top = (layer + 1) * length
        for t in range(length):
            for s in range(length):
                flow[layer, t, s] = network.max_flow(top + t, s)
    if normalize:
        rows = flow.sum(-1, keepdims=True)
        flow = flow / np.where(rows > 0, rows, 1.0)
    return flow


def _layered_capacity(mixing: np.ndarray) -> np.ndarray:
    """Dense capacities [(L+1)·T, (L+1)·T] of the layered graph: node k·T + t is position t entering
    block k; edge (k+1)·T + t → k·T + s carries Â_k[t, s]. mixing: [L, T, T]."""
    n_layers, length = mixing.shape[0], mixing.shape[-1]
    capacity = np.zeros(((n_layers + 1) * length,) * 2)
    for k in range(n_layers):
        capacity[(k + 1) * length:(k + 2) * length, k * length:(k + 1) * length] = mixing[k]
    return capacity


class FlowNetwork:
    """A directed graph with dense float capacities [N, N], for many max-flow queries (Dinic's algorithm).

    Each query copies the capacities as residuals, then repeats phases: breadth-first levels of the
    residual graph, and a blocking flow along level-increasing edges, until the sink is unreachable
    (at most N phases). The inner loops walk Python lists: per-edge steps are scalar, and NumPy's
    per-call overhead would dominate them. Residuals at or below 1e-12 count as saturated.
    """

    def __init__(self, capacity):
        capacity = np.asarray(capacity, np.float64)
        if capacity.ndim != 2 or capacity.shape[0] != capacity.shape[1] or (capacity < 0).any() \
                or not np.isfinite(capacity).all():
            raise AnalysisError(f"capacity must be a square matrix [N, N] of finite non-negative numbers; "
                             f"got shape {capacity.shape}.")
        self.capacity = capacity.tolist()
        linked = (capacity > 0) | (capacity.T > 0)  # residual edges run both ways
        self.neighbours = [np.flatnonzero(row).tolist() for row in linked]

    def max_flow(self, source: int, sink: int) -> float:
        """The maximum flow value from node `source` to node `sink`."""
        n = len(self.capacity)
        if not (0 <= source < n and 0 <= sink < n) or source == sink:
            raise AnalysisError(f"source {source} and sink {sink} must be two different nodes in [0, {n}).")
        residual = [row[:] for row in self.capacity]
        total = 0.0
        while True:
            level = self._levels(residual, source)
            if level[sink] < 0:
                return total
            total += self._blocking_flow(residual, level, source, sink)

    def _levels(self, residual, source: int) -> list[int]:
        """Breadth-first distance of every node from `source` over residual edges (−1: unreachable)."""
        level = [-1] * len(residual)
        level[source] = 0
        queue = [source]
        for node in queue:  # the queue grows while we walk it
            for other in self.neighbours[node]:
                if level[other] < 0 and residual[node][other] > _TOLERANCE:
                    level[other] = level[node] + 1
                    queue.append(other)
        return level

    def _blocking_flow(self, residual, level, source: int, sink: int) -> float:
        """Push flow along source→sink paths that go one level down per edge until none is left; updates
        `residual` in place and returns the flow pushed. Depth-first with a current-edge pointer per node."""
        edges = [[o for o in self.neighbours[node] if level[o] == level[node] + 1] for node in range(len(level))]
        pointer = [0] * len(level)
        path = [source]
        pushed = 0.0
        while path:
            node = path[-1]
            if node == sink:
                steps = list(zip(path[:-1], path[1:]))
                amount = min(residual[a][b] for a, b in steps)
                for a, b in steps:
                    residual[a][b] -= amount
                    residual[b][a] += amount
                pushed += amount
                first_saturated = next(i for i, (a, b) in enumerate(steps) if residual[a][b] <= _TOLERANCE)
                del path[first_saturated + 1:]  # resume from the tail of the first saturated edge
                continue
            candidates, row = edges[node], residual[node]
            while pointer[node] < len(candidates) and row[candidates[pointer[node]]] <= _TOLERANCE:
                pointer[node] += 1
            if pointer[node] < len(candidates):
                path.append(candidates[pointer[node]])
            else:  # dead end: no path to the sink leaves this node in this phase
                path.pop()
                if path:
                    pointer[path[-1]] += 1
        return pushed


def max_flow(capacity, source: int, sink: int) -> float:
    """Maximum flow value from `source` to `sink` with dense capacities [N, N] (see FlowNetwork)."""
    return FlowNetwork(capacity).max_flow(source, sink)
