"""Host↔device moves: the ways an array crosses between NumPy and JAX without compiling anything, and the split of
a scanned run's stacked captures into each layer's value on the host.

On a CPU the device's memory is the host's: a device array reads as a NumPy view (host_view, no copy), and
jax.device_put of a contiguous NumPy array whose buffer is aligned to ALIGNMENT bytes adopts that buffer as the
device array's own (no copy either; JAX's transfer guard still logs it, per array). `adopted` relies on it to hand
host cuts back to JAX with no copy but the cut's own."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import numpy as np

from minibert.core.hooks import STACKED_NAME
from minibert.core.site_names import in_block

ALIGNMENT = 64  # bytes: XLA's CPU client adopts a host buffer so aligned without a copy (and copies any other)


def on_device(array, dtype=None) -> jax.Array:
    """A host array (NumPy, or a list) on the default device, cast to `dtype` on the host: jax.device_put, which
    compiles nothing (jnp.asarray and jnp.array compile a small program for every new shape, and JAX keeps each)."""
    return jax.device_put(np.asarray(array, dtype))


def all_on_device(arrays):
    """A pytree of host arrays (NumPy: an Inputs' fields, a call's cut outputs) on the default device in one
    jax.device_put: one call, whose arrays JAX moves in one batch (JAX's transfer guard logs each array)."""
    return jax.device_put(arrays)


def adopted(values):
    """A pytree with its NumPy leaves (views of CPU device arrays, cut or split on the host) made device arrays in
    one all_on_device call, each written contiguous into an ALIGNMENT-aligned buffer first where it is not one
    already, so that on a CPU the device arrays adopt those buffers: the cut's host copy is its one copy (a
    jax.device_put of the strided view would copy it into a buffer of XLA's own). Other leaves stay as they are."""
    leaves, tree = jax.tree.flatten(values)
    host = [i for i, leaf in enumerate(leaves) if isinstance(leaf, np.ndarray)]
    if host:
        for i, moved in zip(host, all_on_device([_aligned(leaves[i]) for i in host])):
            leaves[i] = moved
    return jax.tree.unflatten(tree, leaves)


def _aligned(rows: np.ndarray) -> np.ndarray:
    """`rows` as it is where contiguous and ALIGNMENT-aligned, else a copy in a buffer that is."""
    return rows if rows.flags.c_contiguous and rows.ctypes.data % ALIGNMENT == 0 else host_copy(rows)


def host_copy(array, dtype=None) -> np.ndarray:
    """`array` copied (cast to `dtype`) into a host_buffer of minibert's own: what a user gave is never the memory a
    device array adopts, so changing their array afterwards (or while an asynchronous call still reads it) changes
    nothing of ours."""
    rows = np.asarray(array, dtype)
    copy = host_buffer(rows.shape, rows.dtype)
    np.copyto(copy, rows)
    return copy


def host_buffer(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialised C-contiguous NumPy array whose buffer is aligned to ALIGNMENT bytes: one that
    jax.device_put adopts on a CPU, with no copy (fill it first: the device array shares its memory)."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    buffer = np.empty(size + ALIGNMENT, np.uint8)
    start = -buffer.ctypes.data % ALIGNMENT
    return buffer[start:start + size].view(dtype).reshape(shape)


def host_view(array):
    """A concrete device array on the CPU as a NumPy array (no copy where its buffer allows it); anything else (a
    tracer, an array on an accelerator, a NumPy array) as it is. Slice the view, not the array: slicing a device
    array with jax compiles a small program for every new shape, and JAX keeps each."""
    if isinstance(array, jax.Array) and not isinstance(array, jax.core.Tracer) and \
            {device.platform for device in array.devices()} == {"cpu"}:
        return np.asarray(array)
    return array


def unstacked(captured: Mapping[str, object], host: bool = True) -> dict[str, object]:
    """Captures with each stacked buffer (stacked_name) split into its layers' values under their own names, in
    the order given. host: slices of a device array on a CPU are NumPy views of it (slicing it with jax would
    compile a small program for every new shape; `adopted` puts them back); False: sliced as they are
    (inside a traced function). Shapes (jax.ShapeDtypeStruct) split into the shape of one layer's value."""
    values = {}
    for name, value in captured.items():
        match = STACKED_NAME.match(name)
        if match is None:
            values[name] = value
            continue
        rows = host_view(value) if host else value
        for slot, layer in enumerate(match.group(1).split(",")):
            values[in_block(layer, match.group(2))] = (
                jax.ShapeDtypeStruct(value.shape[1:], value.dtype) if isinstance(value, jax.ShapeDtypeStruct)
                else rows[slot])
    return values
