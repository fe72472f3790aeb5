"""What minibert asks of the functions you pass it, and how such a function keys a compiled program.

The metric contract: every function that takes a metric, loss or target function (Model.grad and the analyses)
runs it inside a compiled program, so it is written with jax.numpy and returns floats, one value per batch row,
shape [B] — each row an example of its own — or one value for the whole batch, shape ().

The static key: a hook or metric function is part of the program it is traced into, so the program is kept
under a key that stands for the function (`StaticFn`). Two functions share a program when they compute the
same: the same code, reading the same values (`behaviour_key`), so a lambda written again (a loop, a notebook
cell run again) reuses the program, while `HEAD = 5` after a run with `HEAD = 4` compiles a new one rather than
silently reusing the old value. The key sees the function's closure cells, the globals its own code names,
default arguments and functools.partial arguments — scalars, NumPy arrays, tuples, lists, dicts and sets by
value (a NumPy array or a list changed in place compiles anew), jax arrays and other objects by identity
(`fingerprint`). It does not see globals read by helper functions the function calls, nor the attributes of an
object changed in place: values that change go in as traced arrays (hooks.HookFn), which compile once for all.
"""

from __future__ import annotations

import dataclasses
import dis
import functools
import hashlib
import numbers
import types
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from minibert.errors import AnalysisError

# ---- the metric contract ----------------------------------------------------------------------------------


def metric_values(values, n_rows: int, what: str = "metric") -> jax.Array:
    """A metric's, loss's or target's return value checked against the one contract: float [B] or (). Integers
    and booleans are refused everywhere, not only where a gradient of them would silently be zero: one rule,
    and a cast (.astype(float)) is all it asks."""
    dtype, shape = getattr(values, "dtype", None), getattr(values, "shape", None)
    if isinstance(values, float):
        dtype, shape = jnp.dtype(jnp.float32), ()
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating) or tuple(shape) not in ((), (n_rows,)):
        got = f"shape {tuple(shape)}, dtype {dtype}" if dtype is not None else f"a {type(values).__name__}"
        raise AnalysisError(f"the {what} must return floats written with jax.numpy: one value per batch row, shape "
                            f"({n_rows},), or one value for the whole batch, shape (); it returned {got}. Reduce "
                            f"the other axes inside the {what} (e.g. .mean(-1)) and cast counts with .astype(float).")
    return jnp.asarray(values, jnp.float32)


def metric_function(fn: Callable) -> Callable:
    """fn itself if it can be called; else the contract's message (a number where the function goes used to end
    in "'int' object is not callable" inside the trace)."""
    if not callable(fn):
        raise AnalysisError(f"the metric (loss, target) must be a function fn(output) returning floats, e.g. "
                            f"lambda out: out.logits[:, 0, 1]; got {type(fn).__name__} {fn!r}.")
    return fn


def traced_call(fn: Callable, output, what: str = "metric"):
    """fn(output), which runs inside a compiled program: a NumPy-only metric gets a message, not a traceback."""
    try:
        return fn(output)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError) as error:
        raise AnalysisError(f"the {what} {getattr(fn, '__name__', fn)!r} must be written with jax.numpy "
                            f"(jnp.linalg.norm, not np.linalg.norm, no float() or np.asarray): it runs inside a "
                            f"compiled program. JAX said: {str(error).splitlines()[0]}") from None
    except (AttributeError, TypeError) as error:
        message = _missing_field(output, error, what)
        if message is None:
            raise
        raise AnalysisError(message) from None


def _missing_field(output, error: Exception, what: str) -> str | None:
    """What to tell a user whose metric read a field the output does not have: a name that is no field
    (out.hidden_states), or one this model leaves None (out.logits of a checkpoint with no head); None where the
    error is something else, which keeps its traceback."""
    if not dataclasses.is_dataclass(output):
        return None
    fields = [field.name for field in dataclasses.fields(output)]
    has = [name for name in fields if getattr(output, name) is not None]
    if isinstance(error, AttributeError) and getattr(error, "obj", None) is output:
        return (f"the {what} read out.{error.name}, which an output does not have: its fields are "
                f"{', '.join(fields)}, and this model fills {', '.join(has)}.")
    if "NoneType" in str(error) and len(has) < len(fields):
        missing = [name for name in fields if name not in has]
        return (f"the {what} failed on this model's output: it has no {', '.join(missing)} (None: the checkpoint "
                f"has no such head); read out.last_hidden_state (or a field it has: {', '.join(has)}) instead. "
                f"Python said: {error}")
    return None


# ---- a function as a static key ----------------------------------------------------------------------------


class _Identity:
    """An object compared by identity; holding it keeps its id from being reused while a program keyed on it lives."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return isinstance(other, _Identity) and other.obj is self.obj

    def __hash__(self):
        return id(self.obj)


_EMPTY_CELL = object()
MAX_DEPTH, MAX_ITEMS = 4, 10_000  # containers deeper or longer than this are keyed by identity (cost per call)


def _by_value(obj, depth: int = 0):
    """Scalars by value; tuples, lists, dicts and sets of them by value, as are NumPy arrays (a digest of their
    bytes), since each of these can be changed in place and a program keyed on its identity would keep the old
    value; anything else (jax arrays, which never change, modules, functions, objects) by identity."""
    if obj is None or isinstance(obj, (bool, numbers.Number, str, bytes)):
        return (type(obj), obj)
    if depth < MAX_DEPTH:
        if isinstance(obj, (tuple, list)) and len(obj) <= MAX_ITEMS:
            return (type(obj), tuple(_by_value(x, depth + 1) for x in obj))
        if isinstance(obj, dict) and len(obj) <= MAX_ITEMS:
            return (dict, tuple((_by_value(k, depth + 1), _by_value(v, depth + 1)) for k, v in obj.items()))
        if isinstance(obj, (set, frozenset)) and len(obj) <= MAX_ITEMS:
            return (type(obj), frozenset(_by_value(x, depth + 1) for x in obj))
    if isinstance(obj, np.ndarray) and obj.dtype != object:
        digest = hashlib.blake2b(np.ascontiguousarray(obj).view(np.uint8), digest_size=16).digest()
        return (np.ndarray, obj.dtype.str, obj.shape, digest)
    return _Identity(obj)


@functools.cache
def _globals_read(code) -> frozenset[str]:
    """The global names `code` loads (and the functions, lambdas and comprehensions defined in it): not every
    name in co_names, which also holds attribute names (`.at`, `.set`) a notebook may use for its own variables."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _globals_read(constant)
    return frozenset(names)


def fingerprint(fn: Callable) -> tuple:
    """What a function reads besides its arguments: closure cells, the globals its code loads, default
    arguments, functools.partial arguments (by value where they can change in place, see _by_value)."""
    if isinstance(fn, functools.partial):
        return ("partial", _by_value(fn.args), _by_value(tuple(sorted(fn.keywords.items()))), fingerprint(fn.func))
    code = getattr(fn, "__code__", None)
    if code is None:  # a callable object: its attributes are its own business; identity is what we have
        return ()
    cells = tuple(_cell_contents(cell) for cell in fn.__closure__ or ())
    names = sorted(_globals_read(code) & fn.__globals__.keys())
    return (_by_value(cells), tuple((name, _by_value(fn.__globals__[name])) for name in names),
            _by_value(fn.__defaults__), _by_value(tuple(sorted((fn.__kwdefaults__ or {}).items()))))


def _cell_contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # a closure variable not assigned yet
        return _EMPTY_CELL


def behaviour_key(fn: Callable):
    """What decides what a function computes: its code, its module's globals, its bound object and what it
    reads (fingerprint). Two functions with equal keys compute the same, so they share a program."""
    if isinstance(fn, functools.partial):
        return ("partial", behaviour_key(fn.func), fingerprint(fn))
    code = getattr(fn, "__code__", None)
    if code is None:  # a callable object: itself (its own __eq__) is all we know
        return ("object", fn)
    return (code, _Identity(fn.__globals__), _Identity(getattr(fn, "__self__", None)), fingerprint(fn))


class StaticFn:
    """A function as a static argument of a compiled program (jax.jit's static_argnames, a pytree's aux data):
    equal to any function with the same behaviour_key. `.fn` is the function."""

    __slots__ = ("fn", "key")

    def __init__(self, fn: Callable):
        self.fn, self.key = fn, behaviour_key(fn)

    def __eq__(self, other):
        return isinstance(other, StaticFn) and other.key == self.key

    def __hash__(self):
        return hash(self.key)


def static_metric(fn: Callable) -> StaticFn:
    """A metric (loss, target) function checked against the contract and keyed for a compiled program."""
    return StaticFn(metric_function(fn))
