"""Attention matrices: one head's heatmap, and a layers × heads grid of them on one colour scale."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from minibert.core.config import head_label
from minibert.viz import _check
from minibert.viz._check import VizError
from minibert.viz.figures._base import NotebookFigure, _axes, _finish, _heatmap_size, _strings, _tick_labels

ATTENTION_CMAP = "Blues"
MAX_TICKED_TOKENS = 40  # head_grid labels its thumbnails with tokens up to this length; beyond, they would overlap


def attention_heatmap(attention, tokens: Sequence[str], tokens_to: Sequence[str] | None = None, *,
                      title: str | None = None, vmax: float | None = None, cmap=ATTENTION_CMAP,
                      ax: Axes | None = None, path=None, overwrite: bool = False) -> Figure:
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
    top = a.max() if vmax is None else _check.number("vmax", vmax, positive=True)
    fig, ax = _axes(ax, _heatmap_size(*a.shape))
    image = ax.imshow(a, cmap=cmap, vmin=0.0, vmax=top)
    _tick_labels(ax, "x", cols, rotation=90)
    _tick_labels(ax, "y", rows)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(title or "", parse_math=False)
    fig.colorbar(image, ax=ax, label="attention")
    return _finish(fig, path, overwrite)


def head_grid(attention, tokens: Sequence[str], *, layers: Sequence[int] | None = None,
              heads: Sequence[int] | None = None, vmax: float | None = None, cmap=ATTENTION_CMAP,
              title: str | None = None, path=None, overwrite: bool = False) -> Figure:
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
    norm = Normalize(0.0, shown.max() if vmax is None else _check.number("vmax", vmax, positive=True))
    for (i, layer), (j, head) in product(enumerate(rows), enumerate(cols)):
        image = grid[i, j].imshow(a[layer, head], cmap=cmap, norm=norm)
        grid[i, j].set_title(head_label(layer, head), fontsize=9)
    _grid_ticks(grid, tokens)
    fig.colorbar(image, ax=grid, shrink=0.6, label="attention")
    fig.suptitle(title or "attention by layer-head (1-indexed)", parse_math=False)
    return _finish(fig, path, overwrite)


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

