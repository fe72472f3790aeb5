"""The neuron view on paper (bertviz's): how one query's attention is computed, q and k to the softmax."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from minibert.viz import _check
from minibert.viz._check import VizError
from minibert.viz.figures._base import NEURON_CMAP, NotebookFigure, _finish, _tick_labels
from minibert.viz.views import neuron_softmax

NEURON_PANELS = ("q", "k", "q×k", "q·k", "q·k/√K", "softmax")  # each panel's Axes label (ax.get_label())


def neuron_figure(q, k, tokens: Sequence[str], query_index: int = 0, *, title: str | None = None,
                  path=None, overwrite: bool = False) -> Figure:
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
    return _finish(fig, path, overwrite)


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



def _symmetric_norm(values: np.ndarray) -> Normalize:
    """A scale centred on 0 (white in NEURON_CMAP) that reaches the largest magnitude."""
    limit = float(np.abs(values).max()) or 1.0
    return Normalize(-limit, limit)
