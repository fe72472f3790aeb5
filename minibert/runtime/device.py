"""Host↔device moves: the two ways an array crosses between NumPy and JAX without compiling anything."""

from __future__ import annotations

import jax
import numpy as np


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
