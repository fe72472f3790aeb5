"""Clark et al. (2019) head statistics: where each head's attention goes, its entropy, and how heads differ.

Definitions follow /ANALYSIS.md ("What Does BERT Look At?"). For one document with n real tokens and
one head's attention A [T, S] (rows sum to 1 over the real keys):

    self      Σ_i A[i, i] / n              next     Σ_i A[i, i+1] / n       prev   Σ_i A[i, i−1] / n
    to_cls    Σ_i A[i, CLS] / n            to_sep   Σ_i Σ_s∈SEP A[i, s] / n
    to_punct  Σ_i Σ_s∈{. ,} A[i, s] / n
    sep_to_sep   Σ_{i∈SEP} Σ_{s∈SEP} A[i, s] / #SEP        (Clark: / 2)
    rest_to_sep  Σ_{i∉SEP} Σ_{s∈SEP} A[i, s] / (n − #SEP)  (Clark: / (n − 2))
    entropy      mean over real rows of −Σ_s p ln p, p = 0.9999·A + 0.0001/n over the real keys (nats)
    cls_entropy  the same for the [CLS] row alone
    uniform_entropy  ln n: its document average is the entropy of uniform attention, the baseline

Clark et al. ran `[CLS] A [SEP] B [SEP]` segments, which have two [SEP]s, so their constants 2 and
n − 2 are the [SEP] count and the non-[SEP] count; dividing by the counts gives the same numbers there
and keeps the two [SEP] statistics fractions for single sentences (one [SEP]) too.

Every statistic is computed per document; averaging over documents is the caller's (the corpus runner
sums them on the device). Arrays: pattern [L, B, H, T, S], masks [B, T]; layers and heads 0-indexed,
labels in the paper's 1-indexed "L-H" form.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import xlogy

STATISTICS: tuple[str, ...] = (
    "self", "next", "prev", "to_cls", "to_sep", "to_punct", "sep_to_sep", "rest_to_sep",
    "entropy", "cls_entropy", "uniform_entropy",
)

EXACT = jax.lax.Precision.HIGHEST  # full float32 sums on GPUs/TPUs too (no TF32 / bf16 passes)
ENTROPY_SMOOTHING = 1e-4  # p = (1 − ε)·A + ε/n, as Clark et al., so ln p is finite
JS_SMOOTHING = 1e-3

# Behaviour label → (statistic, threshold): a head gets the label when the statistic exceeds it.
BEHAVIOURS: dict[str, tuple[str, float]] = {
    "broad": ("entropy", 3.8),
    "next": ("next", 0.5),
    "prev": ("prev", 0.5),
    "cls": ("to_cls", 0.6),
    "sep": ("to_sep", 0.6),
    "punct": ("to_punct", 0.6),
}


def _real_pattern(pattern, attention_mask):
    """pattern [L, B, H, T, S] in float32 with padding rows and padding keys set to exactly 0; mask [B, T]."""
    mask = jnp.asarray(attention_mask, jnp.float32)
    rows, keys = mask[None, :, None, :, None], mask[None, :, None, None, :]
    return jnp.where((rows * keys) > 0, jnp.asarray(pattern, jnp.float32), 0.0), mask


def _smoothed(a, mask, eps):
    """(1 − ε)·A + ε/n on real rows × real keys, 0 elsewhere. a: _real_pattern output; mask [B, T]."""
    n = jnp.maximum(mask.sum(-1), 1.0)[None, :, None, None, None]
    real = (mask[None, :, None, :, None] * mask[None, :, None, None, :]) > 0
    return jnp.where(real, (1 - eps) * a + eps / n, 0.0)


def head_statistics(pattern, attention_mask, is_cls, is_sep, is_punct) -> dict[str, jax.Array]:
    """Every statistic of STATISTICS for every document and head: {name: [B, L, H]} (jit-compatible).

    pattern [L, B, H, T, S] (cache.stack("attn.hook_pattern")); attention_mask [B, T] (1 real, 0 padding);
    is_cls / is_sep / is_punct [B, T] (float or bool; see token_masks_from_ids). Only real query rows and
    real keys count; n is each document's number of real tokens. A document with no [SEP] (or no
    [CLS]) gets 0 for the statistics about it.
    """
    a, mask = _real_pattern(pattern, attention_mask)
    cls, sep, punct = (jnp.asarray(m, jnp.float32) * mask for m in (is_cls, is_sep, is_punct))
    n = mask.sum(-1)  # [B]
    per_token = jnp.maximum(n, 1.0)[:, None, None]
    n_sep = sep.sum(-1)[:, None, None]

    def to_columns(columns, rows=mask):  # Σ over rows × Σ over the chosen columns → [B, L, H]
        return jnp.einsum("LBHTS,BT,BS->BLH", a, rows, columns, precision=EXACT)

    def diagonal(offset):
        return jnp.diagonal(a, offset=offset, axis1=-2, axis2=-1).sum(-1).transpose(1, 0, 2)

    p = _smoothed(a, mask, ENTROPY_SMOOTHING)
    row_entropy = -xlogy(p, p).sum(-1)  # [L, B, H, T]; padding rows are 0
    n_cls = jnp.maximum(cls.sum(-1), 1.0)[:, None, None]
    return {
        "self": diagonal(0) / per_token,
        "next": diagonal(1) / per_token,
        "prev": diagonal(-1) / per_token,
        "to_cls": to_columns(cls) / per_token,
        "to_sep": to_columns(sep) / per_token,
        "to_punct": to_columns(punct) / per_token,
        "sep_to_sep": to_columns(sep, rows=sep) / jnp.maximum(n_sep, 1.0),
        "rest_to_sep": to_columns(sep, rows=mask - sep) / jnp.maximum(n[:, None, None] - n_sep, 1.0),
        "entropy": jnp.einsum("LBHT->BLH", row_entropy) / per_token,
        "cls_entropy": jnp.einsum("LBHT,BT->BLH", row_entropy, cls, precision=EXACT) / n_cls,
        "uniform_entropy": jnp.broadcast_to(jnp.log(per_token), (a.shape[1], a.shape[0], a.shape[2])),
    }


_head_statistics_jit = jax.jit(head_statistics)


def token_masks_from_ids(ids, mask, cls_id: int, sep_id: int, punct_ids: Sequence[int]) -> dict[str, np.ndarray]:
    """{is_cls, is_sep, is_punct}: float32 [B, T] indicators from token ids (padding positions are 0).

    Punctuation is "." and "," only, as Clark et al.: pass their ids as punct_ids.
    """
    ids, real = np.asarray(ids), np.asarray(mask) > 0
    as_mask = lambda hit: (hit & real).astype(np.float32)
    return dict(is_cls=as_mask(ids == cls_id), is_sep=as_mask(ids == sep_id),
                is_punct=as_mask(np.isin(ids, np.asarray(list(punct_ids), dtype=ids.dtype))))


def js_divergence_batch(pattern, attention_mask, doc_mask) -> jax.Array:
    """Jensen–Shannon divergence between every pair of heads, summed over documents: [L·H, L·H].

    Per document, with p and q two heads' rows smoothed as 0.999·A + 0.001/n over the real keys and
    m = (p + q)/2: Σ over real query rows of ½Σ p ln(p/m) + ½Σ q ln(q/m). Documents are weighted by
    doc_mask [B] (0 drops a padding document). Heads are flattened layer-major (index = layer·H + head).
    One head is compared with all heads at a time ([L·H, B, T, S]), never all pairs at once.
    """
    a, mask = _real_pattern(pattern, attention_mask)
    L, B, H, T, S = a.shape
    p = _smoothed(a, mask, JS_SMOOTHING).transpose(0, 2, 1, 3, 4).reshape(L * H, B, T, S)
    log_p = jnp.log(jnp.where(p > 0, p, 1.0))  # 0 where p is 0 (padding), so those terms vanish
    weights = jnp.asarray(doc_mask, jnp.float32)

    def against_all(i):
        m = 0.5 * (p[i][None] + p)
        log_m = jnp.log(jnp.where(m > 0, m, 1.0))
        terms = 0.5 * p[i][None] * (log_p[i][None] - log_m) + 0.5 * p * (log_p - log_m)
        return jnp.einsum("JBTS,B->J", terms, weights, precision=EXACT)

    js = jax.lax.map(against_all, jnp.arange(L * H))
    js = 0.5 * (js + js.T)  # the two halves agree up to rounding; make the matrix exactly symmetric
    return js * (1.0 - jnp.eye(L * H, dtype=js.dtype))


def behaviour_labels(mean: Mapping[str, np.ndarray]) -> np.ndarray:
    """[L, H] strings naming what each head does, from document-averaged statistics (ANALYSIS.md).

    Labels (BEHAVIOURS): "broad" (entropy > 3.8 nats), "next" / "prev" (> 0.5 of the attention on the
    next / previous token), "cls" / "sep" / "punct" (> 0.6 on [CLS] / [SEP] / "." and ","). A head that
    passes several thresholds gets them joined with "+" in that order (e.g. "prev+sep"); a head that
    passes none gets "". Statistics missing from `mean` are not tested.
    """
    shape = np.shape(next(iter(mean.values())))
    labels = np.full(shape, "", dtype=object)
    for name, (statistic, threshold) in BEHAVIOURS.items():
        if statistic not in mean:
            continue
        hit = np.asarray(mean[statistic]) > threshold
        labels[hit] = np.where(labels[hit] == "", name, labels[hit] + "+" + name)
    return labels.astype(str)


def head_table(mean: Mapping[str, np.ndarray]) -> list[dict]:
    """One tidy row per head: layer, head (0-indexed), label ("L-H", 1-indexed as in the paper),
    every statistic of `mean` as a float, and its behaviour label."""
    behaviour = behaviour_labels(mean)
    n_layers, n_heads = behaviour.shape
    return [
        {"layer": layer, "head": head, "label": f"{layer + 1}-{head + 1}",
         **{name: float(np.asarray(values)[layer, head]) for name, values in mean.items()},
         "behaviour": str(behaviour[layer, head])}
        for layer in range(n_layers) for head in range(n_heads)
    ]


def model_token_masks(model, ids, mask) -> dict[str, np.ndarray]:
    """token_masks_from_ids with the model tokenizer's [CLS], [SEP], "." and "," ids."""
    tokenizer = model.tokenizer
    return token_masks_from_ids(ids, mask, cls_id=tokenizer.cls_token_id, sep_id=tokenizer.sep_token_id,
                                punct_ids=[tokenizer.vocab[p] for p in (".", ",") if p in tokenizer.vocab])


def attention_statistics(model, texts_or_batch, pairs=None, segment_ids: str = "real") -> dict[str, np.ndarray]:
    """Head statistics of one batch, averaged over its documents: {name: [L, H]} NumPy.

    texts_or_batch: a text, a list of texts (with `pairs` for sentence B), a Batch, or a dict of id
    arrays. segment_ids: "real" (sentence B has type 1) or "zeros" (Clark et al.'s extraction script).
    For a corpus, `minibert.corpus.survey` batches, buckets and accumulates on the device.
    """
    if segment_ids not in ("real", "zeros"):
        raise ValueError(f"segment_ids must be 'real' or 'zeros', not {segment_ids!r}.")
    batch = texts_or_batch
    if isinstance(batch, str) or (isinstance(batch, (list, tuple)) and all(isinstance(t, str) for t in batch)):
        batch = model.tokenize([batch] if isinstance(batch, str) else list(batch),
                               [pairs] if isinstance(pairs, str) else pairs)
    elif pairs is not None:
        raise ValueError("pairs goes with texts; a tokenized batch already holds its pairs.")
    fields = dict(batch.to_dict() if hasattr(batch, "to_dict") else batch)
    ids = np.asarray(fields["input_ids"])
    mask = np.asarray(fields.get("attention_mask", np.ones_like(ids)))
    if segment_ids == "zeros":
        fields["token_type_ids"] = np.zeros_like(ids)
    _, cache = model.run_with_cache(fields, names="blocks.*.attn.hook_pattern")
    stats = _head_statistics_jit(cache.stack("attn.hook_pattern"), mask, **model_token_masks(model, ids, mask))
    return {name: np.asarray(value).mean(0) for name, value in stats.items()}
