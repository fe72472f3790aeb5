"""What every figure shares: saving by suffix, the Figure that shows itself in a notebook, an Axes of one's own or
the caller's, tick labels drawn literally, and the legend in the emptiest corner."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import LinearSegmentedColormap
from matplotlib.figure import Figure, SubFigure

from minibert.io.files import output_path, write_output
from minibert.viz._check import VizError

SUFFIXES = (".png", ".svg", ".pdf")
PNG_DPI = 200
# bertviz's neuron-view colours: negative orange, zero white, positive blue (also sweep_heatmap's diverging scale).
NEURON_CMAP = LinearSegmentedColormap.from_list("minibert_neuron", ["#e66101", "#ffffff", "#2166ac"])


def figure_path(path, overwrite: bool = False) -> Path:
    """`path` checked as a figure file to write (.png, .svg or .pdf) by the rule of every minibert writer
    (io.files.output_path): figure writers call it before drawing, save() again before writing."""
    return output_path(path, SUFFIXES, VizError, overwrite=overwrite)


def save(fig: Figure, path, overwrite: bool = False) -> Path:
    """Write `fig` to `path` in the format its suffix names (.png at 200 dpi, .svg, .pdf); returns the path. A file
    already there is the user's: it is replaced only with overwrite=True, as every minibert writer does."""
    path = figure_path(path, overwrite)
    return write_output(path, lambda p: fig.savefig(p, dpi=PNG_DPI, bbox_inches="tight"), VizError)


class NotebookFigure(Figure):
    """The Figure every figure function returns: one that shows itself in Jupyter.

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


def _finish(fig, path, overwrite: bool = False) -> Figure:
    if path is not None:
        save(fig, path, overwrite)
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


def _strings(name: str, values, n: int, what: str = "rows") -> list[str]:
    """N strings (legend labels, sentences, key tokens), one per row (or column) of the data."""
    if isinstance(values, str) or not hasattr(values, "__len__"):
        raise VizError(f"{name} must be a list of {n} strings; got {type(values).__name__}.")
    if len(values) != n:
        raise VizError(f"{name} has {len(values)} entries but the data has {n} {what}; pass one per {what[:-1]}.")
    return [str(v) for v in values]


def _heatmap_size(n_rows: int, n_cols: int) -> tuple[float, float]:
    return min(2.5 + 0.28 * n_cols, 18.0), min(1.8 + 0.28 * n_rows, 18.0)
