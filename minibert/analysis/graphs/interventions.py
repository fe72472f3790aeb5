"""Testing a graph on the model: ablate, clamp or steer features and compare the target's change with the
graph's linear prediction (docs/graphs.md).

The model runs with every MLP output replaced by its transcoder's output on the *live* MLP input, features
changed where asked, plus the error node held at the clean run's value (as circuit-tracer holds errors):

    f = σ(x W_enc + b_enc), then f_{t,i} ← v (clamp, ablate: v = 0) or f_{t,i} + δ (steer)
    MLP output = f W_dec + b_dec (+ x W_skip) + ε_clean

freeze=True also holds the attention patterns and LayerNorm σ at the clean run (circuit-tracer's
freeze_attention); freeze=False leaves them live. Unchanged, either run is the clean run (ŷ + ε = y).

The graph's prediction: with W[n, m] = A[n, m] / a_m the direct effect of one unit of feature m on node n, the
change of the features' activations solves Δa = c + W_ff Δa (a clamped feature's row zero: it ignores its
inputs; c = v − a for it, δ for a steered one, 0 elsewhere: active features pass changes on with slope 1), and the
target's change is W_tf Δa. It is first-order: with freeze=True the run differs from it only where a feature's
activity switches or through the readout's curvature (second order in the change).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from minibert.analysis.circuits._checks import check_model
from minibert.analysis.graphs.attribution import record_run
from minibert.analysis.graphs.replacement import (
    check_transcoders,
    frozen_hooks,
    record_names,
    replace_with,
    sites,
)
from minibert.analysis.graphs.targets import unlabelled
from minibert.analysis.transcoders.model import decode, encode
from minibert.core.hooks import HookFn
from minibert.errors import AnalysisError

MODES = ("clamp", "steer")
FLOAT32_MAX = float(np.finfo(np.float32).max)  # the largest value a change can hold in the model's float32


@dataclasses.dataclass
class InterventionResult:
    """The targets (labels) at the clean run and with the features changed, their change (intervened − clean),
    and beside it the graph's linear prediction of that change."""

    labels: list[str]
    clean: np.ndarray
    intervened: np.ndarray
    change: np.ndarray
    predicted: np.ndarray


KEY_FORMS = ("(layer, position, latent)", "'F layer.position.latent' (graph.node_label, pruned.edges())",
             "'layer_latent_position' (the node_id of write_json)")


def feature_key(key) -> tuple[int, int, int]:
    """(layer, position, latent) of a feature named as a tuple, by its label "F l.t.i" (graph.node_label, as
    pruned.edges() shows it) or by its JSON node_id "l_i_t" (write_json)."""
    parts = None
    if isinstance(key, tuple | list) and len(key) == 3:
        parts = list(key)
    elif isinstance(key, str) and key.startswith("F ") and key[2:].count(".") == 2:
        parts = key[2:].split(".")
    elif isinstance(key, str) and key.count("_") == 2:
        layer, latent, position = key.split("_")
        parts = [layer, position, latent]
    if parts is not None:
        if all(isinstance(v, str) and v.isdigit() for v in parts):
            return tuple(int(v) for v in parts)
        if all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in parts):
            return tuple(int(v) for v in parts)
    raise AnalysisError(f"changes: {key!r} names no feature; name one as {', '.join(KEY_FORMS[:-1])} or "
                        f"{KEY_FORMS[-1]}.")


def _intervened(model, state, inputs, params, targets, frozen, errors, steer, clamp_mask, clamp_value, *, configs,
                freeze: bool):
    s = sites(model)
    held = frozen if freeze else {}
    resid = model.embed(state, inputs)
    for layer, (config, p) in enumerate(zip(configs, params)):
        block_held = frozen_hooks((s.patterns[layer], *s.block_scales(layer)), held) if freeze else {}
        reading = model.hook_points(hooks=block_held, names=[s.mlp_in[layer]])
        model.block(state, layer, resid, inputs, reading)
        x = reading.captured[s.mlp_in[layer]][0]
        f = encode(config, p, x)
        f = jnp.where(clamp_mask[layer], clamp_value[layer], f + steer[layer])
        written = decode(config, p, f, x) + errors[layer]
        replacing = block_held | {s.mlp_out[layer]: HookFn(replace_with, new=written[None])}
        resid = model.block(state, layer, resid, inputs, model.hook_points(hooks=replacing))
    out = model.head(state, resid, frozen_hooks(s.head_scales(), held) if freeze else None)
    return jnp.stack([t(out) for t in targets])


def predicted_change(graph, steer: dict, clamp: dict) -> np.ndarray:
    """The graph's first-order change of each target (module docstring) for {node index: δ} and {node index: v}."""
    n, a = graph.n_features, graph.activations.astype(np.float64)
    per_unit = graph.adjacency[:, :n].astype(np.float64) / a[None, :]
    W_ff, W_tf = per_unit[:n].copy(), per_unit[-graph.n_targets:]
    c = np.zeros(n)
    for node, delta in steer.items():
        c[node] += delta
    for node, value in clamp.items():
        c[node] = value - a[node]
        W_ff[node] = 0.0
    return W_tf @ np.linalg.solve(np.eye(n) - W_ff, c)


def intervene(model, batch, transcoders, graph, changes: dict, *, mode: str = "steer",
              freeze: bool = True, other_weights: bool = False) -> InterventionResult:
    """Change features {feature: value} — steer (add δ = value), clamp (set to value; ablate: 0) — on the model
    for the graph's input, and report each of graph.targets before and after and their change, beside the
    graph's prediction of it (module docstring). A feature is named (layer, position, latent), by its label
    "F l.t.i" (graph.node_label, pruned.edges()) or by its write_json node_id "l_i_t". One compiled program for
    any changes."""
    check_model(model)
    if mode not in MODES:
        raise AnalysisError(f"mode must be one of {MODES} ('clamp' with value 0 ablates); got {mode!r}.")
    if not isinstance(changes, dict) or not changes:
        raise AnalysisError("changes must be a non-empty dict {(layer, position, latent): value}.")
    tc = check_transcoders(model, transcoders, other_weights=other_weights)
    inputs = model.inputs(batch)
    if inputs.shape != (1, graph.n_pos) or not np.array_equal(np.asarray(inputs.input_ids)[0], graph.input_ids):
        raise AnalysisError("the batch is not the graph's input: intervene on the input the graph was built for.")
    L, T, S = graph.n_layers, graph.n_pos, graph.d_sae
    steer, mask, value = np.zeros((L, T, S), np.float32), np.zeros((L, T, S), bool), np.zeros((L, T, S), np.float32)
    by_node_steer, by_node_clamp = {}, {}
    for given, amount in changes.items():
        key = feature_key(given)
        if isinstance(amount, bool) or not isinstance(amount, int | float | np.number) or not np.isfinite(amount):
            raise AnalysisError(f"changes: {given!r}: {amount!r} must be a finite number (the value to "
                                f"{'add' if mode == 'steer' else 'set'}).")
        if abs(float(amount)) > FLOAT32_MAX:  # the model runs in float32: it would be ±inf there, and NaN after
            raise AnalysisError(f"changes: {given!r}: {amount!r} is beyond float32's range (±{FLOAT32_MAX:.3g}), the "
                                f"model's; pass a value within it (an activation of a few times the feature's own).")
        node = graph.node_index(*key)
        if mode == "steer":
            steer[key], by_node_steer[node] = amount, float(amount)
        else:
            mask[key], value[key], by_node_clamp[node] = True, amount, float(amount)
    s = sites(model)
    run = model.jit(record_run, static_argnames=("configs", "names"))
    targets = unlabelled(graph.targets)
    captured, _, _, errors, clean = run(model.state, inputs, tc.params, targets, configs=tc.configs,
                                        names=tuple(record_names(s)))
    frozen = {k: v for k, v in captured.items() if k in set(s.patterns) | set(s.scales)}
    program = model.jit(_intervened, static_argnames=("configs", "freeze"), what="the intervention")
    after = program(model.state, inputs, tc.params, targets, frozen, errors, steer, mask, value,
                    configs=tc.configs, freeze=bool(freeze))
    clean, after = np.asarray(clean), np.asarray(after)
    if not np.isfinite(after).all():
        raise AnalysisError(f"the intervention {dict(changes)} overflowed float32 in the model (the target came out "
                            f"{after.tolist()}); pass smaller values.")
    return InterventionResult(list(graph.target_labels), clean, after, after - clean,
                              predicted_change(graph, by_node_steer, by_node_clamp))
