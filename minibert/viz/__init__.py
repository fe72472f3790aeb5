"""Attention views: interactive HTML (head, model, neuron; offline, self-contained) and matplotlib figures.

    from minibert import viz
    doc = viz.document(model, "The cat sat.", "It was tired.")   # runs the model once
    doc.head_view(layer=2)                                        # shows inline in a notebook
    viz.model_view(tokens, attention, sentence_b_start).save("model_view.html")
    viz.figures.attention_heatmap(doc.attention[2, 5], doc.tokens)   # a matplotlib Figure
    viz.explore(model)                                            # the live workbench, as a notebook widget
"""

import importlib

from minibert.viz._check import VizError
from minibert.viz._html import View
from minibert.viz.explore import explore  # the live workbench as a notebook widget (needs anywidget)
from minibert.viz.views import Document, document, head_view, model_view, neuron_view

# Modules imported when first used (viz.figures.…): they bring matplotlib and the SAE code, ~1-2 s that the views
# and minibert serve's start need not pay. circuits: circuit graphs, faithfulness curves, token text (analysis.
# circuits); features: the SAE feature browser (viz.features.feature_browser); figures: matplotlib figures;
# graphs: attribution graphs (analysis.graphs).
LATER = ("circuits", "features", "figures", "graphs")


def __getattr__(name: str):
    if name not in LATER:
        raise AttributeError(f"module 'minibert.viz' has no attribute {name!r}")
    return importlib.import_module(f"minibert.viz.{name}")  # importing it sets the attribute: asked once

__all__ = ["Document", "View", "VizError", "circuits", "document", "explore", "features", "figures", "graphs",
           "head_view", "model_view", "neuron_view"]
