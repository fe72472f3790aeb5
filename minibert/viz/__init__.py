"""Attention views: interactive HTML (head, model, neuron; offline, self-contained) and matplotlib figures.

    from minibert import viz
    doc = viz.document(model, "The cat sat.", "It was tired.")   # runs the model once
    doc.head_view(layer=2)                                        # shows inline in a notebook
    viz.model_view(tokens, attention, sentence_b_start).save("model_view.html")
    viz.figures.attention_heatmap(doc.attention[2, 5], doc.tokens)   # a matplotlib Figure
    viz.explore(model)                                            # the live workbench, as a notebook widget
"""

# circuits: circuit graphs, faithfulness curves, token text (analysis.circuits)
from minibert.viz import circuits, features, figures  # features: the SAE feature browser (viz.features.feature_browser)
from minibert.viz._check import VizError
from minibert.viz._html import View
from minibert.viz.explore import explore  # the live workbench as a notebook widget (needs anywidget)
from minibert.viz.views import Document, document, head_view, model_view, neuron_view

__all__ = ["Document", "View", "VizError", "circuits", "document", "explore", "features", "figures", "head_view",
           "model_view", "neuron_view"]
