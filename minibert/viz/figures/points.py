"""Per-sentence and per-point plots: attention to a chosen word by layer, one line per sentence, and sentences
in two principal components with their texts placed where they do not overprint."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from minibert.viz import _check
from minibert.viz._check import VizError
from minibert.viz.figures._base import _axes, _finish, _legend, _one_based_ticks, _strings

MAX_LEGEND_CHARS = 48


def attention_to_word_plot(values, labels: Sequence[str], *, word: str | None = None, groups=None,
                           title: str | None = None, ax: Axes | None = None, path=None,
                           overwrite: bool = False) -> Figure:
    """Attention paid to a chosen token in each layer, one line per sentence (seed 000, its Figure 2).

    values: [N, L], sentence n's attention to its chosen token in layer l (rows of layers 0-indexed;
    the x axis shows them 1-indexed). labels: N legend entries, e.g. the sentences. word: the chosen
    token, for the y label. groups: N labels that colour the lines as pca_scatter colours its points
    (same labels, same colours); default one colour per line.
    """
    v = _check.matrix("values", values, 2, "[N, L] (sentences × layers)")
    labels = _strings("labels", labels, v.shape[0])
    if groups is None:
        colors = [f"C{n % 10}" for n in range(v.shape[0])]
    else:
        groups = _labels("groups", groups, v.shape[0])
        colors = [_label_colors(groups)[group] for group in groups]
    fig, ax = _axes(ax, (6.0, 4.0))
    layers = np.arange(1, v.shape[1] + 1)
    for row, label, color in zip(v, labels, colors):
        ax.plot(layers, row, marker="o", color=color, label=_shorten(label, MAX_LEGEND_CHARS))
    _one_based_ticks(ax, "x", v.shape[1])
    ax.set_xlabel("layer (1-indexed)")
    ax.set_ylabel(f"attention to {word!r}" if word else "attention to the chosen token")
    ax.set_title(title or "", parse_math=False)
    _legend(ax, fontsize=8)
    return _finish(fig, path, overwrite)


def pca_scatter(coords, labels=None, texts: Sequence[str] | None = None, explained=None, *,
                max_chars: int = 40, title: str | None = None, ax: Axes | None = None, path=None,
                overwrite: bool = False) -> Figure:
    """Sentences in two principal components, coloured by label or prediction, annotated with their text.

    coords: [N, 2] (e.g. PCA of mean-pooled embeddings). labels: N class labels or predictions (colour
    and legend; same labels, same colours as attention_to_word_plot's groups). texts: N sentences,
    written next to their points, cut to max_chars. explained: the two components' fractions of
    variance (e.g. PCA's explained_variance_ratio_[:2]), shown on the axes.
    """
    xy = _check.matrix("coords", coords, 2, "[N, 2] (points × two components)")
    if xy.shape[1] != 2:
        raise VizError(f"coords must be [N, 2], two components per point; got shape {xy.shape}.")
    fig, ax = _axes(ax, (6.5, 5.0))
    if labels is None:
        ax.scatter(xy[:, 0], xy[:, 1], s=80, alpha=0.6)
    else:
        _scatter_by_label(ax, xy, _labels("labels", labels, xy.shape[0]))
    if texts is not None:
        _place_labels(ax, xy, [_shorten(t, max_chars) for t in _strings("texts", texts, xy.shape[0])])
    for axis, name in zip("xy", _component_names(explained)):
        getattr(ax, f"set_{axis}label")(name)
    ax.set_title(title or "", parse_math=False)
    return _finish(fig, path, overwrite)


LABEL_FONTSIZE = 8
LABEL_GAP = 4.0  # points between a point and its label


def _label_offsets(width: float, height: float, rings: int = 8) -> list[tuple[float, float]]:
    """Where a label's lower-left corner may go, in points from its point: beside it first (right-above,
    right-below, left-above, left-below), then one label height further out each ring."""
    offsets = []
    for ring in range(rings):
        up, down = LABEL_GAP + ring * height, -LABEL_GAP - height - ring * height
        offsets += [(LABEL_GAP, up), (LABEL_GAP, down), (-LABEL_GAP - width, up), (-LABEL_GAP - width, down)]
    return offsets


def _overlap(a, b) -> float:
    """Area shared by two boxes (x0, y0, x1, y1)."""
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))


def _place_labels(ax: Axes, xy: np.ndarray, texts: list[str]) -> None:
    """Annotate each point with its text where it overlaps no label placed before it (greedy, in points on the
    page; a text's box is estimated from its length), so labels of close or equal points do not overprint.
    A label pushed away from its point gets a thin leader line."""
    ax.autoscale_view()
    anchors = ax.transData.transform(xy) * 72 / ax.figure.dpi  # points on the page
    placed: list[tuple[float, float, float, float]] = []
    for text, (x, y), (px, py) in zip(texts, xy, anchors):
        width, height = 0.6 * LABEL_FONTSIZE * max(len(text), 1), 1.25 * LABEL_FONTSIZE
        boxes = [(px + dx, py + dy, px + dx + width, py + dy + height) for dx, dy in _label_offsets(width, height)]
        crowding = [sum(_overlap(box, other) for other in placed) for box in boxes]
        best = int(np.argmin(crowding))  # the first free place, or the least crowded one
        placed.append(boxes[best])
        dx, dy = boxes[best][0] - px, boxes[best][1] - py
        leader = {"arrowprops": {"arrowstyle": "-", "lw": 0.5, "color": "0.5"}} if best >= 4 else {}
        ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=LABEL_FONTSIZE,
                    va="bottom", parse_math=False, **leader)


def _scatter_by_label(ax: Axes, xy: np.ndarray, labels: list) -> None:
    colors = _label_colors(labels)
    ax.scatter(xy[:, 0], xy[:, 1], c=[colors[label] for label in labels], s=80, alpha=0.6)
    handles = [Line2D([], [], marker="o", linestyle="", color=color, alpha=0.6) for color in colors.values()]
    _legend(ax, handles, [str(label) for label in colors], title="label", fontsize=8)


def _component_names(explained) -> list[str]:
    if explained is None:
        return ["PC 1", "PC 2"]
    fractions = _check.matrix("explained", explained, 1, "[2] (fraction of variance of each component)")
    if fractions.shape != (2,):
        raise VizError(f"explained must give the 2 components' fractions of variance; got shape {fractions.shape}.")
    return [f"PC {i + 1} ({f:.1%} of variance)" for i, f in enumerate(fractions)]



def _shorten(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars - 1] + "…"


def _labels(name: str, values, n: int) -> list:
    """N class labels or predictions (strings or ints), one per point or line."""
    values = np.asarray(values)
    if values.shape != (n,):
        raise VizError(f"{name} must hold one label per row ({n}); got shape {values.shape}.")
    return values.tolist()


def _label_colors(labels: Sequence) -> dict:
    """Label → colour, from the sorted distinct labels: the same labels get the same colours in every figure."""
    distinct = np.unique(np.asarray(labels)).tolist()
    palette = colormaps["tab10" if len(distinct) <= 10 else "tab20"].colors
    return {label: palette[i % len(palette)] for i, label in enumerate(distinct)}
