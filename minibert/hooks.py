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
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import re
from typing import Callable, Iterable, Iterator, Mapping

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


@jax.tree_util.register_pytree_node_class
class HookFn:
    """A hook function with array arguments that jit traces rather than bakes in.

    `HookFn(fn, head=jnp.int32(3))` calls `fn(value, ctx, head=...)`. Changing `head`
    reuses the compiled program; a new plain lambda each time would recompile.
    """

    def __init__(self, fn: Callable, **arrays):
        self.fn = fn
        self.arrays = arrays

    def __call__(self, value, ctx: HookContext):
        return self.fn(value, ctx, **self.arrays)

    def tree_flatten(self):
        keys = tuple(sorted(self.arrays))
        return [self.arrays[k] for k in keys], (self.fn, keys)

    @classmethod
    def tree_unflatten(cls, aux, children):
        fn, keys = aux
        return cls(fn, **dict(zip(keys, children)))

    def __repr__(self):
        return f"HookFn({getattr(self.fn, '__name__', self.fn)}, {', '.join(self.arrays)})"


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
              "classifier": "a classifier head"}


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
    return f"no hook point matches {pattern!r}.{hint} `model.hook_names` lists them all; `minibert hooks` prints the table."


def writers_for(hooks: Mapping[str, Callable] | None, hook_names: list[str], architecture: str) -> dict[str, tuple[HookFn, ...]]:
    """{name or glob: fn} → {hook name: (HookFn, ...)}, several hooks on one name applied in the order given."""
    writers: dict[str, list[HookFn]] = {}
    for pattern, fns in (hooks or {}).items():
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

    def __getitem__(self, name: str):
        try:
            return self._values[name]
        except KeyError:
            pass
        if name in self._hook_names:
            raise KeyError(f"{name!r} was not captured; pass names=[{name!r}] (or a glob) to run_with_cache.")
        raise KeyError(_unknown_message(name, self._hook_names, "model"))

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
            raise KeyError(f"{suffix!r} is not a per-layer hook; examples: 'hook_pattern', 'attn.hook_q', 'hook_resid_post'.")
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


# What each hook site holds: axes and the equation, for the docs table (`minibert hooks`).
# Per-block sites are listed without their "blocks.{i}." prefix; LN is written for every layernorm.
SITE_DOCS: dict[str, tuple[str, str]] = {
    "embed.hook_embed": ("[B, T, D]", "W_E[input_ids] — token embeddings"),
    "embed.hook_pos_embed": ("[B, T, D]", "W_pos[0..T) — absolute position embeddings"),
    "embed.hook_token_type_embed": ("[B, T, D]", "W_type[token_type_ids] — segment embeddings"),
    "hook_full_embed": ("[B, T, D]", "LayerNorm(embed + pos + token_type) — the residual stream entering block 0"),
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
    "classifier.hook_logits": ("[B, C] or [B, T, C]", "pooled W + b (sequence) or h W + b (token classification)"),
}
_LAYERNORMS = re.compile(r"(^|\.)(ln1|ln2|ln)\.(hook_\w+)$")


def site_doc(name: str) -> tuple[str, str]:
    """(axes, equation) of a hook name, e.g. "blocks.3.attn.hook_q" → ("[B, T, H, K]", "q = x W_Q + b_Q")."""
    site = _site(name) if layer_of(name) is not None else name
    if site in SITE_DOCS:
        return SITE_DOCS[site]
    match = _LAYERNORMS.search(site)
    if match:
        return SITE_DOCS[f"ln.{match.group(3)}"]
    raise KeyError(f"hook {name!r} has no entry in SITE_DOCS; document it there.")


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
