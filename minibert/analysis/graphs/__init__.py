"""Attribution graphs for encoders (docs/graphs.md): the local replacement model of one input, its graph of
features, error nodes and token embeddings feeding each other and a target, pruning, interventions, export.

    from minibert.analysis import graphs
    text = "the capital of france is [MASK]."
    graph = graphs.attribute(model, text, transcoders, graphs.mlm_target(model, text, token="paris"))
    pruned = graphs.prune(graph, node_threshold=0.8, edge_threshold=0.98)
    graphs.graph_scores(graph)                      # (replacement score, completeness score)
    graphs.intervene(model, text, transcoders, graph, {(2, 5, 117): 0.0})   # real-model change vs the graph's
    graphs.write_json(graph, "graph.json", slug="capital")                     # circuit-tracer's frontend format
"""

from minibert.analysis.graphs.attribution import AttributionGraph, attribute
from minibert.analysis.graphs.export import graph_json, write_json
from minibert.analysis.graphs.interventions import InterventionResult, intervene, predicted_change
from minibert.analysis.graphs.pruning import PrunedGraph, graph_scores, prune
from minibert.analysis.graphs.replacement import check_transcoders, mlp_input_site
from minibert.analysis.graphs.targets import Target, class_target, direction_target, mlm_target

__all__ = ["AttributionGraph", "InterventionResult", "PrunedGraph", "Target", "attribute", "check_transcoders",
           "class_target", "direction_target", "graph_json", "graph_scores", "intervene", "mlm_target",
           "mlp_input_site", "predicted_change", "prune", "write_json"]
