"""Host↔device moves: the two ways an array crosses between NumPy and JAX without compiling anything, and the
split of a scanned run's stacked captures into each layer's value on the host."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import numpy as np

from minibert.core.hooks import STACKED_NAME
from minibert.core.site_names import in_block


def on_device(array, dtype=None) -> jax.Array:
    """A host array (NumPy, or a list) on the default device, cast to `dtype` on the host: jax.device_put, which
    compiles nothing (jnp.asarray and jnp.array compile a small program for every new shape, and JAX keeps each)."""
    return jax.device_put(np.asarray(array, dtype))


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
    compile a small program for every new shape; on_device puts them back); False: sliced as they are
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
