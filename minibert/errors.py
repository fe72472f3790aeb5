"""Every error minibert raises on purpose, under one base class.

A `MinibertError` means the input was wrong — a file, a key, a shape, a hook name, a token count —
and its message names the problem and the fix. The command line turns these (and only these) into a
one-line message; anything else is a bug and keeps its traceback.

Each class also derives from the built-in exception a Python user would try first (`ValueError`
for bad values, `FileNotFoundError` for a missing file), so `except ValueError` keeps working.
"""

from __future__ import annotations

import numbers
import os
import sys
from pathlib import Path

import numpy as np


def _check_package() -> None:
    """Refuse to run under a namespace `minibert`: Python's `import minibert` in the folder that holds a clone
    named minibert/ (with minibert installed editable, or not at all) finds the clone's folder first, as a
    namespace package without our __init__ (no __file__), whose modules then load half-way and fail far from
    the cause. Nearly every module imports this one first, so the cause is named here."""
    package = sys.modules.get("minibert")
    if package is not None and getattr(package, "__file__", None) is None:
        folders = ", ".join(str(folder) for folder in getattr(package, "__path__", []))
        raise ImportError(f"`minibert` was imported as a namespace package from {folders}: a folder named minibert "
                          f"in the current directory (the clone itself, run from the folder that holds it) hides "
                          f"the installed package. Run Python inside the clone, or from another directory.")


_check_package()


class MinibertError(Exception):
    """Base class: the input (or the environment) is wrong, and the message says how to fix it."""


class ConfigError(MinibertError, ValueError):
    """A config.json (or a set of weights) that describes no encoder minibert can run."""


class CheckpointError(MinibertError, ValueError):
    """A checkpoint that does not match the key table: names the file or key and the fix."""


class SourceError(MinibertError, LookupError):
    """No checkpoint of that name could be found (or fetched)."""


class TokenizerError(MinibertError, ValueError):
    """Text or a vocabulary the tokenizer cannot use."""


class InputError(MinibertError, ValueError):
    """A batch the model cannot run: names the field, its shape or values, and the fix."""


class HookError(MinibertError, ValueError):
    """A hook name, hook function or captured value the model cannot honour."""


class AnalysisError(MinibertError, ValueError):
    """Arguments an analysis cannot use (shapes, indices, settings)."""


class AnalysisWarning(UserWarning):
    """A result an analysis computed but cannot vouch for as asked (an integral short of its points): names the
    rows and the setting to change. Raised at the caller's line."""


class VizError(MinibertError, ValueError):
    """Arguments a figure or view cannot draw."""


class DataFileError(MinibertError, ValueError):
    """A data file (corpus, CoNLL-U treebank, output path) that cannot be read or written: names file and line."""


class DataFileMissing(DataFileError, FileNotFoundError):
    """A data file that does not exist."""


class DivergedError(MinibertError, FloatingPointError):
    """A training run whose loss or weights stopped being finite: names the step and the setting to lower.
    Nothing of the run after that point is saved."""


class DistributedError(MinibertError, RuntimeError):
    """Processes of a multi-process run that disagree (settings, weights, corpus) or stopped answering: names
    the processes and how to resume."""


ConllError = DataFileError  # the CoNLL-U reader's errors are data-file errors


def is_whole(value) -> bool:
    """Whether `value` is a whole number (int or NumPy integer), not a bool: the check behind every count argument."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def refuse_unless_flag(name: str, value, error: type[MinibertError] = InputError) -> bool:
    """`value` as a True/False setting named `name`, refused otherwise: overwrite="no" is truthy, and would
    replace a user's file."""
    if not isinstance(value, (bool, np.bool_)):
        raise error(f"{name}={value!r}: pass True or False.")
    return bool(value)


def refuse_existing(paths, overwrite, error: type[MinibertError] = InputError, *,
                    replace_hint: str = "pass overwrite=True to replace it", elsewhere: str = "pass another path"
                    ) -> bool:
    """The rule of every minibert writer, checked before it writes anything: a file already at one of `paths` (a
    path or a list of them), or a symbolic link (dangling or not: a link is never written through), is the user's,
    replaced only with overwrite=True. `replace_hint` says how to replace it (the command line: --overwrite),
    `elsewhere` where else to write. Returns `overwrite` as a bool (refuse_unless_flag)."""
    overwrite = refuse_unless_flag("overwrite", overwrite, error)
    if overwrite:
        return overwrite
    for path in map(Path, [paths] if isinstance(paths, (str, os.PathLike)) else paths):
        if path.is_symlink():
            raise error(f"{path} is a symbolic link (to {os.readlink(path)}) and is not written through; "
                        f"{replace_hint} (the link, not what it points to), or {elsewhere}.")
        if path.exists():
            raise error(f"{path} already exists; {replace_hint}, or {elsewhere}.")
    return overwrite


def outside_minibert() -> int:
    """The stacklevel, for its caller's warnings.warn, of the first frame outside minibert and the JAX and Flax
    code it calls through: a warning points at your line (`minibert.load(...)`, the `minibert` command's own, the
    call whose trace warns), not at a line of ours or JAX's. importlib's frames are passed over without a count,
    as warnings.warn counts them."""
    frame, level = sys._getframe(2), 2
    libraries = _libraries()
    while frame is not None and (frame.f_code.co_filename.startswith(libraries) or _importlib_frame(frame)):
        level += not _importlib_frame(frame)
        frame = frame.f_back
    return level


def _libraries() -> tuple[str, ...]:
    """The folders of minibert, JAX and Flax (those of them imported: minibert warns only once JAX runs)."""
    here = str(Path(__file__).parent)
    return (here, *(str(Path(sys.modules[name].__file__).parent) for name in ("jax", "flax") if name in sys.modules))


def _importlib_frame(frame) -> bool:
    """A frame of importlib's bootstrap, which warnings.warn leaves out of its stacklevel (as its own check does)."""
    return "importlib" in frame.f_code.co_filename and "_bootstrap" in frame.f_code.co_filename
