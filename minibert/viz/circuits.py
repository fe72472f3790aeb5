"""Figures and views of circuits (minibert.analysis.circuits): the circuit as a graph over layers, the
faithfulness-vs-size curve, token attributions as coloured text.

    graph = analysis.edge_attribution(model, clean, corrupted, metric)
    viz.circuits.circuit_figure(graph, graph.circuit(top=30))       # a matplotlib Figure
    viz.circuits.faithfulness_figure(analysis.circuit_faithfulness(model, clean, corrupted, metric,
                                                                   graph.sweep([5, 10, 20, 50])))
    viz.circuits.token_text(analysis.token_attribution(model, texts, metric))   # HTML, shows inline

Layers go bottom to top, heads are labelled "L-H" and MLPs "MLP l", 1-indexed (config.head_label).
"""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from minibert.core.config import head_label
from minibert.errors import is_whole
from minibert.viz._check import VizError
from minibert.viz._html import page, write_page
from minibert.viz.figures._base import _axes, _finish, _legend

POSITIVE, NEGATIVE = "#1f6feb", "#cf222e"  # an edge (or token) that raises the metric, one that lowers it


def _node_positions(layers: int, heads: int) -> dict[str, tuple[float, float]]:
    """(x, y) of every node label: the embeddings at the bottom, each block's heads on one row and its MLP on
    the row above, the output at the top; centred over the heads."""
    middle = (heads - 1) / 2
    positions = {"embed": (middle, 0.0), "output": (middle, 2.0 * layers + 1)}
    for layer in range(layers):
        positions |= {head_label(layer, h): (float(h), 2.0 * layer + 1) for h in range(heads)}
        positions[f"MLP {layer + 1}"] = (middle, 2.0 * layer + 2)
    return positions


def _node_of(receiver: str) -> str:
    """The node a receiver belongs to: "2-3.q" → "2-3", "MLP 1 in" → "MLP 1", "output" → "output"."""
    return receiver.split(".")[0].removesuffix(" in")


def circuit_figure(graph, circuit=None, *, top: int = 30, ax=None, path=None, overwrite: bool = False) -> Figure:
    """The circuit's edges (default: graph.circuit(top=top)) between the graph's nodes, each line as wide as its
    |score| and coloured by its sign; an edge into a head's q, k or v ends at that head, its letter beside."""
    if not all(hasattr(graph, name) for name in ("scores", "senders", "receivers", "layers", "heads", "circuit")):
        raise VizError(f"circuit_figure draws an edge graph (analysis.edge_attribution(...), a CircuitGraph); got "
                       f"{type(graph).__name__}.")
    circuit = graph.circuit(top=top) if circuit is None else circuit
    if not isinstance(getattr(circuit, "edges", None), np.ndarray):
        raise VizError(f"circuit must be a Circuit of this graph (graph.circuit(top=n)) or None; got "
                       f"{type(circuit).__name__}.")
    if circuit.edges.shape != graph.scores.shape:
        raise VizError(f"the circuit has {circuit.edges.shape} edges but the graph {graph.scores.shape}; pass a "
                       f"circuit of this graph (graph.circuit(top=n)).")
    positions = _node_positions(graph.layers, graph.heads)
    fig, ax = _axes(ax, (max(5.0, 1.1 * graph.heads + 2), 1.2 * graph.layers + 2.5))
    senders, receivers = np.nonzero(circuit.edges)
    scores = graph.scores[senders, receivers]
    widest = max(float(np.abs(scores).max()), 1e-30) if scores.size else 1.0
    segments = [(positions[graph.senders[u]], positions[_node_of(graph.receivers[v])]) for u, v in
                zip(senders, receivers)]
    ax.add_collection(LineCollection(segments, linewidths=0.5 + 4 * np.abs(scores) / widest,
                                     colors=[POSITIVE if s > 0 else NEGATIVE for s in scores], alpha=0.7, zorder=1))
    for v, ((x0, y0), (x1, y1)) in zip(receivers, segments):
        part = graph.receivers[v].rpartition(".")[2]
        if part in ("q", "k", "v"):
            ax.text(x0 + 0.85 * (x1 - x0), y0 + 0.85 * (y1 - y0), part, fontsize=7, color="#57606a", zorder=3)
    used = {graph.senders[u] for u in senders} | {_node_of(graph.receivers[v]) for v in receivers}
    for label, (x, y) in positions.items():
        ax.scatter([x], [y], s=260, color="#ffffff" if label not in used else "#ddf4ff", edgecolors="#57606a",
                   zorder=2)
        ax.text(x, y, label, ha="center", va="center", fontsize=7, zorder=3, parse_math=False)
    ax.set_xlim(-1, graph.heads)
    ax.set_ylim(-0.8, 2 * graph.layers + 1.8)
    ax.set_axis_off()
    ax.set_title(f"{graph.method.upper()} circuit: {circuit.size} edges\n(an edge's score is the metric's change "
                 f"when the corrupted run's value flows along it: red lowers the metric — the clean behaviour "
                 f"depends on that edge — blue raises it)", fontsize=8, wrap=True)
    return _finish(fig, path, overwrite)


def faithfulness_figure(result, *, ax=None, path=None, overwrite: bool = False) -> Figure:
    """Faithfulness against circuit size (edges kept): 1 is the clean run, 0 the corrupted one; post-LN families
    also mark the empty graph's value (the frozen skip path's approximation of the corrupted run)."""
    if not all(hasattr(result, name) for name in ("sizes", "values", "empty", "clean", "corrupted")):
        raise VizError(f"faithfulness_figure draws what circuit_faithfulness returns (a Faithfulness, e.g. of "
                       f"graph.sweep([5, 10, 20])); got {type(result).__name__}.")
    sizes = np.asarray(result.sizes)
    order = np.argsort(sizes, kind="stable")
    fig, ax = _axes(ax, (5.0, 3.4))
    ax.plot(sizes[order], np.asarray(result.values)[order], marker="o", color=POSITIVE, label="circuit")
    ax.axhline(1.0, color="#57606a", linestyle="--", linewidth=0.8, label="clean (full graph)")
    ax.axhline(0.0, color="#57606a", linestyle=":", linewidth=0.8, label="corrupted")
    empty = (result.empty - result.corrupted) / (result.clean - result.corrupted)
    ax.axhline(empty, color=NEGATIVE, linestyle="-.", linewidth=0.8, label="empty graph")
    ax.set_xlabel("edges in the circuit")
    ax.set_ylabel("faithfulness")
    _legend(ax, fontsize=8)
    return _finish(fig, path, overwrite)


def _colour(score: float, norm: Normalize) -> str:
    """An rgba background: blue for positive scores, red for negative, as strong as |score| is large."""
    strength = float(np.clip(norm(abs(score)), 0.0, 1.0))
    rgb = (31, 111, 235) if score > 0 else (207, 34, 46)
    return f"rgba({rgb[0]},{rgb[1]},{rgb[2]},{0.85 * strength:.3f})"


class TokenText:
    """Token (or word) attributions as coloured text, one line per row; `.html` a fragment, `.save(path)` a page."""

    def __init__(self, attribution, rows=None):
        if not all(hasattr(attribution, name) for name in ("scores", "labels", "total", "method")):
            raise VizError(f"token_text shows what analysis.token_attribution returns (a TokenAttribution); got "
                           f"{type(attribution).__name__}.")
        count, given = len(attribution.labels), rows
        rows = range(count) if rows is None else rows
        rows = list(rows) if hasattr(rows, "__iter__") and not isinstance(rows, (str, bytes)) else None
        if rows is None or not all(is_whole(row) and 0 <= row < count for row in rows):
            raise VizError(f"rows must be a list of row indices from 0 to {count - 1} (the attribution has {count} "
                           f"rows); got {given!r}.")
        scale = max(float(np.abs(attribution.scores).max()), 1e-30)
        norm = Normalize(0.0, scale)
        lines = []
        for row in rows:
            spans = "".join(
                f'<span title="{score:+.4g}" style="background:{_colour(score, norm)};padding:1px 3px;'
                f'margin:1px;border-radius:3px">{html.escape(label)}</span>'
                for label, score in zip(attribution.labels[row], attribution.scores[row]))
            total = f"<small>(Σ {attribution.total[row]:+.4g})</small>"
            lines.append(f'<div style="line-height:1.9">{spans} {total}</div>')
        self.title = f"token attributions ({attribution.method})"
        self.html = f'<div class="mb-token-text"><b>{html.escape(self.title)}</b>{"".join(lines)}</div>'

    def _repr_html_(self) -> str:
        return self.html

    def save(self, path, *, overwrite: bool = False) -> Path:
        """Write the text as a page to `path`; an existing file is refused unless overwrite=True."""
        return write_page(path, page(self.title, self.html), overwrite)


def token_text(attribution, rows=None) -> TokenText:
    """A TokenAttribution as coloured text: each token (word) on a blue (raises the metric) or red (lowers it)
    background as strong as its |score| relative to the largest; its score shows on hover. Text is escaped."""
    return TokenText(attribution, rows)
