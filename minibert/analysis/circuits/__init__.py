"""Circuits for encoders: token attributions, direct attribution per head, edge attribution patching,
circuits and their faithfulness (docs/circuits.md has the definitions).

    from minibert.analysis import circuits
    circuits.token_attribution(model, texts, metric)            # per-token scores [B, T]
    circuits.direct_attribution(model, texts, metric).heads     # each head's direct effect [L, H]
"""

from minibert.analysis.circuits.direct import DirectAttribution, direct_attribution
from minibert.analysis.circuits.tokens import TokenAttribution, integration_points, token_attribution

__all__ = ["DirectAttribution", "TokenAttribution", "direct_attribution", "integration_points", "token_attribution"]
