"""Sums and maps over many items (integration steps, occluded words, circuits) inside one compiled program,
`chunk` items side by side, so live memory stays near accounting.MEMORY_BUDGET whatever the count."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


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
