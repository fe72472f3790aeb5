"""The optimiser every minibert trainer shares: AdamW as transformers' Trainer runs it, its learning-rate
schedules, gradient clipping and accumulation, and a progress bar.

Parameters are any tree whose paths spell their dotted names ("blocks.0.attn.W_Q", "classifier.b";
`parameter_names` gives them): finetune's nested params dict (model.params), or a dict {dotted name: array}.

What transformers' Trainer + torch.optim.AdamW do, and `adamw` does the same:
    g      ← Σ grads over `accumulate` micro-batches / accumulate
    g      ← g · min(1, max_grad_norm / (‖g‖₂ + 1e-6))          (torch.nn.utils.clip_grad_norm_)
    m, v   ← β₁m + (1−β₁)g, β₂v + (1−β₂)g²
    p      ← p − lr_t·(m̂ / (√v̂ + ε) + λ·p)                       (decoupled weight decay, λ only where decays)
with lr_t the schedule at the number of updates made so far (the first update uses lr_0, as the
Trainer's LambdaLR does). Biases and LayerNorm gains and biases do not decay.
"""

from __future__ import annotations

import collections
import contextlib
import fnmatch
import math
import sys
import time
from collections.abc import Callable, Iterable, Mapping

import jax
import jax.numpy as jnp
import optax
from tqdm.auto import tqdm

from minibert.core.encoder import parameter_names  # the Model's names are the optimiser's (kept here)
from minibert.errors import InputError

SCHEDULES = ("linear", "constant")
# Leaf names of the parameters that do not decay: biases (b, b_Q, …, the decoder's bias, the discriminator's c)
# and LayerNorm's gain `scale` with its `bias` (transformers' Trainer: names with "bias", LayerNorm modules).
_NO_DECAY_LEAVES = ("b", "b_*", "bias", "decoder_bias", "c", "scale")


def decays(name: str) -> bool:
    """Whether weight decay applies to the parameter `name` (dotted): not to biases nor LayerNorm parameters."""
    leaf = name.rsplit(".", 1)[-1]
    return not any(fnmatch.fnmatchcase(leaf, pattern) for pattern in _NO_DECAY_LEAVES)


def name_mask(params, predicate: Callable[[str], bool]):
    """A tree of `params`' form holding predicate(dotted name) at each parameter: names read once, where a mask is
    made, so that the step that uses it meets its parameters' one form."""
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(params), [predicate(name) for name in
                                        parameter_names(params)])


def decay_mask(params):
    """decays(name) at each parameter of `params` (name_mask): the mask `adamw` takes."""
    return name_mask(params, decays)


def split(params: Mapping, mask: Mapping) -> tuple[dict, dict]:
    """(the parameters where `mask` holds True, the others): two nested dicts of `params`' form (name_mask's
    `mask`), a branch left out of the one that has none of its leaves. joined is its inverse."""
    chosen, rest = {}, {}
    for key, value in params.items():
        if isinstance(value, Mapping):
            inner = split(value, mask[key])
            chosen |= {key: inner[0]} if inner[0] else {}
            rest |= {key: inner[1]} if inner[1] else {}
        else:
            (chosen if mask[key] else rest)[key] = value
    return chosen, rest


def joined(chosen: Mapping, rest: Mapping) -> dict:
    """split's two parts as one nested dict again."""
    both = dict(chosen)
    for key, value in rest.items():
        both[key] = joined(chosen[key], value) if key in chosen else value
    return both


def selected(names: Iterable[str], patterns: str | Iterable[str] | None) -> set[str]:
    """The names matching any of the glob `patterns` ("classifier.*", "blocks.[45].*"); None selects all.
    A pattern that matches nothing is an error listing a few names (a typo would otherwise train nothing)."""
    names = list(names)
    if patterns is None:
        return set(names)
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    chosen = set()
    for pattern in patterns:
        matches = {n for n in names if fnmatch.fnmatchcase(n, pattern)}
        if not matches:
            raise InputError(f"trainable pattern {pattern!r} matches no parameter; names look like "
                             f"{', '.join(names[:3])}, …, {names[-1]} (globs over dotted names).")
        chosen |= matches
    return chosen


def warmup_steps(warmup: float | int, total_steps: int) -> int:
    """Warm-up as a number of updates: a float in [0, 1) is a fraction of total_steps (ceil, as the
    Trainer's warmup_ratio), an int ≥ 1 a count."""
    if isinstance(warmup, float) and 0.0 <= warmup < 1.0:
        return math.ceil(warmup * total_steps)
    if isinstance(warmup, bool) or not isinstance(warmup, (int, float)) or not math.isfinite(warmup) \
            or int(warmup) != warmup or warmup < 0:  # nan and inf first: int() of them raises
        raise InputError(f"warmup={warmup!r}: pass a fraction of the steps in [0, 1) or a whole number of steps.")
    return int(warmup)


def learning_rate_schedule(peak: float, total_steps: int, *, warmup: float | int = 0.0,
                           schedule: str = "linear") -> optax.Schedule:
    """lr(step) as transformers' get_linear_schedule_with_warmup / get_constant_schedule_with_warmup:
    peak·step/W during the W warm-up steps, then peak·(N − step)/(N − W) ("linear", down to 0 at N)
    or peak ("constant")."""
    if schedule not in SCHEDULES:
        raise InputError(f"schedule={schedule!r} is not one of {', '.join(map(repr, SCHEDULES))}.")
    W, N = warmup_steps(warmup, total_steps), total_steps

    def lr(step):
        step = jnp.asarray(step, jnp.float32)
        rising = step / max(1, W)
        after = jnp.maximum(0.0, (N - step) / max(1, N - W)) if schedule == "linear" else 1.0
        return peak * jnp.where(step < W, rising, after)

    return lr


def clip_like_torch(max_norm: float) -> optax.GradientTransformation:
    """g · min(1, max_norm / (‖g‖₂ + 1e-6)): torch.nn.utils.clip_grad_norm_'s formula (optax's
    clip_by_global_norm has no 1e-6 and leaves g alone below the norm; they differ by ~1e-6 relative)."""

    def update(grads, state, params=None):
        norm = optax.tree.norm(grads)
        factor = jnp.minimum(1.0, max_norm / (norm + 1e-6))
        return jax.tree.map(lambda g: g * factor.astype(g.dtype), grads), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def adamw(learning_rate: float | optax.Schedule, *, weight_decay: float = 0.0, mask=None,
          max_grad_norm: float | None = 1.0, accumulate: int = 1, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8) -> optax.GradientTransformation:
    """AdamW with decoupled weight decay (only where `mask` is True; None: everywhere), preceded by
    torch-style global-norm clipping (None: no clipping), optionally averaging gradients over
    `accumulate` calls before each update (optax.MultiSteps). Defaults are transformers' Trainer's."""
    checked_accumulate(accumulate)
    steps = [clip_like_torch(max_grad_norm)] if max_grad_norm is not None else []
    steps.append(optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=mask))
    chain = optax.chain(*steps)
    return optax.MultiSteps(chain, every_k_schedule=accumulate) if accumulate > 1 else chain


def checked_accumulate(accumulate) -> int:
    """accumulate=: a whole number of micro-batches per update, at least 1."""
    if accumulate < 1 or int(accumulate) != accumulate:
        raise InputError(f"accumulate={accumulate!r}: pass a whole number of micro-batches per update, ≥ 1.")
    return int(accumulate)


def frozen_except(optimizer: optax.GradientTransformation, trainable: Mapping[str, bool]):
    """`optimizer` on the parameters marked True in {name: bool}; the others get zero updates and no state."""
    labels = {name: "train" if moves else "freeze" for name, moves in trainable.items()}
    return optax.multi_transform({"train": optimizer, "freeze": optax.set_to_zero()}, labels)


CACHE_HIT, CACHE_MISS = "/jax/compilation_cache/cache_hits", "/jax/compilation_cache/cache_misses"  # JAX's events


class Progress:
    """A tqdm bar over optimisation steps showing the loss, tokens per second and the time left (eta).

        with Progress(total_steps, "fine-tuning") as bar:
            with bar.compiling(length):   # around each step: says so while a new row length's step is prepared
                ...
            bar.update(loss, tokens)   # after each step; loss a scalar, tokens the real tokens it saw

    The rate and eta leave compiling out: an update is measured over the time since the previous one (since the
    bar opened, for the first), and an update in whose time a step was compiled (or loaded from the cache) is not
    measured at all, its tokens neither. Until one update is measured, neither is shown (a first step's compile
    made the bar say 6 tokens/s and 2 h 16 min left). tqdm's own rate and remaining time, which count everything,
    are not shown."""

    FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"

    def __init__(self, total: int, description: str = "training", *, enabled: bool = True,
                 clock: Callable[[], float] = time.perf_counter):
        self.bar = tqdm(total=total, desc=description, disable=not enabled, unit="step", bar_format=self.FORMAT)
        self.clock, self.last = clock, clock()
        self.tokens, self.seconds, self.measured = 0, 0.0, 0  # of the measured updates
        self.compiled = False  # a step was compiled since the last update: the next update is not measured
        self.description = description
        self.lengths: list[int] = []  # the row lengths a step ran at, in the order they first came: one program each

    @contextlib.contextmanager
    def compiling(self, length: int):
        """Around a step on rows of `length` tokens: the first time that length comes, the step is compiled, or
        loaded from the persistent compilation cache, before it runs. The bar says so meanwhile and, once the step
        ran, a line says which it was: JAX's monitoring events count a program read from the cache as a hit and
        one compiled and written to it as a miss (with the cache off, neither: compiled)."""
        if length in self.lengths:
            yield
            return
        self.lengths.append(length)
        cached = jax.config.jax_enable_compilation_cache and jax.config.jax_compilation_cache_dir  # JAX's own word
        self.bar.set_description_str(f"{self.description}: " + (
            f"preparing the step for {length}-token rows (compiling it, or loading it from the compilation cache)"
            if cached else f"compiling the step for {length}-token rows"))
        events = collections.Counter()

        def count(event: str, **kwargs):
            events[event] += 1

        jax.monitoring.register_event_listener(count)
        began = self.clock()
        try:
            yield
        finally:
            jax.monitoring.unregister_event_listener(count)
            self.bar.set_description_str(self.description)
            self.compiled = True
        took = self.clock() - began
        if not self.bar.disable:
            loaded = events[CACHE_HIT] and not events[CACHE_MISS]
            done = "loaded" if loaded else "compiled"
            self.bar.write(f"{self.description}: {done} the step for {length}-token rows"
                           f"{' from the compilation cache' if loaded else ''} in {took:.1f} s", file=sys.stderr)

    def update(self, loss, tokens: int) -> None:
        now = self.clock()
        if self.compiled:
            self.compiled = False
        else:
            self.tokens, self.seconds, self.measured = self.tokens + int(tokens), self.seconds + now - self.last, \
                self.measured + 1
        self.last = now
        shown = {"loss": f"{float(loss):.4f}"}
        if self.measured and self.seconds > 0:
            shown["tokens_per_s"] = f"{self.tokens / self.seconds:,.0f}"
            if self.bar.total is not None:  # steps=None: no end to count down to
                left = max(self.bar.total - self.bar.n - 1, 0)
                shown["eta"] = tqdm.format_interval(left * self.seconds / self.measured)
        self.bar.set_postfix(shown, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
