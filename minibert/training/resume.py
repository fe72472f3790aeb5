"""Resumable training: a run's state saved atomically to a directory with orbax, JAX's checkpoint library.

What a run needs to continue exactly where it stopped is small, because everything random in finetune is a
function of the seed and a counter: the data order of epoch e is drawn from (seed, e), masked-LM masks of batch b
from (seed, e, b), each step's dropout key is fold_in(key(seed), step). So a checkpoint holds the trainable
parameters, the optimiser state (with its step count and any accumulated gradients), the number of micro-batches
done, the history, and the settings that must not change between the runs. Orbax writes each checkpoint to a
temporary directory and renames it when complete, so a run killed while saving leaves the previous one intact.
"""

from __future__ import annotations

from pathlib import Path

import orbax.checkpoint as ocp

from minibert.errors import InputError


class Checkpoints:
    """The checkpoints of one run in `directory` (the newest two are kept)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory).absolute()
        self.manager = ocp.CheckpointManager(self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=2))

    def save(self, micro: int, state: dict, meta: dict) -> None:
        """Save `state` (a pytree of arrays) and `meta` (JSON) as the checkpoint after `micro` micro-batches."""
        self.manager.save(micro, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                         meta=ocp.args.JsonSave(meta)))
        self.manager.wait_until_finished()

    def restore(self, like: dict, settings: dict) -> tuple[int, dict, dict] | None:
        """(micro, state, meta) of the newest checkpoint, or None when there is none. `like` gives the state's
        structure; `settings` must equal the saved run's, or the two runs would not be one run."""
        micro = self.manager.latest_step()
        if micro is None:
            return None
        restored = self.manager.restore(micro, args=ocp.args.Composite(state=ocp.args.StandardRestore(like),
                                                                       meta=ocp.args.JsonRestore()))
        saved = restored["meta"]["settings"]
        changed = sorted(k for k in settings.keys() | saved.keys() if settings.get(k) != saved.get(k))
        if changed:
            shown = ", ".join(f"{k}: {saved.get(k)!r} then, {settings.get(k)!r} now" for k in changed[:4])
            raise InputError(f"{self.directory} holds a run with other settings ({shown}); resume with the same "
                             f"settings, or pass another directory.")
        return micro, restored["state"], restored["meta"]

    def close(self) -> None:
        self.manager.close()
