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

A plain function may also read globals or closed-over values: the compiled program is keyed
on a fingerprint of what the function reads (`fingerprint`), so `HEAD = 5` after a run with
`HEAD = 4` recompiles rather than silently reusing the old value. The fingerprint sees the
function's closure cells, the globals its own code names, default arguments and
functools.partial arguments — scalars by value, arrays and other objects by identity. It does
not see globals read by helper functions the hook calls, nor an object mutated in place: for
values that change, and for sweeps (which should not recompile at all), use HookFn's arrays.

TransformerLens habits work too: `get_act_name("pattern", 3)`, `cache["pattern", -1]`, hooks
as a list of (name, fn) pairs (`fwd_hooks=`), `names_filter=` for the names to capture.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import functools
import numbers
import re
from collections.abc import Callable, Iterable, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from minibert.config import architectures_with
from minibert.errors import HookError


@dataclasses.dataclass(frozen=True)
class HookContext:
    """What a hook function is told about the site it runs at."""

    name: str  # full hook name, e.g. "blocks.3.attn.hook_pattern"
    layer: int | None  # block index (0-indexed), None outside the blocks
    n_heads: int
    d_head: int


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


def _by_value(obj):
    """Scalars (and tuples of them) by value, anything else by identity."""
    if obj is None or isinstance(obj, (bool, numbers.Number, str, bytes)):
        return (type(obj), obj)
    if isinstance(obj, tuple):
        return tuple(_by_value(x) for x in obj)
    return _Identity(obj)


def fingerprint(fn: Callable) -> tuple:
    """What a hook function reads besides its arguments: closure cells, the globals its code names,
    default arguments, functools.partial arguments (scalars by value, other objects by identity).

    Two calls with equal fingerprints trace to the same program; any change recompiles. Globals read by
    functions the hook calls, and objects mutated in place, are not seen (see the module docstring).
    """
    if isinstance(fn, functools.partial):
        return ("partial", _by_value(fn.args), _by_value(tuple(sorted(fn.keywords.items()))), fingerprint(fn.func))
    code = getattr(fn, "__code__", None)
    if code is None:  # a callable object: its attributes are its own business; identity is what we have
        return ()
    cells = tuple(_cell_contents(cell) for cell in fn.__closure__ or ())
    names = sorted(set(code.co_names) & fn.__globals__.keys())
    return (_by_value(cells), tuple((name, _by_value(fn.__globals__[name])) for name in names),
            _by_value(fn.__defaults__), _by_value(tuple(sorted((fn.__kwdefaults__ or {}).items()))))


def _cell_contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # a closure variable not assigned yet
        return _EMPTY_CELL


@jax.tree_util.register_pytree_node_class
class HookFn:
    """A hook function with array arguments that jit traces rather than bakes in.

    `HookFn(fn, head=jnp.int32(3))` calls `fn(value, ctx, head=...)`. Changing `head`
    reuses the compiled program; a new plain lambda each time would recompile, and so does
    changing a global or closed-over value `fn` reads (its `fingerprint` keys the program).
    """

    def __init__(self, fn: Callable, **arrays):
        self.fn = fn
        self.arrays = arrays

    def __call__(self, value, ctx: HookContext):
        return self.fn(value, ctx, **self.arrays)

    def tree_flatten(self):
        keys = tuple(sorted(self.arrays))
        return [self.arrays[k] for k in keys], (self.fn, keys, fingerprint(self.fn))

    @classmethod
    def tree_unflatten(cls, aux, children):
        fn, keys, _ = aux
        return cls(fn, **dict(zip(keys, children)))

    def __repr__(self):
        return f"HookFn({getattr(self.fn, '__name__', self.fn)}, {', '.join(self.arrays)})"


def add_delta(value, ctx: HookContext, delta):
    """value + delta: at delta = 0 it changes nothing, and its gradient is ∂loss/∂value (Model.grad,
    attribution patching)."""
    return value + delta


_LAYER = re.compile(r"^blocks\.(\d+)\.")


def _site(name: str) -> str:
    """"blocks.3.attn.hook_q" → "attn.hook_q"."""
    return name.split(".", 2)[2]


def layer_of(name: str) -> int | None:
    match = _LAYER.match(name)
    return int(match.group(1)) if match else None


class HookPoints:
    """The `hooks` object of one traced forward: captures some names, rewrites others."""

    def __init__(self, capture: Iterable[str], writers: Mapping[str, tuple[HookFn, ...]], n_heads: int, d_head: int):
        self.capture = frozenset(capture)
        self.writers = writers
        self.n_heads, self.d_head = n_heads, d_head
        self.captured: dict[str, jax.Array] = {}

    def active(self, name: str) -> bool:
        return name in self.capture or name in self.writers

    def __call__(self, name: str, value: jax.Array) -> jax.Array:
        for fn in self.writers.get(name, ()):
            value = _checked(fn(value, HookContext(name, layer_of(name), self.n_heads, self.d_head)), value, name, fn)
        if name in self.capture:
            self.captured[name] = value
        return value


def _checked(new, old, name: str, fn) -> jax.Array:
    if new is None:
        raise HookError(
            f"hook {fn!r} on {name!r} returned None; a hook returns the new value (JAX arrays are immutable: "
            f"return value.at[...].set(...) or value * mask rather than assigning in place), or value unchanged.")
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
    """A `hooks` object that marks every site active and records (name, shape) in forward order."""

    def __init__(self):
        self.sites: dict[str, tuple[tuple[int, ...], jnp.dtype]] = {}

    def active(self, name):
        return True

    def __call__(self, name, value):
        self.sites[name] = (tuple(value.shape), value.dtype)
        return value


# Hook prefixes of the head parts: on a model without that part they are valid names, just absent.
HEAD_PARTS = {"pooler": "a pooler", "mlm": "a masked-LM head", "nsp": "a next-sentence head",
              "classifier": "a classifier head", "discriminator": "ELECTRA's discriminator head"}


def resolve_names(spec, hook_names: list[str], architecture: str) -> list[str]:
    """Names, globs ("blocks.*.attn.hook_pattern") or a predicate → the matching hook names, in forward order.

    None means every hook. Unknown names raise HookError with the closest real names.
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
            raise HookError(_unknown_message(pattern, hook_names, architecture))
        chosen.update(matches)
    return [n for n in hook_names if n in chosen]


def _unknown_message(pattern: str, hook_names: list[str], architecture: str) -> str:
    for part, needs in HEAD_PARTS.items():
        if pattern.startswith(part + "."):
            return (f"{pattern!r}: this model is a {architecture}, which has no {part} hooks; they need {needs} "
                    f"({', '.join(architectures_with(part))}).")
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


def writers_for(hooks, hook_names: list[str], architecture: str) -> dict[str, tuple[HookFn, ...]]:
    """{name or glob: fn} or [(name or glob, fn), ...] → {hook name: (HookFn, ...)}, several hooks on one name
    applied in the order given."""
    writers: dict[str, list[HookFn]] = {}
    for pattern, fns in hook_pairs(hooks):
        if not (isinstance(pattern, str) or callable(pattern)):
            raise HookError(f"a hook's name must be a hook name, a glob or a predicate fn(name) -> bool; got "
                            f"{_shown(pattern)}. For TransformerLens shorthand use get_act_name('pattern', 3).")
        fns = fns if isinstance(fns, (list, tuple)) else [fns]
        for fn in fns:
            if not callable(fn):
                raise HookError(f"the hook for {pattern!r} is {type(fn).__name__}, not a function fn(value, ctx).")
            wrapped = fn if isinstance(fn, HookFn) else HookFn(fn)
            for name in resolve_names(pattern, hook_names, architecture):
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
        """One per-layer hook over all layers: "hook_pattern" or "attn.hook_pattern" → [L, ...]."""
        names = [n for n in self._hook_names
                 if layer_of(n) is not None and (_site(n) == suffix or _site(n).endswith("." + suffix))]
        if not names:
            raise KeyError(f"{suffix!r} is not a per-layer hook; examples: 'hook_pattern', 'attn.hook_q', "
                           f"'hook_resid_post'.")
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

    def numpy(self) -> dict[str, np.ndarray]:
        return {n: np.asarray(v) for n, v in self._values.items()}


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
    if not _is_minibert_name(full):
        raise HookError(f"get_act_name({name!r}, {layer!r}, {layer_type!r}) gives {full!r}, which minibert does not "
                        f"have. Per block: 'resid_pre', 'q', 'k', 'v', 'attn_scores', 'pattern', 'z', 'result', "
                        f"'attn_out', 'resid_mid', 'pre', 'post', 'mlp_out', 'resid_post', 'normalized_resid_post', "
                        f"and 'scale' / 'normalized' / 'out' with layer_type 'ln1' or 'ln2'; BERT has no final "
                        f"LayerNorm (ln_final). `model.hook_names` lists every name.")
    return full


def _is_minibert_name(name: str) -> bool:
    """A name of minibert's hook grammar (per-block sites of SITE_DOCS, ln1/ln2, or a top-level site)."""
    if layer_of(name) is None:
        return name in SITE_DOCS or bool(re.fullmatch(r"(embed|mlm)\.ln\.hook_\w+", name))
    site = _site(name)
    per_block_ln = re.fullmatch(r"ln[12]\.hook_(scale|normalized|out)", site)
    return (site in SITE_DOCS and site not in _TOP_LEVEL) or bool(per_block_ln)


# What each hook site holds: axes and the equation, for the docs table (`minibert hooks`).
# Per-block sites are listed without their "blocks.{i}." prefix; LN is written for every layernorm.
# E is the embedding width: D unless the family projects (ALBERT; ELECTRA when embedding_size ≠ hidden_size).
SITE_DOCS: dict[str, tuple[str, str]] = {
    "embed.hook_embed": ("[B, T, E]", "W_E[input_ids] — token embeddings (E = D unless the family projects)"),
    "embed.hook_pos_embed": ("[B, T, E]", "W_pos[positions] — absolute position embeddings: rows 0…T−1, RoBERTa's "
                             "from pad_token_id + 1"),
    "embed.hook_token_type_embed": ("[B, T, E]", "W_type[token_type_ids] — segment embeddings"),
    "embed.hook_project": ("[B, T, D]", "LayerNorm(embed + pos + token_type) W_proj + b_proj — E-wide embeddings "
                           "projected to D (ELECTRA, ALBERT)"),
    "hook_full_embed": ("[B, T, D]", "LayerNorm(embed + pos + token_type), projected to D where the family projects "
                        "(= embed.hook_project) — the residual stream entering block 0"),
    "hook_resid_pre": ("[B, T, D]", "x — the block's input (previous block's output)"),
    "attn.hook_q": ("[B, T, H, K]", "q = x W_Q + b_Q"),
    "attn.hook_k": ("[B, S, H, K]", "k = x W_K + b_K"),
    "attn.hook_v": ("[B, S, H, K]", "v = x W_V + b_V"),
    "attn.hook_qk": ("[B, H, T, S]", "q·k — raw dot products, before scaling and mask"),
    "attn.hook_attn_scores": ("[B, H, T, S]", "q·k/√K, padding keys set to the most negative float"),
    "attn.hook_pattern": ("[B, H, T, S]", "softmax over S of the scores — rows sum to 1"),
    "attn.hook_z": ("[B, T, H, K]", "z = pattern · v — each head's mix of values"),
    "attn.hook_result": ("[B, T, H, D]", "z_h W_O[h] — each head's output, before summing heads and adding b_O"),
    "hook_attn_out": ("[B, T, D]", "Σ_h z_h W_O[h] + b_O"),
    "hook_resid_mid": ("[B, T, D]", "x + attn_out"),
    "mlp.hook_pre": ("[B, T, F]", "ln1 W_in + b_in"),
    "mlp.hook_post": ("[B, T, F]", "act(pre) (gelu, gelu_new or relu, per config)"),
    "hook_mlp_out": ("[B, T, D]", "post W_out + b_out"),
    "hook_resid_post": ("[B, T, D]", "ln1 + mlp_out"),
    "hook_normalized_resid_post": ("[B, T, D]", "LayerNorm(resid_post) — the block's output"),
    "ln.hook_scale": ("[B, T, 1]", "σ = sqrt(mean((x − μ)²) + eps)"),
    "ln.hook_normalized": ("[B, T, D]", "(x − μ)/σ — before gain and bias (TransformerLens' meaning)"),
    "ln.hook_out": ("[B, T, D]", "(x − μ)/σ · γ + β — the layernorm's output"),
    "pooler.hook_out": ("[B, D]", "tanh(h_[CLS] W + b) — pooler output"),
    "mlm.hook_logits": ("[B, T, V]", "LayerNorm(act(h W + b)) W_Eᵀ + bias — masked-LM logits"),
    "nsp.hook_logits": ("[B, 2]", "pooled W + b — next-sentence logits"),
    "discriminator.hook_logits": ("[B, T]", "act(h W + b) · w + c — ELECTRA's replaced-token logits"),
    "classifier.hook_logits": ("[B, C] or [B, T, C]", "pooled W + b (sequence) or h W + b (token classification)"),
}
_LAYERNORMS = re.compile(r"(^|\.)(ln1|ln2|ln)\.(hook_\w+)$")
_HEAD_AND_EMBED = ("embed", *HEAD_PARTS)
_TOP_LEVEL = frozenset(n for n in SITE_DOCS if n.split(".")[0] in _HEAD_AND_EMBED or n == "hook_full_embed")


def site_doc(name: str) -> tuple[str, str]:
    """(axes, equation) of a hook name, e.g. "blocks.3.attn.hook_q" → ("[B, T, H, K]", "q = x W_Q + b_Q")."""
    site = _site(name) if layer_of(name) is not None else name
    if site in SITE_DOCS:
        return SITE_DOCS[site]
    match = _LAYERNORMS.search(site)
    if match:
        axes, doc = SITE_DOCS[f"ln.{match.group(3)}"]
        # embed.ln and mlm.ln normalize E-wide vectors (the embeddings; the MLM transform maps D back down to E)
        return (axes.replace("D", "E"), doc) if match.group(2) == "ln" else (axes, doc)
    raise KeyError(f"hook {name!r} has no entry in SITE_DOCS; document it there.")


def site_axes(name: str, ndim: int | None = None) -> list[str]:
    """The axis letters of a hook's value from SITE_DOCS, e.g. ["B", "H", "T", "S"]; for a site with two forms
    ("[B, C] or [B, T, C]"), the one with `ndim` axes (default: the first)."""
    options = [re.findall(r"\w", option) for option in site_doc(name)[0].split(" or ")]
    return next((o for o in options if len(o) == ndim), options[0])


def hook_table(hook_names: list[str], n_layers: int | str) -> str:
    """The Markdown table of hook points: block 0 stands for every block."""
    rows = ["| hook name | axes | what it holds |", "| --- | --- | --- |"]
    for name in hook_names:
        layer = layer_of(name)
        if layer not in (None, 0):
            continue
        axes, doc = site_doc(name)
        shown = name.replace("blocks.0.", "blocks.{i}.", 1)
        rows.append(f"| `{shown}` | {axes} | {doc} |")
    return "\n".join(rows) + f"\n\n`{{i}}` runs over the {n_layers} blocks (0-indexed).\n"
