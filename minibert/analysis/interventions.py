"""Interventions, built on hooks: head ablation, activation patching, attention scaling, and the batched
sweeps researchers run over them (every head, every layer × position, attribution patching, head importance).

Each builder returns a `hooks` dict for `model.run_with_hooks`. Their array arguments travel as traced
`HookFn` arrays, so a loop over heads or positions compiles once.

The sweeps are one compiled program each, batched over the swept items. For the items of layer l they reuse
the unchanged run up to block l (the residual stream entering block l, captured once for every layer) and
run only the suffix — block l with the intervention, the blocks after it, the head, the metric — vmapped over
the items and chunked to a memory budget. The layer is a traced argument: the suffix program holds every
block behind a `lax.cond(i >= l)`, so all layers share one compilation instead of one per suffix length
(blocks before l are skipped at run time, not computed and discarded).

One contract for every function here, in `mixing`, `gradients` and `Model.grad` that takes a metric, loss or
target function (`contract.metric_values` checks it, with one message): it is written with jax.numpy (it runs
inside a compiled program) and returns floats, either one value per batch row, shape [B] — each row an
example of its own — or one value for the whole batch, shape () — the batch one example. Sweeps report the
mean over rows of a [B] value and a () value as it is; gradient analyses differentiate each row's own value,
or the batch's one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from minibert.analysis.sweeps import residual_streams, row_mean, sweep_streams
from minibert.core.contract import metric_values, static_metric, traced_call
from minibert.core.encoder import unrolled_stack
from minibert.core.hooks import HookError, HookFn, add_delta, any_length, site_axes
from minibert.core.site_names import ATTN_SCORES, RESID_PRE, Z, every_block
from minibert.errors import AnalysisError
from minibert.io.tokenizer import Batch
from minibert.runtime.model import Inputs, is_text


@any_length  # position by position: the mask and replacement are [L, H(, K)], so rows may run padded, unprobed
def _ablate_z(z, ctx, mask, replacement):
    """z [B, T, H, K]: heads with mask[layer, h] = 1 take replacement[layer, h] instead of their output."""
    m = mask[ctx.layer][None, None, :, None]
    return (z * (1 - m) + replacement[ctx.layer][None, None] * m).astype(z.dtype)


def ablate_heads(mask, mean=None) -> dict:
    """Ablate the heads where `mask[L, H]` is 1: zero ablation, or mean ablation given `mean[L, H, K]`.

    Acts on `attn.hook_z`, each head's mix of values before W_O: a zero-ablated head adds
    nothing to the residual stream (the output bias b_O stays, as it belongs to no head).
    """
    mask = jnp.asarray(mask, jnp.float32)
    if mask.ndim != 2:
        raise HookError(f"ablate_heads needs a [layers, heads] mask; got shape {mask.shape}.")
    replacement = jnp.zeros((*mask.shape, 1), jnp.float32) if mean is None else jnp.asarray(mean, jnp.float32)
    return {every_block(Z): HookFn(_ablate_z, mask=mask, replacement=replacement)}


def head_mask(layer: int, head: int, n_layers: int, n_heads: int) -> np.ndarray:
    """A one-hot [L, H] mask selecting one head (0-indexed)."""
    mask = np.zeros((n_layers, n_heads), np.float32)
    mask[layer, head] = 1
    return mask


def mean_z(model, batch) -> jnp.ndarray:
    """Each head's mean output z over the real tokens of `batch` → [L, H, K], for mean ablation."""
    inputs = model.inputs(batch)
    _, cache = model.run_with_cache(inputs, names=every_block(Z))
    z = cache.stack(Z)  # [L, B, T, H, K]
    mask = jnp.asarray(inputs.attention_mask, jnp.float32)[None, :, :, None, None]
    return (z * mask).sum((1, 2)) / mask.sum((1, 2))


def _patch(value, ctx, layer, position, clean):
    """Replace `value` [B, T, ...] at `position` with the clean run's, in block `layer` only."""
    at = (jnp.arange(value.shape[1]) == position).reshape((1, -1) + (1,) * (value.ndim - 2))
    return jnp.where((ctx.layer == layer) & at, clean[ctx.layer], value)


def _patch_head(value, ctx, layer, head, clean):
    """Replace head `head` of `value` [B, T, H, ...] with the clean run's at every position, in block `layer` only."""
    at = (jnp.arange(value.shape[2]) == head).reshape((1, 1, -1) + (1,) * (value.ndim - 3))
    return jnp.where((ctx.layer == layer) & at, clean[ctx.layer], value)


# What one patch covers: per="position" patches one position (every head), per="head" one head (every position).
# The value of a site is [B, T, ...] or [B, T, H, ...]; the swept axis of the stacked values [L, B, T, ...]:
SWEPT_AXIS = {"position": 2, "head": 3}


class Baselines(NamedTuple):
    """The metric without any intervention, beside a sweep's grid (baselines=True): clean, and for patching the
    corrupted run — what a centred or normalised heatmap, (grid − corrupted) / (clean − corrupted), needs."""

    clean: float
    corrupted: float | None = None  # ablation_sweep: None (the ablated runs are the grid itself)

    @property
    def direction(self) -> str | None:
        """Which way the grid's runs were patched: "clean into corrupted" (patch_activations), None for an
        ablation."""
        return None if self.corrupted is None else "clean into corrupted"


def _plain_metric(model, inputs, metric) -> float:
    """The mean metric of the batch's plain run, as the sweep's metric contract reads it (one compiled program)."""
    program = model.jit(_metric_of_run, static_argnames=("metric",))
    return float(program(model.state, inputs, metric=static_metric(metric)))


def _metric_of_run(model, state, inputs, *, metric):
    out = model.suffix(state, 0, model.embed(state, inputs), inputs, {})
    return row_mean(traced_call(metric.fn, out), inputs.shape[0])


# ---- head ablation --------------------------------------------------------------------------------------------

def _ablating(layer, head, replacement):
    """The hooks that ablate head `head` of block `layer` (both traced) with replacement [L, H, K|1]."""
    n_layers, n_heads = replacement.shape[:2]
    mask = (jnp.arange(n_layers)[:, None] == layer) & (jnp.arange(n_heads)[None, :] == head)
    return ablate_heads(mask, mean=replacement)


def ablation_sweep(model, batch, metric: Callable, mode: str = "zero", chunk: int | None = None, *,
                   baselines: bool = False):
    """The metric after ablating each head alone, on `attn.hook_z` as `ablate_heads` does → [L, H] NumPy.

    mode "zero" zeroes the head's z; "mean" puts each head's z averaged over the real tokens of `batch`
    (`mean_z`). `metric(output)` returns one value per row of `batch` (or a scalar); the grid holds its mean.
    All L·H heads run in one compiled program, `chunk` heads per call (default: as many as
    accounting.MEMORY_BUDGET of activations allow, see `accounting.activation_bytes`).
    baselines=True returns (grid, Baselines(clean=the metric without ablation)) instead of the grid alone.
    """
    cfg = model.config
    if mode == "zero":
        replacement = jnp.zeros((cfg.num_hidden_layers, cfg.num_attention_heads, 1), jnp.float32)
    elif mode == "mean":
        replacement = mean_z(model, batch)
    else:
        raise AnalysisError(f"mode must be 'zero' or 'mean'; got {mode!r}.")
    inputs = model.inputs(batch)
    grid = sweep_streams(model, inputs, residual_streams(model, batch), cfg.num_attention_heads, _ablating,
                         replacement, metric, chunk, item="head")
    return (grid, Baselines(_plain_metric(model, inputs, metric))) if baselines else grid


# ---- activation patching --------------------------------------------------------------------------------------

def _positional_site(model, site: str, per: str = "position") -> str:
    """`site` if it is a per-block hook with positions on axis 1 (and, for per="head", heads on axis 2), else a
    HookError listing the choices."""
    if per not in SWEPT_AXIS:
        raise AnalysisError(f"per must be 'position' (one patch per layer and position, every head) or 'head' (one "
                            f"per layer and head, every position); got {per!r}.")
    per_block = [n.split(".", 2)[2] for n in model.hook_names if n.startswith("blocks.0.")]
    positional = [s for s in per_block if site_axes(f"blocks.0.{s}")[1] in ("T", "S")]
    if per == "head":
        positional = [s for s in positional if site_axes(f"blocks.0.{s}")[2:3] == ["H"]]
    if site not in positional:
        having = "positions on axis 1" + (" and heads on axis 2" if per == "head" else "")
        raise HookError(f"site {site!r} is not a per-block hook with {having}; patching per {per} needs one of "
                        f"{', '.join(positional)}.")
    return site


def paired_inputs(model, clean, corrupted) -> tuple[Inputs, Inputs]:
    """The clean and corrupted batches as Inputs of one shape [B, T], row b of one paired with row b of the other:
    texts of different token lengths ("great" / "not great") are aligned by padding the shorter on the right, so
    position t is the t-th token of both, counted from [CLS]. What every clean/corrupted analysis runs on
    (patch_activations, attribution_patching, the circuits' edge scores); batches of different row counts are an
    AnalysisError."""
    clean_inputs, corrupt_inputs = model.inputs(clean), model.inputs(corrupted)
    if clean_inputs.shape[0] != corrupt_inputs.shape[0]:
        raise AnalysisError(f"clean and corrupted batches must have as many rows to patch (row b of one pairs with "
                            f"row b of the other); got {clean_inputs.shape[0]} and {corrupt_inputs.shape[0]}.")
    length = max(clean_inputs.shape[1], corrupt_inputs.shape[1])
    return model.padded(clean_inputs, length), model.padded(corrupt_inputs, length)


def _clean_tokens(clean_inputs, ndim: int) -> jax.Array:
    """Where the clean rows have a token, as a bool mask broadcasting over stacked site values [L, B, T, ...]:
    where the clean text has no token (padding) there is nothing to patch in."""
    real = clean_inputs.attention_mask.astype(bool)  # [B, T]
    return real.reshape(1, *real.shape, *[1] * (ndim - 3))


def _clean_where_real(model, clean_inputs, corrupt_inputs, clean_values, site: str) -> jax.Array:
    """The clean values [L, B, T, ...] with the corrupted run's own values where the clean row has padding."""
    if bool(clean_inputs.attention_mask.all()):  # no padding: nothing to replace, no second forward
        return clean_values
    real = _clean_tokens(clean_inputs, clean_values.ndim)
    return jnp.where(real, clean_values, _site_values(model, corrupt_inputs, site))


@functools.cache
def _patching(site: str, per: str = "position"):
    """The intervention that patches `site` at (layer, position) — or (layer, head) — with the clean values
    [L, B, T, ...]: one function per site and granularity, so a sweep over a site reuses its compilation."""
    def patch(layer, item, clean):
        if per == "head":
            return {f"blocks.*.{site}": HookFn(_patch_head, layer=layer, head=item, clean=clean)}
        return {f"blocks.*.{site}": HookFn(_patch, layer=layer, position=item, clean=clean)}
    return patch


def _site_values(model, batch, site: str) -> jax.Array:
    return model.run_with_cache(batch, names=f"blocks.*.{site}")[1].stack(site)


def patch_activations(model, clean, corrupted, metric: Callable, site: str = RESID_PRE,
                      chunk: int | None = None, per: str = "position", *, baselines: bool = False):
    """Activation patching: for every layer l and position p, run `corrupted` with the clean run's
    `blocks.{l}.{site}` at position p patched in (in every row), and return the metric grid [L, T] (NumPy).
    per="head": for every layer l and head h, patch head h's values at every position instead → [L, H]
    (sites with heads on axis 2: attn.hook_z, hook_q, hook_k, hook_v, hook_result). attribution_patching
    takes the same `per` and returns the same shapes.

    `site` is a per-block hook with positions on axis 1 (hook_resid_pre, attn.hook_z, hook_mlp_out, ...).
    `metric(output)` returns one value per row (or a scalar); the grid holds its mean over rows. The T
    positions of a layer are the batch axis of one vmapped suffix; every layer shares one compilation.

    The two may have different token lengths ("great" / "not great"): the shorter is padded on the right, so
    positions line up from the left — position t is the t-th token of each, [CLS] at 0 — and T is the longer
    length. Where the clean row has padding nothing is patched (the corrupted run's value stays); where only
    the corrupted row has padding the patch lands on a masked position that no real token reads.

    baselines=True returns (grid, Baselines(clean, corrupted)): the metric of the clean and of the corrupted run
    with nothing patched (each padded as the sweep pads it), for (grid − corrupted) / (clean − corrupted).
    Direction: clean into corrupted (Baselines.direction says so); edge_attribution, circuit_faithfulness and
    path_patching patch the other way, corrupted into clean.
    """
    _positional_site(model, site, per)
    clean_inputs, corrupt_inputs = paired_inputs(model, clean, corrupted)
    clean_values = _clean_where_real(model, clean_inputs, corrupt_inputs, _site_values(model, clean_inputs, site),
                                     site)  # [L, B, T, ...]
    grid = sweep_streams(model, corrupt_inputs, residual_streams(model, corrupt_inputs),
                         clean_values.shape[SWEPT_AXIS[per]], _patching(site, per), clean_values, metric, chunk,
                         item=per)
    if not baselines:
        return grid
    return grid, Baselines(_plain_metric(model, clean_inputs, metric), _plain_metric(model, corrupt_inputs, metric))


# ---- gradient estimates ---------------------------------------------------------------------------------------

def _metric_and_site_gradient(model, state, inputs, zeros, *, site, metric):
    """(site values [L, B, T, ...], ∂ mean metric / ∂ site values) of one forward and one backward (model.jit)."""

    def objective(delta):
        names = [f"blocks.{i}.{site}" for i in range(len(zeros))]
        shifts = {name: HookFn(add_delta, delta=delta[i]) for i, name in enumerate(names)}  # zero shifts
        out, captured = model.forward_fn(names, shifts)(state, inputs)
        return row_mean(traced_call(metric.fn, out), inputs.shape[0]), jnp.stack([captured[n] for n in names])

    grads, values = jax.grad(unrolled_stack()(objective), has_aux=True)(zeros)  # core.encoder.unrolled_stack
    return values, grads


def attribution_patching(model, clean, corrupted, metric: Callable, site: str = RESID_PRE,
                         per: str = "position") -> np.ndarray:
    """Attribution patching (Nanda 2023; Syed, Rager & Conmy 2023): the first-order estimate of what patching
    each clean activation into the corrupted run changes, (a_clean − a_corrupt) · ∂metric/∂a on the corrupted
    run, summed over the site's feature axes and the batch rows → [L, T] NumPy; per="head" sums over positions
    instead of heads → [L, H] (sites with heads on axis 2), the shapes patch_activations gives for the same per.

    It estimates `patch_activations(...) − metric(corrupted)` (both means over rows) from one forward and one
    backward pass for the whole grid, plus one forward of the clean run. A linearisation, it is exact only for
    small changes: it ranks sites well where the metric is smooth in the activation (typically better on
    hook_attn_out and hook_mlp_out than on the whole residual stream), and a large real effect can be
    under- or overestimated.
    """
    _positional_site(model, site, per)
    clean_inputs, corrupt_inputs = paired_inputs(model, clean, corrupted)  # aligned as in patch_activations
    clean_values = _site_values(model, clean_inputs, site)
    gradient = model.jit(_metric_and_site_gradient, static_argnames=("site", "metric"), what="attribution patching")
    corrupt_values, grads = gradient(model.state, corrupt_inputs, jnp.zeros_like(clean_values), site=site,
                                     metric=static_metric(metric))
    patched = _clean_tokens(clean_inputs, clean_values.ndim)  # nothing is patched where the clean row has padding
    effect = jnp.where(patched, (clean_values - corrupt_values) * grads, 0)  # [L, B, T, ...]
    kept = (0, SWEPT_AXIS[per])  # layer and position, or layer and head
    return np.asarray(effect.sum(axis=tuple(a for a in range(effect.ndim) if a not in kept)))


def _gate_z(z, ctx, gates):
    """z [B, T, H, K] with each row's head h scaled by gates[b, layer, h]."""
    return z * gates[:, ctx.layer][:, None, :, None].astype(z.dtype)


def _gate_gradients(model, state, inputs, *, loss_fn) -> jax.Array:
    """∂loss_b/∂ξ[b, l, h] at ξ = 1 for every row b: [B, L, H], one backward (row b's loss reads only its gates);
    [1, L, H] for one loss of the whole batch (compiled with model.jit)."""
    cfg = model.config
    n_rows = inputs.shape[0]

    def total_loss(gates):
        out, _ = model.forward_fn((), {every_block(Z): HookFn(_gate_z, gates=gates)})(state, inputs)
        losses = metric_values(traced_call(loss_fn.fn, out, "loss_fn"), n_rows, "loss_fn")
        return losses.sum(), losses

    gates = jnp.ones((n_rows, cfg.num_hidden_layers, cfg.num_attention_heads), jnp.float32)
    gradients, losses = jax.grad(unrolled_stack()(total_loss), has_aux=True)(gates)  # core.encoder.unrolled_stack
    # One loss for the whole batch: the batch is one example, its rows share each head's gate.
    return gradients if losses.ndim else gradients.sum(0, keepdims=True)


def _one_batch(batches) -> bool:
    """A single batch (Batch, dict of arrays, text, list of texts) rather than an iterable of batches."""
    return isinstance(batches, (Inputs, Batch, Mapping)) or is_text(batches)


def head_importance(model, batches, loss_fn: Callable) -> np.ndarray:
    """Head importance (Michel, Levy & Neubig 2019): I_h = mean over examples of |∂L/∂ξ_h| at ξ = 1, where ξ_h
    multiplies head h's z (its output before W_O) → [L, H] NumPy.

    `batches`: one batch or an iterable of batches; `loss_fn(output)` → per-row losses [B], every row an example
    with its own gates (one backward per batch gives every row's gradient), or one loss for the batch (), the
    batch one example whose rows share the gates. This is the paper's I_h; the authors' released script takes
    |·| per token before summing over tokens (docs/context_mixing.md).
    """
    total, examples = 0.0, 0
    for batch in ([batches] if _one_batch(batches) else batches):
        inputs = model.inputs(batch)
        program = model.jit(_gate_gradients, static_argnames=("loss_fn",), what="head importance")
        gradients = program(model.state, inputs, loss_fn=static_metric(loss_fn))  # [examples, L, H]
        total = total + np.abs(np.asarray(gradients)).sum(0)
        examples += gradients.shape[0]
    if examples == 0:
        raise AnalysisError("head_importance got no batches; pass a batch or an iterable of batches.")
    return total / examples


# ---- attention scaling ----------------------------------------------------------------------------------------

def _scale_scores(scores, ctx, log_factor, keys, layers):
    """scores [B, H, T, S] + log(factor) on the chosen key columns, in the chosen layers."""
    shift = jnp.where(keys[:, None, None, :] & layers[ctx.layer], log_factor, 0.0)
    blocked = jnp.isneginf(shift)
    return jnp.where(blocked, jnp.finfo(scores.dtype).min, scores + jnp.where(blocked, 0.0, shift)).astype(scores.dtype)


def scale_attention(keys, factor: float, n_layers: int, layers=None) -> dict:
    """Multiply the attention paid to key positions `keys` (bool [B, S] or [S]) by `factor` before
    renormalisation (factor 0 blocks them), in `layers` (default all). Acts on `attn.hook_attn_scores`,
    so each row still sums to 1: softmax(s + log factor) = factor·e^s / Σ."""
    keys = jnp.asarray(keys, bool)
    keys = keys[None] if keys.ndim == 1 else keys
    chosen = np.zeros(n_layers, bool)
    chosen[list(range(n_layers)) if layers is None else list(layers)] = True
    log_factor = jnp.log(jnp.float32(factor))
    return {every_block(ATTN_SCORES): HookFn(_scale_scores, log_factor=log_factor, keys=keys,
                                                     layers=jnp.asarray(chosen))}


def block_attention(keys, n_layers: int, layers=None) -> dict:
    """No query may attend to key positions `keys` (in `layers`, default all)."""
    return scale_attention(keys, 0.0, n_layers, layers)
