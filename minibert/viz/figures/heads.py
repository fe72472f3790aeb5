"""Per-head values (Clark et al. 2019, "What Does BERT Look At?"): by layer, a dot per head; layers × heads
heatmaps of a statistic or a sweep; the heads placed by MDS; and the head statistics in one figure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from minibert.core.config import head_label
from minibert.viz import _check
from minibert.viz._check import VizError
from minibert.viz.figures._base import (
    NEURON_CMAP,
    NotebookFigure,
    _axes,
    _finish,
    _heatmap_size,
    _legend,
    _one_based_ticks,
    _strings,
)

STATISTIC_CMAP = "viridis"
LAYER_CMAP = "viridis"
BEHAVIOUR_MARKERS = ("^", "s", "D", "v", "P", "X", "*", "<", ">", "p")

# Keys of the head-statistics dicts ([L, H] arrays, per-document averages of docs/definitions.md) → legend labels.
SPECIAL_TOKENS = {"to_cls": "[CLS]", "to_sep": "[SEP]", "to_punct": ". or ,"}
GRADIENTS = {"cls": "[CLS]", "sep": "[SEP]", "punct": ". or ,", "other": "other"}
ENTROPIES = {"entropy": "all tokens", "cls_entropy": "[CLS] row"}
UNIFORM_ENTROPY = "uniform_entropy"
POSITIONAL = {"prev": "attention to the previous token", "next": "attention to the next token",
              "self": "attention to the token itself"}



def layer_plot(series: Mapping[str, object], ylabel: str, *, title: str | None = None,
               ax: Axes | None = None, path=None, overwrite: bool = False) -> Figure:
    """Per-head values by layer: a dot per head and a line through each layer's mean over heads.

    series: {legend label: [L, H] array}, all one shape; each series' dots sit a little apart within
    a layer so they do not hide each other. Layers show 1-indexed. This is the form of Clark et al.
    2019 §3's figures; special_tokens_plot, gradient_plot and entropy_plot fill it from their dicts.
    """
    if not isinstance(series, Mapping) or not series:
        raise VizError("series must be a non-empty dict {legend label: [L, H] array}.")
    arrays = _one_shape({label: _per_head(f"series[{label!r}]", v) for label, v in series.items()}, "series")
    return _layer_plot(arrays, ylabel, None, title, ax, path, overwrite)


def special_tokens_plot(stats: Mapping[str, object], *, title: str | None = None, ax: Axes | None = None,
                        path=None, overwrite: bool = False, cls_token: str = "[CLS]",
                        sep_token: str = "[SEP]") -> Figure:
    """Average attention to [CLS], to [SEP], to "." or "," and to everything else, by layer (Clark et al. §3).

    stats: dict with "to_cls", "to_sep", "to_punct" ([L, H] per-head averages; other keys ignored);
    "other" is 1 − their sum. cls_token, sep_token: the model's own, for the legend (model.tokenizer.cls_token:
    "<s>" and "</s>" for RoBERTa).
    """
    arrays = _statistics(stats, _named(SPECIAL_TOKENS, cls_token, sep_token), "stats")
    arrays["other"] = 1.0 - sum(arrays.values())
    return _layer_plot(arrays, "average attention", None, title, ax, path, overwrite)


def gradient_plot(grads: Mapping[str, object], *, title: str | None = None, ax: Axes | None = None,
                  path=None, overwrite: bool = False, cls_token: str = "[CLS]", sep_token: str = "[SEP]") -> Figure:
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
                       title, ax, path, overwrite)


def entropy_plot(stats: Mapping[str, object], *, title: str | None = None, ax: Axes | None = None,
                 path=None, overwrite: bool = False, cls_token: str = "[CLS]") -> Figure:
    """Entropy of each head's attention, over all query rows and over the [CLS] row, by layer (Clark et al. §3).

    stats: dict with "entropy", "cls_entropy" and "uniform_entropy" ([L, H], nats); the uniform
    baseline is drawn as a dashed line of its layer means. cls_token: as in special_tokens_plot.
    """
    arrays = _statistics(stats, {**_named(ENTROPIES, cls_token), UNIFORM_ENTROPY: "uniform"}, "stats")
    baseline = arrays.pop("uniform")
    return _layer_plot(arrays, "average attention entropy (nats)", baseline, title, ax, path, overwrite)


def _layer_plot(arrays: dict[str, np.ndarray], ylabel: str, baseline: np.ndarray | None, title, ax, path,
                overwrite: bool = False) -> Figure:
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
    return _finish(fig, path, overwrite)


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
                      ax: Axes | None = None, path=None, overwrite: bool = False) -> Figure:
    """Any per-head statistic as a layers × heads heatmap, both axes 1-indexed.

    values: [L, H]; name: what it is, for the colour bar (e.g. "attention to [SEP]").
    annotate: write each value in its cell.
    """
    return sweep_heatmap(values, name, cmap=cmap, annotate=annotate, title=title, ax=ax, path=path,
                         overwrite=overwrite)


def sweep_heatmap(values, name: str, *, tokens: Sequence[str] | None = None, center: float | None = None,
                  cmap=None, annotate: bool = False, title: str | None = None, ax: Axes | None = None,
                  path=None, overwrite: bool = False) -> Figure:
    """A sweep's or a patching's grid: layers × heads, or layers × positions labelled with their tokens.

    values: [L, H] (ablation_sweep, head_importance, patching with per="head", compare_models) or, with
    `tokens`, [L, T] (patch_activations, attribution_patching with per="position"): one token per column.
    Layers and heads are drawn 1-indexed, the cell of 0-indexed (l, h) being head "L-H" = head_label(l, h).
    center: a value to centre a diverging colour scale on (e.g. the corrupted run's metric, or 0 for an
    effect); default: one sequential scale. annotate: write each value in its cell.
    """
    v = _check.matrix("values", values, 2, "[L, H] (layers × heads) or, with tokens, [L, T] (layers × positions)")
    center = None if center is None else _check.number("center", center)
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
    return _finish(fig, path, overwrite)


def mds_scatter(coords, behaviours=None, *, n_heads: int | None = None, annotate: bool = False,
                title: str | None = None, ax: Axes | None = None, path=None, overwrite: bool = False) -> Figure:
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
    return _finish(fig, path, overwrite)


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


def head_statistics_figure(mean: Mapping[str, object], *, title: str | None = None, path=None, overwrite: bool = False,
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
    return _finish(fig, path, overwrite)
