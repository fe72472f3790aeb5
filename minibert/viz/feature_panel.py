"""The workbench's "features" panel (issue 38): the transcoder latents (docs/transcoders.md) active at each token of
the text as typed, and, for one feature clicked, what it feeds in the attribution graph (docs/graphs.md) of the
"why" panel's target — computed only when the page asks (`features`), after the run's tokens and views.

    minibert serve --model M --transcoder out/tc-0 --transcoder out/tc-1 …     # one per layer, transcoders.save's

Features: each transcoder's latents f = σ(x W_enc + b_enc) at its block's MLP input x (one compiled program per
length bucket captures every such x), the TOP_FEATURES largest per position over all layers. What a feature feeds:
its column of graphs.attribute's adjacency (the direct effect of its write on every later feature's
pre-activation and on the target), the TOP_EDGES largest by |weight|, each marked kept or not by graphs.prune.
The graph needs a transcoder at every block and a target it can read: the logit of the predicted class (a
sequence classifier) or of the top guess at the first [MASK] (a masked LM), as the "why" panel explains; a model
with neither (a sentence encoder such as MiniLM) explains its sentence vector's length along its own direction,
⟨s, s/|s|⟩ (graphs.direction_target; s pooled as the model pools, mean where it pools otherwise); one graph
per text is kept (GRAPHS_KEPT), and texts over GRAPH_MAX_TOKENS tokens or GRAPH_MAX_FEATURES active features get
a message instead, so that an answer stays within seconds on a small model.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from minibert.analysis import graphs
from minibert.analysis import transcoders as tc
from minibert.analysis._finite import check_finite_params
from minibert.analysis.corpus.result import weights_digest
from minibert.errors import AnalysisError, InputError
from minibert.runtime.buckets import cut as cut_to_length
from minibert.viz._panel import Panel

TOP_FEATURES = 6  # features listed per token, by activation
TOP_EDGES = 8  # edges listed out of a clicked feature, by |weight|
GRAPH_MAX_TOKENS = 32  # the graph's rows grow with tokens × features: longer texts list features only
GRAPH_MAX_FEATURES = 1024  # active features (over every layer and position) a graph is built over at most
GRAPHS_KEPT = 2  # graphs cached (per text and target): clicking features of one text reuses its graph

HINT = ("No transcoders loaded. Train one per layer (docs/transcoders.md: transcoders.Trainer, then "
        "transcoders.save(\"out/tc-0\", …)) and start the workbench with them: minibert serve --model MODEL "
        "--transcoder out/tc-0 --transcoder out/tc-1 … (one per layer).")


class LoadedTranscoders:
    """A workbench's transcoders, each checked against its model at start-up, by layer; and its cached graphs."""

    def __init__(self, model, pairs: Sequence[tuple]):
        by_layer: dict[int, tuple] = {}
        for config, params in pairs:
            if config.weights is not None and weights_digest(model) != config.weights:  # the CLI has no other_weights
                raise InputError(f"the transcoder of layer {config.layer} was trained on the model weights "
                                 f"{config.weights}, and --model's are {weights_digest(model)}: the workbench serves "
                                 f"a transcoder only with the model it was trained on; pass that model as --model "
                                 f"(or, in Python, graphs.attribute(..., other_weights=True) splices it into these "
                                 f"weights on purpose).")
            tc.checked_site(model, config)  # another family's site or other widths: refused here
            if config.layer in by_layer:
                raise InputError(f"two transcoders for layer {config.layer}: pass one --transcoder per layer.")
            by_layer[config.layer] = (config, params)
        self.model, self.by_layer = model, dict(sorted(by_layer.items()))
        self.graphs: collections.OrderedDict = collections.OrderedDict()
        self.lock = threading.Lock()

    @property
    def complete(self) -> bool:
        """Whether there is one at every block: the attribution graph replaces every MLP."""
        return len(self.by_layer) == self.model.config.num_hidden_layers


def load_transcoders(model, paths: Sequence) -> LoadedTranscoders:
    """--transcoder's directories (or their cfg.json), read with transcoders.load and checked against `model`: a
    missing file, or a transcoder of another model or site, is refused with what to pass instead."""
    pairs = []
    for path in paths:
        path = Path(path)
        if path.is_file() and path.name == "cfg.json":
            path = path.parent
        if not path.exists():
            raise InputError(f"--transcoder {path}: no such file or directory; pass a directory transcoders.save "
                             f"wrote (cfg.json and sae_weights.safetensors).")
        try:
            pairs.append(tc.load(path))
            check_finite_params(pairs[-1][1], "the transcoder")
        except AnalysisError as error:
            raise InputError(f"--transcoder {path}: {error}") from None
    try:
        return LoadedTranscoders(model, pairs)
    except AnalysisError as error:
        raise InputError(f"--transcoder: {error}") from None


def _mlp_inputs(workbench, loaded: LoadedTranscoders, request) -> dict[int, np.ndarray]:
    """{layer: x [T, D]}: every transcoder's MLP input for the text, from one program per length bucket."""
    names = {layer: tc.sites(workbench.model, layer)[0] for layer in loaded.by_layer}
    padded = workbench.padded_inputs(request)
    length = int(np.asarray(workbench.cached_run(request).ids).shape[0])
    with workbench.compiling("features", padded["input_ids"].shape[1]):
        _, cache = workbench.model.run(padded, names=list(names.values()))
    return {layer: np.asarray(cut_to_length(name, cache[name], length))[0] for layer, name in names.items()}


def activations(workbench, loaded: LoadedTranscoders, request) -> dict[int, np.ndarray]:
    """{layer: f [T, S]}: each transcoder's latents at every token of the request's text."""
    return {layer: np.asarray(tc.encode(*loaded.by_layer[layer], x))
            for layer, x in _mlp_inputs(workbench, loaded, request).items()}


def top_features(f: Mapping[int, np.ndarray], k: int = TOP_FEATURES) -> list[list[dict]]:
    """Per position, the k largest active latents over every layer: [{layer, latent, activation}], largest first
    (ties: lower layer, then lower latent)."""
    layers = sorted(f)
    stacked = np.stack([f[layer] for layer in layers], axis=1)  # [T, L', S]
    out = []
    for row in stacked:
        flat = row.reshape(-1)
        order = np.argsort(-flat, kind="stable")[:k]
        out.append([{"layer": layers[i // row.shape[1]], "latent": int(i % row.shape[1]),
                     "activation": float(flat[i])} for i in order if flat[i] > 0])
    return out


def graph_target(model, run, batch):
    """(graphs.Target, what it is in words) the "why" panel explains, where a graph can read it; else (None, a
    hint). batch: the run's text, tokenized."""
    heads, tokenizer = model.config.heads, model.tokenizer
    if heads.classifier == "sequence":
        c = int(np.argmax(run.logits))
        return graphs.class_target(c), f"the logit of the predicted class “{model.config.id2label[c]}”"
    if heads.mlm and (run.ids == tokenizer.mask_token_id).any():
        position = int(np.flatnonzero(run.ids == tokenizer.mask_token_id)[0])
        token = int(np.argmax(run.logits[position]))
        return (graphs.mlm_target(model, batch, token, position=position),
                f"the top guess's logit at the first [MASK] (position {position})")
    if heads.mlm:
        return None, f"Put {tokenizer.mask_token} in the text: the graph then explains the model's top guess there."
    # no head to explain (a sentence encoder): the sentence vector's length along its own direction, u = s / |s|
    mode = (model.pooling or {}).get("mode")
    pooling = mode if mode in ("mean", "cls") else "mean"
    hidden = np.asarray(model(batch).last_hidden_state, np.float64)[0]
    vector = hidden[0] if pooling == "cls" else hidden.mean(0)
    norm = float(np.linalg.norm(vector))
    if not norm > 0:
        return None, "The sentence vector of this text is 0: there is no direction to explain; change the text."
    return (graphs.direction_target(vector / norm, pooling),
            f"the sentence vector's length along its own direction ({pooling}-pooled last hidden state)")


def _graph(workbench, loaded: LoadedTranscoders, request, run, batch, target, described):
    key = (request.text, request.pair, described)
    with loaded.lock:
        if key in loaded.graphs:
            loaded.graphs.move_to_end(key)
            return loaded.graphs[key]
    pairs = [loaded.by_layer[layer] for layer in range(workbench.model.config.num_hidden_layers)]
    with workbench.compiling("graph", len(run.tokens)):
        graph = graphs.attribute(workbench.model, batch, pairs, target)
    try:
        pruned = graphs.prune(graph)
    except AnalysisError:  # nothing left after pruning: every edge counts as not kept
        pruned = None
    with loaded.lock:
        loaded.graphs[key] = (graph, pruned)
        while len(loaded.graphs) > GRAPHS_KEPT:
            loaded.graphs.popitem(last=False)
    return graph, pruned


def _node(graph, index: int) -> dict:
    """One node of the graph as the page shows it: kind, layer, position, latent (0-indexed), label."""
    if index < graph.n_features:
        layer, position, latent = (int(v) for v in graph.active_features[index])
        return {"kind": "feature", "layer": layer, "position": position, "latent": latent,
                "label": graph.node_label(index)}
    if index < graph.error_slice.stop:
        layer, position = divmod(index - graph.n_features, graph.n_pos)
        return {"kind": "error", "layer": layer, "position": position, "label": graph.node_label(index)}
    return {"kind": "target", "label": graph.node_label(index)}


def _feature(body: Mapping, n_tokens: int, n_layers: int, d_sae: int) -> tuple[int, int, int]:
    value = body.get("feature")
    if not isinstance(value, list) or len(value) != 3 or not all(isinstance(v, int) and not isinstance(v, bool)
                                                                 for v in value):
        raise InputError("'feature' must be [layer, position, latent], three whole numbers (0-indexed).")
    layer, position, latent = value
    for name, v, n in (("layer", layer, n_layers), ("position", position, n_tokens), ("latent", latent, d_sae)):
        if not 0 <= v < n:
            raise InputError(f"'feature' {name} {v} is out of range: 0 … {n - 1}.")
    return layer, position, latent


def feeds(workbench, loaded: LoadedTranscoders, request, run, feature: tuple[int, int, int]) -> dict:
    """What one feature writes into: its strongest outgoing edges in the graph of the why panel's target."""
    layer, position, latent = feature
    f = activations(workbench, loaded, request)
    activation = float(f[layer][position, latent]) if layer in f and latent < f[layer].shape[1] else None
    if not activation:
        raise InputError(f"latent not active at this token: feature {latent} of layer {layer} has activation "
                         f"{0 if layer in f else 'none (no transcoder at that layer)'} at position {position}; "
                         f"click one the panel lists.")
    answer = {"feature": list(feature), "target": None, "activation": activation, "edges": [], "hint": None}
    if len(run.tokens) > GRAPH_MAX_TOKENS:
        return {**answer, "hint": f"text too long for a graph: {len(run.tokens)} > {GRAPH_MAX_TOKENS} tokens; "
                                  f"shorten it to see what a feature feeds."}
    if not loaded.complete:
        missing = sorted(set(range(workbench.model.config.num_hidden_layers)) - set(loaded.by_layer))
        return {**answer, "hint": f"The graph replaces every MLP: it needs a transcoder at every layer; pass "
                                  f"--transcoder for layers {', '.join(map(str, missing))} too."}
    batch = workbench.model.tokenize([request.text], None if request.pair is None else [request.pair])
    with workbench.compiling("graph", len(run.tokens)):  # a sentence encoder's target reads one forward
        target, described = graph_target(workbench.model, run, batch)
    if target is None:
        return {**answer, "hint": described}
    active = sum(int((values > 0).sum()) for values in f.values())
    if active > GRAPH_MAX_FEATURES:
        return {**answer, "hint": f"{active} features are active in this text; the graph is built over at most "
                                  f"{GRAPH_MAX_FEATURES}: shorten the text to see what a feature feeds."}
    graph, pruned = _graph(workbench, loaded, request, run, batch, target, described)
    try:
        source = graph.node_index(layer, position, latent)
    except AnalysisError:
        raise InputError(f"feature {latent} of layer {layer} is not active at position {position} (activation 0): "
                         f"click one the panel lists.") from None
    column = graph.adjacency[:, source]
    order = [int(i) for i in np.argsort(-np.abs(column), kind="stable")[:TOP_EDGES] if column[i] != 0]
    edges = [{**_node(graph, i), "weight": float(column[i]),
              "kept": bool(pruned is not None and pruned.edge_mask[i, source])} for i in order]
    return {**answer, "target": described, "activation": float(graph.activations[source]), "edges": edges}


def features(workbench, body: Mapping) -> dict:
    """The answer to the page's "features" request (docs/serve.md): without `feature`, {tokens, layers, d_sae,
    features: per position [{layer, latent, activation}], hint}; with `feature: [layer, position, latent]`, what it
    feeds: {feature, target, activation, edges: [{kind, layer, position, latent, label, weight, kept}], hint}.
    Without transcoders: {tokens: None, hint} saying how to get them."""
    loaded = workbench.resource("transcoders")
    if loaded is None:
        return {"tokens": None, "features": None, "hint": HINT}
    request = workbench.request({**body, "ablate": []})
    run = workbench.cached_run(request)
    if body.get("feature") is not None:
        d_sae = max(config.d_sae for config, _ in loaded.by_layer.values())
        feature = _feature(body, len(run.tokens), workbench.model.config.num_hidden_layers, d_sae)
        return feeds(workbench, loaded, request, run, feature)
    f = activations(workbench, loaded, request)
    return {"tokens": run.tokens, "layers": sorted(loaded.by_layer),
            "d_sae": {str(layer): config.d_sae for layer, (config, _) in loaded.by_layer.items()},
            "features": top_features(f), "hint": None if loaded.complete else
            "Click a feature to see what it feeds once every layer has a transcoder (the graph replaces every MLP)."}


PANEL = Panel("features", answer=features, script="feature_view.js", constructor="minibertFeatures",
              programs=("features", "graph"))
