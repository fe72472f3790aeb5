"""The survey's jitted step: forward over packed rows, statistics layer by layer, sums into running totals,
so that attention patterns never leave the device."""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from minibert.analysis import heads
from minibert.core.hooks import HookFn
from minibert.core.site_names import ATTN_SCORES, PATTERN, every_block, in_block
from minibert.runtime.model import Inputs


def zeros(model, js: bool) -> dict[str, np.ndarray]:
    """The running totals before the first batch: [L, H] per statistic, a document count, [L·H, L·H] for js."""
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    totals = {name: np.zeros((L, H), np.float32) for name in heads.STATISTICS}
    totals["documents"] = np.zeros((), np.float32)
    if js:
        totals["js_divergence"] = np.zeros((L * H, L * H), np.float32)
    return totals


def survey_step(model, js: bool, sep_normalization: str) -> Callable:
    """The step compiled for this model (model.jit: made once per model, one program per batch shape and
    setting, each counted in model.programs.traces): (state, totals, arrays) → new totals."""
    step = model.jit(_step, static_argnames=("js", "sep_normalization"))
    return functools.partial(step, js=js, sep_normalization=sep_normalization)


def within_documents(value, ctx, same):
    """attn.hook_attn_scores [B, H, T, S]: a query sees only the keys of its own document."""
    return jnp.where(same[:, None], value, jnp.finfo(value.dtype).min)


def packed_captures(model, state, arrays, names) -> dict:
    """{name: value} of the hook sites `names` in a forward over packed rows (packing.packed_rows' arrays),
    run so that each document behaves as it does alone: every token reads the position row it reads alone
    (explicit position ids, restarting at each document), and a hook keeps attention within each document
    (the softmax gives other documents' keys exactly 0). Traced inside the caller's model.jit program."""
    same = heads.same_document(arrays["documents"])  # [B, T, S]
    forward = model.forward_fn(names=names, hooks={every_block(ATTN_SCORES): HookFn(within_documents,
                                                                                             same=same)})
    inputs = Inputs(arrays["input_ids"], arrays["token_type_ids"], arrays["attention_mask"],
                    position_ids=arrays["positions"])
    return forward(state, inputs)[1]


def _step(model, state, totals, arrays, *, js: bool, sep_normalization: str):
    """Forward over packed rows with every layer's pattern captured (packed_captures: every document's pattern
    is the one it has alone), statistics layer by layer, sums into totals."""
    names = [in_block(i, PATTERN) for i in range(model.config.num_hidden_layers)]
    documents = arrays["documents"]  # [B, T]: each token's document number in its row, 0 for padding
    captured = packed_captures(model, state, arrays, names)
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
