"""Circuits for encoders: token attributions, direct attribution per head, edge attribution patching,
circuits and their faithfulness (docs/circuits.md has the definitions).

    from minibert.analysis import circuits
    circuits.token_attribution(model, texts, metric)            # per-token scores [B, T]
    circuits.direct_attribution(model, texts, metric).heads     # each head's direct effect [L, H]
    graph = circuits.edge_attribution(model, clean, corrupted, metric, method="eap-ig")
    circuits.head_scores(graph)                                  # each head's summed |edge score| [L, H]
    circuits.circuit_faithfulness(model, clean, corrupted, metric, graph.sweep([10, 50, 200])).values
"""

from minibert.analysis.circuits.direct import DirectAttribution, direct_attribution
from minibert.analysis.circuits.edges import (
    Circuit,
    CircuitGraph,
    Faithfulness,
    circuit_faithfulness,
    edge_attribution,
    head_scores,
    path_patching,
)
from minibert.analysis.circuits.tokens import TokenAttribution, integration_points, token_attribution

__all__ = ["Circuit", "CircuitGraph", "DirectAttribution", "Faithfulness", "TokenAttribution", "circuit_faithfulness",
           "direct_attribution", "edge_attribution", "head_scores", "path_patching", "integration_points",
           "token_attribution"]
