"""Compiled programs: the persistent compilation cache every process shares, and the programs a Model keeps.

JAX compiles one program per function and argument shapes (docs/compiled.md says which a Model compiles and
when). Two things keep that cheap over time:

- The persistent compilation cache: compiled programs are written to disk, so a second process (a restarted
  kernel, the next run of a script) loads them instead of compiling again. It is on by default, in
  $MINIBERT_CACHE_DIR, else a folder you set in JAX yourself (jax_compilation_cache_dir), else
  $XDG_CACHE_HOME/minibert/jax, else ~/.cache/minibert/jax; MINIBERT_COMPILATION_CACHE=0 turns it off in the
  process. A folder that cannot be written turns it off too, with one CacheWarning.
  Several processes may share the folder: where the filelock package is installed (it comes with PyTorch and
  huggingface_hub) JAX locks it around each read and write and keeps it under CACHE_MAX_BYTES, least recently
  used out; without it, a read that meets a half-written entry costs a warning and a compile, never a wrong result
  (in every later process too: JAX never replaces an entry; deleting the folder clears it).
- A Model's resident programs (`Resident`): at most Model.max_programs at a time, the least recently used dropped
  first, with their memory; model.clear_compiled() drops them all.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import tempfile
import warnings
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

CACHE_DIR_ENV = "MINIBERT_CACHE_DIR"  # where the persistent cache lives
CACHE_SWITCH_ENV = "MINIBERT_COMPILATION_CACHE"  # one of SWITCH_OFF turns it off, one of SWITCH_ON keeps it on
SWITCH_OFF = ("0", "false", "off", "no", "n", "none", "disabled", "disable")
SWITCH_ON = ("", "1", "true", "on", "yes", "y", "enabled", "enable")
CACHE_MAX_BYTES = 2 * 1024**3  # the folder's size bound, where filelock makes a bounded folder safe to share
MAX_PROGRAMS = 32  # programs a Model keeps resident (a few MB each for a small model, tens for a large one)


class CacheWarning(UserWarning):
    """The persistent compilation cache's settings could not be followed as given; the message says what minibert
    does instead and how to fix the setting."""


_set_up = {"folder": None, "unusable": set()}  # what use_persistent_cache() did: the folder it gave JAX, ones refused


def switched_off() -> bool:
    """Whether MINIBERT_COMPILATION_CACHE turns the cache off (a value in neither SWITCH_OFF nor SWITCH_ON keeps it
    on; use_persistent_cache() warns about it)."""
    return switch() in SWITCH_OFF


def switch() -> str:
    """MINIBERT_COMPILATION_CACHE as it is compared with SWITCH_OFF and SWITCH_ON: stripped, lower case."""
    return os.environ.get(CACHE_SWITCH_ENV, "").strip().lower()


@functools.cache
def absolute_folder(text: str) -> Path | None:
    """A folder setting as an absolute path: ~ and $VARIABLES expanded as a shell would, a relative path resolved
    against the working directory of the first call (at import), so a later os.chdir does not move the cache;
    None where it names a variable that is not set."""
    expanded = os.path.expanduser(os.path.expandvars(text))
    return None if "$" in expanded else Path(expanded).absolute()


def jax_own_folder() -> Path | None:
    """A cache folder set in JAX itself (jax_compilation_cache_dir, or JAX_COMPILATION_CACHE_DIR), not by minibert."""
    configured = jax.config.jax_compilation_cache_dir
    return Path(configured) if configured and configured != _set_up["folder"] else None


def chosen_folder() -> Path | None:
    """The folder the settings choose (cache_directory() less the check that it can be written): None when
    switched off, or when MINIBERT_CACHE_DIR names an unset variable; MINIBERT_CACHE_DIR wins, then a folder set
    in JAX itself, then $XDG_CACHE_HOME/minibert/jax (an absolute XDG_CACHE_HOME only, as the XDG spec says), then
    ~/.cache/minibert/jax."""
    if switched_off():
        return None
    if os.environ.get(CACHE_DIR_ENV):
        return absolute_folder(os.environ[CACHE_DIR_ENV])
    if (own := jax_own_folder()) is not None:
        return own
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "minibert" / "jax"


def cache_directory() -> Path | None:
    """The persistent compilation cache's folder, or None when it is off: switched off by
    MINIBERT_COMPILATION_CACHE, or off for this process because the folder could not be used."""
    folder = chosen_folder()
    return None if folder in _set_up["unusable"] else folder


def unwritable(folder: Path) -> str | None:
    """Why `folder` cannot hold the cache (created where missing, a file written and removed), or None if it can."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        return f"{type(error).__name__}: {error.strerror or error}"
    return None


def refused(message: str) -> None:
    """The persistent cache off for this process (a JAX folder of your own included), with one warning."""
    jax.config.update("jax_enable_compilation_cache", False)
    warnings.warn(f"{message}; the persistent compilation cache is off in this process (programs compile as "
                  f"usual). Fix: set {CACHE_DIR_ENV} to a folder you can write, or {CACHE_SWITCH_ENV}=0.",
                  CacheWarning, stacklevel=outside_minibert())


def outside_minibert() -> int:
    """The stacklevel, for its caller's warnings.warn, of the first frame outside minibert and the JAX and Flax
    code it calls through: a warning points at your line (`import minibert`, the `minibert` command's own, the
    call whose trace warns), not at a line of ours or JAX's. importlib's frames are passed over without a count,
    as warnings.warn counts them."""
    frame, level = sys._getframe(2), 2
    while frame is not None and (frame.f_code.co_filename.startswith(_LIBRARIES) or _importlib_frame(frame)):
        level += not _importlib_frame(frame)
        frame = frame.f_back
    return level


_LIBRARIES = tuple(str(Path(module.__file__).parent) for module in (sys.modules[__package__], jax)) + (
    str(Path(jax.__file__).parent.parent / "flax"),)


def _importlib_frame(frame) -> bool:
    """A frame of importlib's bootstrap, which warnings.warn leaves out of its stacklevel (as its own check does)."""
    return "importlib" in frame.f_code.co_filename and "_bootstrap" in frame.f_code.co_filename


def use_persistent_cache() -> Path | None:
    """Point JAX's persistent compilation cache at cache_directory() (done when this module is imported); the
    folder in use, or None. Every program is written, however small or quick to compile: on a CPU a small
    model's forward compiles in about a second, which the cache turns into milliseconds. The thresholds are
    lowered in a folder you set in JAX yourself too; switched off, the cache is off in this process, that folder
    included."""
    if switch() not in SWITCH_OFF + SWITCH_ON:
        warnings.warn(f"{CACHE_SWITCH_ENV}={os.environ[CACHE_SWITCH_ENV]!r} is neither on nor off, so the "
                      f"persistent compilation cache stays on; pass one of {', '.join(map(repr, SWITCH_OFF))} to "
                      f"turn it off, or one of {', '.join(map(repr, SWITCH_ON[1:]))} to keep it on.",
                      CacheWarning, stacklevel=outside_minibert())
    if switched_off():
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    folder = chosen_folder()
    if folder is None:
        refused(f"{CACHE_DIR_ENV}={os.environ[CACHE_DIR_ENV]!r} names an environment variable that is not set")
        return None
    problem = unwritable(folder)
    if problem is not None:
        _set_up["unusable"].add(folder)
        refused(f"the compilation cache folder {str(folder)!r} cannot be written ({problem})")
        return None
    if folder != jax_own_folder():  # minibert's folder: remembered, so it is never taken for one of your own
        _set_up["folder"] = str(folder)
        jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # no size floor, and none chosen for us
    if importlib.util.find_spec("filelock") is not None:
        jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)
    return folder


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
