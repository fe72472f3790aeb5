"""The survey's jitted step: forward over packed rows, statistics layer by layer, sums into running totals,
so that attention patterns never leave the device."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from minibert.analysis import heads
from minibert.hooks import HookFn

_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model → {(js, sep_normalization): jitted step}


def zeros(model, js: bool) -> dict[str, np.ndarray]:
    """The running totals before the first batch: [L, H] per statistic, a document count, [L·H, L·H] for js."""
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    totals = {name: np.zeros((L, H), np.float32) for name in heads.STATISTICS}
    totals["documents"] = np.zeros((), np.float32)
    if js:
        totals["js_divergence"] = np.zeros((L * H, L * H), np.float32)
    return totals


def survey_step(model, js: bool, sep_normalization: str) -> Callable:
    """The jitted step for this model, made once and kept while the model lives (jit then caches one
    program per batch shape). It holds the model weakly, so the cache does not keep the model alive."""
    steps = _STEPS.setdefault(model, {})
    key = (js, sep_normalization)
    if key not in steps:
        steps[key] = jax.jit(functools.partial(_step, weakref.ref(model), model.config.num_hidden_layers, js,
                                               sep_normalization))
    return steps[key]


def _positions_within_documents(value, ctx, table, positions):
    """embed.hook_pos_embed [B, T, E] → the position table's rows [B, T] each token reads in its own document."""
    return table[positions].astype(value.dtype)


def _within_documents(value, ctx, same):
    """attn.hook_attn_scores [B, H, T, S]: a query sees only the keys of its own document."""
    return jnp.where(same[:, None], value, jnp.finfo(value.dtype).min)


def _step(model_ref, layers: int, js: bool, sep_normalization: str, state, totals, arrays):
    """Forward over packed rows with every layer's pattern captured, statistics layer by layer, sums into
    totals. Two hooks make a packed row behave as its documents run one by one: positions restart at
    each document, and attention stays within each document (the softmax gives other documents' keys
    exactly 0), so every document's pattern is the one it has alone."""
    names = [f"blocks.{i}.attn.hook_pattern" for i in range(layers)]
    documents = arrays["documents"]  # [B, T]: each token's document number in its row, 0 for padding
    same = heads.same_document(documents)  # [B, T, S]
    table = state["embed"]["position"][...]  # [max_position_embeddings, E], model.Embeddings.position
    hooks = {"embed.hook_pos_embed": HookFn(_positions_within_documents, table=table,
                                            positions=arrays["positions"]),
             "blocks.*.attn.hook_attn_scores": HookFn(_within_documents, same=same)}
    forward = model_ref().forward_fn(names=names, hooks=hooks)
    _, captured = forward(state, (arrays["input_ids"], arrays["token_type_ids"], arrays["attention_mask"]))
    masks = (arrays["is_cls"], arrays["is_sep"], arrays["is_punct"])
    per_layer = [heads.layer_statistics(captured[name], documents, *masks, sep_normalization)
                 for name in names]  # {name: [B, H]}
    new = {name: totals[name] + jnp.stack([s[name] for s in per_layer]).sum(1) for name in heads.STATISTICS}
    new["documents"] = totals["documents"] + documents.max(1).sum()
    if js:
        pattern = jnp.stack([captured[name] for name in names])
        new["js_divergence"] = totals["js_divergence"] + heads.js_divergence_batch(
            pattern, documents, (documents.max(1) > 0).astype(jnp.float32))
    return new
