"""Publication figures (matplotlib): attention heatmaps, the neuron view on paper, per-layer plots,
PCA and MDS scatters, and the head statistics of Clark et al. 2019, "What Does BERT Look At?".

Every function takes plain arrays (NumPy or JAX), returns a `matplotlib.figure.Figure` and, given
`path`, saves it (.png, .svg or .pdf, by suffix). Single-panel figures also take `ax` to draw into
a figure of your own (they then return the figure that holds `ax`). Figures are built without
pyplot: nothing opens a window or piles up in pyplot's list; a returned figure is a NotebookFigure,
which a notebook shows inline with no `%matplotlib inline`. Legends go in the emptiest corner.

Axis letters as everywhere in minibert: L layers, H heads, T query positions, S key positions,
K head dim, N sentences or points. Arguments are 0-indexed; figures label layers and heads
1-indexed, a head as "L-H" in the form of Clark et al. (layer 0, head 3 → "1-4").

    fig = attention_heatmap(cache["blocks.2.attn.hook_pattern"][0, 5], batch.tokens[0])  # head "3-6"
    save(fig, "head_3-6.pdf")
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from itertools import product
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.colors import LinearSegmentedColormap, Normalize
from matplotlib.figure import Figure, SubFigure
from matplotlib.lines import Line2D

from minibert.config import head_label  # figures.head_label: the tutorials and docs/findings.py read it here too
from minibert.viz import _check
from minibert.viz._check import VizError
from minibert.viz.views import neuron_softmax

SUFFIXES = (".png", ".svg", ".pdf")
PNG_DPI = 200
ATTENTION_CMAP = "Blues"
STATISTIC_CMAP = "viridis"
LAYER_CMAP = "viridis"
# bertviz's neuron-view colours: negative orange, zero white, positive blue.
NEURON_CMAP = LinearSegmentedColormap.from_list("minibert_neuron", ["#e66101", "#ffffff", "#2166ac"])
NEURON_PANELS = ("q", "k", "q×k", "q·k", "q·k/√K", "softmax")  # each panel's Axes label (ax.get_label())
MAX_TICKED_TOKENS = 40  # head_grid labels its thumbnails with tokens up to this length; beyond, they would overlap
MAX_LEGEND_CHARS = 48
BEHAVIOUR_MARKERS = ("^", "s", "D", "v", "P", "X", "*", "<", ">", "p")

# Keys of the head-statistics dicts ([L, H] arrays, per-document averages of docs/definitions.md) → legend labels.
SPECIAL_TOKENS = {"to_cls": "[CLS]", "to_sep": "[SEP]", "to_punct": ". or ,"}
GRADIENTS = {"cls": "[CLS]", "sep": "[SEP]", "punct": ". or ,", "other": "other"}
ENTROPIES = {"entropy": "all tokens", "cls_entropy": "[CLS] row"}
UNIFORM_ENTROPY = "uniform_entropy"
POSITIONAL = {"prev": "attention to the previous token", "next": "attention to the next token",
              "self": "attention to the token itself"}


# ---- saving and shared pieces ------------------------------------------------------------------------

def save(fig: Figure, path) -> Path:
    """Write `fig` to `path` in the format its suffix names (.png at 200 dpi, .svg, .pdf); returns the path."""
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise VizError(f"path {str(path)!r} must end in .png, .svg or .pdf (the format follows the suffix); "
                       f"got {path.suffix or 'no suffix'!r}.")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=PNG_DPI, bbox_inches="tight")
    return path


class NotebookFigure(Figure):
    """The Figure every function here returns: one that shows itself in Jupyter.

    A Figure made without pyplot has no canvas manager, and IPython draws a Figure inline only after
    `%matplotlib inline` or a pyplot import has registered its formatter; otherwise a notebook prints
    "<Figure size 642x572 with 2 Axes>". IPython asks any object for `_repr_png_`, so this needs
    neither (where the inline formatter is registered, it is used instead: one image either way).
    PNG rather than SVG: a layers × heads grid or a long neuron figure is megabytes of SVG paths but a
    small PNG, and PNG shows in every notebook front end, as the inline backend's own default.
    """

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", bbox_inches="tight")
        return buffer.getvalue()


def _axes(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure | SubFigure, Axes]:
    if ax is not None:
        return ax.figure, ax
    fig = NotebookFigure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def _finish(fig, path) -> Figure:
    if path is not None:
        save(fig, path)
    return fig


def _tick_labels(ax: Axes, axis: str, labels: Sequence[str], **text) -> None:
    """One label per cell; user text is drawn literally (no $…$ mathtext)."""
    getattr(ax, f"set_{axis}ticks")(np.arange(len(labels)), labels, parse_math=False, **text)


def _one_based_ticks(ax: Axes, axis: str, n: int) -> None:
    """Integer ticks 1..n on an axis whose data runs 1..n (layers, heads)."""
    getattr(ax, f"set_{axis}ticks")(np.arange(1, n + 1))


LEGEND_CORNERS = {"upper right": (True, True), "upper left": (False, True), "lower left": (False, False),
                  "lower right": (True, False)}  # loc → (right half, upper half)


def _emptiest_corner(ax: Axes) -> str:
    """The corner of `ax` whose quarter holds the fewest plotted points, for the legend. loc="best" looks
    for a free place while drawing, testing candidate boxes against every point, and warns that it "can be
    slow with large amounts of data"; one count of the points per quarter decides here instead."""
    points = [line.get_xydata() for line in ax.get_lines()] + [c.get_offsets() for c in ax.collections]
    xy = np.concatenate([np.asarray(p, float).reshape(-1, 2) for p in points] or [np.zeros((0, 2))])
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()  # fractions of the axes, so inverted axes count right
    right, upper = (xy[:, 0] - x0) / (x1 - x0) > 0.5, (xy[:, 1] - y0) / (y1 - y0) > 0.5
    counts = {loc: int(np.sum((right == r) & (upper == u))) for loc, (r, u) in LEGEND_CORNERS.items()}
    return min(counts, key=counts.get)


def _legend(ax: Axes, handles=None, labels=None, **options) -> None:
    options.setdefault("loc", _emptiest_corner(ax))
    legend = ax.legend(handles, labels, **options) if handles else ax.legend(**options)
    for text in legend.get_texts():
        text.set_parse_math(False)


def _shorten(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars - 1] + "…"


def _strings(name: str, values, n: int, what: str = "rows") -> list[str]:
    """N strings (legend labels, sentences, key tokens), one per row (or column) of the data."""
    if isinstance(values, str) or not hasattr(values, "__len__"):
        raise VizError(f"{name} must be a list of {n} strings; got {type(values).__name__}.")
    if len(values) != n:
        raise VizError(f"{name} has {len(values)} entries but the data has {n} {what}; pass one per {what[:-1]}.")
    return [str(v) for v in values]


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


def _symmetric_norm(values: np.ndarray) -> Normalize:
    """A scale centred on 0 (white in NEURON_CMAP) that reaches the largest magnitude."""
    limit = float(np.abs(values).max()) or 1.0
    return Normalize(-limit, limit)


def _heatmap_size(n_rows: int, n_cols: int) -> tuple[float, float]:
    return min(2.5 + 0.28 * n_cols, 18.0), min(1.8 + 0.28 * n_rows, 18.0)


# ---- attention matrices ------------------------------------------------------------------------------

def attention_heatmap(attention, tokens: Sequence[str], tokens_to: Sequence[str] | None = None, *,
                      title: str | None = None, vmax: float | None = None, cmap=ATTENTION_CMAP,
                      ax: Axes | None = None, path=None) -> Figure:
    """One head's attention as a heatmap: query tokens down the rows, key tokens across the columns.

    attention: [T, S], e.g. cache["blocks.2.attn.hook_pattern"][0, 5] (layer 2, head 5, 0-indexed:
    title it head_label(2, 5) = "3-6"). tokens: the T query tokens; tokens_to: the S key tokens
    (default: tokens). vmax: top of the colour scale (default: the largest value); the bottom is 0.
    """
    rows = _check.token_list(tokens)
    a = _check.matrix("attention", attention, 2, "[T, S] (query × key, one head)")
    cols = rows if tokens_to is None else _strings("tokens_to", tokens_to, a.shape[1], "key columns")
    if a.shape != (len(rows), len(cols)):
        raise VizError(f"attention has shape {a.shape} but there are {len(rows)} query and {len(cols)} key tokens; "
                       f"pass [T, S] = [{len(rows)}, {len(cols)}] (drop padding: attention[:n, :n]).")
    fig, ax = _axes(ax, _heatmap_size(*a.shape))
    image = ax.imshow(a, cmap=cmap, vmin=0.0, vmax=a.max() if vmax is None else vmax)
    _tick_labels(ax, "x", cols, rotation=90)
    _tick_labels(ax, "y", rows)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(title or "", parse_math=False)
    fig.colorbar(image, ax=ax, label="attention")
    return _finish(fig, path)


def head_grid(attention, tokens: Sequence[str], *, layers: Sequence[int] | None = None,
              heads: Sequence[int] | None = None, vmax: float | None = None, cmap=ATTENTION_CMAP,
              title: str | None = None, path=None) -> Figure:
    """A layers × heads grid of small heatmaps on one colour scale, each titled "L-H" (1-indexed).

    attention: [L, H, T, S] for one document (or [L, 1, H, T, S], or a list of L [1, H, T, S]), e.g.
    cache.stack("hook_pattern")[:, 0]. layers, heads: which to show, 0-indexed (default all).
    vmax: top of the shared colour scale (default: the largest value shown). Thumbnails carry token
    labels on the outer edges up to 40 tokens.
    """
    tokens, a, rows, cols = _check.layers_and_heads(tokens, attention, layers, heads)
    shown = a[np.ix_(rows, cols)]
    fig = NotebookFigure(figsize=(1.6 * len(cols) + 1.5, 1.6 * len(rows) + 0.8), layout="constrained")
    # Not sharex/sharey: shared tick machinery costs time quadratic in the panels (seconds for 12 × 12).
    grid = fig.subplots(len(rows), len(cols), squeeze=False)
    norm = Normalize(0.0, shown.max() if vmax is None else vmax)
    for (i, layer), (j, head) in product(enumerate(rows), enumerate(cols)):
        image = grid[i, j].imshow(a[layer, head], cmap=cmap, norm=norm)
        grid[i, j].set_title(head_label(layer, head), fontsize=9)
    _grid_ticks(grid, tokens)
    fig.colorbar(image, ax=grid, shrink=0.6, label="attention")
    fig.suptitle(title or "attention by layer-head (1-indexed)", parse_math=False)
    return _finish(fig, path)


def _grid_ticks(grid: np.ndarray, tokens: list[str]) -> None:
    """Small token labels on a head grid's outer edges: keys under the bottom row, queries left of the
    first column (up to MAX_TICKED_TOKENS tokens; none beyond)."""
    labelled = len(tokens) <= MAX_TICKED_TOKENS
    n_rows, n_cols = grid.shape
    for (i, j), ax in np.ndenumerate(grid):
        ax.set_xticks([])
        ax.set_yticks([])
        if labelled and i == n_rows - 1:
            _tick_labels(ax, "x", tokens, fontsize=5, rotation=90)
        if labelled and j == 0:
            _tick_labels(ax, "y", tokens, fontsize=5)


# ---- the neuron view ---------------------------------------------------------------------------------

def neuron_figure(q, k, tokens: Sequence[str], query_index: int = 0, *, title: str | None = None,
                  path=None) -> Figure:
    """How one query token's attention is computed (bertviz's neuron view, on paper).

    q: [T, K], one head's query vectors (query_index picks the row), or [K], the query's vector alone;
    k: [S, K], the same head's key vectors; tokens: the document's S tokens (also the T rows of q).
    E.g. q = cache["blocks.2.attn.hook_q"][0, :, 5], k = cache["blocks.2.attn.hook_k"][0, :, 5].
    Panels (their Axes labels, NEURON_PANELS), one row per key token: q (above k), k, q×k
    (elementwise), q·k, q·k/√K and the softmax over keys, computed here without a mask (pass real
    tokens only). Positive blue, negative orange, white at 0, each panel on its own symmetric scale
    (q and k share one; the softmax runs 0..1 white to blue).
    """
    tokens = _check.token_list(tokens)
    k = _check.matrix("k", k, 2, "[S, K] (key positions × head dim, one head)")
    if k.shape[0] != len(tokens):
        raise VizError(f"k covers {k.shape[0]} key positions but there are {len(tokens)} tokens; "
                       f"pass k[:{len(tokens)}] (real tokens only) or the tokens of the same document.")
    query_index = _check.index("query_index", query_index, len(tokens), "tokens")
    q_row = _query_vector(q, len(tokens), k.shape[1], query_index)
    panels = {"q": q_row[None], **neuron_terms(q_row, k)}
    norms = {name: _symmetric_norm(values) for name, values in panels.items()}
    norms["q"] = norms["k"] = _symmetric_norm(np.concatenate([q_row, k.ravel()]))
    norms["softmax"] = Normalize(-1.0, 1.0)  # its 0..1 runs white to blue
    titles = {"q": f"q ({tokens[query_index]}, position {query_index})", "q·k/√K": f"q·k/√{k.shape[1]}"}
    fig, axes = _neuron_layout(len(tokens), k.shape[1])
    for name in NEURON_PANELS[:3]:
        image = _neuron_panel(axes[name], panels[name], norms[name], titles.get(name, name))
        if name != "q":  # q's scale is k's
            axes[name].set_xlabel("neuron (0-indexed)")
            fig.colorbar(image, ax=axes[name], location="bottom", shrink=0.8, aspect=30)
    for name in NEURON_PANELS[3:]:
        _scalar_panel(axes[name], panels[name], norms[name], titles.get(name, name))
    _tick_labels(axes["k"], "y", tokens)
    axes["k"].get_yticklabels()[query_index].set_fontweight("bold")
    fig.suptitle(title or f"neuron view: {tokens[query_index]!r} (position {query_index}) attending to each token",
                 parse_math=False)
    return _finish(fig, path)


def neuron_terms(q: np.ndarray, k: np.ndarray) -> dict[str, np.ndarray]:
    """The neuron view's panels for one query q [K] over keys k [S, K], in float64:
    "k" and "q×k" [S, K]; "q·k", "q·k/√K" and "softmax" (over S) [S]."""
    scores = k @ q
    scaled = scores / np.sqrt(k.shape[1])
    return {"k": k, "q×k": q * k, "q·k": scores, "q·k/√K": scaled, "softmax": neuron_softmax(scaled)}


def _query_vector(q, n_tokens: int, d_head: int, query_index: int) -> np.ndarray:
    q = _check.matrix("q", q, 1 if np.ndim(q) == 1 else 2, "[T, K] or [K] (one head's query vectors)")
    if q.ndim == 2 and q.shape[0] != n_tokens:
        raise VizError(f"q covers {q.shape[0]} query positions but there are {n_tokens} tokens; "
                       f"pass q[:{n_tokens}] (real tokens only), or the query's vector alone [K].")
    if q.shape[-1] != d_head:
        raise VizError(f"q must be [T, K] or [K] with K = {d_head} (the head dim of k); got shape {q.shape}.")
    return q[query_index] if q.ndim == 2 else q


def _neuron_layout(n_keys: int, d_head: int) -> tuple[Figure, dict[str, Axes]]:
    """q above k; k, q×k, q·k, q·k/√K and softmax side by side, sharing the key rows."""
    vector_width = d_head * max(0.08, 2.0 / d_head)  # inches; a vector panel is at least 2 inches wide
    scalar_width = 0.75
    fig = NotebookFigure(figsize=(2 * vector_width + 3 * scalar_width + 2.5, min(0.25 * n_keys + 2.5, 24.0)),
                 layout="constrained")
    grid = fig.add_gridspec(2, 5, height_ratios=[1, n_keys],
                            width_ratios=[vector_width, vector_width, scalar_width, scalar_width, scalar_width])
    axes = {"k": fig.add_subplot(grid[1, 0])}
    axes["q"] = fig.add_subplot(grid[0, 0], sharex=axes["k"])
    for column, name in enumerate(NEURON_PANELS[2:], start=1):
        axes[name] = fig.add_subplot(grid[1, column], sharey=axes["k"])
    for name, ax in axes.items():
        ax.set_label(name)
        ax.tick_params(labelleft=name == "k", left=name == "k")
    axes["q"].tick_params(labelbottom=False)
    return fig, axes


def _neuron_panel(ax: Axes, values: np.ndarray, norm: Normalize, title: str):
    image = ax.imshow(values, cmap=NEURON_CMAP, norm=norm, aspect="auto", interpolation="nearest")
    ax.set_title(title, fontsize=9, parse_math=False)
    return image


def _scalar_panel(ax: Axes, values: np.ndarray, norm: Normalize, title: str) -> None:
    """One number per key token: a coloured column with the value written in each cell."""
    _neuron_panel(ax, values[:, None], norm, title)
    ax.set_xticks([])
    for row, value in enumerate(values):
        ax.text(0, row, f"{value:.2f}", ha="center", va="center", fontsize=7)


# ---- per-sentence and per-point plots ----------------------------------------------------------------

def attention_to_word_plot(values, labels: Sequence[str], *, word: str | None = None, groups=None,
                           title: str | None = None, ax: Axes | None = None, path=None) -> Figure:
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
    return _finish(fig, path)


def pca_scatter(coords, labels=None, texts: Sequence[str] | None = None, explained=None, *,
                max_chars: int = 40, title: str | None = None, ax: Axes | None = None, path=None) -> Figure:
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
    return _finish(fig, path)


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


# ---- head statistics (Clark et al. 2019) -------------------------------------------------------------

def layer_plot(series: Mapping[str, object], ylabel: str, *, title: str | None = None,
               ax: Axes | None = None, path=None) -> Figure:
    """Per-head values by layer: a dot per head and a line through each layer's mean over heads.

    series: {legend label: [L, H] array}, all one shape; each series' dots sit a little apart within
    a layer so they do not hide each other. Layers show 1-indexed. This is the form of Clark et al.
    2019 §3's figures; special_tokens_plot, gradient_plot and entropy_plot fill it from their dicts.
    """
    if not isinstance(series, Mapping) or not series:
        raise VizError("series must be a non-empty dict {legend label: [L, H] array}.")
    arrays = _one_shape({label: _per_head(f"series[{label!r}]", v) for label, v in series.items()}, "series")
    return _layer_plot(arrays, ylabel, None, title, ax, path)


def special_tokens_plot(stats: Mapping[str, object], *, title: str | None = None, ax: Axes | None = None,
                        path=None, cls_token: str = "[CLS]", sep_token: str = "[SEP]") -> Figure:
    """Average attention to [CLS], to [SEP], to "." or "," and to everything else, by layer (Clark et al. §3).

    stats: dict with "to_cls", "to_sep", "to_punct" ([L, H] per-head averages; other keys ignored);
    "other" is 1 − their sum. cls_token, sep_token: the model's own, for the legend (model.tokenizer.cls_token:
    "<s>" and "</s>" for RoBERTa).
    """
    arrays = _statistics(stats, _named(SPECIAL_TOKENS, cls_token, sep_token), "stats")
    arrays["other"] = 1.0 - sum(arrays.values())
    return _layer_plot(arrays, "average attention", None, title, ax, path)


def gradient_plot(grads: Mapping[str, object], *, title: str | None = None, ax: Axes | None = None,
                  path=None, cls_token: str = "[CLS]", sep_token: str = "[SEP]") -> Figure:
    """Magnitude of the loss gradient w.r.t. attention to [SEP] and to other tokens, by layer (Clark et al. §3).

    grads: dict with any of "cls", "sep", "punct", "other" ([L, H] per-head average gradient
    magnitudes); each key present is drawn, in that order. cls_token, sep_token: as in special_tokens_plot.
    """
    present = {key: label for key, label in _named(GRADIENTS, cls_token, sep_token).items()
               if isinstance(grads, Mapping) and key in grads}
    if not present:
        raise VizError(f"grads must be a dict with one or more of {list(GRADIENTS)} ([L, H] arrays); "
                       f"got {sorted(grads) if isinstance(grads, Mapping) else type(grads).__name__}.")
    return _layer_plot(_statistics(grads, present, "grads"), "average attention-gradient magnitude", None,
                       title, ax, path)


def entropy_plot(stats: Mapping[str, object], *, title: str | None = None, ax: Axes | None = None,
                 path=None, cls_token: str = "[CLS]") -> Figure:
    """Entropy of each head's attention, over all query rows and over the [CLS] row, by layer (Clark et al. §3).

    stats: dict with "entropy", "cls_entropy" and "uniform_entropy" ([L, H], nats); the uniform
    baseline is drawn as a dashed line of its layer means. cls_token: as in special_tokens_plot.
    """
    arrays = _statistics(stats, {**_named(ENTROPIES, cls_token), UNIFORM_ENTROPY: "uniform"}, "stats")
    baseline = arrays.pop("uniform")
    return _layer_plot(arrays, "average attention entropy (nats)", baseline, title, ax, path)


def _layer_plot(arrays: dict[str, np.ndarray], ylabel: str, baseline: np.ndarray | None, title, ax, path) -> Figure:
    fig, ax = _axes(ax, (6.0, 4.0))
    n_layers, n_heads = next(iter(arrays.values())).shape
    layers = np.arange(1, n_layers + 1)
    spread = 0.5 / max(len(arrays), 1)
    for i, (label, values) in enumerate(arrays.items()):
        offset = (i - (len(arrays) - 1) / 2) * spread
        ax.scatter(np.repeat(layers + offset, n_heads), values.ravel(), s=10, alpha=0.5, color=f"C{i}")
        ax.plot(layers, values.mean(axis=1), color=f"C{i}", label=label)
    if baseline is not None:
        ax.plot(layers, baseline.mean(axis=1), color="0.4", linestyle="--", label="uniform")
    _one_based_ticks(ax, "x", n_layers)
    ax.set_xlabel("layer (1-indexed)")
    ax.set_ylabel(ylabel)
    ax.set_title(title or "", parse_math=False)
    _legend(ax, fontsize=8)
    return _finish(fig, path)


def _per_head(name: str, value) -> np.ndarray:
    return _check.matrix(name, value, 2, "[L, H] (layers × heads)")


def _one_shape(arrays: dict[str, np.ndarray], argument: str) -> dict[str, np.ndarray]:
    shapes = {a.shape for a in arrays.values()}
    if len(shapes) > 1:
        raise VizError(f"the arrays in {argument} must share one [L, H] shape; got "
                       f"{ {key: a.shape for key, a in arrays.items()} }.")
    return arrays


def _named(labels: Mapping[str, str], cls_token: str, sep_token: str = "[SEP]") -> dict[str, str]:
    """Legend labels with the model's special tokens in place of BERT's ("<s>" for RoBERTa's "[CLS]")."""
    return {key: label.replace("[CLS]", cls_token).replace("[SEP]", sep_token) for key, label in labels.items()}


def _statistics(stats, keys: Mapping[str, str], argument: str) -> dict[str, np.ndarray]:
    """{legend label: [L, H]} for `keys` of a head-statistics dict, checked and of one shape."""
    if not isinstance(stats, Mapping):
        raise VizError(f"{argument} must be a dict of [L, H] arrays with keys {list(keys)}; "
                       f"got {type(stats).__name__}.")
    missing = [key for key in keys if key not in stats]
    if missing:
        raise VizError(f"{argument} lacks {missing}; this figure needs {list(keys)} ([L, H] per-head averages).")
    return _one_shape({label: _per_head(f"{argument}[{key!r}]", stats[key]) for key, label in keys.items()}, argument)


def statistic_heatmap(values, name: str, *, cmap=STATISTIC_CMAP, annotate: bool = False, title: str | None = None,
                      ax: Axes | None = None, path=None) -> Figure:
    """Any per-head statistic as a layers × heads heatmap, both axes 1-indexed.

    values: [L, H]; name: what it is, for the colour bar (e.g. "attention to [SEP]").
    annotate: write each value in its cell.
    """
    return sweep_heatmap(values, name, cmap=cmap, annotate=annotate, title=title, ax=ax, path=path)


def sweep_heatmap(values, name: str, *, tokens: Sequence[str] | None = None, center: float | None = None,
                  cmap=None, annotate: bool = False, title: str | None = None, ax: Axes | None = None,
                  path=None) -> Figure:
    """A sweep's or a patching's grid: layers × heads, or layers × positions labelled with their tokens.

    values: [L, H] (ablation_sweep, head_importance, patching with per="head", compare_models) or, with
    `tokens`, [L, T] (patch_activations, attribution_patching with per="position"): one token per column.
    Layers and heads are drawn 1-indexed, the cell of 0-indexed (l, h) being head "L-H" = head_label(l, h).
    center: a value to centre a diverging colour scale on (e.g. the corrupted run's metric, or 0 for an
    effect); default: one sequential scale. annotate: write each value in its cell.
    """
    v = _check.matrix("values", values, 2, "[L, H] (layers × heads) or, with tokens, [L, T] (layers × positions)")
    columns = None if tokens is None else _strings("tokens", tokens, v.shape[1], "columns")
    fig, ax = _axes(ax, _heatmap_size(*v.shape))
    if center is None:
        norm, cmap = None, cmap or STATISTIC_CMAP
    else:
        reach = float(np.abs(v - center).max()) or 1.0
        norm, cmap = Normalize(center - reach, center + reach), cmap or NEURON_CMAP
    image = ax.imshow(v, cmap=cmap, norm=norm, aspect="auto", extent=(0.5, v.shape[1] + 0.5, v.shape[0] + 0.5, 0.5))
    _one_based_ticks(ax, "y", v.shape[0])
    ax.set_ylabel("layer (1-indexed)")
    if columns is None:
        _one_based_ticks(ax, "x", v.shape[1])
        ax.set_xlabel('head (1-indexed; cell (3, 6) is head "3-6")')
    else:
        ax.set_xticks(np.arange(1, len(columns) + 1), columns, rotation=90, parse_math=False)
        ax.set_xlabel("position (token)")
    if annotate:
        for (layer, column), value in np.ndenumerate(v):
            ax.text(column + 1, layer + 1, f"{value:.2f}", ha="center", va="center", fontsize=6, color="w")
    ax.set_title(title or name, parse_math=False)
    fig.colorbar(image, ax=ax, label=name)
    return _finish(fig, path)


def mds_scatter(coords, behaviours=None, *, n_heads: int | None = None, annotate: bool = False,
                title: str | None = None, ax: Axes | None = None, path=None) -> Figure:
    """Heads embedded in two dimensions (MDS of the Jensen–Shannon distances; Clark et al. 2019 §6).

    coords: [L*H, 2], head (l, h) at row l*H + h (0-indexed). Colour: layer (1-indexed colour bar).
    behaviours: [L, H] labels such as "broad", "next", "[SEP]" ("" or None for none), one marker
    each; n_heads: H, needed when behaviours is None. annotate: write "L-H" (1-indexed) by each point.
    """
    xy = _check.matrix("coords", coords, 2, "[L*H, 2] (heads × two dimensions)")
    kinds = _behaviours(behaviours, n_heads, xy.shape)
    layer_of = np.arange(xy.shape[0]) // kinds.shape[1]
    fig, ax = _axes(ax, (6.5, 5.0))
    norm = Normalize(1, kinds.shape[0])
    flat = kinds.ravel()
    named = sorted(set(flat) - {""})
    markers = {"": "o", **{kind: BEHAVIOUR_MARKERS[i % len(BEHAVIOUR_MARKERS)] for i, kind in enumerate(named)}}
    for kind in [""] * ("" in flat) + named:
        chosen = flat == kind
        image = ax.scatter(xy[chosen, 0], xy[chosen, 1], c=layer_of[chosen] + 1, cmap=LAYER_CMAP, norm=norm,
                           marker=markers[kind], s=60 if kind else 25, edgecolors="k", linewidths=0.4,
                           label=kind or "no behaviour")
    if annotate:
        for row, (x, y) in enumerate(xy):
            ax.annotate(head_label(*divmod(row, kinds.shape[1])), (x, y), xytext=(3, 3), textcoords="offset points",
                        fontsize=6)
    if named:
        _legend(ax, fontsize=8)
    colorbar = fig.colorbar(image, ax=ax, label="layer (1-indexed)")
    colorbar.set_ticks(np.arange(1, kinds.shape[0] + 1))
    ax.set_title(title or "heads by attention similarity (MDS)", parse_math=False)
    return _finish(fig, path)


def _behaviours(behaviours, n_heads: int | None, coords_shape: tuple[int, ...]) -> np.ndarray:
    """[L, H] behaviour labels as strings ("" for none), consistent with coords [L*H, 2] and n_heads."""
    if coords_shape[1] != 2:
        raise VizError(f"coords must be [L*H, 2], two dimensions per head; got shape {coords_shape}.")
    if behaviours is None:
        if isinstance(n_heads, bool) or not isinstance(n_heads, (int, np.integer)) or n_heads < 1:
            raise VizError(f"pass n_heads (H, heads per layer) or behaviours [L, H], so the {coords_shape[0]} rows "
                           f"of coords can be split into layers; got n_heads={n_heads!r}.")
        behaviours = np.full((coords_shape[0] // n_heads, n_heads), "")
    kinds = np.asarray([["" if b is None else str(b) for b in row] for row in np.asarray(behaviours, dtype=object)])
    if kinds.ndim != 2 or kinds.size != coords_shape[0] or n_heads not in (None, kinds.shape[1]):
        raise VizError(f"coords has {coords_shape[0]} rows, which must be L*H with behaviours [L, H] and n_heads = H; "
                       f"got behaviours of shape {np.shape(behaviours)} and n_heads={n_heads!r}.")
    return kinds


def head_statistics_figure(mean: Mapping[str, object], *, title: str | None = None, path=None,
                           cls_token: str = "[CLS]", sep_token: str = "[SEP]") -> Figure:
    """The main head statistics in one figure: special-token attention and entropy by layer (top),
    and a layers × heads heatmap of each positional statistic present ("prev", "next", "self"; bottom).

    mean: dict of [L, H] per-head averages with at least "to_cls", "to_sep", "to_punct", "entropy",
    "cls_entropy" and "uniform_entropy". cls_token, sep_token: as in special_tokens_plot.
    """
    _statistics(mean, {**SPECIAL_TOKENS, **ENTROPIES, UNIFORM_ENTROPY: "uniform"}, "mean")
    positional = [key for key in POSITIONAL if key in mean]
    fig = NotebookFigure(figsize=(12.0, 9.0 if positional else 4.5), layout="constrained")
    top, bottom = fig.subfigures(2, 1) if positional else (fig, None)
    left, right = top.subplots(1, 2)
    special_tokens_plot(mean, ax=left, title="attention to special tokens", cls_token=cls_token, sep_token=sep_token)
    entropy_plot(mean, ax=right, title="attention entropy", cls_token=cls_token)
    if positional:
        for key, ax in zip(positional, bottom.subplots(1, len(positional), squeeze=False)[0]):
            statistic_heatmap(mean[key], POSITIONAL[key], ax=ax, title=key)
    fig.suptitle(title or "head statistics", parse_math=False)
    return _finish(fig, path)
