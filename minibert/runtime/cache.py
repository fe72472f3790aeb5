"""The persistent compilation cache: compiled programs written to disk, so a second process (a restarted kernel,
the next run of a script) loads them instead of compiling again.

Nothing happens at import: `import minibert` leaves JAX's configuration as it found it. When the first Model of a
process is built, use_persistent_cache() points JAX's cache at minibert's folder — $MINIBERT_CACHE_DIR, else
$XDG_CACHE_HOME/minibert/jax, else ~/.cache/minibert/jax — and lowers JAX's thresholds so that every program is
written, however quick to compile. It does so only where you have not configured JAX's cache yourself: a folder set
in JAX (jax_compilation_cache_dir, JAX_COMPILATION_CACHE_DIR) or JAX's cache switched off
(jax_enable_compilation_cache) is yours, and minibert changes none of JAX's settings then.
MINIBERT_COMPILATION_CACHE=0 keeps minibert's folder off. A folder that cannot be written keeps it off too, with one
CacheWarning. Several processes may share the folder: where the filelock package is installed (it comes with
PyTorch and huggingface_hub) JAX locks it around each read and write and keeps it under CACHE_MAX_BYTES, least
recently used out; without it, a read that meets a half-written entry costs a warning and a compile, never a wrong
result (in every later process too: JAX never replaces an entry; deleting the folder clears it).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import tempfile
import warnings
from pathlib import Path

import jax

from minibert.errors import outside_minibert

CACHE_DIR_ENV = "MINIBERT_CACHE_DIR"  # where the persistent cache lives
CACHE_SWITCH_ENV = "MINIBERT_COMPILATION_CACHE"  # one of SWITCH_OFF turns it off, one of SWITCH_ON keeps it on
SWITCH_OFF = ("0", "false", "off", "no", "n", "none", "disabled", "disable")
SWITCH_ON = ("", "1", "true", "on", "yes", "y", "enabled", "enable")
CACHE_MAX_BYTES = 2 * 1024**3  # the folder's size bound, where filelock makes a bounded folder safe to share


class CacheWarning(UserWarning):
    """The persistent compilation cache's settings could not be followed as given; the message says what minibert
    does instead and how to fix the setting."""


# What use_persistent_cache() did: whether it ran, the folder it gave JAX, the folders it found it could not use.
_set_up: dict = {"done": False, "folder": None, "unusable": set()}


def switched_off() -> bool:
    """Whether MINIBERT_COMPILATION_CACHE turns minibert's cache off (a value in neither SWITCH_OFF nor SWITCH_ON
    keeps it on; use_persistent_cache() warns about it)."""
    return switch() in SWITCH_OFF


def switch() -> str:
    """MINIBERT_COMPILATION_CACHE as it is compared with SWITCH_OFF and SWITCH_ON: stripped, lower case."""
    return os.environ.get(CACHE_SWITCH_ENV, "").strip().lower()


@functools.cache
def absolute_folder(text: str) -> Path | None:
    """A folder setting as an absolute path: ~ and $VARIABLES expanded as a shell would, a relative path resolved
    against the working directory of the first call (when the first Model is built), so a later os.chdir does not
    move the cache; None where it names a variable that is not set."""
    expanded = os.path.expanduser(os.path.expandvars(text))
    return None if "$" in expanded else Path(expanded).absolute()


def jax_own_folder() -> Path | None:
    """A cache folder set in JAX itself (jax_compilation_cache_dir, or JAX_COMPILATION_CACHE_DIR), not by minibert."""
    configured = jax.config.jax_compilation_cache_dir
    return Path(configured) if configured and configured != _set_up["folder"] else None


def configured_in_jax() -> bool:
    """Whether you configured JAX's cache yourself: a folder of your own, or JAX's cache switched off (minibert never
    switches it off). Then minibert leaves every JAX setting as you made it."""
    return jax_own_folder() is not None or not jax.config.jax_enable_compilation_cache


def chosen_folder() -> Path | None:
    """minibert's folder as its settings choose it (less the check that it can be written): None when switched
    off, or when MINIBERT_CACHE_DIR names an unset variable; MINIBERT_CACHE_DIR wins, then $XDG_CACHE_HOME/minibert/jax
    (an absolute XDG_CACHE_HOME only, as the XDG spec says), then ~/.cache/minibert/jax."""
    if switched_off():
        return None
    if os.environ.get(CACHE_DIR_ENV):
        return absolute_folder(os.environ[CACHE_DIR_ENV])
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "minibert" / "jax"


def cache_directory() -> Path | None:
    """The persistent compilation cache's folder, or None when it is off: a folder you set in JAX yourself; else
    minibert's, unless switched off by MINIBERT_COMPILATION_CACHE, or off for this process because the folder could
    not be used; None too where you switched JAX's cache off."""
    if not jax.config.jax_enable_compilation_cache:
        return None
    if (own := jax_own_folder()) is not None:
        return own
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
    """minibert's folder off for this process, with one warning (JAX's settings are left as they are)."""
    warnings.warn(f"{message}; the persistent compilation cache is off in this process (programs compile as "
                  f"usual). Fix: set {CACHE_DIR_ENV} to a folder you can write, or {CACHE_SWITCH_ENV}=0.",
                  CacheWarning, stacklevel=outside_minibert())


def use_persistent_cache() -> Path | None:
    """Point JAX's persistent compilation cache at minibert's folder, once per process (Model calls it when it is
    built; later calls change nothing); the folder in use, or None. Every program is written, however small or
    quick to compile: on a CPU a small model's forward compiles in about a second, which the cache turns into
    milliseconds. Where you configured JAX's cache yourself (configured_in_jax), nothing is changed."""
    if _set_up["done"]:
        return cache_directory()
    _set_up["done"] = True
    if configured_in_jax():
        return cache_directory()
    if switch() not in SWITCH_OFF + SWITCH_ON:
        warnings.warn(f"{CACHE_SWITCH_ENV}={os.environ[CACHE_SWITCH_ENV]!r} is neither on nor off, so the "
                      f"persistent compilation cache stays on; pass one of {', '.join(map(repr, SWITCH_OFF))} to "
                      f"turn it off, or one of {', '.join(map(repr, SWITCH_ON[1:]))} to keep it on.",
                      CacheWarning, stacklevel=outside_minibert())
    if switched_off():
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
    _set_up["folder"] = str(folder)  # remembered, so minibert's folder is never taken for one of your own
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # no size floor, and none chosen for us
    if importlib.util.find_spec("filelock") is not None:
        jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)
    return folder
