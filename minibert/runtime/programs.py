"""A Model's compiled programs (`Resident`): at most Model.max_programs at a time, the least recently used dropped
first, with their memory; model.clear_compiled() drops them all. JAX compiles one program per function and argument
shapes (docs/compiled.md says which a Model compiles and when)."""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable

import jax

MAX_PROGRAMS = 32  # programs a Model keeps resident (a few MB each for a small model, tens for a large one)


class Resident:
    """A Model's compiled programs, one per (function, static arguments, argument shapes): at most `limit`, the
    least recently called dropped first. Each is its own jax.jit of its own function object, so dropping it lets
    JAX free its traces and executable."""

    def __init__(self, limit: int = MAX_PROGRAMS):
        self.limit = limit
        self._programs: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return len(self._programs)

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
    Model.jit returns. Called, lowered (.lower) or shape-evaluated (.eval_shape) as a jax.jit is."""

    def __init__(self, fn: Callable, static_argnames: tuple[str, ...], resident: Resident):
        self.fn, self.static_argnames, self.resident = fn, static_argnames, resident

    def _compiled(self, args, kwargs):
        static = tuple(sorted((k, v) for k, v in kwargs.items() if k in self.static_argnames))
        dynamic = {k: v for k, v in kwargs.items() if k not in self.static_argnames}
        leaves, structure = jax.tree_util.tree_flatten((args, dynamic))
        key = (self.fn, static, structure, tuple(map(jax.typeof, leaves)))
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
        return self._compiled(args, kwargs)(*args, **kwargs)

    def lower(self, *args, **kwargs):
        return self._compiled(args, kwargs).lower(*args, **kwargs)

    def eval_shape(self, *args, **kwargs):
        return self._compiled(args, kwargs).eval_shape(*args, **kwargs)
