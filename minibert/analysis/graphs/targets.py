"""What a graph explains: one number read off the model's output for the one input (docs/graphs.md).

    graphs.mlm_target(model, batch, token="paris", minus="london")   # logit(paris) − logit(london) at the [MASK]
    graphs.class_target(1, minus=0)                                   # a classifier's logit difference
    graphs.direction_target(v, pooling="mean")                        # ⟨mean-pooled last hidden state, v⟩

A target's numbers (position, token ids, direction) are traced arrays: a new token or direction reuses the
compiled program. Whatever the readout (the MLM head's dense → gelu → LayerNorm, the pooler's tanh), the graph
explains it linearised at the run: with g = ∂target/∂h at the run (LayerNorm σ in the head held), the target
node's value is ⟨g, h⟩, and the target minus ⟨g, h⟩ is the readout's remainder, reported beside it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from minibert.core.contract import StaticFn
from minibert.errors import AnalysisError


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class Target:
    """read(out, **arrays) → () float, labelled; the arrays are traced, `read` keys the program."""

    read: Callable
    arrays: dict
    label: str = "target"

    def __call__(self, out):
        return self.read(out, **self.arrays)

    def __repr__(self) -> str:
        """The label, the kind of readout and each number: a one-value array by its value, a vector by its shape
        and norm (a direction of hundreds of values is not printed)."""
        parts = [repr(self.label), f"kind={getattr(self.read, '__name__', 'read').lstrip('_')}"]
        for name in sorted(self.arrays):
            value = self.arrays[name]
            if isinstance(value, jax.core.Tracer):  # inside a program: no values to show
                parts.append(f"{name}={tuple(value.shape)}")
                continue
            value = np.asarray(value)
            parts.append(f"{name}={value.item():g}" if value.size == 1 else
                         f"{name}=[{', '.join(map(str, value.shape))}] norm {float(np.linalg.norm(value)):.4g}")
        return f"Target({', '.join(parts)})"

    def tree_flatten(self):
        keys = tuple(sorted(self.arrays))
        return [self.arrays[k] for k in keys], (StaticFn(self.read), keys, self.label)

    @classmethod
    def tree_unflatten(cls, aux, children):
        read, keys, label = aux
        return cls(read.fn, dict(zip(keys, children)), label)


def _logits(out, per_token: bool):
    if out.logits is None:
        raise AnalysisError("the target reads logits, but this model has no head (out.logits is None): load the "
                            "checkpoint with its masked-LM or classifier head, or use graphs.direction_target.")
    if (out.logits.ndim == 3) != per_token:
        raise AnalysisError("a masked-LM target needs per-token logits [B, T, V] (a ...ForMaskedLM checkpoint) and a "
                            "class target a classifier's [B, C]; this model's logits are "
                            f"{'per token' if out.logits.ndim == 3 else 'per row'}: use "
                            f"{'graphs.mlm_target' if out.logits.ndim == 3 else 'graphs.class_target'}.")
    return out.logits[0]


def _mlm(out, position, token, minus, sign):
    logits = _logits(out, per_token=True)[position]
    return (logits[token] - sign * logits[minus]).astype(jnp.float32)


def _class(out, label, minus, sign):
    logits = _logits(out, per_token=False)
    return (logits[label] - sign * logits[minus]).astype(jnp.float32)


def _direction_cls(out, direction):
    return (out.last_hidden_state[0, 0] @ direction).astype(jnp.float32)


def _direction_mean(out, direction):
    return (out.last_hidden_state[0].mean(0) @ direction).astype(jnp.float32)


def _token_id(model, token) -> int:
    if isinstance(token, str):
        ids = model.tokenizer.convert_tokens_to_ids([token]) if hasattr(model.tokenizer, "convert_tokens_to_ids") \
            else None
        if not ids or ids[0] is None or ids[0] == getattr(model.tokenizer, "unk_token_id", -1):
            raise AnalysisError(f"token {token!r} is not one wordpiece of this model's vocabulary; pass its id or a "
                                f"token from model.to_str_tokens(...).")
        return int(ids[0])
    if isinstance(token, bool) or not isinstance(token, int | np.integer) or not 0 <= token < model.config.vocab_size:
        raise AnalysisError(f"token {token!r} must be a vocabulary id in [0, {model.config.vocab_size}) or a "
                            f"wordpiece.")
    return int(token)


def mlm_target(model, batch, token, minus=None, position: int | None = None) -> Target:
    """The masked-LM logit of `token` (minus that of `minus`) at `position` (default: the input's one [MASK])."""
    ids = np.asarray(model.inputs(batch).input_ids)
    if position is None:
        mask_id = getattr(model.tokenizer, "mask_token_id", None)
        where = np.flatnonzero(ids[0] == mask_id) if mask_id is not None else np.array([])
        if where.size != 1:
            raise AnalysisError(f"the input has {where.size} [MASK] tokens; give the target's position= (0-indexed) "
                                f"or mask exactly one token.")
        position = int(where[0])
    if isinstance(position, bool) or not isinstance(position, int | np.integer) or not 0 <= position < ids.shape[1]:
        raise AnalysisError(f"position {position!r} must be a token index in [0, {ids.shape[1]}) of the input.")
    first = _token_id(model, token)
    second = _token_id(model, minus) if minus is not None else 0
    label = f"logit {token!r}" + (f" − {minus!r}" if minus is not None else "") + f" at {position}"
    return Target(_mlm, {"position": jnp.int32(position), "token": jnp.int32(first), "minus": jnp.int32(second),
                         "sign": jnp.float32(minus is not None)}, label)


def class_target(label: int, minus: int | None = None) -> Target:
    """A sequence classifier's logit of class `label` (minus that of `minus`), read through the pooler: the
    graph linearises the pooler's tanh (and any head non-linearity) at the run."""
    for name, value in (("label", label), ("minus", minus)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0):
            raise AnalysisError(f"class_target: {name}={value!r} must be a class index ≥ 0.")
    return Target(_class, {"label": jnp.int32(label), "minus": jnp.int32(minus or 0),
                           "sign": jnp.float32(minus is not None)},
                  f"class {label}" + (f" − {minus}" if minus is not None else ""))


def direction_target(direction, pooling: str = "mean") -> Target:
    """⟨sentence vector, direction⟩: the last hidden state mean-pooled over the row ("mean") or at [CLS] ("cls")."""
    direction = np.asarray(direction, np.float32)
    if direction.ndim != 1 or not np.all(np.isfinite(direction)):
        raise AnalysisError("direction_target: the direction must be one finite vector [D].")
    reads = {"mean": _direction_mean, "cls": _direction_cls}
    if pooling not in reads:
        raise AnalysisError(f"direction_target: pooling must be 'mean' or 'cls'; got {pooling!r}.")
    return Target(reads[pooling], {"direction": jnp.asarray(direction)}, f"sentence vector ({pooling}) · direction")


def unlabelled(targets) -> tuple[Target, ...]:
    """The targets without their labels, as programs take them: a label is not part of the compiled program."""
    return tuple(Target(t.read, t.arrays, "") for t in targets)


def check_targets(model, targets) -> tuple[Target, ...]:
    targets = (targets,) if isinstance(targets, Target) else tuple(targets)
    if not targets or not all(isinstance(t, Target) for t in targets):
        raise AnalysisError("targets must be a graphs target (mlm_target, class_target, direction_target) or a list "
                            "of them.")
    for t in targets:
        if "direction" in t.arrays and t.arrays["direction"].shape != (model.config.hidden_size,):
            raise AnalysisError(f"direction_target: the direction has {t.arrays['direction'].shape[0]} values; this "
                                f"model's hidden states have {model.config.hidden_size}.")
    return targets
