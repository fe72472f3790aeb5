"""The sweep engine: every intervention of an analysis — ablation, patching, a knockout of your own, circuits'
faithfulness and edge patches — runs here, as one compiled program over the swept items, `chunk` items side by
side, so live memory stays near accounting.MEMORY_BUDGET whatever the count.

- sweep(model, batch, patch, n_items, metric): the metric after `patch(layer, item, shared)` at every layer × item
  → [L, n_items]; the model runs once up to each block (the residual streams) and the suffix from there is
  vmapped over the items. ablation_sweep and patch_activations are two patch setters on it.
- chunked_sum, chunked_map: Σ_k fn(items[k]) and [fn(items[k])] over many items inside one traced function
  (integration steps, occluded words, circuits), `chunk` items vmapped at a time.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from minibert.analysis._finite import check_finite
from minibert.core.contract import metric_values, static_metric, traced_call
from minibert.errors import AnalysisError
from minibert.runtime import accounting


def chunked_sum(fn: Callable, items, chunk: int):
    """Σ_k fn(items[k]) over the leading axis of the pytree `items`, `chunk` items vmapped at a time and added
    into one running sum (lax.scan), the remainder apart: memory does not grow with the number of items."""
    n = jax.tree_util.tree_leaves(items)[0].shape[0]
    whole, rest = divmod(n, chunk)
    summed = lambda part: jax.tree_util.tree_map(lambda v: v.sum(0), jax.vmap(fn)(part))  # noqa: E731
    take = lambda start, stop: jax.tree_util.tree_map(lambda v: v[start:stop], items)  # noqa: E731
    shapes = jax.eval_shape(fn, jax.tree_util.tree_map(lambda v: v[0], items))
    total = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    if whole:
        parts = jax.tree_util.tree_map(lambda v: v[:whole * chunk].reshape(whole, chunk, *v.shape[1:]), items)
        total, _ = jax.lax.scan(lambda total, part: (jax.tree_util.tree_map(jnp.add, total, summed(part)), None),
                                total, parts)
    if rest:
        total = jax.tree_util.tree_map(jnp.add, total, summed(take(whole * chunk, n)))
    return total


def chunked_map(fn: Callable, items, chunk: int):
    """[fn(items[k]) for every k], stacked: `chunk` items vmapped at a time (lax.map's batch_size)."""
    return jax.lax.map(fn, items, batch_size=chunk)


# ---- the sweep engine: prefix once, suffix vmapped over the items ---------------------------------------------

def row_mean(values, n_rows: int, what: str = "metric") -> jax.Array:
    """A metric's value per batch row [B] → its mean over rows; one value for the batch () → itself."""
    return metric_values(values, n_rows, what).mean()


def residual_streams(model, batch) -> jax.Array:
    """The residual stream entering every block, from one forward: [L, B, T, D]."""
    return model.run_with_cache(batch, names="blocks.*.hook_resid_pre")[1].stack("hook_resid_pre")


def _suffix_metrics(model, state, inputs, start, resid, items, shared, *, patch, metric) -> jax.Array:
    """The mean metric after each intervention `patch(start, item, shared)` (a hooks dict) → [N] (compiled with
    model.jit).

    resid [B, T, D]: the residual stream entering block `start` (traced, so every layer shares this program);
    items [N]: what is swept (a head, a position), vmapped; shared: arrays every item reads (clean values).
    """
    def one(item):
        out = model.suffix(state, start, resid, inputs, patch(start, item, shared))
        return row_mean(traced_call(metric.fn, out), resid.shape[0])

    return jax.vmap(one)(items)


def items_per_call(model, batch_shape, n_items: int, chunk: int | None) -> int:
    """How many swept items one program call runs: `chunk` (checked), or as many as accounting.MEMORY_BUDGET of
    activations allows (one swept item runs the suffix block by block: one block's activations live at a time)."""
    if chunk is None:
        rows, tokens = batch_shape
        item = accounting.activation_bytes(model.config, rows, tokens, itemsize=jnp.dtype(model.dtype).itemsize)
        return accounting.items_per_chunk(item, n_items)
    if not isinstance(chunk, (int, np.integer)) or isinstance(chunk, bool) or chunk < 1:
        raise AnalysisError(f"chunk must be a positive number of items per program call; got {chunk!r}.")
    return min(int(chunk), n_items)


def sweep_streams(model, inputs, resids, n_items: int, patch: Callable, shared, metric, chunk=None,
                  item: str = "item") -> np.ndarray:
    """`patch` at every layer × item → the metric grid [L, n_items], `chunk` items per program call, from the
    residual streams `resids` [L, B, T, D] entering each block (residual_streams) of the run `inputs`. A grid
    cell that is NaN or ±inf is refused, named "layer l, {item} i" (a metric dividing by zero).

    The last chunk is padded with repeats of item 0 (its results are dropped) so every call has one shape and
    reuses one compilation.
    """
    size = items_per_call(model, inputs.shape, n_items, chunk)
    n_chunks = -(-n_items // size)
    items = np.zeros(n_chunks * size, np.int32)
    items[:n_items] = np.arange(n_items)
    program = model.jit(_suffix_metrics, static_argnames=("patch", "metric"), what="the sweep")
    rows = []
    for layer in range(resids.shape[0]):
        rows.append([program(model.state, inputs, jnp.int32(layer), resids[layer], part, shared,
                             patch=patch, metric=static_metric(metric))
                     for part in jnp.asarray(items.reshape(n_chunks, size))])
    grid = np.stack([np.concatenate([np.asarray(r) for r in row])[:n_items] for row in rows])
    cells = [f"layer {layer}, {item} {i}" for layer in range(grid.shape[0]) for i in range(n_items)]
    return check_finite(grid.ravel(), "the metric after each intervention", cells).reshape(grid.shape)


def sweep(model, batch, patch: Callable, n_items: int, metric: Callable, *, shared=None,
          chunk: int | None = None) -> np.ndarray:
    """The metric after each intervention, for every layer × item → [L, n_items] (NumPy): what ablation_sweep,
    patch_activations and a user's own intervention run through.

    `patch(layer, item, shared)` returns the hooks of one intervention ({name or glob: fn}, as run_with_hooks
    takes them): `layer` and `item` are traced int32 scalars (the block the model reruns from, and the swept item
    0 … n_items − 1), `shared` is the arrays every item reads (a clean run's values; None if not needed). Hooks
    on sites before block `layer` do not run: the model reruns from the residual stream entering that block.
    `patch` is part of the compiled program's key — pass the same function (not a new lambda) to reuse it —
    while `layer`, `item` and `shared` are traced, so the whole grid compiles once.
    `metric(output)` returns one value per row of `batch` (or a scalar); the grid holds its mean over rows.
    """
    if not callable(patch):
        raise AnalysisError(f"patch must be a function patch(layer, item, shared) -> hooks; got "
                            f"{type(patch).__name__}.")
    if not isinstance(n_items, (int, np.integer)) or isinstance(n_items, bool) or n_items < 1:
        raise AnalysisError(f"n_items must be a positive number of swept items; got {n_items!r}.")
    inputs = model.inputs(batch)
    return sweep_streams(model, inputs, residual_streams(model, inputs), int(n_items), patch, shared, metric, chunk)
