"""Resumable training: a run's state saved atomically to a directory with orbax, JAX's checkpoint library.

What a run needs to continue exactly where it stopped is small, because everything random in finetune is a
function of the seed and a counter: the data order of epoch e is drawn from (seed, e), masked-LM masks of batch b
from (seed, e, b), each step's dropout key is fold_in(key(seed), step). So a checkpoint holds the trainable
parameters, the optimiser state (with its step count and any accumulated gradients), the number of micro-batches
done, the history, and the settings that must not change between the runs. Orbax writes each checkpoint to a
temporary directory and renames it when complete, so a run killed while saving leaves the previous one intact.

The settings include fingerprints of what the run was trained on but does not save (run_fingerprints): the
training data as tokenized (texts, pairs, labels; a changed tokenizer changes them too), the base model's
weights (a frozen encoder comes from it) and the hooks. A run resumed with other data, another base model or
other hooks would not be one run, and is refused.

A checkpoint's arrays are named as model.named_parameters names them ({"params": {dotted name: array}, "opt": the
optimiser's state with each of its parameter-shaped trees so named}), whatever form the run carries them in:
`on_disk` names them once per save, `in_memory` gives the run's form back once per resume.

A run's directory holds its checkpoints and nothing else: a directory holding anything else (a user's files,
a folder named like a checkpoint) is refused rather than written into.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

import jax
import numpy as np

from minibert.errors import DataFileError, InputError
from minibert.runtime.weights import by_name, shaped_as

CHECKPOINT_MARK = "_CHECKPOINT_METADATA"  # the file orbax writes into each checkpoint's folder
UNFINISHED_MARK = ".orbax-checkpoint-tmp"  # in the name of a folder orbax was writing when the run stopped
# What each fingerprint of run_fingerprints covers (the refusal says it in words, not as two digests).
FINGERPRINTS = {"data": "the training data (texts, pairs and labels, as tokenized)", "eval_data": "the eval data",
                "base": "the base model's weights", "hooks": "the hooks (names, functions, their arrays)"}


class Checkpoints:
    """The checkpoints of one run in `directory` (the newest two are kept): a new or empty folder, or one holding
    a run's checkpoints and nothing else."""

    def __init__(self, directory: str | Path):
        # Imported here, by the runs that save: importing minibert.training (the workbench's start, a probe) need
        # not pay for orbax (~0.6 s).
        import orbax.checkpoint as ocp

        self.ocp = ocp
        self.directory = Path(directory).absolute()
        _check_run_folder(self.directory)
        self.manager = ocp.CheckpointManager(self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=2))

    def save(self, micro: int, state: dict, meta: dict) -> None:
        """Save `state` (a pytree of arrays) and `meta` (JSON) as the checkpoint after `micro` micro-batches."""
        args = self.ocp.args
        self.manager.save(micro, args=args.Composite(state=args.StandardSave(state), meta=args.JsonSave(meta)))
        self.manager.wait_until_finished()

    def restore(self, like: dict, settings: dict) -> tuple[int, dict, dict] | None:
        """(micro, state, meta) of the newest checkpoint, or None when there is none. `like` gives the state's
        structure; `settings` must equal the saved run's, or the two runs would not be one run."""
        micro = self.manager.latest_step()
        if micro is None:
            return None
        try:
            args = self.ocp.args
            restored = self.manager.restore(micro, args=args.Composite(state=args.StandardRestore(like),
                                                                       meta=args.JsonRestore()))
            saved = restored["meta"]["settings"]
        except (OSError, ValueError, KeyError, TypeError) as error:  # orbax's, tensorstore's and json's errors
            raise DataFileError(f"the checkpoint {self.directory / str(micro)} cannot be read ({type(error).__name__}: "
                                f"{error}); it was damaged after it was written. Delete that folder to continue "
                                f"from the checkpoint before it, or start the run in another folder.") from None
        changed = sorted(k for k in settings.keys() | saved.keys() if settings.get(k) != saved.get(k))
        if any(k in FINGERPRINTS and k not in saved for k in changed):
            raise InputError(f"{self.directory} holds a run saved by an earlier minibert, without the fingerprints of "
                             f"its data, base model and hooks, so this version cannot vouch that the two runs are "
                             f"one; continue it with that version, or start the run in another folder.")
        if changed:
            shown = ", ".join(f"{FINGERPRINTS[k]} differ" if k in FINGERPRINTS
                              else f"{k}: {saved.get(k)!r} then, {settings.get(k)!r} now" for k in changed[:4])
            raise InputError(f"{self.directory} holds a run with other settings ({shown}); resume with the same "
                             f"settings, or pass another directory.")
        return micro, restored["state"], restored["meta"]

    def close(self) -> None:
        self.manager.close()


def on_disk(tree, params):
    """`tree` (a run's state: its parameters, the optimiser's state) with each subtree shaped as `params` (the
    parameters themselves, Adam's moments, accumulated gradients) as {dotted name: array}: a checkpoint's layout."""
    def named(subtree):
        return by_name(subtree) if _shaped_as(params)(subtree) else subtree

    return jax.tree.map(named, tree, is_leaf=_shaped_as(params))


def in_memory(saved, tree, params):
    """on_disk's inverse: `saved` (a checkpoint's layout) in the form of `tree`, each {dotted name: array} back in
    `params`' form."""
    def unnamed(subtree, named):
        return shaped_as(subtree, named) if _shaped_as(params)(subtree) else named

    return jax.tree.map(unnamed, tree, saved, is_leaf=_shaped_as(params))


def _shaped_as(params):
    structure = jax.tree_util.tree_structure(params)
    return lambda subtree: isinstance(subtree, Mapping) and jax.tree_util.tree_structure(subtree) == structure


def _check_run_folder(directory: Path) -> None:
    """Refuse a file, and a folder holding anything but a run's checkpoints: nothing of a user's is written over."""
    if directory.exists() and not directory.is_dir():
        raise DataFileError(f"resume={directory} is a file; pass a folder for the run's checkpoints (new, empty, or "
                            f"holding the run to continue).")
    if not directory.is_dir():
        return
    for entry in sorted(directory.iterdir()):
        checkpoint = entry.name.isascii() and entry.name.isdigit() and (entry / CHECKPOINT_MARK).is_file()
        if not (checkpoint or UNFINISHED_MARK in entry.name):
            raise DataFileError(f"{directory} holds {entry.name!r}, which is no checkpoint of a run; a run saves "
                                f"into a new or empty folder, or continues in one that holds only its checkpoints. "
                                f"Pass another folder (nothing in this one was changed).")


def fingerprint(*parts) -> str:
    """A sha256 digest (32 hex digits) of arrays (dtype, shape and bytes) and JSON values, in order."""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, (str, int, float, bool, list, tuple, dict)) or part is None:
            digest.update(json.dumps(part, sort_keys=True).encode())
        else:
            array = np.ascontiguousarray(part)
            digest.update(f"{array.dtype}{array.shape}".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()[:32]


def run_fingerprints(model, encoded, eval_encoded, writers: Mapping[str, tuple]) -> dict[str, str | None]:
    """{data, eval_data, base, hooks: fingerprint}: what a resumed run must share with the saved one (FINGERPRINTS).
    `model`: the base model finetune was given; `encoded`, `eval_encoded`: data.encode's rows (eval: or None);
    `writers`: hooks.writers_for's {hook name: (HookFn, ...)}."""

    def rows(encoded):
        return None if encoded is None else fingerprint(*encoded.ids, *encoded.types, *encoded.labels)

    parameters = model.named_parameters()
    hooks = [(name, [_function(getattr(fn, "fn", fn)) for fn in fns]) for name, fns in sorted(writers.items())]
    arrays = [array for _, fns in sorted(writers.items()) for fn in fns
              for _, array in sorted(getattr(fn, "arrays", {}).items())]
    return {"data": rows(encoded), "eval_data": rows(eval_encoded),
            "base": fingerprint(sorted(parameters), *(parameters[name] for name in sorted(parameters))),
            "hooks": fingerprint(hooks, *arrays) if writers else None}


def _function(fn) -> str:
    """A hook function as a resumed run can recognise it in another process: its module, name and code (its
    bytecode and constants); a functools.partial adds its arguments. What a function reads from globals is
    not seen. Nothing in it depends on the process: no address, no order of string hashes."""
    if hasattr(fn, "func"):  # functools.partial
        keywords = [(key, _constant(value)) for key, value in sorted(fn.keywords.items())]
        return f"{_function(fn.func)}{[_constant(arg) for arg in fn.args]!r}{keywords!r}"
    code = getattr(fn, "__code__", None)
    name = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
    return name if code is None else f"{name}:{_code(code)}"


def _code(code) -> str:
    digest = hashlib.sha256(code.co_code)
    for constant in code.co_consts:
        digest.update(_constant(constant).encode())
    digest.update(repr(code.co_names).encode())
    return digest.hexdigest()[:16]


def _constant(value) -> str:
    """A constant or a partial's argument as the same text in every process: a code object or a function by its
    code (not its address), a frozenset (a set literal's constant) in sorted order (its own order follows the
    process's string hashes), tuples item by item."""
    if hasattr(value, "co_code"):
        return _code(value)
    if callable(value) and (hasattr(value, "__code__") or hasattr(value, "func")):
        return _function(value)
    if isinstance(value, frozenset):
        return f"frozenset({sorted(_constant(item) for item in value)!r})"
    if isinstance(value, tuple):
        return f"({', '.join(_constant(item) for item in value)},)"
    return repr(value)
