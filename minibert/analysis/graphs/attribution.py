"""Attribution graphs of one input through its local replacement model (docs/graphs.md).

Nodes, in circuit-tracer's order: the active features (l, t, i) (activation a > 0), the error nodes (l, t), the
token embeddings (t), the targets. The edge from source s to node n is s's direct effect on n's pre-activation
through the frozen replacement (replacement.py):

    w_{s→n} = ⟨J_n(l_s, t_s), v_s⟩      v_s = a_s W_dec[i_s] (a feature), ε_{l,t} (an error), e_t (an embedding)

with J_n = ∂ pre_n / ∂ (what is written at the source's MLP output, or the embeddings' output), the pre-activation
pre_n = ⟨x_{l_n, t_n}, W_enc[:, i_n]⟩ + b_enc[i_n] of a feature, ⟨g, h⟩ of a target (targets.py). Every feature's
activation and every error is a constant of the replacement, so J_n carries only the skip path and the frozen
attention's OV (from any position to any position: both directions in an encoder) — direct effects. Because the
replacement is affine, pre_n = Σ_s w_{s→n} + bias_n, bias_n the replacement's value with every source zero (each
b_dec, attention and LayerNorm bias carried), reported per node (completeness).

One row of the adjacency is one backward pass (a vjp of the replacement) with n's cotangent; rows go through
lax.map in chunks sized to the memory budget, in one compiled program.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from minibert.analysis.circuits._checks import check_model
from minibert.analysis.graphs.replacement import (
    Sites,
    Transcoders,
    check_transcoders,
    feature_activations,
    readout,
    record_names,
    replacement,
    sites,
    writes_of,
)
from minibert.analysis.graphs.targets import Target, check_targets, unlabelled
from minibert.analysis.sweeps import chunked_map, padded_count, power_of_two
from minibert.analysis.transcoders.model import decode
from minibert.core.site_names import FULL_EMBED
from minibert.errors import AnalysisError, is_whole
from minibert.io.tokenizer import Batch, is_text
from minibert.runtime.accounting import activation_bytes, items_per_chunk

# The fewest feature rows a graph program is built for: the active features are padded to a power of two at least
# this (sweeps.padded_count), so inputs with different numbers of active features share programs.
FEWEST_FEATURES = 8


@dataclasses.dataclass
class AttributionGraph:
    """adjacency [n, n] (rows: targets of edges, columns: sources; circuit-tracer's layout) over the nodes
    [features (N), errors (L·T, layer-major), tokens (T), targets]. active_features [N, 3] (layer, position, latent),
    activations [N]; pre_activations [n] (a feature's at the run, a target's ⟨g, h⟩; 0 for errors and tokens) and
    bias [n] with pre = adjacency.sum(1) + bias for features and targets; target_values the targets themselves,
    target_weights what pruning weighs them by (circuit-tracer's logit probabilities); prompt the input's text."""

    adjacency: np.ndarray
    active_features: np.ndarray
    activations: np.ndarray
    pre_activations: np.ndarray
    bias: np.ndarray
    target_labels: list[str]
    target_values: np.ndarray
    target_weights: np.ndarray
    input_ids: np.ndarray
    tokens: list[str]
    n_layers: int
    d_sae: int
    targets: tuple = ()
    vocab_size: int = 0
    prompt: str = ""  # the input's text (write_json's "prompt"): the text given, or the ids decoded

    @property
    def n_features(self) -> int:
        return len(self.active_features)

    @property
    def n_pos(self) -> int:
        return len(self.input_ids)

    @property
    def n_targets(self) -> int:
        return len(self.target_labels)

    @property
    def error_slice(self) -> slice:
        return slice(self.n_features, self.n_features + self.n_layers * self.n_pos)

    @property
    def token_slice(self) -> slice:
        end = self.error_slice.stop
        return slice(end, end + self.n_pos)

    @property
    def remainder(self) -> np.ndarray:
        """Each target minus its linear part ⟨g, h⟩: what the readout adds beyond its linearisation."""
        return self.target_values - self.pre_activations[-self.n_targets:]

    def node_label(self, index: int) -> str:
        """"F l.t.i" (a feature), "E l.t" (an error), "T t 'token'" (an embedding), or the target's label."""
        if index < self.n_features:
            layer, pos, latent = self.active_features[index]
            return f"F {layer}.{pos}.{latent}"
        if index < self.error_slice.stop:
            layer, pos = divmod(index - self.n_features, self.n_pos)
            return f"E {layer}.{pos}"
        if index < self.token_slice.stop:
            pos = index - self.error_slice.stop
            return f"T {pos} {self.tokens[pos]!r}"
        return self.target_labels[index - self.token_slice.stop]

    def node_index(self, layer: int, position: int, latent: int) -> int:
        """The node of active feature (layer, position, latent); an AnalysisError if it is not active."""
        hit = np.flatnonzero((self.active_features == (layer, position, latent)).all(1))
        if not hit.size:
            active = self.active_features
            here = active[(active[:, 0] == layer) & (active[:, 1] == position)]
            shown = ", ".join(f"F {layer}.{position}.{i}" for i in here[:8, 2]) + (", …" if len(here) > 8 else "")
            raise AnalysisError(f"feature F {layer}.{position}.{latent} (layer {layer}, position {position}, latent "
                                f"{latent}) is not active in this graph (activation 0), so it has no node; "
                                + (f"active at that layer and position: {shown}." if len(here) else
                                   f"no feature is active at layer {layer}, position {position}; pick one of "
                                   f"graph.active_features ({self.n_features}) or the 'F l.t.i' labels of "
                                   f"pruned.edges()."))
        return int(hit[0])


# ---- the two programs -------------------------------------------------------------------------------------------

def record_run(model, state, inputs, params, targets, *, configs, names):
    """Program 1: the run's recorded values, each feature's pre-activation and activation, the error nodes and the
    targets' values."""
    out, captured = model.forward_fn(names)(state, inputs)
    s = sites(model)
    tc = Transcoders(configs, params, {})
    x = jnp.stack([captured[n][0] for n in s.mlp_in])
    y = jnp.stack([captured[n][0] for n in s.mlp_out])
    pre, f = feature_activations(tc, x)
    y_hat = jnp.stack([decode(c, p, f[i], x[i]) for i, (c, p) in enumerate(zip(configs, params))])
    values = jnp.stack([t(out) for t in targets])
    return captured, pre, f, y - y_hat, values


def graph_rows(model, state, inputs, frozen, stacked, embed, f, errors, active, items, targets, *, chunk: int):
    """Program 2: the adjacency's rows of `items` [R, 4] (row_items: the N active features, the targets, padding
    to a multiple of `chunk`, so one vmapped backward serves all), the features' (`active`, padded) and targets'
    bias terms and the targets' linear parts."""
    s = sites(model)
    L, T = f.shape[0], f.shape[1]

    def replace(e, w):
        return replacement(model, state, inputs, frozen, stacked, s, e, w)

    writes = writes_of(stacked, f, errors)
    (x, h), pullback = jax.vjp(replace, embed, writes)
    grads = jnp.stack([jax.grad(lambda hh, t=t: t(readout(model, state, frozen, s, hh)))(h) for t in targets])
    layer, pos, latent = active[:, 0], active[:, 1], active[:, 2]
    sources = f[layer, pos, latent][:, None] * stacked["W_dec"][layer, latent]  # a_s W_dec[i_s], [N, D]
    where = layer * T + pos

    def row(cotangent):
        g_embed, g_writes = pullback(cotangent)
        features = (g_writes.reshape(L * T, -1)[where] * sources).sum(-1)
        return jnp.concatenate([features, (g_writes * errors).sum(-1).ravel(), (g_embed * embed).sum(-1)])

    def node_row(item):
        """item = (layer, position, latent, target): a feature's row (target −1), or target k's (the rest unused)."""
        layer_n, pos_n, latent_n, k = item[0], item[1], item[2], item[3]
        encoder = stacked["W_enc"][layer_n, :, latent_n] * (k < 0)
        return row((jnp.zeros_like(x).at[layer_n, pos_n].set(encoder), grads[jnp.maximum(k, 0)] * (k >= 0)))

    rows = chunked_map(node_row, items, chunk)
    zero_x, zero_h = replace(jnp.zeros_like(embed), jnp.broadcast_to(stacked["b_dec"][:, None], writes.shape))
    feature_bias = (zero_x[layer, pos] * stacked["W_enc"][layer, :, latent]).sum(-1) + stacked["b_enc"][layer, latent]
    return {"rows": rows, "feature_bias": feature_bias,
            "target_bias": jnp.einsum("nTD,TD->n", grads, zero_h), "target_linear": jnp.einsum("nTD,TD->n", grads, h),
            "x": x}


def row_items(active: np.ndarray, n_targets: int, chunk: int, padded: int) -> np.ndarray:
    """[R, 4] (layer, position, latent, target): the N features' rows (target −1), then the targets' (k), then
    padding up to a multiple of max(chunk, padded / 8) — few distinct row counts per `padded`, at most 1/8 of
    the rows wasted."""
    step = max(chunk, padded // 8)
    n = len(active)
    items = np.zeros((-(-(n + n_targets) // step) * step, 4), np.int32)
    items[:, 3] = -1
    items[:n, :3] = active
    items[n:n + n_targets, 3] = np.arange(n_targets)
    return items


def row_bytes(model, n_features: int, tokens: int) -> int:
    """Bytes one row's backward pass keeps alive: the replacement's activations (each block run twice) and their
    gradients, and the row's gathered sources (N · D) and writes (L · T · D)."""
    cfg = model.config
    stream = tokens * cfg.hidden_size * 4
    return 2 * activation_bytes(cfg, 1, tokens, blocks=cfg.num_hidden_layers, backward=True) \
        + n_features * cfg.hidden_size * 4 + 2 * cfg.num_hidden_layers * stream


def attribute(model, batch, transcoders, targets, *, target_weights=None, chunk: int | None = None,
              other_weights: bool = False) -> AttributionGraph:
    """The attribution graph of one input (`batch`: a text or a one-row batch) through the local replacement model
    built from `transcoders` (a list of (TranscoderConfig, params), one per block) for `targets` (a Target or a
    list of them; target_weights: how pruning weighs each, default equal, summing to 1). Two compiled programs:
    the run, then every row of the graph (chunk: rows per vmapped backward, default from the memory budget).
    Transcoders whose config records other model weights than these are refused unless other_weights=True."""
    if chunk is not None and (not is_whole(chunk) or chunk < 1):
        raise AnalysisError(f"chunk={chunk!r} must be a whole number ≥ 1 (rows per vmapped backward; rounded down "
                            f"to a power of two), or None to size it from the memory budget.")
    check_model(model)
    inputs = model.inputs(batch)
    if inputs.shape[0] != 1:
        raise AnalysisError(f"an attribution graph explains one input; got a batch of {inputs.shape[0]} rows: pass "
                            f"one text (or one row).")
    tc = check_transcoders(model, transcoders, other_weights=other_weights)
    targets = check_targets(model, targets)
    weights = _weights(target_weights, len(targets))
    s = sites(model)
    names = record_names(s)
    run = model.jit(record_run, static_argnames=("configs", "names"))
    captured, pre, f, errors, values = run(model.state, inputs, tc.params, unlabelled(targets), configs=tc.configs,
                                           names=tuple(names))
    _check_finite_run(pre, errors, values)
    active = np.argwhere(np.asarray(f) > 0).astype(np.int32)  # [N, 3] (layer, position, latent), row-major
    n, padded = len(active), np.zeros((padded_count(len(active), fewest=FEWEST_FEATURES), 3), np.int32)
    padded[:n] = active
    frozen = {k: v for k, v in captured.items() if k in set(s.patterns) | set(s.scales)}
    T = inputs.shape[1]
    # a power of two, as the padded feature count is: it divides row_items' step, so lax.map runs whole chunks only
    # (a remainder would compile the row a second time)
    chunk = power_of_two(chunk or items_per_chunk(row_bytes(model, len(padded), T), n + len(targets)))
    items = row_items(active, len(targets), chunk, len(padded))
    program = model.jit(graph_rows, static_argnames=("chunk",), what="the attribution graph")
    parts = program(model.state, inputs, frozen, tc.stacked, captured[FULL_EMBED][0], f, errors, padded,
                    items, unlabelled(targets), chunk=chunk)
    parts = {k: np.asarray(v) for k, v in parts.items()}
    graph = _assemble(model, inputs, tc, targets, weights, np.asarray(values), np.asarray(pre), np.asarray(f),
                      active, parts)
    return dataclasses.replace(graph, prompt=_prompt(model, batch, graph.input_ids))


def _prompt(model, batch, ids: np.ndarray) -> str:
    """The input's text: the text (or pair, joined by a space, as the viewer shows one prompt) it was given as,
    else its ids decoded without special tokens."""
    texts, pairs = ([batch], None) if isinstance(batch, str) else \
        (batch.texts, batch.pairs) if isinstance(batch, Batch) else \
        (list(batch), None) if is_text(batch) else (None, None)
    if texts:
        return " ".join(t for t in (texts[0], pairs[0] if pairs else None) if t)
    decode = getattr(model.tokenizer, "decode", None)
    return decode([int(i) for i in ids]) if decode is not None else ""


def _weights(target_weights, n: int) -> np.ndarray:
    if target_weights is None:
        return np.full(n, 1.0 / n, np.float32)
    w = np.asarray(target_weights, np.float32)
    if w.shape != (n,) or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise AnalysisError(f"target_weights must be {n} finite weights ≥ 0, not all 0 (one per target); got {w!r}.")
    return w


def _check_finite_run(pre, errors, values) -> None:
    for what, array in (("the transcoders' pre-activations", pre), ("the error nodes (MLP output − transcoder "
                                                                     "output)", errors), ("the targets", values)):
        if not np.all(np.isfinite(np.asarray(array))):
            raise AnalysisError(f"{what} are NaN or ±inf on this input: the model's activations or the transcoders' "
                                f"parameters overflow; check the checkpoint and transcoders (model.run_with_cache "
                                f"shows where the activations stop being finite).")


def _assemble(model, inputs, tc: Transcoders, targets, weights, values, pre, f, active, parts) -> AttributionGraph:
    n, T, L = len(active), inputs.shape[1], model.config.num_hidden_layers
    n_targets = len(targets)
    n_sources = n + L * T + T
    size = n_sources + n_targets
    keep = np.r_[np.arange(n), np.arange(len(parts["feature_bias"]), len(parts["feature_bias"]) + L * T + T)]
    adjacency = np.zeros((size, size), np.float32)
    adjacency[:n, :n_sources] = parts["rows"][:n][:, keep]
    adjacency[n_sources:, :n_sources] = parts["rows"][n:n + n_targets][:, keep]
    layer, pos, latent = active.T
    pre_all = np.zeros(size, np.float32)
    pre_all[:n] = pre[layer, pos, latent]
    pre_all[n_sources:] = parts["target_linear"]
    bias = np.zeros(size, np.float32)
    bias[:n] = parts["feature_bias"][:n]
    bias[n_sources:] = parts["target_bias"]
    ids = np.asarray(inputs.input_ids)[0]
    tokens = [str(t) for t in model.tokenizer.convert_ids_to_tokens([int(i) for i in ids])] \
        if hasattr(model.tokenizer, "convert_ids_to_tokens") else [str(int(i)) for i in ids]
    return AttributionGraph(adjacency, active, f[layer, pos, latent], pre_all, bias, [t.label for t in targets],
                            values, weights, ids, tokens, L, tc.d_sae, tuple(targets),
                            model.config.vocab_size)


__all__ = ["AttributionGraph", "Sites", "Target", "attribute"]
