"""Hook points: read, replace and differentiate any intermediate of the forward pass.

`model.py` passes every intermediate through `hooks(name, value)`. During one traced
forward, a `HookPoints` object decides what happens there:
  - capture: the value is stored and returned from the jitted function (only the names
    asked for, so memory stays bounded);
  - write: a hook function `fn(value, ctx) -> new value` replaces it (ablate, patch, scale);
  - nothing: the value passes through, and the model takes its fast paths (the fused
    attention kernel runs when no score or pattern hook is active).

Hook functions are Python callables traced into the jitted program. Arrays they need —
which head, a patch value, a position mask — go in a `HookFn(fn, head=3)`, whose
keyword arrays are traced arguments: a sweep over heads or positions compiles once.

A plain function may also read globals or closed-over values: the compiled program is keyed on the
function's code and what it reads (minibert.core.contract.StaticFn), so `HEAD = 5` after a run with `HEAD = 4`
recompiles rather than silently reusing the old value, and a function written again with the same code,
reading the same values (a loop's lambda, a notebook cell run again), reuses the program. For values that
change, and for sweeps (which should not recompile at all), use HookFn's arrays; when one hook's code has
compiled RECOMPILE_WARNING_AT programs anyway, a RecompileWarning says so once and names HookFn as the fix.
Model.run pads rows to a bucket length under hooks that cannot tell (minibert.runtime.buckets.pads_safely).

TransformerLens habits work too: `get_act_name("pattern", 3)`, `cache["pattern", -1]`, `cache.stack("pattern")`,
`stack_activation`, `hook.layer()`, hooks as a list of (name, fn) pairs (`fwd_hooks=`), `names_filter=` for
the names to capture, and TL's head hook names.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import functools
import numbers
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from minibert.core import site_names
from minibert.core.contract import StaticFn
from minibert.core.sites import HEAD_PARTS, is_site_name, site_axes  # noqa: F401 (site_axes: hooks.site_axes, as before)
from minibert.errors import HookError, outside_minibert


@dataclasses.dataclass(frozen=True)
class HookContext:
    """What a hook function is told about the site it runs at."""

    name: str  # full hook name, e.g. "blocks.3.attn.hook_pattern"
    layer: int | None  # block index (0-indexed; also callable, TL's hook.layer()), None outside the blocks
    n_heads: int
    d_head: int


@jax.tree_util.register_pytree_node_class
class HookFn:
    """A hook function with array arguments that jit traces rather than bakes in.

    `HookFn(fn, head=jnp.int32(3))` calls `fn(value, ctx, head=...)`. Changing `head` reuses the compiled
    program; `fn` itself keys the program as a contract.StaticFn (its code and what it reads: `key`).
    """

    def __init__(self, fn: Callable, **arrays):
        for name, value in arrays.items():
            bad = next((leaf for leaf in jax.tree_util.tree_leaves(value) if not _traceable(leaf)), None)
            if bad is not None:
                shown = getattr(fn, "__name__", type(fn).__name__)
                raise HookError(f"HookFn({shown}, {name}={value!r}): HookFn's keyword arguments are arrays "
                                f"jit traces (a head index, a patch), and a {type(bad).__name__} is not one; pass a "
                                f"number or an array, or close over the value in the hook's own code "
                                f"(functools.partial(fn, {name}=...)).")
        self.fn, self.arrays, self._key = fn, arrays, None  # _key: a call's copy holds its StaticFn (for_call)

    def __call__(self, value, ctx: HookContext):
        return self.fn(value, ctx, **self.arrays)

    @property
    def key(self) -> StaticFn:
        """`fn` as a program's static key (contract.StaticFn): anew each time for a HookFn you hold (what it reads may
        change between calls); computed once for a call's copy (`for_call`) and what JAX unflattens from it."""
        return StaticFn(self.fn) if self._key is None else self._key

    def for_call(self) -> HookFn:
        """This hook as one call holds it (hooks.writers_for): the same function and arrays, keyed once, now."""
        return self.tree_unflatten((StaticFn(self.fn), tuple(self.arrays)), list(self.arrays.values()))

    def tree_flatten(self):
        keys = tuple(sorted(self.arrays))
        return [self.arrays[k] for k in keys], (self.key, keys)

    @classmethod
    def tree_unflatten(cls, aux, children):
        key, names = aux
        hook = object.__new__(cls)  # not __init__: JAX unflattens with tracers, axis specs or placeholders as leaves
        hook.fn, hook.arrays, hook._key = key.fn, dict(zip(names, children)), key
        return hook

    @property
    def any_length(self) -> bool:
        """Whether `fn` was marked with `any_length` (Model.run may then pad its rows to a bucket length)."""
        return getattr(self.fn, "minibert_any_length", False)

    def __repr__(self):
        return f"HookFn({getattr(self.fn, '__name__', self.fn)}, {', '.join(self.arrays)})"


def _traceable(leaf) -> bool:
    """Whether jit can take `leaf` as a traced argument: an array or a number (bool included), not a str or object."""
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic, numbers.Number)) or hasattr(leaf, "__jax_array__")


def any_length(fn: Callable) -> Callable:
    """Mark a hook function (or HookFn) whose result at each position does not depend on the row length:
    it reads no value.shape along T or S, counts no position from the end (value[:, -1]), takes no mean or
    sum over positions and holds no array shaped by T. Model.run pads rows to a bucket length under any hook
    that passes buckets.pads_safely's probe; the mark promises it and skips the probe, so a wrong mark is not
    seen: to check a hook, compare run_with_hooks with jax.jit(model.forward_fn(hooks=...)), which never pads
    (docs/compiled.md). Returns `fn`, marked."""
    target = fn.fn if isinstance(fn, HookFn) else fn
    try:
        target.minibert_any_length = True
    except AttributeError:  # a builtin or a partial of one: wrap it in a function that can carry the mark
        raise HookError(f"any_length cannot mark {_shown(fn)}; wrap it: any_length(lambda value, ctx: f(value, "
                        f"ctx)).") from None
    return fn


# A hook's code that has compiled this many programs gets one warning: it is being re-traced per value.
RECOMPILE_WARNING_AT = 8


class RecompileWarning(UserWarning):
    """One hook function's code keeps compiling new programs (new closed-over values, new row lengths)."""


def count_compiles(writers: Mapping[str, tuple[HookFn, ...]], counts: dict, shape: tuple[int, ...]) -> None:
    """Count, for each hook code at each site in `writers`, the programs it has caused: the distinct versions of
    it (what it reads: contract.StaticFn) and batch shapes it was traced with, so that a hook which never changes
    is not blamed for programs that other hooks, names or a loss compile. Warn once per code and site when the
    count reaches RECOMPILE_WARNING_AT, saying what to do. One code at several sites (a HookFn moved from layer to
    layer) compiles a program per site, which is not what the warning is about. `counts` is the model's own
    tally; `shape` the traced batch's [B, T]."""
    for name, fns in writers.items():
        for hook in fns:
            count_compile(hook.key, name, counts, shape)


def count_compile(key: StaticFn, site: str, counts: dict, shape: tuple[int, ...]) -> None:
    """count_compiles for one keyed function at one site ("loss_fn": Model.grad's loss, by version alone: shape ())."""
    fn = key.fn
    if getattr(fn, "__module__", "").startswith("minibert."):
        return  # minibert's own hooks (Model.grad's shifts, the sweeps') are HookFns already
    code = getattr(fn, "__code__", fn)
    versions, version = counts.setdefault((code, site), set()), (key, tuple(shape))
    if version in versions:
        return
    versions.add(version)
    if len(versions) == RECOMPILE_WARNING_AT:
        where = f" ({code.co_filename}:{code.co_firstlineno})" if hasattr(code, "co_filename") else ""
        what, how = _LOSS_WARNING if site == "loss_fn" else _HOOK_WARNING
        warnings.warn(f"{what.format(site=site)} {getattr(fn, '__name__', fn)!r}{where} has compiled "
                      f"{RECOMPILE_WARNING_AT} programs: {how} (docs/compiled.md).",
                      RecompileWarning, stacklevel=outside_minibert())


# What a RecompileWarning names, and what it says causes the programs and what to do.
_HOOK_WARNING = ("the hook at {site}",
                 "each new value it closes over or reads as a global, and each new row length, compiles again "
                 "(seconds and memory each). Pass the values that change as arrays, HookFn(fn, head=jnp.int32(h)), "
                 "which compiles once for all of them; a hook that reads the row length (a mean over positions, "
                 "value[:, -1], an array shaped by it) runs at each exact length")
_LOSS_WARNING = ("model.grad's loss",
                 "each new value it closes over or reads as a global compiles again (seconds and memory each). Keep "
                 "what a loss reads fixed and put what changes in the batch: a loss of one value per row [B] gives "
                 "each row its own gradient in one program")


def add_delta(value, ctx: HookContext, delta):
    """value + delta: at delta = 0 it changes nothing, and its gradient is ∂loss/∂value (Model.grad,
    attribution patching)."""
    return value + delta


_LAYER = re.compile(r"^blocks\.(\d+)\.")


def _site(name: str) -> str:
    """"blocks.3.attn.hook_q" → "attn.hook_q"."""
    return name.split(".", 2)[2]


class LayerIndex(int):
    """A block index that can also be called: `ctx.layer` is the int, and `ctx.layer()` gives it too, as
    TransformerLens' `hook.layer()` does."""

    def __call__(self) -> int:
        return int(self)


def layer_of(name: str) -> LayerIndex | None:
    match = _LAYER.match(name)
    return LayerIndex(match.group(1)) if match else None


class HookPoints:
    """The `hooks` object of one traced forward: captures some names, rewrites others.

    stacked: the captures of a scanned run of blocks stay one buffer [n, ...] per site, under stacked_name
    (blocks.0,1,2.attn.hook_pattern), for the caller to split outside the program (runtime.device.unstacked):
    slicing every layer's value out inside the program makes its compile grow with depth (benchmarks/RESULTS.md)."""

    def __init__(self, capture: Iterable[str], writers: Mapping[str, tuple[HookFn, ...]], n_heads: int, d_head: int,
                 stacked: bool = False):
        self.capture = frozenset(capture)
        self.writers = writers
        self.n_heads, self.d_head = n_heads, d_head
        self.stacked = stacked
        self.captured: dict[str, jax.Array] = {}

    def active(self, name: str) -> bool:
        return name in self.capture or name in self.writers

    def __call__(self, name: str, value: jax.Array) -> jax.Array:
        value = self.write(name, value)
        if name in self.capture:
            self.captured[name] = value
        return value

    def write(self, name: str, value: jax.Array) -> jax.Array:
        """value through the hook functions on `name`, in order."""
        for fn in self.writers.get(name, ()):
            value = _checked(fn(value, HookContext(name, layer_of(name), self.n_heads, self.d_head)), value, name, fn)
        return value

    def over_layers(self, layers: range) -> LayerHooks:
        """These hooks in the blocks `layers` of a scanned stack (encoder.Encoder.stack)."""
        return LayerHooks(self, layers)


class LayerHooks:
    """The hooks of a run of blocks that encoder.Encoder.stack scans: one traced block runs for every layer, calling
    its hooks by template names ("blocks.*.attn.hook_z"); these act as the hooks of the layer the scan is at, under
    that layer's own name ("blocks.3.attn.hook_z"), so hooks keep their per-layer names and meanings:

    - writes: the hook functions on blocks.3.attn.hook_z run in layer 3 only (jax.lax.switch on the traced layer
      picks that layer's functions, each called with ctx.layer = 3, or none);
    - captures: the layers asked of a site fill a buffer [n, ...] carried through the scan, one slot per layer
      asked, which `store` hands to the HookPoints after the scan, under the per-layer names or, where the
      HookPoints are stacked (Model.run's), whole under its stacked_name: memory holds what was asked, nothing more;
    - active: a site is active where it is in any layer of the run (the block's path is one for every layer).

    `at(layer, buffers)` is the hooks object of one step of the scan; buffers None (a trace that only looks for
    the captured values' shapes) keeps each captured value as it is and runs no hook function.
    """

    def __init__(self, points: HookPoints, layers: range, layer=None, buffers: dict | None = None):
        self.points, self.layers, self.layer = points, layers, layer
        self.probing = buffers is None  # a trace for the captured values' shapes: keep the values themselves
        self.buffers = {} if buffers is None else dict(buffers)

    def names(self, template: str) -> list[str]:
        """The per-layer names of a template: "blocks.*.attn.hook_z" → blocks.i.attn.hook_z for each layer i."""
        return [template.replace("*", str(i), 1) for i in self.layers]

    @property
    def captures(self) -> bool:
        """Whether any site of these layers is captured."""
        return any(layer_of(name) in self.layers for name in self.points.capture)

    def active(self, template: str) -> bool:
        return any(self.points.active(name) for name in self.names(template))

    def at(self, layer, buffers: dict | None) -> LayerHooks:
        return LayerHooks(self.points, self.layers, layer, buffers)

    def __call__(self, template: str, value: jax.Array) -> jax.Array:
        names = self.names(template)
        position = self.layer - self.layers.start  # traced
        written = [k for k, name in enumerate(names) if name in self.points.writers]
        # A trace for the captured shapes runs no hook (one keeps its value's shape and dtype: _checked). Branch 0
        if written and not self.probing:  # leaves the value; branch j + 1 runs the functions of layer written[j]
            branch = np.zeros(len(names), np.int32)
            branch[written] = np.arange(1, len(written) + 1)
            functions = [lambda value: value] + [functools.partial(self.points.write, names[k]) for k in written]
            value = jax.lax.switch(jnp.asarray(branch)[position], functions, value)
        kept = [k for k, name in enumerate(names) if name in self.points.capture]
        if kept:
            self.buffers[template] = value if self.probing else self._kept(self.buffers[template], value, kept,
                                                                            position)
        return value

    def _kept(self, buffer, value, kept: list[int], position):
        """buffer [n, ...] with value in the slot of this layer, where it is one of the n layers `kept`."""
        if len(kept) == len(self.layers):
            return jax.lax.dynamic_update_index_in_dim(buffer, value, position, 0)
        slots = np.full(len(self.layers), len(kept) - 1, np.int32)  # layers not kept: the last slot, unchanged
        slots[kept] = np.arange(len(kept))
        slot = jnp.asarray(slots)[position]
        here = jnp.isin(position, jnp.asarray(kept))
        return jax.lax.dynamic_update_index_in_dim(
            buffer, jnp.where(here, value, jax.lax.dynamic_index_in_dim(buffer, slot, keepdims=False)), slot, 0)

    def empty(self, shapes: Mapping[str, jax.ShapeDtypeStruct]) -> dict[str, jax.Array]:
        """Zeroed buffers [n, ...] for the captured sites' values (shapes: one layer's)."""
        return {template: jnp.zeros((len(self._kept_layers(template)), *shape.shape), shape.dtype)
                for template, shape in shapes.items()}

    def _kept_layers(self, template: str) -> list[int]:
        return [i for i, name in zip(self.layers, self.names(template)) if name in self.points.capture]

    def store(self, buffers: Mapping[str, jax.Array]) -> None:
        """Each captured layer's slot, under its own name, into the HookPoints' captures; with points.stacked, the
        buffer of two or more layers as it is, under its stacked_name."""
        for template, buffer in buffers.items():
            layers = self._kept_layers(template)
            if self.points.stacked and len(layers) > 1:
                self.points.captured[stacked_name(template, layers)] = buffer
                continue
            for slot, layer in enumerate(layers):
                self.points.captured[template.replace("*", str(layer), 1)] = buffer[slot]


STACKED_NAME = re.compile(r"^blocks\.(\d+(?:,\d+)+)\.(.+)$")


def stacked_name(template: str, layers: Iterable[int]) -> str:
    """The name of a buffer [n, ...] holding the values of a per-layer site at `layers`: "blocks.*.attn.hook_z",
    (0, 1, 2) → "blocks.0,1,2.attn.hook_z"."""
    return template.replace("*", ",".join(map(str, layers)), 1)


def _checked(new, old, name: str, fn) -> jax.Array:
    if new is None:
        raise HookError(
            f"hook {fn!r} on {name!r} returned None; a hook returns the new value (JAX arrays are immutable: "
            f"return value.at[...].set(...) or value * mask rather than assigning in place), or value unchanged.")
    if not isinstance(new, (jax.Array, np.ndarray, numbers.Number)):
        raise HookError(f"hook {fn!r} on {name!r} returned a {type(new).__name__}; a hook returns the new value, an "
                        f"array of shape {old.shape} and dtype {old.dtype} (or the value unchanged).")
    new = jnp.asarray(new)
    if new.shape != old.shape:
        raise HookError(
            f"hook {fn!r} on {name!r} returned shape {new.shape}; it must return the shape of the value "
            f"it replaces, {old.shape}."
        )
    if new.dtype != old.dtype:
        raise HookError(
            f"hook {fn!r} on {name!r} returned dtype {new.dtype}; it must return {old.dtype} "
            f"(cast with .astype(value.dtype))."
        )
    return new


class Recorder:
    """A `hooks` object that marks every site active and records (name, shape) in forward order. In a scanned
    stack it records the block's sites once, under their template names, and gives them each layer's names when
    the scan ends (a trace of one block, not of every layer: Model.hook_sites)."""

    captures = False  # nothing is carried through a scan
    buffers: dict = {}

    def __init__(self, layers: range | None = None, into: Recorder | None = None):
        self.sites: dict[str, tuple[tuple[int, ...], jnp.dtype]] = {}
        self.layers, self.into = layers, into

    def active(self, name):
        return True

    def __call__(self, name, value):
        self.sites[name] = (tuple(value.shape), value.dtype)
        return value

    def over_layers(self, layers: range) -> Recorder:
        return Recorder(layers, into=self)

    def at(self, layer, buffers) -> Recorder:
        return self

    def store(self, buffers) -> None:
        """The end of a scanned run: each template site ("blocks.*.attn.hook_z") under every layer's name."""
        for layer in self.layers:
            self.into.sites |= {name.replace("*", str(layer), 1): site for name, site in self.sites.items()}


# The hook-name prefix of each head part's sites (TransformerLens' module names where it has the part).
HEAD_PREFIXES = {"pooler": "pooler", "mlm_head": "mlm", "unembed": "mlm", "nsp_head": "nsp",
                 "classifier": "classifier", "discriminator": "discriminator"}


def resolve_names(spec, hook_names: list[str], model) -> list[str]:
    """Names, globs ("blocks.*.attn.hook_pattern") or a predicate → the matching hook names, in forward order.

    None means every hook. Unknown names raise HookError with the closest real names. `model`: the model's Config
    (its family names the architectures that have a missing head part), or its architecture name.
    """
    if spec is None:
        return list(hook_names)
    if callable(spec):
        return [n for n in hook_names if spec(n)]
    if isinstance(spec, str):
        spec = [spec]
    if not isinstance(spec, Iterable) or not all(isinstance(p, str) for p in spec):
        raise HookError(f"names must be a hook name, a glob, a list of them, or a predicate fn(name) -> bool; got "
                        f"{_shown(spec)}. For TransformerLens shorthand use get_act_name, e.g. "
                        f"get_act_name('pattern', 3).")
    chosen = set()
    for pattern in spec:
        matches = fnmatch.filter(hook_names, pattern) if any(c in pattern for c in "*?[") else (
            [pattern] if pattern in hook_names else [])
        if not matches:
            raise HookError(_unknown_message(pattern, hook_names, model))
        chosen.update(matches)
    return [n for n in hook_names if n in chosen]


def _architecture(model) -> str:
    return model if isinstance(model, str) else model.architecture


def _having(model, part: str) -> str:
    """The architectures of the model's family that have a head part; for an architecture name alone (no family at
    hand: the core never reads the registry), where to find them."""
    if isinstance(model, str):
        return f"minibert.families.registry.architectures_with({part!r}) lists the architectures that have it"
    return ", ".join(model.family.architectures_with(part))


def _unknown_message(pattern: str, hook_names: list[str], model) -> str:
    for prefix, part in HEAD_PREFIXES.items():  # a head part the model lacks (not a misspelt hook of one it has)
        if pattern.startswith(prefix + ".") and not any(name.startswith(prefix + ".") for name in hook_names):
            return (f"{pattern!r}: this model is a {_architecture(model)}, which has no {prefix} hooks; they need "
                    f"{HEAD_PARTS[part]} ({_having(model, part)}).")
    close = difflib.get_close_matches(pattern, hook_names, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
    return (f"no hook point matches {pattern!r}.{hint} `model.hook_names` lists them all; `minibert hooks` prints "
            f"the table.")


def _shown(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:80]}{'…' if len(text) > 80 else ''}"


def hook_pairs(hooks) -> list[tuple]:
    """{name or glob: fn}, or TransformerLens' list of (name, fn) pairs → [(name, fn), ...].

    A name may also be a predicate fn(name) -> bool, as in TransformerLens' fwd_hooks."""
    if hooks is None:
        return []
    if isinstance(hooks, Mapping):
        return list(hooks.items())
    if isinstance(hooks, (list, tuple)) and all(isinstance(p, tuple) and len(p) == 2 for p in hooks):
        return list(hooks)
    raise HookError(f"hooks must be {{name: fn}} or a list of (name, fn) pairs (TransformerLens' fwd_hooks); got "
                    f"{_shown(hooks)}.")


def writers_for(hooks, hook_names: list[str], model) -> dict[str, tuple[HookFn, ...]]:
    """{name or glob: fn} or [(name or glob, fn), ...] → {hook name: (HookFn, ...)}, several hooks on one name
    applied in the order given; `model` as resolve_names takes it. Each is keyed once for the call (for_call)."""
    writers: dict[str, list[HookFn]] = {}
    for pattern, fns in hook_pairs(hooks):
        if not (isinstance(pattern, str) or callable(pattern)):
            raise HookError(f"a hook's name must be a hook name, a glob or a predicate fn(name) -> bool; got "
                            f"{_shown(pattern)}. For TransformerLens shorthand use get_act_name('pattern', 3).")
        fns = fns if isinstance(fns, (list, tuple)) else [fns]
        for fn in fns:
            if not callable(fn):
                raise HookError(f"the hook for {pattern!r} is {type(fn).__name__}, not a function fn(value, ctx).")
            wrapped = (fn if isinstance(fn, HookFn) else HookFn(fn)).for_call()
            for name in resolve_names(pattern, hook_names, model):
                writers.setdefault(name, []).append(wrapped)
    return {name: tuple(fns) for name, fns in writers.items()}


class Cache(Mapping):
    """Captured hook values by name, in forward order. Values are device arrays or NumPy (offloaded)."""

    def __init__(self, values: Mapping[str, object], hook_names: list[str]):
        self._values = {n: values[n] for n in hook_names if n in values}
        self._hook_names = hook_names

    def __getitem__(self, name):
        """cache["blocks.3.attn.hook_pattern"], or TransformerLens' shorthand: cache["pattern", 3],
        cache["scale", 2, "ln1"], cache["resid_post", -1] (negative layers count from the last)."""
        if isinstance(name, tuple):
            name = self._act_name(*name)
        elif not isinstance(name, str):
            raise HookError(f"cache keys are hook names (str) or TransformerLens tuples like ('pattern', 3); got "
                            f"{_shown(name)}.")
        try:
            return self._values[name]
        except KeyError:
            pass
        if name in self._hook_names:
            raise KeyError(f"{name!r} was not captured; pass names=[{name!r}] (or a glob) to run_with_cache.")
        raise KeyError(_unknown_message(name, self._hook_names, "model"))

    def _act_name(self, name, layer=None, layer_type=None) -> str:
        if isinstance(layer, int) and layer < 0:  # as TransformerLens' ActivationCache does
            layer += 1 + max((layer_of(n) for n in self._hook_names if layer_of(n) is not None), default=-1)
        return get_act_name(name, layer, layer_type)

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self):
        return f"Cache({len(self)} values: {', '.join(list(self._values)[:4])}{', ...' if len(self) > 4 else ''})"

    def stack(self, suffix: str):
        """One per-layer hook over all layers → [L, ...]: "hook_pattern", "attn.hook_pattern", or the short name
        TransformerLens' get_act_name takes ("pattern", "resid_pre", "q")."""
        suffix = _short_site(suffix)
        names = [n for n in self._hook_names
                 if layer_of(n) is not None and (_site(n) == suffix or _site(n).endswith("." + suffix))]
        if not names:
            raise KeyError(f"{suffix!r} is not a per-layer hook; examples: {site_names.leaf(site_names.PATTERN)!r}, "
                           f"{site_names.Q!r}, {site_names.RESID_POST!r}.")
        sites = sorted({_site(n) for n in names})
        if len(sites) > 1:
            raise KeyError(f"{suffix!r} is ambiguous: it names {sites}; pass one of them.")
        missing = [n for n in names if n not in self._values]
        if missing:
            raise KeyError(f"stack({suffix!r}) needs every layer; not captured: {missing[:3]}. "
                           f"Capture with names='blocks.*.{suffix}'.")
        values = [self._values[n] for n in names]
        stack = np.stack if isinstance(values[0], np.ndarray) else jnp.stack
        return stack(values)

    def stack_activation(self, activation_name: str, layer: int = -1, sublayer_type: str | None = None):
        """TransformerLens' ActivationCache.stack_activation: the activation of layers 0 … layer − 1 (−1: all
        layers) stacked → [layers, ...]; names as get_act_name takes them ("pattern"; "scale" with "ln1")."""
        if layer is None or layer == -1:
            layer = 1 + max((layer_of(n) for n in self._hook_names if layer_of(n) is not None), default=-1)
        values = [self[activation_name, i, sublayer_type] for i in range(layer)]
        stack = np.stack if isinstance(values[0], np.ndarray) else jnp.stack
        return stack(values)

    def numpy(self) -> dict[str, np.ndarray]:
        return {n: np.asarray(v) for n, v in self._values.items()}


def _short_site(name: str) -> str:
    """A per-block site from TransformerLens' short name ("pattern" → "attn.hook_pattern"); other names as they are."""
    if not isinstance(name, str) or "hook_" in name:
        return name
    try:
        return _site(get_act_name(name, 0))
    except HookError:
        return name  # stack's own KeyError names the choices


# TransformerLens' get_act_name shorthand (transformer_lens.utils), its aliases and layer types as TL has them.
_TL_LAYER_TYPES = {"a": "attn", "m": "mlp", "b": "", "block": "", "blocks": "", "attention": "attn"}
_TL_ALIASES = {"attn": "pattern", "attn_logits": "attn_scores", "key": "k", "query": "q", "value": "v",
               "mlp_pre": "pre", "mlp_mid": "mid", "mlp_post": "post"}
_TL_ATTN = ("k", "v", "q", "z", "rot_k", "rot_q", "result", "pattern", "attn_scores")
_TL_MLP = ("pre", "post", "mid", "pre_linear")


def get_act_name(name: str, layer: int | None = None, layer_type: str | None = None) -> str:
    """TransformerLens' `utils.get_act_name`, for the names minibert has: shorthand → full hook name.

    get_act_name("pattern", 3) == "blocks.3.attn.hook_pattern"; get_act_name("k6") == "blocks.6.attn.hook_k";
    get_act_name("scale", 2, "ln1") == "blocks.2.ln1.hook_scale"; get_act_name("resid_pre", 0) ==
    "blocks.0.hook_resid_pre"; a full name ("blocks.0.hook_resid_pre") comes back as it is. The first digits
    in `name` are the layer and what follows is the layer type, as in TL. A name TL would build but minibert
    lacks (TL's final LayerNorm "ln_final", GPT-only sites such as "rot_q") raises HookError.
    """
    if not isinstance(name, str):
        raise HookError(f"get_act_name takes a name such as 'pattern' or 'resid_pre'; got {_shown(name)}.")
    if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
        return name
    match = re.match(r"([a-z]+)(\d+)([a-z]?.*)", name)
    if match is not None:
        name, layer, layer_type = match.groups(0)
    name = _TL_ALIASES.get(name, name)
    if name in _TL_ATTN:
        layer_type = "attn"
    elif name in _TL_MLP:
        layer_type = "mlp"
    elif layer_type in _TL_LAYER_TYPES:
        layer_type = _TL_LAYER_TYPES[layer_type]
    full = (f"blocks.{layer}." if layer is not None else "") + (f"{layer_type}." if layer_type else "") + f"hook_{name}"
    if name in ("scale", "normalized") and layer is None:
        full = f"ln_final.{full}"
    if not is_site_name(full):  # the site table knows every name some model has
        raise HookError(f"get_act_name({name!r}, {layer!r}, {layer_type!r}) gives {full!r}, which minibert does not "
                        f"have. Per block: 'resid_pre', 'q', 'k', 'v', 'attn_scores', 'pattern', 'z', 'result', "
                        f"'attn_out', 'resid_mid', 'pre', 'post', 'mlp_out', 'resid_post', 'normalized_resid_post', "
                        f"and 'scale' / 'normalized' / 'out' with layer_type 'ln1' or 'ln2'; BERT has no final "
                        f"LayerNorm (ln_final). `model.hook_names` lists every name.")
    return full
