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

One module per kind of figure: attention (matrices), neuron (the neuron view), points (per sentence or point),
heads (per-head values); _base holds what they share.
"""

from __future__ import annotations

from minibert.core.config import head_label  # figures.head_label: the tutorials and docs/findings.py read it here too
from minibert.viz.figures._base import NEURON_CMAP, SUFFIXES, NotebookFigure, save
from minibert.viz.figures.attention import attention_heatmap, head_grid
from minibert.viz.figures.heads import (
    entropy_plot,
    gradient_plot,
    head_statistics_figure,
    layer_plot,
    mds_scatter,
    special_tokens_plot,
    statistic_heatmap,
    sweep_heatmap,
)
from minibert.viz.figures.neuron import NEURON_PANELS, neuron_figure, neuron_terms
from minibert.viz.figures.points import attention_to_word_plot, pca_scatter

__all__ = ["NEURON_CMAP", "NEURON_PANELS", "SUFFIXES", "NotebookFigure", "attention_heatmap",
           "attention_to_word_plot", "entropy_plot", "gradient_plot", "head_grid", "head_label",
           "head_statistics_figure", "layer_plot", "mds_scatter", "neuron_figure", "neuron_terms", "pca_scatter",
           "save", "special_tokens_plot", "statistic_heatmap", "sweep_heatmap"]
