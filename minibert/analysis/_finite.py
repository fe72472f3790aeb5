"""The one check that what an analysis is given, or computes, holds no NaN or ±inf. Finding them (how many, where
the first is) is done here; each caller words the refusal for its own data (rows of activations, a probe's
features, a metric's values by name)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from minibert.errors import AnalysisError


@dataclasses.dataclass(frozen=True)
class NonFinite:
    """The NaN and ±inf entries of an array: `count` of them, the first at index `first` holding `value`; `flat`:
    the flat indices of every one, in order."""

    count: int
    first: tuple[int, ...]
    value: np.generic
    flat: np.ndarray


def refuse_nonfinite(values, wording: Callable[[NonFinite], str]) -> np.ndarray:
    """values as a NumPy array, or one AnalysisError whose message is wording(the entries that are not finite)."""
    values = np.asarray(values)
    flat = np.flatnonzero(~np.isfinite(values))
    if flat.size:
        first = tuple(int(i) for i in np.unravel_index(flat[0], values.shape))
        raise AnalysisError(wording(NonFinite(int(flat.size), first, values.flat[flat[0]], flat)))
    return values


def check_finite(values, what: str, names: list[str] | None = None) -> np.ndarray:
    """A metric's values (or what is computed from them) as a NumPy array, or one AnalysisError naming where they
    are NaN or infinite: the rows, or the entries by `names` (the flattened values' labels). The one check of a
    metric's values every analysis makes: attributions, edge scores, sweeps and patching grids."""
    def wording(bad: NonFinite) -> str:
        where = [names[i] if names is not None else f"row {i}" for i in bad.flat[:5]]
        return (f"{what}: not finite (NaN or ±inf) at {', '.join(where)}{' …' if bad.count > 5 else ''}; check the "
                f"metric for a division by zero (a norm of 0, an empty mask) or a log of 0.")

    return refuse_nonfinite(values, wording)


def check_finite_params(params, what: str) -> None:
    """Nothing, or one AnalysisError naming the first parameter array of `params` ({name: array}) that holds NaN or
    ±inf and its first bad index: the one check of a trained dictionary's weights (a crosscoder's, a
    transcoder's) before it is used, saved or served. what: whose parameters, as the message names them."""
    for name, value in params.items():
        def wording(bad: NonFinite, name=name) -> str:
            return (f"{what}: params[{name!r}] is not finite at index {bad.first} (value {bad.value}; {bad.count} "
                    f"such entr{'y' if bad.count == 1 else 'ies'}); the training diverged or the file is damaged: "
                    f"retrain (a lower learning rate), or load an earlier checkpoint.")

        refuse_nonfinite(value, wording)
