"""Ready-made interventions, built on hooks: head ablation, activation patching, attention scaling.

Each builder returns a `hooks` dict for `model.run_with_hooks`. Their array arguments
travel as traced `HookFn` arrays, so a sweep (every head, every layer × position)
compiles once.
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import numpy as np

from minibert.hooks import HookError, HookFn


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
    return {"blocks.*.attn.hook_z": HookFn(_ablate_z, mask=mask, replacement=replacement)}


def head_mask(layer: int, head: int, n_layers: int, n_heads: int) -> np.ndarray:
    """A one-hot [L, H] mask selecting one head (0-indexed)."""
    mask = np.zeros((n_layers, n_heads), np.float32)
    mask[layer, head] = 1
    return mask


def mean_z(model, batch) -> jnp.ndarray:
    """Each head's mean output z over the real tokens of `batch` → [L, H, K], for mean ablation."""
    _, cache = model.run_with_cache(batch, names="blocks.*.attn.hook_z")
    z = cache.stack("attn.hook_z")  # [L, B, T, H, K]
    mask = jnp.asarray(model.inputs(batch)[2], jnp.float32)[None, :, :, None, None]
    return (z * mask).sum((1, 2)) / mask.sum((1, 2))


def _patch(value, ctx, layer, position, clean):
    """Replace `value` [B, T, ...] at `position` with the clean run's, in block `layer` only."""
    at = (jnp.arange(value.shape[1]) == position).reshape((1, -1) + (1,) * (value.ndim - 2))
    return jnp.where((ctx.layer == layer) & at, clean[ctx.layer], value)


def patch_activations(model, clean, corrupted, metric: Callable, site: str = "hook_resid_pre") -> np.ndarray:
    """Activation patching: for every layer l and position p, run `corrupted` with the clean run's
    `blocks.{l}.{site}` at position p patched in, and return `metric(output)` as a grid [L, T].

    `site` is a per-block hook with positions on axis 1 (hook_resid_pre, attn.hook_z, hook_mlp_out, ...).
    The sweep compiles once: layer, position and clean values are traced arguments.
    """
    clean_inputs, corrupt_inputs = model.inputs(clean), model.inputs(corrupted)
    if clean_inputs[0].shape != corrupt_inputs[0].shape:
        raise HookError(f"clean and corrupted batches must have the same shape to patch; got "
                        f"{tuple(clean_inputs[0].shape)} and {tuple(corrupt_inputs[0].shape)}. Pad both to one length.")
    _, cache = model.run_with_cache(clean, names=f"blocks.*.{site}")
    values = cache.stack(site)  # [L, B, T, ...]
    n_layers, n_positions = values.shape[0], values.shape[2]
    grid = np.zeros((n_layers, n_positions), np.float32)
    for layer in range(n_layers):
        for position in range(n_positions):
            hook = HookFn(_patch, layer=jnp.int32(layer), position=jnp.int32(position), clean=values)
            grid[layer, position] = float(metric(model.run_with_hooks(corrupted, {f"blocks.*.{site}": hook})))
    return grid


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
    return {"blocks.*.attn.hook_attn_scores": HookFn(_scale_scores, log_factor=log_factor, keys=keys,
                                                     layers=jnp.asarray(chosen))}


def block_attention(keys, n_layers: int, layers=None) -> dict:
    """No query may attend to key positions `keys` (in `layers`, default all)."""
    return scale_attention(keys, 0.0, n_layers, layers)
