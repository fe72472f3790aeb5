"""What stops a run that diverged. A loss or a weight that is no longer finite means the steps were too large
(most often the learning rate) and every later step is NaN: such a run must stop where it happened, saying
so, rather than go on and save a model (or a checkpoint) of non-finite weights. A loss that stays finite but
grows a hundredfold, and a warm-up as long as the run, train a useless model without failing: they warn."""

from __future__ import annotations

import math
import warnings

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


GROWTH = 100  # a loss this many times the first update's: the steps are far too large (fine-tuning lowers it)


def check_growth(losses: list[float], update: int, total: int, rate: float) -> None:
    """Warn when the last of `losses` (update `update` of `total`, at learning rate `rate`) first exceeds GROWTH ×
    the first: finite, so the run goes on, but it is diverging."""
    limit = GROWTH * losses[0]
    if len(losses) >= 2 and losses[-1] > limit >= losses[-2] and losses[0] > 0:
        warnings.warn(f"the loss of update {update} of {total} is {losses[-1]:.3g} (learning rate {rate:.3g} there), "
                      f"more than {GROWTH} × the first update's {losses[0]:.3g}: the run is diverging. Lower the "
                      f"learning rate (learning_rate, --learning-rate), e.g. to a tenth.", stacklevel=3)


def check_warmup(warmup, warmup_updates: int, total: int) -> None:
    """Warn when the warm-up lasts the whole run: the rate never reaches its peak, and the first update's is 0."""
    if warmup_updates >= total:
        one = "; with one update the model does not change" if total == 1 else ""
        updates = "1 update" if warmup_updates == 1 else f"{warmup_updates} updates"
        warnings.warn(f"warmup={warmup!r} is {updates} but the run has {total}: the learning rate never "
                      f"reaches its peak and the first update's is 0{one}. Pass a smaller warmup (--warmup), or "
                      f"train for more updates.", stacklevel=3)


def _diverged(what: str) -> str:
    return (f"training diverged: {what}, so the run stopped and saved no "
            f"model. Lower the learning rate (learning_rate, --learning-rate), e.g. to a tenth, and start again in a "
            f"new folder.")
