"""The sweep engine: every intervention of an analysis — ablation, patching, a knockout of your own, circuits'
faithfulness and edge patches — runs here, as one compiled program over the swept items, `chunk` items side by
side, so live memory stays near accounting.MEMORY_BUDGET whatever the count.

- sweep(model, batch, patch, n_items, metric): the metric after `patch(layer, item, shared)` at every layer × item
  → [L, n_items]; the model runs once up to each block (the residual streams) and the suffix from there is
  vmapped over the items. ablation_sweep and patch_activations are two patch setters on it.
- chunked_map: [fn(items[k])] over a fixed number of items inside one traced function (the senders of an edge
  graph, an attribution graph's rows), `chunk` items vmapped at a time.
- live_sum, live_map: Σ_k fn(items[k]) and [fn(items[k])] over a count the user chooses (integration points,
  circuits, occluded words): the items padded to padded_count(n), a power of two, and only the chunks holding the
  n live ones run (a lax.fori_loop over a traced number of chunks), live_chunk(…) items at a time — so every count
  of a bucket shares one program, and under 1/8 of the items run are padding.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from minibert.analysis._finite import check_finite
from minibert.core.contract import metric_values, static_metric, traced_call
from minibert.core.site_names import RESID_PRE, every_block
from minibert.errors import AnalysisError
from minibert.runtime import accounting


def chunked_map(fn: Callable, items, chunk: int):
    """[fn(items[k]) for every k], stacked: `chunk` items vmapped at a time (lax.map's batch_size)."""
    return jax.lax.map(fn, items, batch_size=chunk)


# ---- counts of items: one program per bucket of counts --------------------------------------------------------

FEWEST_PADDED = 16  # the fewest items a program is built for: EAP and EAP-IG up to 16 steps share one
PADDING_SHARE = 8  # a live loop's chunk is at most 1/(2·PADDING_SHARE) of its bucket: under 1/8 of what runs pads


def power_of_two(n: int) -> int:
    """The largest power of two ≤ n (n ≥ 1): it divides every larger power of two, so chunks tile a bucket."""
    return 1 << (int(n).bit_length() - 1)


def padded_count(n: int, fewest: int = FEWEST_PADDED) -> int:
    """The number of items a program over n items is built for: the next power of two ≥ n, at least `fewest`.
    Every count of a bucket (1 to 16 steps; 33 to 64) shares one program, and its padding is not run (live_sum)."""
    return max(fewest, 1 << max(0, int(n) - 1).bit_length())


def live_chunk(bytes_per_item: float, n: int) -> int:
    """How many of n items a live loop runs side by side: a power of two chosen from n's bucket alone, so every
    count of the bucket shares the program — within accounting.MEMORY_BUDGET, and at most bucket/16. The last chunk
    run holds fewer than `chunk` padding items, and n > bucket/2 past the first bucket (which runs one at a time),
    so under 1/8 of the items run are padding."""
    bucket = padded_count(n)
    return power_of_two(min(accounting.items_per_chunk(bytes_per_item, bucket), bucket // (2 * PADDING_SHARE)))


def padded(values, fill) -> np.ndarray:
    """`values` [n, ...] (host) followed by copies of `fill` up to padded_count(n) items: a live loop's items.
    Fill with a valid item (α = 1, a cut of no edge) so the padding a last chunk runs computes finite values."""
    values = np.asarray(values)
    out = np.empty((padded_count(len(values)), *values.shape[1:]), values.dtype)
    out[:len(values)], out[len(values):] = values, fill
    return out


def _chunk_at(items, start, chunk: int):
    return jax.tree_util.tree_map(lambda v: jax.lax.dynamic_slice_in_dim(v, start, chunk), items)


def live_sum(fn: Callable, items, live, chunk: int):
    """Σ_{k < live} fn(items[k]) over the leading axis of the pytree `items` (padded: `padded`), `chunk` items
    vmapped at a time into one running sum: a lax.fori_loop over the ceil(live / chunk) chunks holding a live item,
    `live` a traced int32, so one program serves every count; the last chunk's padding is computed and left out."""
    zeros = jax.eval_shape(fn, jax.tree_util.tree_map(lambda v: v[0], items))

    def add_chunk(i, total):
        start = i * chunk
        keep = start + jnp.arange(chunk) < live
        values = jax.vmap(fn)(_chunk_at(items, start, chunk))
        return jax.tree_util.tree_map(
            lambda t, v: t + jnp.where(keep.reshape(-1, *[1] * (v.ndim - 1)), v, 0).sum(0), total, values)

    total = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), zeros)
    return jax.lax.fori_loop(0, (live + chunk - 1) // chunk, add_chunk, total)


def live_map(fn: Callable, items, live, chunk: int):
    """[fn(items[k])] over the padded leading axis of `items`, stacked: the chunks holding an item k < live run
    (`chunk` vmapped at a time, as live_sum), the rest stay 0 — cut them off on the host ([:n])."""
    n = jax.tree_util.tree_leaves(items)[0].shape[0]
    shapes = jax.eval_shape(fn, jax.tree_util.tree_map(lambda v: v[0], items))

    def write_chunk(i, out):
        values = jax.vmap(fn)(_chunk_at(items, i * chunk, chunk))
        return jax.tree_util.tree_map(lambda o, v: jax.lax.dynamic_update_slice_in_dim(o, v, i * chunk, 0), out,
                                      values)

    out = jax.tree_util.tree_map(lambda s: jnp.zeros((n, *s.shape), s.dtype), shapes)
    return jax.lax.fori_loop(0, (live + chunk - 1) // chunk, write_chunk, out)


# ---- the sweep engine: prefix once, suffix vmapped over the items ---------------------------------------------

def row_mean(values, n_rows: int, what: str = "metric") -> jax.Array:
    """A metric's value per batch row [B] → its mean over rows; one value for the batch () → itself."""
    return metric_values(values, n_rows, what).mean()


def residual_streams(model, batch) -> jax.Array:
    """The residual stream entering every block, from one forward: [L, B, T, D]."""
    return model.run_with_cache(batch, names=every_block(RESID_PRE))[1].stack(RESID_PRE)


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
