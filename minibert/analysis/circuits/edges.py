"""Edge attribution patching (Syed, Rager & Conmy 2023), EAP-IG (Hanna, Pezzelle & Belinkov 2024), circuits,
their faithfulness, and path patching (Wang et al. 2022), for encoders.

Nodes (docs/circuits.md). Senders write to the residual stream: the embeddings, each head's output
o_{l,h} = z_{l,h}·W_O[h], each MLP's output. Receivers read it: each head's q, k and v input, each MLP's input,
the output (the readout). An edge joins a sender to a later receiver; its term is the sender's change
o_u(corrupted) − o_u(clean) carried along the skip path frozen at the clean run (frozen.py) to the receiver.

    EAP       score(u→v) = ⟨P_{u→v}(o_u(corrupted) − o_u(clean)), ∂metric/∂in_v⟩ at the clean run
    EAP-IG    the same with ∂metric/∂in_v averaged over `steps` runs whose embeddings go from corrupted to clean,
              e(α) = e_clean − (1 − α)(e_clean − e_corrupted), α = k/steps, k = 1..steps (steps=1 is EAP)

Scores are of the metric's mean over rows; a [B] metric's rows are examples of their own. A receiver's input
gradient ∂metric/∂in_v is the gradient that flows into that receiver alone: for a head's q, k or v, back through
its own projection (and, pre-LN, its own layernorm); for an MLP, its branch (the stream's gradient less the
skip connection's).

Patching (circuit_faithfulness, path_patching) runs the clean input with every receiver v's input changed by
Σ_{u→v patched} P_{u→v}(o_u(corrupted) − o_u(patched run)): each edge outside the circuit brings its sender's
corrupted output instead of the one the patched run itself computes (the clean one, for a single edge). Each
receiver recomputes its own layernorm from its changed input, so in pre-LN families patching every edge is the
corrupted run; in post-LN ones the frozen skip path is an approximation (m(empty) is reported beside
m(corrupted)). Texts of different lengths align as interventions.patch_activations aligns them: padded on the
right, nothing patched where the clean row has padding.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from minibert.analysis._finite import check_finite
from minibert.analysis.circuits._checks import check_choice, check_count, check_model, metric_of
from minibert.analysis.circuits.direct import stacked
from minibert.analysis.circuits.frozen import layout, point_names, scale_names, skip_path, skip_weights
from minibert.analysis.interventions import paired_inputs
from minibert.analysis.sweeps import chunked_map, live_chunk, live_map, live_sum, padded
from minibert.core import site_names
from minibert.core.config import head_label
from minibert.core.contract import StaticFn, static_metric
from minibert.core.encoder import unrolled_stack
from minibert.core.hooks import HookFn, add_delta
from minibert.core.site_names import FULL_EMBED, MLP_OUT, RESID_POST, RESULT, in_block
from minibert.errors import AnalysisError, AnalysisWarning, is_whole, outside_minibert, refuse_unless_flag
from minibert.runtime.accounting import activation_bytes, items_per_chunk

METHODS = ("eap", "eap-ig")
MAX_EAP_IG_STEPS = 1000  # gradient runs, each a forward and backward: past this a call runs for hours on a CPU
# |m(clean) − m(corrupted)| below this fraction of their scale is float32 rounding of two runs (tests/tolerances.py's
# forward bound for a 6-layer, 384-wide model at 128 tokens is ~1e-4): a faithfulness would be noise over noise
SAME_METRIC_RTOL = 1e-4
# A difference within 10 gaps between two computations of the clean metric (circuit_faithfulness) is rounding: one
# gap samples the metric's rounding error once, and a rounding error of mean zero exceeds 10 times a typical sample
# rarely (a normal error, 10 standard deviations: never in practice).
ROUNDING_SAMPLES = 10
# More samples of that rounding: each run's metric again with every output value moved by one rounding (a relative
# ±eps, signs at random): the gap of two computations alone can be 0 by chance (two programs that agree to the bit).
RESAMPLES = 4
QKV = "qkv"
QKV_SITES = (site_names.Q, site_names.K, site_names.V)  # their sites, in QKV's order


# ---- the graph: node labels and which edges exist -------------------------------------------------------------

def sender_labels(L: int, H: int) -> list[str]:
    """"embed", then per block its heads ("L-H", 1-indexed) and "MLP l" (1-indexed): forward order."""
    return ["embed"] + [label for layer in range(L)
                        for label in [head_label(layer, h) for h in range(H)] + [f"MLP {layer + 1}"]]


def receiver_labels(L: int, H: int) -> list[str]:
    """Per block its heads' inputs ("L-H.q", .k, .v) and "MLP l in", then "output": forward order."""
    return [label for layer in range(L)
            for label in [f"{head_label(layer, h)}.{c}" for c in QKV for h in range(H)] + [f"MLP {layer + 1} in"]] \
        + ["output"]


def edge_mask(L: int, H: int) -> np.ndarray:
    """bool [senders, receivers]: the sender writes before the receiver reads (a block's heads read what the
    earlier blocks wrote, its MLP also what its own heads wrote; the output reads everything)."""
    writes = np.array([0] + [2 * layer + 1 + (h == H) for layer in range(L) for h in range(H + 1)])
    reads = np.array([2 * layer + 1 + (k == 3 * H) for layer in range(L) for k in range(3 * H + 1)] + [2 * L + 1])
    return writes[:, None] < reads[None, :]


@dataclasses.dataclass
class Circuit:
    """A set of edges: bool [senders, receivers] (True = kept clean), with the graph's node labels."""

    edges: np.ndarray
    senders: list[str]
    receivers: list[str]

    @property
    def size(self) -> int:
        return int(self.edges.sum())

    def edge_list(self) -> list[tuple[str, str]]:
        return [(self.senders[u], self.receivers[v]) for u, v in zip(*np.nonzero(self.edges))]


@dataclasses.dataclass
class CircuitGraph:
    """Edge scores [senders, receivers] (0 where no edge joins them), the nodes' labels and the edges that exist.
    `direction`: each score estimates patching the sender's corrupted output into the clean run."""

    scores: np.ndarray
    senders: list[str]
    receivers: list[str]
    edges: np.ndarray
    layers: int
    heads: int
    method: str
    direction: str = "corrupted into clean"

    def circuit(self, top: int | None = None, threshold: float | None = None) -> Circuit:
        """The `top` edges by |score|, or every edge with |score| ≥ threshold."""
        if (top is None) == (threshold is None):
            raise AnalysisError("circuit takes top=n (the n edges with the largest |score|) or threshold=t (every "
                                "edge with |score| ≥ t); pass one of them.")
        magnitude = np.where(self.edges, np.abs(self.scores), -np.inf)
        if threshold is not None:
            if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.number)) \
                    or not np.isfinite(threshold) or threshold < 0:
                raise AnalysisError(f"threshold must be a finite number ≥ 0 (edges with |score| ≥ it are kept); got "
                                    f"{threshold!r}.")
            return Circuit(self.edges & (magnitude >= threshold), self.senders, self.receivers)
        top = check_count("top (a number of edges)", top)
        kept = np.zeros(magnitude.size, bool)
        kept[np.argsort(-magnitude, axis=None, kind="stable")[:min(int(top), int(self.edges.sum()))]] = True
        return Circuit(kept.reshape(magnitude.shape), self.senders, self.receivers)

    def sweep(self, sizes: Sequence[int]) -> list[Circuit]:
        """circuit(top=n) for each n of `sizes`: what circuit_faithfulness takes for a faithfulness curve."""
        if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence | np.ndarray):
            raise AnalysisError(f"sizes must be a list of edge counts, e.g. graph.sweep([5, 10, 20]); got "
                                f"{type(sizes).__name__} {sizes!r}.")
        return [self.circuit(top=n) for n in sizes]

    def top_edges(self, n: int = 10) -> list[tuple[str, str, float]]:
        """The n edges with the largest |score|: (sender, receiver, score)."""
        kept = self.circuit(top=n).edges
        ranked = sorted(zip(*np.nonzero(kept)), key=lambda uv: -abs(self.scores[uv]))
        return [(self.senders[u], self.receivers[v], float(self.scores[u, v])) for u, v in ranked]


HEAD_EDGES = ("both", "out", "in")


def _graph_of_shape(shape) -> tuple[int, int]:
    """(L, H) of a graph whose scores are [senders, receivers] = [1 + L(H + 1), L(3H + 1) + 1], or None."""
    senders, receivers = shape
    per_head = (receivers - senders) / 2  # L·H
    layers = senders - 1 - per_head
    if per_head > 0 and layers > 0 and per_head == int(per_head) and per_head % layers == 0:
        return int(layers), int(per_head // layers)
    return None


def head_scores(graph, edges: str = "both", *, absolute: bool = True) -> np.ndarray:
    """Each head's summed edge scores, [L, H] (0-indexed; docs/circuits.md): `edges` "out" the edges out of head
    (l, h) (sender "L-H"), "in" the edges into its q, k and v (receivers "L-H.q", ".k", ".v"), "both" their sum.
    absolute=True sums |score| (how much the circuit runs through the head, whatever the sign), False the signed
    scores. `graph`: a CircuitGraph, its scores [senders, receivers], or a Circuit (then each head's count of kept
    edges)."""
    check_choice("edges", edges, HEAD_EDGES)
    absolute = refuse_unless_flag("absolute", absolute, AnalysisError)
    if isinstance(graph, CircuitGraph):
        values, shape = graph.scores, (graph.layers, graph.heads)
    elif isinstance(graph, Circuit):
        values = np.asarray(graph.edges, np.int64)
        shape = _graph_of_shape(values.shape) if values.ndim == 2 else None
    else:
        values = np.asarray(graph) if isinstance(graph, np.ndarray | list) else None
        shape = _graph_of_shape(values.shape) if values is not None and values.ndim == 2 else None
    if shape is None or values.shape != edge_mask(*shape).shape or not np.issubdtype(values.dtype, np.number):
        given = f"an array of shape {values.shape}" if values is not None else type(graph).__name__
        raise AnalysisError(f"head_scores takes a CircuitGraph (edge_attribution(...)), its scores [senders, "
                            f"receivers] = [1 + L(H + 1), L(3H + 1) + 1] or a Circuit; got {given}.")
    L, H = shape
    senders, receivers = sender_labels(L, H), receiver_labels(L, H)
    heads = [[head_label(layer, h) for h in range(H)] for layer in range(L)]
    out_of = np.array([[senders.index(label) for label in row] for row in heads])  # [L, H] → sender index
    into = np.array([[[receivers.index(f"{label}.{c}") for c in QKV] for label in row] for row in heads])  # [L, H, 3]
    values = np.abs(values) if absolute else values
    total = np.zeros((L, H), values.dtype)
    if edges in ("both", "out"):
        total = total + values[out_of].sum(-1)
    if edges in ("both", "in"):
        total = total + values[:, into].sum((0, -1))
    return total


# ---- what a run reads and writes --------------------------------------------------------------------------------

def _sender_names(model) -> list[str]:
    L = model.config.num_hidden_layers
    return [FULL_EMBED, *[f"blocks.{i}.{s}" for s in (RESULT, MLP_OUT) for i in range(L)]]


def _senders(model, captured) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(e [B, T, D], heads [L, B, T, H, D], mlps [L, B, T, D]) of a run's captures."""
    return (captured[FULL_EMBED], stacked(captured, model, RESULT),
            stacked(captured, model, MLP_OUT))


def attention_inputs(model, state, layer: int, resid, inputs) -> tuple[jax.Array, ...]:
    """Block `layer`'s q, k, v [B, T, H, K] computed from the stream resid [B, T, D] entering it (the block runs
    through model.block; in a compiled program everything after q, k, v is dropped as unused)."""
    names = [in_block(layer, part) for part in QKV_SITES]
    hooks = model.hook_points(names=names)
    model.block(state, layer, resid, inputs, hooks)
    return tuple(hooks.captured[n] for n in names)


def _replace(value, ctx, new):
    return new.astype(value.dtype)


def _head_input_gradients(model, state, layer: int, resid, inputs, g) -> jax.Array:
    """[3, H, B, T, D]: ∂metric/∂ the input of each head's q, k and v in block `layer`, from the gradients g
    [3, B, T, H, K] at q, k, v: each (c, h) part of g pulled back alone through q, k, v's computation from the
    stream resid [B, T, D] entering the block."""
    H = g.shape[-2]
    _, pullback = jax.vjp(lambda x: attention_inputs(model, state, layer, x, inputs), resid)
    one_hot = jnp.eye(3 * H).reshape(3 * H, 3, 1, 1, H, 1)  # (c, h) → its own part of g
    return jax.vmap(lambda part: pullback(tuple(part))[0])(one_hot * g[None]).reshape(3, H, *resid.shape)


def _receiver_gradients(model, state, inputs, embedding, *, metric: StaticFn) -> dict:
    """∂(mean metric)/∂ each receiver's input, the embeddings' output replaced by `embedding`: "attn"
    [L, 3, H, B, T, D], "mlp" [L, B, T, D], "output" [B, T, D]."""
    cfg = model.config
    L, H, K = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim
    B, T = inputs.shape
    points = point_names(model)
    qkv = [in_block(i, part) for i in range(L) for part in QKV_SITES]
    skips = [in_block(i, RESID_POST) for i in range(L)]
    streams = sorted(set(points["mlp_in"] + skips + points["final"]))
    zeros = {n: jnp.zeros((B, T, H, K), jnp.float32) for n in qkv} | \
        {n: jnp.zeros((B, T, cfg.hidden_size), jnp.float32) for n in streams}

    def objective(deltas):
        hooks = {FULL_EMBED: HookFn(_replace, new=embedding)} | \
            {n: HookFn(add_delta, delta=d) for n, d in deltas.items()}
        out, captured = model.forward_fn(points["attn_in"], hooks)(state, inputs)
        return metric_of(metric, out, B).mean(), captured

    grads, captured = jax.grad(unrolled_stack()(objective), has_aux=True)(zeros)  # core.encoder.unrolled_stack
    per_head = jnp.stack([_head_input_gradients(model, state, layer, captured[points["attn_in"][layer]], inputs,
                                                jnp.stack([grads[in_block(layer, part)] for part in QKV_SITES]))
                          for layer in range(L)])
    mlp = jnp.stack([grads[points["mlp_in"][i]] - grads[skips[i]] for i in range(L)])  # the MLP's branch alone
    return {"attn": per_head, "mlp": mlp, "output": grads[points["final"][0]]}


def _sender_table(L: int, H: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(kind: 0 embed, 1 head, 2 MLP; layer; head) of every sender, in sender_labels' order."""
    kind, layer, head = [0], [0], [0]
    for i in range(L):
        kind += [1] * H + [2]
        layer += [i] * (H + 1)
        head += list(range(H)) + [0]
    return np.array(kind), np.array(layer), np.array(head)


def _written(L: int, sender, change):
    """What sender (kind, layer, head) writes where, for SkipPath.carry: (e, attn [L], mlp [L]) from the senders'
    changes (e [B, T, D], heads [L, B, T, H, D], mlps [L, B, T, D])."""
    kind, layer, head = sender
    e, heads, mlps = change
    at = (jnp.arange(L) == layer)[:, None, None, None]
    return (jnp.where(kind == 0, e, 0.0), jnp.where(at & (kind == 1), heads[layer, :, :, head][None], 0.0),
            jnp.where(at & (kind == 2), mlps[layer][None], 0.0))


def _edge_scores(model, state, clean, corrupt, weights, alphas, steps, senders, *, metric: StaticFn,
                 step_chunk: int, sender_chunk: int):
    """Every edge's score [senders, receivers] (compiled with model.jit): the clean and corrupted runs, the
    receivers' gradients averaged over the steps (the first `steps` of the padded alphas, steps traced: every
    count of a bucket shares the program), each sender's change carried to every receiver."""
    cfg = model.config
    L, H = cfg.num_hidden_layers, cfg.num_attention_heads
    names = _sender_names(model) + scale_names(model)
    _, clean_values = model.forward_fn(names)(state, clean)
    _, corrupt_values = model.forward_fn(names)(state, corrupt)
    skip = skip_path(model, clean_values, weights)
    real = clean.attention_mask.astype(jnp.float32)[:, :, None]  # nothing is patched where the clean row pads
    (e, heads, mlps), (e0, heads0, mlps0) = _senders(model, corrupt_values), _senders(model, clean_values)
    change = (real * (e - e0), real[..., None] * (heads - heads0), real * (mlps - mlps0))
    e_clean = clean_values[FULL_EMBED]
    towards_clean = lambda alpha: _receiver_gradients(  # noqa: E731
        model, state, clean, e_clean - (1 - alpha) * (e_clean - corrupt_values[FULL_EMBED]), metric=metric)
    grads = jax.tree_util.tree_map(lambda g: g / steps, live_sum(towards_clean, alphas, steps, step_chunk))

    def scores_of(sender):
        reached = skip.carry(*_written(L, sender, change))
        heads = jnp.einsum("LBTD,LCHBTD->LCH", reached.attn_in, grads["attn"]).reshape(L, 3 * H)
        mlps = jnp.einsum("LBTD,LBTD->L", reached.mlp_in, grads["mlp"])
        return jnp.concatenate([jnp.concatenate([heads, mlps[:, None]], 1).ravel(),
                                (reached.final * grads["output"]).sum()[None]])

    return chunked_map(scores_of, senders, sender_chunk)


def _check_method(method: str, steps: int) -> np.ndarray:
    """The α of the gradient runs: [1] for EAP (the clean run), k/steps for EAP-IG."""
    check_choice("method", method, METHODS)
    if not is_whole(steps) or steps < 1:
        raise AnalysisError(f"steps must be a positive whole number (EAP-IG's interpolation runs; 5 by default); "
                            f"got {steps!r}.")
    steps = int(steps)
    if steps > MAX_EAP_IG_STEPS:
        raise AnalysisError(f"steps={steps} is more than {MAX_EAP_IG_STEPS} EAP-IG runs (each a forward and backward "
                            f"of the model; Hanna et al. use 5 to 50); pass fewer.")
    return np.ones(1) if method == "eap" else np.arange(1, steps + 1) / steps


def _stream_bytes(model, inputs) -> int:
    B, T = inputs.shape
    return B * T * model.config.hidden_size * 4


def edge_attribution(model, clean, corrupted, metric: Callable, method: str = "eap", steps: int = 5) -> CircuitGraph:
    """Every edge's attribution score (module docstring) for `metric(output)` (one value per row, or one for the
    batch; its mean over rows) between the `clean` and `corrupted` batches → CircuitGraph. method "eap": the
    gradient at the clean run; "eap-ig": averaged over `steps` runs interpolating the embeddings. One compiled
    program, shared by EAP and every `steps` of a bucket (analysis.sweeps.padded_count: 1 to 16, 17 to 32, 33 to
    64, …): the steps and the senders each run in chunks sized to accounting.MEMORY_BUDGET."""
    check_model(model)
    alphas = _check_method(method, steps)
    layout(model)
    _refuse_same_inputs(model, clean, corrupted, "every edge's score, a product with the difference, is 0")
    clean_inputs, corrupt_inputs = paired_inputs(model, clean, corrupted)
    paired = [bool(np.any(np.asarray(i.token_type_ids) * np.asarray(i.attention_mask))) for i in (clean_inputs,
                                                                                                  corrupt_inputs)]
    if paired[0] != paired[1]:
        pair, single = ("clean", "corrupted") if paired[0] else ("corrupted", "clean")
        warnings.warn(f"edge_attribution: the {pair} batch holds sentence pairs (segment-1 tokens) and the {single} "
                      f"batch single sentences, so the two runs differ in their segments as well as their tokens, "
                      f"and past the first [SEP] a position holds sentence B in one run and something else in the "
                      f"other; pass both as pairs (or both single) to attribute a change of tokens alone.",
                      AnalysisWarning, stacklevel=outside_minibert())
    cfg = model.config
    L, H = cfg.num_hidden_layers, cfg.num_attention_heads
    B, T = clean_inputs.shape
    stream = _stream_bytes(model, clean_inputs)
    step_bytes = activation_bytes(cfg, B, T, blocks=L, backward=True) + (3 * L * H + L + 1) * stream
    program = model.jit(_edge_scores, static_argnames=("metric", "step_chunk", "sender_chunk"), what="edge attribution")
    senders = tuple(jnp.asarray(a) for a in _sender_table(L, H))
    scores = program(model.state, clean_inputs, corrupt_inputs, skip_weights(model),
                     jnp.asarray(padded(alphas, 1.0), jnp.float32), jnp.int32(len(alphas)), senders,
                     metric=static_metric(metric), step_chunk=live_chunk(step_bytes, len(alphas)),
                     sender_chunk=items_per_chunk((2 * L + 2) * stream, len(senders[0])))
    edges = edge_mask(L, H)
    senders, receivers = sender_labels(L, H), receiver_labels(L, H)
    scores = check_finite(np.where(edges, np.asarray(scores), 0.0).ravel(), "the edge scores (the metric's gradient)",
                          [f"{u} → {v}" for u in senders for v in receivers])
    if not scores.any():  # a score is (corrupted − clean) · ∂metric: a metric that reads nothing has no gradient
        warnings.warn("edge_attribution: every edge scores exactly 0: the metric's gradient is 0 everywhere (a "
                      "constant metric, or one that reads nothing the edges change); a circuit of this graph means "
                      "nothing: check that the metric is computed from the output it is given.",
                      AnalysisWarning, stacklevel=outside_minibert())
    return CircuitGraph(scores.reshape(edges.shape), senders, receivers, edges, L, H, method)


# ---- patching edges: circuits, faithfulness, path patching ------------------------------------------------------

def _one_head_each(changed) -> jax.Array:
    """[H, B, T, H, K] (run h's own values for every head) → [B, T, H, K]: head h's values from run h."""
    H = changed.shape[0]
    return (changed * jnp.eye(H)[:, None, None, :, None]).sum(0)


def _changed_head_inputs(model, state, layer: int, x, inputs, changes) -> dict:
    """Hooks adding to block `layer`'s q, k, v what each head's own input change changes [3, H, B, T, D] make of
    them: head h's q recomputed from x + changes[0, h] (through its layernorm, pre-LN), less the unchanged q."""
    unchanged = attention_inputs(model, state, layer, x, inputs)
    hooks = {}
    for c, part in enumerate(QKV_SITES):
        changed = jax.vmap(lambda d, c=c: attention_inputs(model, state, layer, x + d, inputs)[c])(changes[c])
        hooks[in_block(layer, part)] = HookFn(add_delta, delta=_one_head_each(changed) - unchanged[c])
    return hooks


def _patched_metric(model, state, clean, corrupt, skip, real, cut, *, metric: StaticFn) -> jax.Array:
    """The mean metric of the clean run with each receiver's input changed by its patched edges' terms (module
    docstring); cut [senders, receivers] is 1 on patched edges. The stages run one block at a time: each
    receiver's input is known only once the blocks before it ran."""
    cfg, lay = model.config, layout(model)
    L, H = cfg.num_hidden_layers, cfg.num_attention_heads
    e_corrupt, heads_corrupt, mlps_corrupt = corrupt
    x = model.embed(state, clean)
    # pending[u]: sender u's corrupted output less its output in this run, carried to the current point
    pending = jnp.zeros((1 + L * (H + 1), *x.shape), jnp.float32).at[0].set(real * (e_corrupt - x))
    width = 3 * H + 1
    for layer in range(L):
        column, first_head = layer * width, 1 + layer * (H + 1)
        into_heads = jnp.einsum("UBTD,UR->RBTD", pending, cut[:, column:column + 3 * H]).reshape(3, H, *x.shape)
        head_hooks = _changed_head_inputs(model, state, layer, x, clean, into_heads)
        attention = model.hook_points(head_hooks, names=[in_block(layer, RESULT)])
        model.block(state, layer, x, clean, attention)
        heads_now = jnp.moveaxis(attention.captured[in_block(layer, RESULT)], 2, 0)  # [H, B, T, D]
        pending = pending.at[first_head:first_head + H].set(real * (jnp.moveaxis(heads_corrupt[layer], 2, 0)
                                                                   - heads_now))
        pending = skip.through(0, layer, pending)
        into_mlp = jnp.einsum("UBTD,U->BTD", pending, cut[:, column + 3 * H])
        # the MLP alone reads its changed input: the skip connection takes the change back out
        mlp_hooks = head_hooks | {in_block(layer, lay.mlp_in): HookFn(add_delta, delta=into_mlp),
                                  in_block(layer, RESID_POST): HookFn(add_delta, delta=-into_mlp)}
        block = model.hook_points(mlp_hooks, names=[in_block(layer, MLP_OUT)])
        x_next = model.block(state, layer, x, clean, block)
        mlp_now = block.captured[in_block(layer, MLP_OUT)]
        pending = skip.through(1, layer, pending.at[first_head + H].set(real * (mlps_corrupt[layer] - mlp_now)))
        x = x_next
    out = model.head(state, x + jnp.einsum("UBTD,U->BTD", pending, cut[:, -1]))
    return metric_of(metric, out, clean.shape[0]).mean()


def _circuit_metrics(model, state, clean, corrupt, weights, cuts, n_cuts, *, metric: StaticFn, chunk: int):
    """(the patched metric of the first n_cuts (traced) of the padded cuts [N, senders, receivers] → [N], 0 past
    them; the corrupted run's metric; the plain clean run's) (model.jit)."""
    names = _sender_names(model) + scale_names(model)
    clean_out, clean_values = model.forward_fn(names)(state, clean)
    corrupt_out, corrupt_values = model.forward_fn(names)(state, corrupt)
    skip = skip_path(model, clean_values, weights)
    real = clean.attention_mask.astype(jnp.float32)[:, :, None]
    corrupt_senders = _senders(model, corrupt_values)
    patched = live_map(lambda cut: _patched_metric(model, state, clean, corrupt_senders, skip, real, cut,
                                                   metric=metric), cuts, n_cuts, chunk)
    plain, corrupted = (metric_of(metric, out, clean.shape[0]).mean() for out in (clean_out, corrupt_out))
    return patched, corrupted, plain, jnp.maximum(_rounding_gap(metric, clean_out, plain, clean.shape[0], 0),
                                                  _rounding_gap(metric, corrupt_out, corrupted, clean.shape[0], 1))


def _rounding_gap(metric: StaticFn, out, value, n_rows: int, seed: int) -> jax.Array:
    """The largest change of the mean metric `value` of `out` when every float output value moves by one rounding
    (× (1 ± eps), signs at random), over RESAMPLES draws: samples of the metric's rounding error."""
    eps = jnp.finfo(jnp.float32).eps
    leaves, tree = jax.tree_util.tree_flatten(out)
    gaps = []
    for key in jax.random.split(jax.random.key(seed), RESAMPLES):
        signs = [jax.random.rademacher(k, v.shape, v.dtype) for k, v in zip(jax.random.split(key, len(leaves)),
                                                                             leaves)]
        moved = jax.tree_util.tree_unflatten(tree, [v * (1 + eps * r) for v, r in zip(leaves, signs)])
        gaps.append(jnp.abs(metric_of(metric, moved, n_rows).mean() - value))
    return jnp.max(jnp.stack(gaps))


def _patched_metrics(model, clean, corrupted, metric: Callable,
                     cuts: np.ndarray) -> tuple[np.ndarray, float, float, float]:
    """(the metric of every cut [N], the corrupted run's, the plain clean run's: the full graph's twin, computed
    by the plain forward rather than the patched one; the largest rounding gap of the two runs' metrics)."""
    layout(model)
    clean_inputs, corrupt_inputs = paired_inputs(model, clean, corrupted)
    cfg = model.config
    B, T = clean_inputs.shape
    run_bytes = activation_bytes(cfg, B, T) * (3 * cfg.num_attention_heads + 2) + cuts.shape[1] * \
        _stream_bytes(model, clean_inputs)
    program = model.jit(_circuit_metrics, static_argnames=("metric", "chunk"), what="circuit patching")
    patched, corrupt, plain, gap = program(model.state, clean_inputs, corrupt_inputs, skip_weights(model),
                                      jnp.asarray(padded(cuts, 0.0), jnp.float32), jnp.int32(len(cuts)),
                                      metric=static_metric(metric), chunk=live_chunk(run_bytes, len(cuts)))
    corrupt = check_finite(np.asarray([corrupt, plain]), "the corrupted run's metric")
    return check_finite(np.asarray(patched)[:len(cuts)], "the patched runs' metric"), float(corrupt[0]), \
        float(corrupt[1]), float(gap)


@dataclasses.dataclass
class Faithfulness:
    """m(C) of each circuit with its size (edges kept, Python ints), m(full graph) = `clean`, m(empty graph) =
    `empty` and the corrupted run's `corrupted`; `values` = (m(C) − m(corrupted)) / (m(clean) − m(corrupted)).
    `direction`: the edges outside a circuit are patched from the corrupted run into the clean one."""

    sizes: list[int]
    metrics: np.ndarray
    clean: float
    corrupted: float
    empty: float
    direction: str = "corrupted into clean"

    @property
    def values(self) -> np.ndarray:
        return (self.metrics - self.corrupted) / (self.clean - self.corrupted)


def _graph_shape(model) -> tuple[int, int]:
    check_model(model)
    return model.config.num_hidden_layers, model.config.num_attention_heads


def _check_circuit(circuit: Circuit, edges: np.ndarray, senders: list[str], receivers: list[str], wanted: str):
    """A circuit of this model's graph: a bool array of its shape, its nodes' labels this graph's in this order (a
    circuit is applied by position), only edges that exist kept."""
    kept = circuit.edges
    if not isinstance(kept, np.ndarray) or kept.dtype != bool or kept.shape != edges.shape:
        given = f"{kept.dtype} values of shape {kept.shape}" if isinstance(kept, np.ndarray) else type(kept).__name__
        fix = " (an int mask: circuit.edges.astype(bool))" if isinstance(kept, np.ndarray) and \
            kept.shape == edges.shape else ""
        raise AnalysisError(f"{wanted}: its edges must be a bool array {edges.shape}; got {given}{fix}.")
    if list(circuit.senders) != senders or list(circuit.receivers) != receivers:
        raise AnalysisError(f"{wanted}: the circuit's node labels are not this model's, in its order (another "
                            f"model's graph, or a circuit edited by hand); build it with this model's "
                            f"edge_attribution(...).circuit(top=n).")
    impossible = int((kept & ~edges).sum())
    if impossible:
        raise AnalysisError(f"{wanted}: the circuit keeps {impossible} edges that cannot exist (a receiver that reads "
                            f"before its sender writes); keep only edges of graph.edges.")


def circuit_faithfulness(model, clean, corrupted, metric: Callable,
                         circuit: Circuit | Sequence[Circuit]) -> Faithfulness:
    """Faithfulness of one circuit or of each of a list (graph.sweep(sizes) for a curve): the clean run with every
    edge outside the circuit patched (module docstring), against the full graph (m(clean)) and the corrupted run.
    Every circuit, the full graph and the empty one run in one compiled program, in chunks; lists whose lengths
    share a bucket (analysis.sweeps.padded_count: up to 14 circuits, then up to 30, …) share the program, as does
    path_patching."""
    L, H = _graph_shape(model)
    edges = edge_mask(L, H)
    wanted = (f"circuit_faithfulness takes a Circuit (graph.circuit(top=n)) or a list of them (graph.sweep(sizes)) "
              f"from a graph of this model ({edges.shape[0]} senders × {edges.shape[1]} receivers)")
    circuits = [circuit] if isinstance(circuit, Circuit) else circuit
    if isinstance(circuits, Sequence) and not isinstance(circuits, str) and not circuits:
        raise AnalysisError(f"{wanted}; got an empty list: pass at least one circuit (graph.sweep([5, 10, 20])).")
    if not isinstance(circuits, Sequence) or not all(isinstance(c, Circuit) for c in circuits):
        odd = next((c for c in circuits if not isinstance(c, Circuit)), None) if isinstance(circuits, (list, tuple)) \
            else None
        inside = f" holding a {type(odd).__name__}" if odd is not None else ""
        raise AnalysisError(f"{wanted}; got {type(circuit).__name__}{inside}.")
    for c in circuits:
        _check_circuit(c, edges, sender_labels(L, H), receiver_labels(L, H), wanted)
    cuts = np.stack([edges & ~c.edges for c in circuits] + [np.zeros_like(edges), edges])
    _refuse_same_inputs(model, clean, corrupted, "faithfulness, a ratio over it, is undefined")
    patched, corrupted, plain, gap = _patched_metrics(model, clean, corrupted, metric, cuts)
    difference, scale = abs(patched[-2] - corrupted), max(abs(patched[-2]), abs(corrupted))
    # The full graph and the plain clean run compute one value by two programs: their gap is this metric's own
    # rounding, which a metric that is 0 in exact arithmetic has at any scale (the relative test misses it).
    # Programs that agree to the bit give a gap of 0 whatever the rounding: the runs' metrics resampled add samples.
    rounding = ROUNDING_SAMPLES * max(abs(patched[-2] - plain), gap)
    if difference <= max(SAME_METRIC_RTOL * scale, rounding):
        raise AnalysisError(f"the clean and corrupted runs give the same metric ({patched[-2]:.6g} and "
                            f"{corrupted:.6g}, difference {difference:.2g}, within rounding): faithfulness, a ratio "
                            f"over that difference, is undefined; pick pairs whose metric differs.")
    return Faithfulness([c.size for c in circuits], patched[:-2], float(patched[-2]), corrupted,
                        float(patched[-1]))


def path_patching(model, clean, corrupted, metric: Callable, sender: str, receivers: Sequence[str]) -> float:
    """Path patching (Wang et al. 2022): the mean metric of the clean run where `sender`'s corrupted output reaches
    the named `receivers` only, along the frozen skip path, everything else clean. Labels as in the graph:
    sender "embed", "L-H" or "MLP l"; receivers "L-H.q" (.k, .v), "MLP l in" or "output" (1-indexed).
    Direction: corrupted into clean (the sender's corrupted output is patched into the clean run), as in
    edge_attribution and circuit_faithfulness; patch_activations patches the other way, clean into corrupted."""
    L, H = _graph_shape(model)
    senders, readers = sender_labels(L, H), receiver_labels(L, H)
    labels = "senders are 'embed', 'L-H' and 'MLP l' (1-indexed), receivers 'L-H.q'/.k/.v, 'MLP l in' and 'output'"
    if sender not in senders:
        raise AnalysisError(f"path_patching: {sender!r} is not a sender of this model; {labels}.")
    if isinstance(receivers, str) or not isinstance(receivers, Sequence) or not receivers:
        raise AnalysisError(f"path_patching: receivers must be a non-empty list of receiver labels, e.g. ['output'] "
                            f"or ['2-1.q', 'MLP 2 in']; got {receivers!r}.")
    for receiver in receivers:
        if receiver not in readers:
            hint = {f"{receiver}.{c}" for c in QKV} & set(readers) or {f"{receiver} in"} & set(readers)
            said = f" (did you mean {' or '.join(repr(h) for h in sorted(hint))}?)" if hint else ""
            raise AnalysisError(f"path_patching: {receiver!r} is not a receiver of this model{said}; {labels}.")
    u, mask = senders.index(sender), edge_mask(L, H)
    reached = [readers[v] for v in np.flatnonzero(mask[u])]
    missing = [r for r in receivers if r not in reached]
    if missing:
        raise AnalysisError(f"path_patching: there is no edge {sender} → {', '.join(missing)} (a receiver reads before "
                            f"{sender} writes); {sender} reaches {len(reached)} receivers, from {reached[0]!r} to "
                            f"{reached[-1]!r}.")
    cut = np.zeros((len(senders), len(readers)), bool)
    cut[u, [readers.index(r) for r in receivers]] = True
    return float(_patched_metrics(model, clean, corrupted, metric, cut[None])[0][0])


def _refuse_same_inputs(model, clean, corrupted, consequence: str) -> None:
    """One AnalysisError where the corrupted batch is the clean one: every difference between the runs is 0."""
    if _same_inputs(model, clean, corrupted):
        raise AnalysisError(f"the corrupted batch is the clean batch (the same tokens, types and mask): m(clean) − "
                            f"m(corrupted) is 0 for any metric and {consequence}; pass corrupted inputs that differ "
                            f"from the clean ones.")


def _same_inputs(model, clean, corrupted) -> bool:
    """Whether the two batches, aligned as patching aligns them, hold the same rows."""
    a, b = paired_inputs(model, clean, corrupted)
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(
        (a.input_ids, a.token_type_ids, a.attention_mask), (b.input_ids, b.token_type_ids, b.attention_mask)))
