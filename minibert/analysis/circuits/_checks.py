"""The checks every circuits function makes of what it is given: the model, a named choice, the metric's values."""

from __future__ import annotations

import jax
import numpy as np

from minibert.core.contract import StaticFn, metric_values, traced_call
from minibert.errors import AnalysisError


def check_model(model) -> None:
    """A minibert Model, or one AnalysisError saying what was given instead."""
    if not all(hasattr(model, name) for name in ("config", "inputs", "jit", "forward_fn")):
        raise AnalysisError(f"model must be a minibert model (minibert.load(...)); got {type(model).__name__}.")


def check_choice(name: str, value, options: tuple[str, ...]) -> str:
    """value, one of the names in `options` (an array or another object is refused as an unknown name is)."""
    if not isinstance(value, str) or value not in options:
        shown = repr(value) if isinstance(value, str) else type(value).__name__
        raise AnalysisError(f"{name} must be one of {options}; got {shown}.")
    return value


def check_count(name: str, value) -> int:
    """A whole number ≥ 0 (not a bool), or one AnalysisError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise AnalysisError(f"{name} must be a whole number ≥ 0; got {value!r}.")
    return int(value)


def metric_of(metric: StaticFn, out, n_rows: int) -> jax.Array:
    """metric(out) checked against the contract, float [B] or (); a metric reading a field this model's output does
    not have (None: no head, no pooler) is told which, not left to fail with 'NoneType' inside the trace."""
    return metric_values(traced_call(metric.fn, out), n_rows)

