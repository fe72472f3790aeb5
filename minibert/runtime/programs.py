"""A Model's compiled programs (`Resident`): at most Model.max_programs at a time, the least recently used dropped
first, with their memory; model.clear_compiled() drops them all. JAX compiles one program per function and argument
shapes (docs/compiled.md says which a Model compiles and when). A program made with a name (Model.jit(...,
what=...): the analyses') says so on stderr each time it is compiled, not when it is reused."""

from __future__ import annotations

import functools
import os
import sys
from collections import OrderedDict
from collections.abc import Callable

import jax

MAX_PROGRAMS = 32  # programs a Model keeps resident (a few MB each for a small model, tens for a large one)
QUIET = "MINIBERT_QUIET_COMPILES"  # set to 1 (any value but "" and "0"), the analyses compile without a word


def say_compiling(what: str) -> None:
    """One stderr line as a named program is compiled: a cold analysis spends most of its time compiling (20 of
    a cold EAP-IG's 37 s on a CPU), and would otherwise look hung. Silenced by MINIBERT_QUIET_COMPILES=1, read at
    each compile (a notebook's os.environ[...] = "1" takes effect at once)."""
    if os.environ.get(QUIET, "") not in ("", "0"):
        return
    cached = jax.config.jax_enable_compilation_cache and jax.config.jax_compilation_cache_dir
    how = "compiling" + (" (or loading from the compilation cache)" if cached else "")
    print(f"minibert: {how} {what} (first use for these shapes) …", file=sys.stderr, flush=True)


class Resident:
    """A Model's compiled programs, one per (function, static arguments, argument shapes): at most `limit`, the
    least recently called dropped first. Each is its own jax.jit of its own function object, so dropping it lets
    JAX free its traces and executable."""

    def __init__(self, limit: int = MAX_PROGRAMS):
        self.limit = limit
        self._programs: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return len(self._programs)

    def __contains__(self, key) -> bool:
        return key in self._programs

    def get(self, key, make: Callable[[], Callable]) -> Callable:
        """The program under `key`, made by make() if absent; it becomes the most recently used."""
        if key in self._programs:
            self._programs.move_to_end(key)
            return self._programs[key]
        program = self._programs[key] = make()
        self.resize(self.limit)
        return program

    def resize(self, limit: int) -> None:
        """Keep at most `limit` programs from now on, dropping the least recently used past it."""
        self.limit = limit
        while len(self._programs) > limit:
            self._programs.popitem(last=False)

    def clear(self) -> None:
        self._programs.clear()


class Program:
    """`fn(*args, **kwargs)` compiled, kept in a Resident under its argument shapes and static arguments: what
    Model.jit returns. Called, lowered (.lower) or shape-evaluated (.eval_shape) as a jax.jit is. `what` names it
    in the line a call says when it compiles it (say_compiling); None says nothing."""

    def __init__(self, fn: Callable, static_argnames: tuple[str, ...], resident: Resident, what: str | None = None):
        self.fn, self.static_argnames, self.resident, self.what = fn, static_argnames, resident, what

    def _compiled(self, args, kwargs, say: bool = False):
        static = tuple(sorted((k, v) for k, v in kwargs.items() if k in self.static_argnames))
        dynamic = {k: v for k, v in kwargs.items() if k not in self.static_argnames}
        leaves, structure = jax.tree_util.tree_flatten((args, dynamic))
        key = (self.fn, static, structure, tuple(map(jax.typeof, leaves)))
        if say and self.what is not None and key not in self.resident:
            say_compiling(self.what)
        return self.resident.get(key, functools.partial(self._jitted, self.fn, self.static_argnames))

    @staticmethod
    def _jitted(fn, static_argnames):
        """jax.jit of a new function object calling fn: JAX keys its traces on the function (unwrapping a partial),
        so a program of its own function takes its trace, lowering and executable with it when it is dropped."""
        @functools.wraps(fn)
        def program(*args, **kwargs):
            return fn(*args, **kwargs)

        return jax.jit(program, static_argnames=static_argnames)

    def __call__(self, *args, **kwargs):
        return self._compiled(args, kwargs, say=True)(*args, **kwargs)

    def lower(self, *args, **kwargs):
        return self._compiled(args, kwargs).lower(*args, **kwargs)

    def eval_shape(self, *args, **kwargs):
        return self._compiled(args, kwargs).eval_shape(*args, **kwargs)
