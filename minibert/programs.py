"""Compiled programs: the persistent compilation cache every process shares, and the programs a Model keeps.

JAX compiles one program per function and argument shapes (docs/compiled.md says which a Model compiles and
when). Two things keep that cheap over time:

- The persistent compilation cache: compiled programs are written to disk, so a second process (a restarted
  kernel, the next run of a script) loads them instead of compiling again. It is on by default, in
  $MINIBERT_CACHE_DIR, else $XDG_CACHE_HOME/minibert/jax, else ~/.cache/minibert/jax; MINIBERT_COMPILATION_CACHE=0
  turns it off, and a cache directory you set in JAX yourself (jax_compilation_cache_dir) is left as it is.
  Several processes may share the folder: where the filelock package is installed (it comes with PyTorch and
  huggingface_hub) JAX locks it around each read and write and keeps it under CACHE_MAX_BYTES, least recently
  used out; without it, a read that meets a half-written entry costs a warning and a compile, never a wrong result.
- A Model's resident programs (`Resident`): at most Model.max_programs at a time, the least recently used dropped
  first, with their memory; model.clear_compiled() drops them all.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

CACHE_DIR_ENV = "MINIBERT_CACHE_DIR"  # where the persistent cache lives
CACHE_SWITCH_ENV = "MINIBERT_COMPILATION_CACHE"  # "0" (or "false", "off", "no") turns it off
CACHE_MAX_BYTES = 2 * 1024**3  # the folder's size bound, where filelock makes a bounded folder safe to share
MAX_PROGRAMS = 32  # programs a Model keeps resident (a few MB each for a small model, tens for a large one)


def cache_directory() -> Path | None:
    """The persistent compilation cache's folder, or None when MINIBERT_COMPILATION_CACHE turns it off."""
    if os.environ.get(CACHE_SWITCH_ENV, "1").strip().lower() in ("0", "false", "off", "no"):
        return None
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "minibert" / "jax"


def use_persistent_cache() -> Path | None:
    """Point JAX's persistent compilation cache at cache_directory() (done when this module is imported); the
    folder in use, or None. Every program is written, however small or quick to compile: on a CPU a small
    model's forward compiles in about a second, which the cache turns into milliseconds."""
    configured = jax.config.jax_compilation_cache_dir
    if configured:  # the user's own setting wins
        return Path(configured)
    directory = cache_directory()
    if directory is None:
        return None
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # no size floor, and none chosen for us
    if importlib.util.find_spec("filelock") is not None:
        jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)
    return directory


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


use_persistent_cache()  # on by default: every minibert program a process compiles is kept for the next


class Resident:
    """A Model's compiled programs, one per (function, static arguments, argument shapes): at most `limit`, the
    least recently called dropped first. Each is its own jax.jit of its own function object, so dropping it lets
    JAX free its traces and executable."""

    def __init__(self, limit: int = MAX_PROGRAMS):
        self.limit = limit
        self._programs: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return len(self._programs)

    def get(self, key, make: Callable[[], Callable]) -> Callable:
        """The program under `key`, made by make() if absent; it becomes the most recently used."""
        if key in self._programs:
            self._programs.move_to_end(key)
            return self._programs[key]
        program = self._programs[key] = make()
        self.resize(self.limit)
        return program

    def resize(self, limit: int) -> None:
        """Keep at most `limit` programs from now on, dropping the least recently used past it."""
        self.limit = limit
        while len(self._programs) > limit:
            self._programs.popitem(last=False)

    def clear(self) -> None:
        self._programs.clear()


class Program:
    """`fn(*args, **kwargs)` compiled, kept in a Resident under its argument shapes and static arguments: what
    Model.jit returns. Called, lowered (.lower) or shape-evaluated (.eval_shape) as a jax.jit is."""

    def __init__(self, fn: Callable, static_argnames: tuple[str, ...], resident: Resident):
        self.fn, self.static_argnames, self.resident = fn, static_argnames, resident

    def _compiled(self, args, kwargs):
        static = tuple(sorted((k, v) for k, v in kwargs.items() if k in self.static_argnames))
        dynamic = {k: v for k, v in kwargs.items() if k not in self.static_argnames}
        leaves, structure = jax.tree_util.tree_flatten((args, dynamic))
        key = (self.fn, static, structure, tuple(map(jax.typeof, leaves)))
        return self.resident.get(key, functools.partial(self._jitted, self.fn, self.static_argnames))

    @staticmethod
    def _jitted(fn, static_argnames):
        """jax.jit of a new function object calling fn: JAX keys its traces on the function (unwrapping a partial),
        so a program of its own function takes its trace, lowering and executable with it when it is dropped."""
        @functools.wraps(fn)
        def program(*args, **kwargs):
            return fn(*args, **kwargs)

        return jax.jit(program, static_argnames=static_argnames)

    def __call__(self, *args, **kwargs):
        return self._compiled(args, kwargs)(*args, **kwargs)

    def lower(self, *args, **kwargs):
        return self._compiled(args, kwargs).lower(*args, **kwargs)

    def eval_shape(self, *args, **kwargs):
        return self._compiled(args, kwargs).eval_shape(*args, **kwargs)
