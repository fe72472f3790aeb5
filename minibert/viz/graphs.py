"""A figure of an attribution graph (minibert.analysis.graphs), in viz.circuits' style: layers go up (token
embeddings at the bottom, the targets at the top), positions across, each kept edge a line as wide as its
|weight|, blue where it raises its target node, red where it lowers it.

    pruned = graphs.prune(graph)
    viz.graphs.graph_figure(pruned, path="graph.png")
"""

from __future__ import annotations

import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

from minibert.errors import refuse_unless_flag
from minibert.viz._check import VizError
from minibert.viz.circuits import NEGATIVE, POSITIVE
from minibert.viz.figures._base import _axes, _finish, figure_path

KIND_COLOURS = {"feature": "#ddf4ff", "error": "#eaeef2", "token": "#fff8c5", "target": "#dafbe1"}


def _place(graph, index: int) -> tuple[float, float, str]:
    """(x, y, kind) of a node: x its position (features of one layer and position fanned out a little), y its layer
    (tokens 0, layer l's features and error l + 1, targets L + 1)."""
    if index < graph.n_features:
        layer, pos, latent = graph.active_features[index]
        return pos + 0.35 * ((latent * 0.618) % 1 - 0.5), layer + 1.0, "feature"
    if index < graph.error_slice.stop:
        layer, pos = divmod(index - graph.n_features, graph.n_pos)
        return pos + 0.4, layer + 1.0, "error"
    if index < graph.token_slice.stop:
        return float(index - graph.error_slice.stop), 0.0, "token"
    k = index - graph.token_slice.stop
    return (graph.n_pos - 1) / 2 + k, graph.n_layers + 1.0, "target"


def graph_figure(pruned, *, ax=None, path=None, overwrite: bool = False) -> Figure:
    """The kept nodes and edges of a PrunedGraph (graphs.prune); `path` (a str or pathlib.Path ending in .png, .svg
    or .pdf) is refused if it exists unless overwrite=True."""
    if not all(hasattr(pruned, name) for name in ("graph", "node_mask", "edge_mask")):
        raise VizError(f"graph_figure takes a pruned graph (graphs.prune(graph)); got {type(pruned).__name__}.")
    refuse_unless_flag("overwrite", overwrite, VizError)  # the flag's type, also without a path
    if path is not None:
        figure_path(path, overwrite)  # before drawing: a bad path or an existing file costs nothing
    graph = pruned.graph
    kept = np.flatnonzero(pruned.node_mask)
    places = {int(i): _place(graph, int(i)) for i in kept}
    fig, ax = _axes(ax, (max(5.0, 0.7 * graph.n_pos + 2), 0.9 * graph.n_layers + 3))
    rows, cols = np.nonzero(pruned.edge_mask)
    pairs = [(r, c) for r, c in zip(rows.tolist(), cols.tolist()) if r in places and c in places]
    weights = np.array([graph.adjacency[r, c] for r, c in pairs])
    widest = max(float(np.abs(weights).max()), 1e-30) if weights.size else 1.0
    segments = [(places[c][:2], places[r][:2]) for r, c in pairs]
    ax.add_collection(LineCollection(segments, linewidths=0.3 + 3 * np.abs(weights) / widest,
                                     colors=[POSITIVE if w > 0 else NEGATIVE for w in weights], alpha=0.6, zorder=1))
    for x, y, kind in places.values():
        ax.scatter([x], [y], s=60 if kind in ("feature", "error") else 160, color=KIND_COLOURS[kind],
                   edgecolors="#57606a", marker="s" if kind == "error" else "o", zorder=2)
    ax.set_xticks(np.arange(graph.n_pos), graph.tokens, rotation=60, fontsize=7, parse_math=False)
    ax.set_yticks(np.arange(graph.n_layers + 2), ["emb", *[str(i) for i in range(graph.n_layers)], "target"])
    ax.set_xlim(-1, graph.n_pos)
    ax.set_ylim(-0.6, graph.n_layers + 1.6)
    ax.set_title(f"attribution graph: {pruned.n_nodes} nodes, {pruned.n_edges} edges (blue raises, red lowers; "
                 f"squares: error nodes)", fontsize=9)
    return _finish(fig, path, overwrite)
