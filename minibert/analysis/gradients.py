"""Gradients with respect to attention: how much a loss would change if a head attended differently.

    masked, labels = mask_tokens(model, batch)                  # [MASK] 15% of the words, as in pretraining
    grad = attention_gradients(model, masked, mlm_loss_fn(labels))   # ∂L/∂α, [L, B, H, T, S]
    gradient_by_target(grad, token_targets(model, masked), masked["attention_mask"])["sep"]   # [L, H]

The pattern α is treated as free input to the rest of the network (the softmax that made it is not
differentiated through), as in Clark et al. (2019, §3.2), who found ∂L/∂α small for attention to [SEP]
from layer 5 on: attending to [SEP] acts as a no-op. Layers and heads are 0-indexed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from minibert.analysis import heads
from minibert.core.encoder import Output
from minibert.core.hooks import Cache
from minibert.core.site_names import PATTERN
from minibert.core.sites import PATTERNS
from minibert.errors import AnalysisError, InputError

IGNORE = -100  # label of positions that are not predicted (Hugging Face's convention)


def attention_gradients(model, batch, loss_fn: Callable[[Output], jax.Array]) -> np.ndarray:
    """∂ loss_fn(output) / ∂ pattern for every layer: NumPy [L, B, H, T, S].

    loss_fn maps the model's Output to one loss for the batch, () (e.g. mlm_loss_fn(labels)), or one per row,
    [B] (e.g. a logit of a classifier), each row then differentiated on its own: the metric contract of
    `interventions` (Model.grad checks it).
    """
    _, grads = model.grad(batch, loss_fn, PATTERNS)
    return np.asarray(Cache(grads, model.hook_names).stack(PATTERN))


def require_mlm_head(model, needs: str) -> None:
    """An AnalysisError unless `model` has a masked-LM head; `needs` says what needs it ("the logit lens")."""
    if not model.config.heads.mlm:
        with_mlm = " or ".join(model.config.family.architectures_with("mlm"))  # every family has …ForMaskedLM
        raise AnalysisError(f"{needs} needs a model with a masked-LM head ({with_mlm}); "
                            f"this model is a {model.config.architecture}. Load a checkpoint that has one, e.g. "
                            f"minibert.load('bert-base-uncased').")


def mask_tokens(model, batch, positions=None, *, rate: float = 0.15, seed: int = 0) -> tuple[dict, np.ndarray]:
    """Replace tokens by [MASK] → (masked batch {input_ids, token_type_ids, attention_mask}, labels [B, T]).

    positions: bool [B, T], True where to mask (real tokens only). None picks `rate` of each row's real
    tokens other than [CLS], [SEP] and [PAD] at random (numpy seed `seed`), at least one per row; unlike
    BERT's pretraining recipe every chosen token becomes [MASK] (no 10% random / 10% kept).
    labels hold the original id at masked positions and -100 elsewhere (Hugging Face's convention).
    """
    require_mlm_head(model, "masking tokens for the masked-LM loss")
    inputs = model.inputs(batch)
    ids, types, mask = (np.asarray(a) for a in (inputs.input_ids, inputs.token_type_ids, inputs.attention_mask))
    real = mask > 0
    if positions is None:
        positions = _random_positions(real & ~np.isin(ids, _special_ids(model)), rate, seed)
    positions = np.asarray(positions, bool)
    if positions.shape != ids.shape:
        raise InputError(f"positions has shape {positions.shape} but the batch is {ids.shape}; "
                         f"pass a bool [B, T] mask.")
    if (positions & ~real).any():
        b, t = np.argwhere(positions & ~real)[0]
        raise InputError(f"positions marks padding (row {b}, position {t}); mask real tokens only.")
    if not positions.any():
        raise InputError("positions masks no token; the loss would be undefined. Mark at least one real token.")
    masked = np.where(positions, model.tokenizer.mask_token_id, ids).astype(np.int32)
    labels = np.where(positions, ids, IGNORE).astype(np.int32)
    return {"input_ids": masked, "token_type_ids": types, "attention_mask": mask}, labels


def _special_ids(model) -> list[int]:
    tok = model.tokenizer
    return [tok.cls_token_id, tok.sep_token_id, tok.pad_token_id]


def _random_positions(candidates: np.ndarray, rate: float, seed: int) -> np.ndarray:
    """`rate` of each row's candidate positions (at least one where a row has any), chosen at random."""
    if not 0.0 < rate <= 1.0:
        raise InputError(f"rate must lie in (0, 1]; got {rate}.")
    rng = np.random.default_rng(seed)
    chosen = np.zeros_like(candidates)
    for row, allowed in enumerate(candidates):
        options = np.flatnonzero(allowed)
        if len(options):
            count = max(1, int(round(rate * len(options))))
            chosen[row, rng.choice(options, size=count, replace=False)] = True
    return chosen


def mlm_loss_fn(labels) -> Callable[[Output], jax.Array]:
    """loss_fn(output) = mean over positions with a label (≠ -100) of −log softmax(logits)[label]: the
    masked-LM cross-entropy, as Hugging Face's BertForMaskedLM computes it."""
    labels = jnp.asarray(labels, jnp.int32)

    def loss_fn(out: Output) -> jax.Array:
        if out.logits is None or out.logits.ndim != 3 or out.logits.shape[:2] != labels.shape:
            raise InputError(f"mlm_loss_fn needs masked-LM logits [B, T, V] matching labels {tuple(labels.shape)}; "
                             f"the model gave {None if out.logits is None else tuple(out.logits.shape)}. "
                             "Use a model with a masked-LM head (a …ForMaskedLM architecture).")
        log_probs = jax.nn.log_softmax(out.logits.astype(jnp.float32), axis=-1)
        picked = jnp.take_along_axis(log_probs, jnp.maximum(labels, 0)[..., None], axis=-1)[..., 0]
        scored = labels != IGNORE
        return -(picked * scored).sum() / jnp.maximum(scored.sum(), 1)

    return loss_fn


def mlm_loss(model, batch, positions=None, *, rate: float = 0.15, seed: int = 0) -> float:
    """The masked-LM cross-entropy of `batch` with `positions` (or a random `rate`) masked; see mask_tokens."""
    masked, labels = mask_tokens(model, batch, positions, rate=rate, seed=seed)
    return float(mlm_loss_fn(labels)(model(masked)))


def token_targets(model, batch) -> dict[str, np.ndarray]:
    """{"cls", "sep", "punct"}: bool [B, T] key groups for gradient_by_target (punct is "." and ",")."""
    inputs = model.inputs(batch)
    masks = heads.model_token_masks(model, np.asarray(inputs.input_ids), np.asarray(inputs.attention_mask))
    return {name: masks[f"is_{name}"] > 0 for name in ("cls", "sep", "punct")}


def gradient_by_target(grad, targets: Mapping[str, np.ndarray], attention_mask) -> dict[str, np.ndarray]:
    """Mean |∂L/∂α| per head by the kind of key attended to: {name: [L, H], ..., "other": [L, H]}.

    grad [L, B, H, T, S] (attention_gradients); targets {name: bool [B, S]} groups of keys (e.g.
    token_targets); attention_mask [B, T]. For group c and head (l, h):

        mean over every document b, real query t and real key s in c of |grad[l, b, h, t, s]|

    pooled over the batch (each (b, t, s) triple counts once). "other" holds the real keys in no group.
    This is the quantity of Clark et al.'s Fig. 2 (bottom), which averages it further over heads per
    layer: `.mean(-1)`. A group with no key in the batch gives NaN.
    """
    g = np.abs(np.asarray(grad, np.float64))
    real = np.asarray(attention_mask) > 0
    if g.ndim != 5 or g.shape[1] != real.shape[0] or g.shape[3:] != (real.shape[1],) * 2:
        raise AnalysisError(f"grad must be [L, B, H, T, S] for attention_mask [B, T] = {real.shape}; got {g.shape}.")
    if "other" in targets:
        raise AnalysisError('"other" is computed (the real keys in no group); name your group differently.')
    groups = {}
    for name, keys in targets.items():
        keys = np.asarray(keys, bool)
        if keys.shape != real.shape:
            raise AnalysisError(f"targets[{name!r}] has shape {keys.shape}; it must be [B, S] = {real.shape}.")
        groups[name] = keys & real
    in_a_group = np.any([*groups.values(), np.zeros_like(real)], axis=0)
    groups["other"] = real & ~in_a_group
    rows = real.astype(np.float64)
    result = {}
    for name, keys in groups.items():
        total = np.einsum("LBHTS,BT,BS->LH", g, rows, keys.astype(np.float64))
        count = (rows.sum(1) * keys.sum(1)).sum()
        result[name] = total / count if count else np.full(total.shape, np.nan)
    return result


def gradient_times_attention(grad, attention) -> np.ndarray:
    """α · ∂L/∂α elementwise, [L, B, H, T, S]: the first-order change in the loss if that attention
    weight were removed, L(α) − L(α with α_ts = 0) ≈ α_ts ∂L/∂α_ts (a Taylor estimate, no renormalising)."""
    grad, attention = np.asarray(grad), np.asarray(attention)
    if grad.shape != attention.shape:
        raise AnalysisError(f"grad {grad.shape} and attention {attention.shape} must have the same shape "
                         f"[L, B, H, T, S]; stack the patterns with cache.stack({PATTERN!r}).")
    return grad * attention
