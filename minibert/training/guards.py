"""What stops a run that diverged. A loss or a weight that is no longer finite means the steps were too large
(most often the learning rate) and every later step is NaN: such a run must stop where it happened, saying
so, rather than go on and save a model (or a checkpoint) of non-finite weights."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from minibert.errors import DivergedError


@jax.jit
def all_finite(tree) -> jax.Array:
    """Whether every entry of every array in `tree` is finite (one program per tree structure)."""
    return jnp.all(jnp.stack([jnp.isfinite(leaf).all() for leaf in jax.tree_util.tree_leaves(tree)]))


def check_weights(params, update: int, total: int, peak: float) -> None:
    """Stop when a parameter in `params` (after update `update`) is not finite: called before anything is saved."""
    if not bool(all_finite(params)):
        raise DivergedError(_diverged(f"a weight was no longer finite after update {update} of {total} (peak "
                                      f"learning rate {peak:.3g})"))


def check_loss(loss: float, update: int, total: int, rate: float) -> None:
    """Stop when `loss`, the loss of update `update` (from 1) of `total`, made at learning rate `rate`, is not
    finite."""
    if not math.isfinite(loss):
        raise DivergedError(_diverged(f"the loss of update {update} of {total} was {loss} (learning rate {rate:.3g} "
                                      f"there)"))


def _diverged(what: str) -> str:
    return (f"training diverged: {what}, so the run stopped and saved no "
            f"model. Lower the learning rate (learning_rate, --learning-rate), e.g. to a tenth, and start again in a "
            f"new folder.")
