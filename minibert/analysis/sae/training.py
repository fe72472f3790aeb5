"""Training an SAE: Adam (minibert.training.optim), learning-rate warm-up, decoder rows renormalised after every
update, dead-latent tracking, one compiled step; resumable from a checkpoint file.

A latent is dead once it has not fired on any of the last `dead_tokens` tokens seen (Gao et al. count 10M
tokens; the default here suits small runs). Dead latents feed the TopK SAE's AuxK loss.

    trainer = Trainer(SAEConfig(d_in=384, d_sae=4096, k=32), learning_rate=2e-4, warmup=100)
    for x in activations(model, texts, "blocks.3.hook_resid_post"):
        trainer.step(x)                     # {"total", "mse", "aux"}: this step's losses
    trainer.save("run.npz"); trainer = Trainer.resume("run.npz")

train() on sae.activations' stream records the hook and model weights it reads (Trainer.source) and refuses
another stream, even of the same width, after a resume.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import tempfile
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from minibert.analysis.sae.model import SAEConfig, checked_finite, init_params, losses, unit_decoder
from minibert.errors import AnalysisError, DataFileError, DataFileMissing, DivergedError, is_whole
from minibert.io.files import as_umask_allows
from minibert.training.optim import Progress, adamw, learning_rate_schedule


@functools.partial(jax.jit, static_argnames=("config", "optimizer"))
def _train_step(params, opt_state, since_fired, x, step, dead_tokens, *, config, optimizer):
    """One update: (params, opt_state, tokens since each latent fired [S], losses)."""
    dead = since_fired >= dead_tokens

    def objective(params):
        parts, latents = losses(config, params, x, dead, step)
        return parts["total"], (parts, latents)

    (_, (parts, latents)), grads = jax.value_and_grad(objective, has_aux=True)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = unit_decoder(optax.apply_updates(params, updates))
    fired = jnp.any(latents > 0, axis=0)
    since_fired = jnp.where(fired, 0, since_fired + x.shape[0])
    return params, opt_state, since_fired, parts


def _check_settings(learning_rate, warmup, dead_tokens) -> None:
    """A negative rate ascends the loss, inf or NaN destroys the parameters at the first step."""
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, int | float) or not 0 < learning_rate < np.inf:
        raise AnalysisError(f"learning_rate={learning_rate!r} must be a finite number > 0 (SAEs train at ~1e-4).")
    for name, value, smallest in (("warmup", warmup, 0), ("dead_tokens", dead_tokens, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < smallest:
            raise AnalysisError(f"{name}={value!r} must be a whole number ≥ {smallest}.")


@functools.cache
def _adam(learning_rate: float, warmup: int) -> optax.GradientTransformation:
    """Adam (no weight decay, no clipping) at a rate constant after a linear warm-up; one object per setting, so
    trainers with the same settings share the compiled step (the optimiser is a static argument)."""
    schedule = learning_rate_schedule(learning_rate, max(warmup, 1), warmup=warmup, schedule="constant")
    return adamw(schedule, max_grad_norm=None)


class Trainer:
    """Holds an SAE's parameters and optimiser state; `step(x)` trains on one batch x [N, d_in]."""

    config_class = SAEConfig  # what resume builds from a checkpoint's settings (transcoders.Trainer: its own)
    what = "SAE"  # in the checkpoint's messages

    def __init__(self, config: SAEConfig, *, learning_rate: float = 2e-4, warmup: int = 0,
                 dead_tokens: int = 1_000_000, seed: int = 0, params=None, source: dict | None = None):
        _check_settings(learning_rate, warmup, dead_tokens)
        self.config, self.learning_rate, self.warmup, self.dead_tokens = config, learning_rate, warmup, dead_tokens
        self.source = source  # {"hook_name", "weights"} of the activation stream trained on, once train() saw one
        self.seed = seed
        self.optimizer = _adam(learning_rate, warmup)
        self.params = init_params(config, seed) if params is None else {k: jnp.asarray(v) for k, v in params.items()}
        self.opt_state = self.optimizer.init(self.params)
        self.since_fired = jnp.zeros(config.d_sae, jnp.int32)
        self.steps = 0

    def center(self, x) -> None:
        """Set b_dec to the mean of sample activations x [N, d_in] before training (SAELens' b_dec_init "mean";
        Gao et al. use the geometric median): the decoder then starts at the data's centre, not at 0."""
        self.params = self.params | {"b_dec": jnp.mean(jnp.asarray(x, jnp.float32), axis=0)}

    @property
    def dead(self) -> np.ndarray:
        """[S] bool: latents that have not fired over the last dead_tokens tokens."""
        return np.asarray(self.since_fired) >= self.dead_tokens

    def step(self, x) -> dict[str, float]:
        x = np.asarray(x, np.float32)
        if x.ndim != 2 or x.shape[1] != self.config.d_in:
            raise AnalysisError(f"a training batch is [N, {self.config.d_in}] activations; got shape {x.shape}.")
        # one NaN would reach every parameter through Adam's moments
        checked_finite(x, "this batch", "the step would put NaN into the SAE's parameters")
        return self._applied(*_train_step(
            self.params, self.opt_state, self.since_fired, x, jnp.int32(self.steps), jnp.int32(self.dead_tokens),
            config=self.config, optimizer=self.optimizer))

    def _applied(self, params, opt_state, since_fired, step_losses) -> dict[str, float]:
        """Take one compiled step's result as the trainer's state, unless a loss is not finite (the trainer then
        keeps its last finite state); the step's losses as floats."""
        losses = {name: float(value) for name, value in step_losses.items()}
        if not all(np.isfinite(value) for value in losses.values()):
            raise DivergedError(f"{self.what} step {self.steps}: the loss is not finite ({losses}); the update was "
                                f"not applied. Lower learning_rate ({self.learning_rate}) or add warmup.")
        self.params, self.opt_state, self.since_fired = params, opt_state, since_fired
        self.steps += 1
        return losses

    def compiled_step(self, x):
        """The compiled training step for batches shaped as x (jax.stages.Compiled): its memory_analysis() and
        cost_analysis() are XLA's own account of one step (benchmarks/ read them)."""
        x = np.asarray(x, np.float32)
        return _train_step.lower(self.params, self.opt_state, self.since_fired, x, jnp.int32(self.steps),
                                 jnp.int32(self.dead_tokens), config=self.config, optimizer=self.optimizer).compile()

    def train(self, batches, steps: int | None = None, progress: bool = False) -> list[dict[str, float]]:
        """Train on an iterable of batches (at most `steps` of them); returns each step's losses."""
        if steps is not None and (not is_whole(steps) or steps < 0):
            raise AnalysisError(f"steps={steps!r} must be a whole number ≥ 0 (or None: every batch given).")
        self._check_source(getattr(batches, "source", None))
        history = []
        with Progress(steps, self.what, enabled=progress) as bar:
            for batch in batches:
                if steps is not None and len(history) >= steps:
                    break
                history.append(self.step(batch))
                bar.update(history[-1]["total"], self.rows(batch))
        return history

    @staticmethod
    def rows(batch) -> int:
        """How many tokens a batch holds (the progress bar's count)."""
        return len(batch)

    def _check_source(self, source: dict | None) -> None:
        """Batches from sae.activations say which hook and weights they read (ActivationStream.source): refuse a
        stream of another hook than the config's, or other than the one this trainer (or the run it resumes)
        trained on, even where the widths agree; then remember it."""
        if source is None:
            return
        if self.config.hook_name is not None and source["hook_name"] != self.config.hook_name:
            raise AnalysisError(f"these activations are {source['hook_name']!r}'s but the SAE reads "
                                f"{self.config.hook_name!r}; stream the hook it was configured for.")
        if self.source is not None and source != self.source:
            raise AnalysisError(f"this SAE was trained on {self.source} and these activations come from {source}; "
                                f"resume on the same hook and model weights, or start a new Trainer.")
        self.source = source

    def save(self, path) -> Path:
        """Everything needed to resume (parameters, Adam's moments, step, dead-latent counters, the stream trained
        on) in one .npz file written at exactly `path` (no suffix added; replaced whole, never half-written). A
        file already there is replaced only if it is a trainer checkpoint itself; anything else is refused."""
        settings = dict(config=dataclasses.asdict(self.config), learning_rate=self.learning_rate, warmup=self.warmup,
                        dead_tokens=self.dead_tokens, seed=self.seed, source=self.source, steps=self.steps)
        return write_state(path, settings, (self.params, self.opt_state, self.since_fired))

    @classmethod
    def resume(cls, path) -> Trainer:
        """A trainer in the state `save` wrote: the next step is the one the saved run would have taken."""
        def rebuild(settings):
            steps = settings.pop("steps")
            trainer = cls(cls.config_class(**settings.pop("config")), **settings)
            trainer.steps = steps
            return trainer

        trainer, state = read_state(path, cls.what, rebuild,
                                    lambda trainer: (trainer.params, trainer.opt_state, trainer.since_fired))
        trainer.params, trainer.opt_state, trainer.since_fired = state
        return trainer


def write_state(path, settings: dict, state) -> Path:
    """A trainer's JSON `settings` and the leaves of its `state` pytree in one .npz file at exactly `path` (no
    suffix added; missing parent folders are created). Written to a temporary file of its own name in the same
    folder, then moved over `path`: replaced whole, never half-written. An existing file is replaced only when it
    is itself a trainer checkpoint (an .npz holding "settings": saving again during a run); any other file is the
    user's and is refused."""
    path = checkpoint_path(path)
    text = json.dumps(settings)  # before anything is written: a setting JSON cannot hold leaves no file behind
    leaves = jax.tree_util.tree_leaves(state)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    except OSError as error:
        raise DataFileError(f"cannot write a checkpoint at {path} ({error.strerror or error}); pass a path in a "
                            f"folder you can write.") from None
    try:
        with os.fdopen(descriptor, "wb") as file:  # a file object: np.savez appends no ".npz"
            np.savez(file, settings=text, **{f"leaf{i}": np.asarray(leaf) for i, leaf in enumerate(leaves)})
        as_umask_allows(temporary)  # mkstemp's file is private (0600): what a plain new file gets, as Model.save
        os.replace(temporary, path)
    except BaseException as error:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise DataFileError(f"cannot write a checkpoint at {path} ({error.strerror or error}); pass another "
                                f"path.") from None
        raise
    return path


def checkpoint_path(path) -> Path:
    """`path` as a Path that write_state may write: not a directory, not under a file, and either free or a trainer
    checkpoint already (an .npz whose arrays include "settings")."""
    if not isinstance(path, str | os.PathLike):
        raise DataFileError(f"a checkpoint path is a str or pathlib.Path, such as 'run.npz'; got "
                            f"{type(path).__name__} {path!r}.")
    path = Path(path)
    if path.is_dir():
        raise DataFileError(f"{path} is a directory; save to a file path such as {path / 'run.npz'}.")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise DataFileError(f"cannot write a checkpoint at {path}: {parent} is a file, not a folder; pass "
                                    f"another path.")
            break
    if path.exists() and not _is_checkpoint(path):
        raise DataFileError(f"{path} exists and is not a trainer checkpoint (an .npz Trainer.save wrote); save to "
                            f"another path, or delete that file first.")
    return path


def _is_checkpoint(path: Path) -> bool:
    """Whether `path` is an .npz archive holding a "settings" array (what write_state writes), read by its zip
    directory only: nothing of it is loaded."""
    try:
        with zipfile.ZipFile(path) as archive:
            return "settings.npy" in archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def read_state(path, what: str, rebuild, state_of):
    """(trainer, its state) from a file write_state wrote: rebuild(settings) makes a fresh trainer, whose
    state_of(trainer) pytree gives the structure the saved leaves fill. `what` names the trainer in errors."""
    path = Path(path)
    if not path.is_file():
        raise DataFileMissing(f"no {what} checkpoint at {path}; pass the file its Trainer.save wrote.")
    try:
        with np.load(path) as saved:
            settings = json.loads(str(saved["settings"]))
            leaves = [saved[f"leaf{i}"] for i in range(len(saved.files) - 1)]
        trainer = rebuild(settings)
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile, AnalysisError) as error:
        # numpy's own words for a pickled file advise loading it unsafely: never for a file of unknown origin. It
        # says so of any file that is neither .npz nor .npy; only a pickle (opcode PROTO first) or an .npy of
        # objects holds pickled objects
        detail = f"{type(error).__name__}: {error}"
        if "pickle" in str(error):
            with open(path, "rb") as file:
                start = file.read(6)
            pickled = start[:1] == b"\x80" or start == b"\x93NUMPY"
            detail = "it holds pickled objects, which are never loaded" if pickled else \
                "it is not an .npz archive: a checkpoint is a zip of arrays, this file is not one"
        raise DataFileError(f"{path} is not a whole {what} checkpoint ({detail}); pass the file Trainer.save wrote, "
                            f"uncut.") from None
    structure = jax.tree_util.tree_structure(state_of(trainer))
    if structure.num_leaves != len(leaves):
        raise DataFileError(f"{path} holds {len(leaves)} arrays; this {what}'s state has {structure.num_leaves}.")
    return trainer, jax.tree_util.tree_unflatten(structure, [jnp.asarray(leaf) for leaf in leaves])
