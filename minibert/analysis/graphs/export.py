"""A pruned graph as JSON in circuit-tracer's frontend format (its frontend/graph_models.py and
utils/create_graph_files.py: {metadata, qParams, nodes, links}), so its viewer and Neuronpedia-style tools open it.

Node ids as circuit-tracer writes them: a feature "{layer}_{latent}_{position}", an error "err_{layer}_{position}"
(ours: circuit-tracer's "0_{layer}_{position}" is also the id of feature `layer` at layer 0 and that position),
a token embedding "E_{token id}_{position}", a target "{L + 1}_{id}_{position}" with id the token's for a masked-LM
target and vocab_size + k for the k-th other target (circuit-tracer's virtual index for a target that is not
one token). Ours: a target's ctx_idx is its [MASK]'s position (a masked-LM target) or 0 (the others read the
whole row); the viewer's "cross layer transcoder" feature type is kept for our per-layer transcoders, as
circuit-tracer writes it for its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from minibert.analysis.graphs.pruning import prune, unpruned
from minibert.errors import AnalysisError
from minibert.io.files import output_path, write_output


def _cantor(x: int, y: int) -> int:
    return (x + y) * (x + y + 1) // 2 + y


def _node(graph, index: int, influence: float, vocab_size: int) -> dict:
    common = {"token_prob": 0.0, "is_target_logit": False, "run_idx": 0, "reverse_ctx_idx": 0, "clerp": "",
              "influence": float(influence), "activation": None}
    if index < graph.n_features:
        layer, pos, latent = (int(v) for v in graph.active_features[index])
        return common | {"node_id": f"{layer}_{latent}_{pos}", "feature": _cantor(layer, latent), "layer": str(layer),
                         "ctx_idx": pos, "feature_type": "cross layer transcoder", "jsNodeId": f"{layer}_{latent}-0",
                         "activation": float(graph.activations[index])}
    if index < graph.error_slice.stop:
        layer, pos = divmod(index - graph.n_features, graph.n_pos)
        return common | {"node_id": f"err_{layer}_{pos}", "feature": -1, "layer": str(layer), "ctx_idx": pos,
                         "feature_type": "mlp reconstruction error", "jsNodeId": f"{layer}_{pos}-0"}
    if index < graph.token_slice.stop:
        pos = index - graph.error_slice.stop
        vocab = int(graph.input_ids[pos])
        return common | {"node_id": f"E_{vocab}_{pos}", "feature": pos, "layer": "E", "ctx_idx": pos,
                         "feature_type": "embedding", "jsNodeId": f"E_{vocab}-{pos}"}
    k = index - graph.token_slice.stop
    target = graph.targets[k] if graph.targets else None
    is_mlm = target is not None and "token" in target.arrays and "position" in target.arrays
    vocab = int(target.arrays["token"]) if is_mlm else vocab_size + k
    pos = int(target.arrays["position"]) if is_mlm else 0
    layer = str(graph.n_layers + 1)
    weight = float(graph.target_weights[k])
    return common | {"node_id": f"{layer}_{vocab}_{pos}", "feature": vocab, "layer": layer, "ctx_idx": pos,
                     "feature_type": "logit", "token_prob": weight, "is_target_logit": k == 0,
                     "jsNodeId": f"L_{vocab}-{pos}", "clerp": f"{graph.target_labels[k]} (weight {weight:.3f})",
                     "influence": None}


def graph_json(graph, *, slug: str, scan: str = "minibert", prompt: str | None = None, node_threshold: float = 0.8,
               edge_threshold: float = 0.98, vocab_size: int | None = None) -> dict:
    """The graph pruned (pruning.prune) as circuit-tracer's frontend dict; "prompt" is the input's text
    (graph.prompt) unless `prompt` is given."""
    unpruned(graph, "graph_json and write_json")
    if not isinstance(slug, str) or not slug:
        raise AnalysisError("slug must be a non-empty name for the graph (its file is <slug>.json).")
    prompt = graph.prompt if prompt is None else prompt
    if not isinstance(prompt, str):
        raise AnalysisError(f"prompt is the input's text shown by the viewer, a str; got {type(prompt).__name__}.")
    pruned = prune(graph, node_threshold, edge_threshold)
    vocab_size = vocab_size if vocab_size is not None else graph.vocab_size
    nodes = {int(i): _node(graph, int(i), pruned.cumulative_scores[i], vocab_size)
             for i in np.flatnonzero(pruned.node_mask)}
    rows, cols = np.nonzero(pruned.edge_mask)
    links = [{"source": nodes[c]["node_id"], "target": nodes[r]["node_id"], "weight": float(graph.adjacency[r, c])}
             for r, c in zip(rows.tolist(), cols.tolist()) if r in nodes and c in nodes]
    connected = {link["source"] for link in links} | {link["target"] for link in links}
    used = [node for node in nodes.values() if node["node_id"] in connected
            or node["feature_type"] in ("embedding", "logit")]
    metadata = {"slug": slug, "scan": scan, "transcoder_list": [], "prompt_tokens": list(graph.tokens),
                "prompt": prompt, "node_threshold": float(node_threshold), "schema_version": 1}
    qparams = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}
    return {"metadata": metadata, "qParams": qparams, "nodes": used, "links": links}


def write_json(graph, path, *, slug: str, overwrite: bool = False, **options) -> Path:
    """graph_json(graph, slug=…, **options) written to `path` (missing folders created); an existing file is
    refused unless overwrite=True."""
    path = output_path(path, (".json",), AnalysisError, overwrite=overwrite)  # the rule of every minibert writer
    text = json.dumps(graph_json(graph, slug=slug, **options), indent=2)
    return write_output(path, lambda p: p.write_text(text), AnalysisError)
