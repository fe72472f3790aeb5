"""A Model's compile management, `model.programs` (`Programs`): its compiled programs (`Resident`, at most
`model.programs.limit` at a time, the least recently used dropped first with their memory; `clear()` drops them all),
the count of programs traced (`traces`), and the length buckets its forwards pad rows to (`bucket_rule`,
`length_buckets`, `padded_length`). JAX compiles one program per function and argument shapes (docs/compiled.md says
which a Model compiles and when). A program made with a name (Model.jit(..., what=...): the analyses') says
so on stderr each time it is compiled, not when it is reused."""

from __future__ import annotations

import collections
import functools
import os
import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

import jax

from minibert.core import attention
from minibert.core.hooks import HookContext, HookFn, layer_of
from minibert.errors import InputError, is_whole
from minibert.runtime import buckets

MAX_PROGRAMS = 32  # programs a Model keeps resident (a few MB each for a small model, tens for a large one)
QUIET = "MINIBERT_QUIET_COMPILES"  # set to 1 (any value but "" and "0"), the analyses compile without a word


def say_compiling(what: str) -> None:
    """One stderr line as a named program is compiled: a cold analysis spends most of its time compiling on a
    CPU, and would otherwise look hung. Silenced by MINIBERT_QUIET_COMPILES=1, read at
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


class Programs:
    """A Model's compile management, reached as `model.programs`: which programs it has traced (`traces`) and holds
    (`count`, at most `limit`; `clear()`), and the row lengths its forwards pad to (`bucket_rule`, `length_buckets`,
    `padded_length`, and `attention_backend`, the kernel a batch so padded runs). `model.jit(fn)` makes its programs.
    """

    def __init__(self, model):
        """`model`: the runtime.model.Model whose programs these are (not imported here: the Model imports this)."""
        self._model = model
        self._traces = 0  # programs traced (compiled) so far, by Model.jit's programs and forward_fn's functions
        self._tracing = 0  # counted traces in progress: a counted function traced inside another counts once
        self._bucket_rule = buckets.INTERACTIVE
        self._made: dict = {}  # Model.jit's Programs, by (fn, static_argnames)
        self._resident = Resident()  # their compiled programs, least recently used out first
        self._pads_safely: dict = {}  # (hook name, hook fn, its arrays' shapes, B) → whether it may run padded
        self._shape_calls: collections.Counter = collections.Counter()  # Model.run's calls per [B, T] (run_length)

    def __repr__(self):
        return (f"Programs(traces={self.traces}, count={self.count}, limit={self.limit}, "
                f"bucket_rule={self.bucket_rule})")

    @property
    def traces(self) -> int:
        """How many programs this model has traced (compiled) so far: each trace of a Model.jit program or a
        forward_fn function, once however deeply they nest; a test or benchmark counts compiles by its growth."""
        return self._traces

    def program(self, fn: Callable, static_argnames: Sequence[str] = (), what: str | None = None) -> Program:
        """`fn(model, *args, **kwargs)` compiled for this model, each trace counted in `traces`: what Model.jit
        returns. Made once per (fn, static_argnames), so repeated calls reuse the compiled programs; `what` names
        it in the line a call says when it compiles (say_compiling)."""
        static = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)  # as jax.jit
        key = (fn, static)
        if key not in self._made:
            self._made[key] = Program(self.counted(functools.partial(fn, self._model)), static, self._resident,
                                      what)
        return self._made[key]

    def counted(self, fn: Callable) -> Callable:
        """fn, with each trace of it counted in `traces`; traced inside another counted function, it counts once."""
        @functools.wraps(fn)
        def counted(*args, **kwargs):
            self._traces += self._tracing == 0
            self._tracing += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._tracing -= 1
        return counted

    @property
    def limit(self) -> int:
        """How many compiled programs this model keeps at most (default MAX_PROGRAMS); past it, the least recently
        used is dropped with its memory, and compiles again (or loads from the persistent cache) when next needed."""
        return self._resident.limit

    @limit.setter
    def limit(self, limit: int) -> None:
        if not is_whole(limit) or limit < 1:
            raise InputError(f"programs.limit={limit!r}: pass a whole number of programs, at least 1.")
        self._resident.resize(int(limit))

    @property
    def count(self) -> int:
        """How many compiled programs this model holds now (at most `limit`)."""
        return len(self._resident)

    def clear(self) -> None:
        """Drop every compiled program this model holds, and their memory; the next calls compile again (or load
        from the persistent compilation cache)."""
        self._resident.clear()
        self._pads_safely.clear()

    @property
    def bucket_rule(self) -> tuple[int, int]:
        """(smallest, per_octave) of the length buckets plain calls, captures and hooks pad to
        (buckets.length_buckets): buckets.INTERACTIVE by default, COARSE or FINE to choose (docs/compiled.md)."""
        return self._bucket_rule

    @bucket_rule.setter
    def bucket_rule(self, rule) -> None:
        self._bucket_rule = buckets.checked_rule(rule)

    @property
    def length_buckets(self) -> tuple[int, ...]:
        """The row lengths run, model(batch), run_with_cache and run_with_hooks pad to, up to the model's positions:
        buckets.length_buckets under `bucket_rule` — buckets.INTERACTIVE (32, 64, 128, 256, 512) unless set to
        buckets.COARSE (16, 24, 32, 48, …) or buckets.FINE for throughput (docs/compiled.md). A batch of at most 4
        rows starts at 64 under INTERACTIVE (padded_length)."""
        return buckets.length_buckets(self._model.config.max_tokens, *self.bucket_rule)

    def padded_length(self, length: int, rows: int = 1, *, calls: int | None = None) -> int:
        """The row length run pads a batch of `rows` rows of `length` tokens to (buckets.run_length): its length
        bucket, under buckets.INTERACTIVE at least 64 tokens for a batch of at most 4 rows, and for a batch of at
        least 8 rows whose shape recurs its tight bucket (≤ 1.125× its tokens) from the shape's second call. `calls`:
        which call of this shape (default: the next run's, counting this model's calls so far)."""
        max_tokens = self._model.config.max_tokens
        if not is_whole(length) or not 1 <= length <= max_tokens:
            raise InputError(f"padded_length: length={length!r}; pass a whole number of tokens from 1 to this "
                             f"model's {max_tokens} positions (a batch's is batch.input_ids.shape[1]).")
        if not is_whole(rows) or rows < 1:
            raise InputError(f"padded_length: rows={rows!r}; pass a whole number of rows, at least 1 (a batch's is "
                             f"batch.input_ids.shape[0]).")
        if calls is None:
            calls = self._shape_calls[(int(rows), int(length))] + 1
        return buckets.run_length(int(length), int(rows), self.bucket_rule, max_tokens, calls)

    def called(self, shape: tuple[int, int]) -> int:
        """Count one Model.run call of a batch of `shape` [B, T]; how many there have been, this one included (a
        recurring shape gets its tight bucket: buckets.run_length)."""
        self._shape_calls[shape] += 1
        return self._shape_calls[shape]

    def pads_safely_under(self, writers: Mapping[str, tuple[HookFn, ...]], rows: int) -> bool:
        """Whether every hook may run on rows padded to a bucket length: it sits at a site without a T or S axis
        (the pooler, sequence logits), is marked `any_length`, or passes buckets.pads_safely's probe (once per
        hook, site and shapes of its arrays; `clear()` forgets the verdicts). Otherwise the run keeps the exact
        length."""
        config, sites = self._model.config, self._model.hook_sites

        def safe(name: str, hook: HookFn) -> bool:
            shape, dtype = sites[name]
            if hook.any_length or not buckets.has_positions(name, len(shape)):
                return True
            arrays = tuple((k, jax.typeof(v)) for k, v in sorted(hook.arrays.items()))
            key = (name, hook.key, arrays, rows)  # the call's key (HookFn.for_call), not a second one
            if key not in self._pads_safely:
                ctx = HookContext(name, layer_of(name), config.num_attention_heads, config.head_dim)
                self._pads_safely[key] = buckets.pads_safely(hook, name, (rows, *shape[1:]), dtype, ctx)
            return self._pads_safely[key]

        return all(safe(name, hook) for name, hooks in writers.items() for hook in hooks)

    def attention_backend(self, batch, *, platform: str | None = None) -> attention.Backend:
        """Which attention kernel model(batch) runs, and why (minibert.core.attention; docs/accelerators.md): on the
        default device's platform, or on `platform` ("cpu", "cuda", "rocm", "tpu"; any case; JAX's "gpu" is refused
        as ambiguous, as is any other name), for this batch padded to its bucket as run pads it. Hooks that read the
        scores or pattern, and training's attention dropout, change the answer as attention.choose says."""
        model = self._model
        inputs = model.inputs(batch)
        length = self.padded_length(inputs.shape[1], inputs.shape[0])
        if not buckets.every_row_real(inputs.attention_mask):  # run keeps such a batch at its own length
            length = inputs.shape[1]
        mask = inputs.padded_to(length, model.config.pad_token_id).attention_mask
        platform = attention.platform() if platform is None else attention.checked_platform(platform)
        return attention.for_mask(platform, model.dtype, model.config.num_attention_heads, model.config.head_dim,
                                  mask, cudnn=platform == "cuda")
