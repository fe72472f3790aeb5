"""Clark et al. (2019) head statistics: where each head's attention goes, its entropy, and how heads differ.

Definitions follow docs/definitions.md ("Clark et al. head statistics"). For one document with n real
tokens and one head's attention A [T, S] (rows sum to 1 over the real keys):

    self      Σ_i A[i, i] / n              next     Σ_i A[i, i+1] / n       prev   Σ_i A[i, i−1] / n
    to_cls    Σ_i A[i, CLS] / n            to_sep   Σ_i Σ_s∈SEP A[i, s] / n
    to_punct  Σ_i Σ_s∈{. ,} A[i, s] / n
    sep_to_sep   Σ_{i∈SEP} Σ_{s∈SEP} A[i, s] / 2
    rest_to_sep  Σ_{i∉SEP} Σ_{s∈SEP} A[i, s] / (n − 2)
    entropy      mean over real rows of −Σ_s p ln p, p = 0.9999·A + 0.0001/n over the real keys (nats)
    cls_entropy  the same for the [CLS] row alone
    uniform_entropy  ln n: its document average is the entropy of uniform attention, the baseline

The constants 2 and n − 2 are Clark et al.'s (General_Analysis.ipynb), written for `[CLS] A [SEP] B [SEP]`
segments, and they are the default for every document, one [SEP] or two, so numbers compare with the
paper's. sep_normalization="count" divides by the document's [SEP] count and non-[SEP] count instead
(the two agree on two-[SEP] documents; with one [SEP], "clark" gives half the "count" sep_to_sep and
(n − 1)/(n − 2) times its rest_to_sep).

Every statistic is computed per document (or summed over the documents a row packs); averaging over
documents is the caller's (the corpus runner sums them on the device). Arrays: pattern [L, B, H, T, S],
masks [B, T]; layers and heads 0-indexed, labels in the paper's 1-indexed "L-H" form.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import xlogy

from minibert.core.config import head_label
from minibert.core.site_names import PATTERN
from minibert.core.sites import PATTERNS
from minibert.errors import AnalysisError
from minibert.runtime.accounting import EXACT  # full float32 sums on GPUs/TPUs too (no TF32 / bf16 passes)
from minibert.runtime.model import is_text

STATISTICS: tuple[str, ...] = (
    "self", "next", "prev", "to_cls", "to_sep", "to_punct", "sep_to_sep", "rest_to_sep",
    "entropy", "cls_entropy", "uniform_entropy",
)

ENTROPY_SMOOTHING = 1e-4  # p = (1 − ε)·A + ε/n, as Clark et al., so ln p is finite
JS_SMOOTHING = 1e-3
SEP_NORMALIZATIONS = ("clark", "count")  # sep_to_sep / rest_to_sep divided by 2 and n − 2, or by the counts

# Behaviour label → (statistic, threshold): a head gets the label when the statistic exceeds it. "broad"
# here is Clark et al.'s absolute threshold (behaviour_labels(broad="absolute")); by default it is BROAD_FRACTION.
BEHAVIOURS: dict[str, tuple[str, float]] = {
    "broad": ("entropy", 3.8),
    "next": ("next", 0.5),
    "prev": ("prev", 0.5),
    "cls": ("to_cls", 0.6),
    "sep": ("to_sep", 0.6),
    "punct": ("to_punct", 0.6),
}
# "broad" by default: mean entropy above this share of the mean uniform entropy (ln n). Clark et al.'s 3.8 nats
# over ln 128, the uniform entropy of their 128-token segments: the same bar for their documents, one that a
# document of 44 tokens or fewer (ln 44 < 3.8) can also pass.
BROAD_FRACTION = 3.8 / math.log(128)
BROAD_RULES = ("relative", "absolute")


def same_document(documents) -> jax.Array:
    """[B, T, S] bool: query t and key s are real tokens of the same document. documents [B, T]: each
    token's document number (0 padding; a 0/1 attention mask is one document per row)."""
    return (documents[:, :, None] == documents[:, None, :]) & (documents[:, :, None] > 0)


def _documents(documents):
    """Each token's document [B, T] int, same_document [B, T, S], and each token's document length [B, T]."""
    documents = jnp.asarray(documents).astype(jnp.int32)
    same = same_document(documents)
    return documents, same, same.sum(-1).astype(jnp.float32)


def _real_pattern(pattern, same):
    """pattern [..., B, H, T, S] in float32, exactly 0 outside real query × real key pairs of one document."""
    return jnp.where(same[:, None], jnp.asarray(pattern, jnp.float32), 0.0)


def _smoothed(a, same, n, eps):
    """(1 − ε)·A + ε/n over each row's own document's keys (n: that document's length [B, T]), 0 elsewhere."""
    return jnp.where(same[:, None], (1 - eps) * a + eps / jnp.maximum(n, 1.0)[:, None, :, None], 0.0)


def layer_statistics(pattern, documents, is_cls, is_sep, is_punct,
                     sep_normalization: str = "clark") -> dict[str, jax.Array]:
    """Every statistic of STATISTICS for one layer: {name: [B, H]} from pattern [B, H, T, S].

    Arguments as head_statistics. Each statistic is a sum over query rows with per-token weights (1/n
    of the token's document, 1/#SEP, …), so a row that packs several documents gives the sum of their
    statistics. The pattern is read twice — one contraction with the [CLS]/[SEP]/punctuation columns,
    one entropy reduction — and the rest works on [B, H, T] row sums, so a corpus survey costs little
    beyond the forward pass.
    """
    documents, same, n = _documents(documents)
    a = _real_pattern(pattern, same)
    real = (documents > 0).astype(jnp.float32)
    cls, sep, punct = (jnp.asarray(m, jnp.float32) * real for m in (is_cls, is_sep, is_punct))
    in_document = lambda marks: jnp.einsum("BTS,BS->BT", same.astype(jnp.float32), marks)  # per token's document
    n_sep, n_cls = in_document(sep), in_document(cls)
    per_token = real / jnp.maximum(n, 1.0)  # each document's tokens weigh 1/n in all
    sep_rows, rest_rows = _sep_denominators(n, n_sep, sep_normalization)
    # Each query row's attention to the [CLS], [SEP] and punctuation columns: [B, H, T, 3].
    to = jnp.einsum("BHTS,BSC->BHTC", a, jnp.stack([cls, sep, punct], -1), precision=EXACT)
    rows = lambda weights, values: jnp.einsum("BT,BHT->BH", weights, values, precision=EXACT)
    diagonal = lambda offset: jnp.diagonal(a, offset=offset, axis1=-2, axis2=-1)  # [B, H, T − |offset|]
    p = _smoothed(a, same, n, ENTROPY_SMOOTHING)
    row_entropy = -xlogy(p, p).sum(-1)  # [B, H, T]; 0 at padding rows
    uniform = jnp.einsum("BT,BT->B", per_token, jnp.log(jnp.maximum(n, 1.0)), precision=EXACT)
    return {
        "self": rows(per_token, diagonal(0)),
        "next": rows(per_token[:, :-1], diagonal(1)),  # A[i, i+1] sits in row i
        "prev": rows(per_token[:, 1:], diagonal(-1)),  # A[i, i−1] sits in row i
        "to_cls": rows(per_token, to[..., 0]),
        "to_sep": rows(per_token, to[..., 1]),
        "to_punct": rows(per_token, to[..., 2]),
        "sep_to_sep": rows(sep / sep_rows, to[..., 1]),
        "rest_to_sep": rows((real - sep) / rest_rows, to[..., 1]),
        "entropy": rows(per_token, row_entropy),
        "cls_entropy": rows(cls / jnp.maximum(n_cls, 1.0), row_entropy),
        "uniform_entropy": jnp.broadcast_to(uniform[:, None], a.shape[:2]),
    }


def _sep_denominators(n, n_sep, sep_normalization: str):
    """What sep_to_sep and rest_to_sep divide by, per token [B, T]: Clark's 2 and n − 2, or the document's
    [SEP] and non-[SEP] counts (floored at 1: a document without such rows adds 0 either way)."""
    check_sep_normalization(sep_normalization)
    if sep_normalization == "clark":
        return jnp.full_like(n, 2.0), jnp.maximum(n - 2.0, 1.0)
    return jnp.maximum(n_sep, 1.0), jnp.maximum(n - n_sep, 1.0)


def check_sep_normalization(sep_normalization: str) -> None:
    if sep_normalization not in SEP_NORMALIZATIONS:
        raise AnalysisError(f"sep_normalization must be 'clark' (divide by 2 and n − 2, the paper's constants; "
                            f"the default) or 'count' (divide by the [SEP] and non-[SEP] counts), not "
                            f"{sep_normalization!r}.")


def head_statistics(pattern, documents, is_cls, is_sep, is_punct,
                    sep_normalization: str = "clark") -> dict[str, jax.Array]:
    """Every statistic of STATISTICS for every document and head: {name: [B, L, H]} (jit-compatible).

    pattern [L, B, H, T, S] (cache.stack("attn.hook_pattern")); documents [B, T]: each token's document number
    1, 2, … in its row, 0 for padding (a document is one text or text pair the model reads as one sequence; a
    row may pack several, and then gives the sum of their statistics; a row's 0/1 attention_mask is the
    one-document case); is_cls / is_sep / is_punct [B, T] (float or
    bool; see token_masks_from_ids). Only query rows and keys of the same document count; n is the
    document's number of real tokens. A document with no [SEP] (or no [CLS]) gets 0 for the statistics
    about it. sep_normalization: "clark" (default) or "count", see the module docstring. One layer at a
    time: layer_statistics.
    """
    per_layer = [layer_statistics(layer, documents, is_cls, is_sep, is_punct, sep_normalization)
                 for layer in pattern]
    return {name: jnp.stack([s[name] for s in per_layer], axis=1) for name in STATISTICS}


_head_statistics_jit = jax.jit(head_statistics, static_argnames="sep_normalization")


def token_masks_from_ids(ids, mask, cls_id: int, sep_id: int, punct_ids: Sequence[int]) -> dict[str, np.ndarray]:
    """{is_cls, is_sep, is_punct}: float32 [B, T] indicators from token ids (padding positions are 0).

    Punctuation is "." and "," only, as Clark et al.: pass their ids as punct_ids.
    """
    ids, real = np.asarray(ids), np.asarray(mask) > 0
    as_mask = lambda hit: (hit & real).astype(np.float32)
    return dict(is_cls=as_mask(ids == cls_id), is_sep=as_mask(ids == sep_id),
                is_punct=as_mask(np.isin(ids, np.asarray(list(punct_ids), dtype=ids.dtype))))


def js_divergence_batch(pattern, documents, doc_mask) -> jax.Array:
    """Jensen–Shannon divergence between every pair of heads, summed over documents: [L·H, L·H].

    Per document, with p and q two heads' rows smoothed as 0.999·A + 0.001/n over the real keys and
    m = (p + q)/2: Σ over real query rows of ½Σ p ln(p/m) + ½Σ q ln(q/m). documents as head_statistics
    (each token's document number; a 0/1 attention mask for one document per row). Rows are weighted by
    doc_mask [B] (0 drops a padding row). Heads are flattened layer-major (index = layer·H + head). One head
    is compared with all heads at a time ([L·H, B, T, S]), never all pairs at once.
    """
    _, same, n = _documents(documents)
    a = _real_pattern(pattern, same)
    L, B, H, T, S = a.shape
    p = _smoothed(a, same, n, JS_SMOOTHING).transpose(0, 2, 1, 3, 4).reshape(L * H, B, T, S)
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


def behaviour_labels(mean: Mapping[str, np.ndarray], broad: str = "relative") -> np.ndarray:
    """[L, H] strings naming what each head does, from document-averaged statistics (docs/definitions.md).

    Labels (BEHAVIOURS): "broad", "next" / "prev" (> 0.5 of the attention on the next / previous token),
    "cls" / "sep" / "punct" (> 0.6 on [CLS] / [SEP] / "." and ","). A head that passes several thresholds
    gets them joined with "+" in that order (e.g. "prev+sep"); a head that passes none gets "". Statistics
    missing from `mean` are not tested.
    broad: "relative" (default) — entropy > BROAD_FRACTION × uniform_entropy (the documents' mean ln n), so
    short documents can be broad; without uniform_entropy in `mean`, the absolute rule. "absolute" —
    entropy > 3.8 nats, Clark et al.'s threshold for 128-token segments.
    """
    if broad not in BROAD_RULES:
        raise AnalysisError(f"broad must be 'relative' (entropy against the uniform entropy ln n) or 'absolute' "
                            f"(Clark et al.'s 3.8 nats), not {broad!r}.")
    shape = np.shape(next(iter(mean.values())))
    labels = np.full(shape, "", dtype=object)
    for name, (statistic, threshold) in BEHAVIOURS.items():
        if statistic not in mean:
            continue
        if name == "broad" and broad == "relative" and "uniform_entropy" in mean:
            threshold = BROAD_FRACTION * np.asarray(mean["uniform_entropy"])
        hit = np.asarray(mean[statistic]) > threshold
        labels[hit] = np.where(labels[hit] == "", name, labels[hit] + "+" + name)
    return labels.astype(str)


def head_table(mean: Mapping[str, np.ndarray], broad: str = "relative") -> list[dict]:
    """One tidy row per head: layer, head (0-indexed), label ("L-H", 1-indexed as in the paper),
    every statistic of `mean` as a float, and its behaviour label (behaviour_labels(mean, broad))."""
    behaviour = behaviour_labels(mean, broad)
    n_layers, n_heads = behaviour.shape
    return [
        {"layer": layer, "head": head, "label": head_label(layer, head),
         **{name: float(np.asarray(values)[layer, head]) for name, values in mean.items()},
         "behaviour": str(behaviour[layer, head])}
        for layer in range(n_layers) for head in range(n_heads)
    ]


def model_token_masks(model, ids, mask) -> dict[str, np.ndarray]:
    """token_masks_from_ids with the model tokenizer's [CLS], [SEP], "." and "," ids."""
    tokenizer = model.tokenizer
    return token_masks_from_ids(ids, mask, cls_id=tokenizer.cls_token_id, sep_id=tokenizer.sep_token_id,
                                punct_ids=[tokenizer.vocab[p] for p in (".", ",") if p in tokenizer.vocab])


SEGMENT_IDS = ("real", "zeros")  # sentence B's token type 1 as the tokenizer gives it, or all 0 (Clark et al.)


def check_segment_ids(segment_ids: str) -> None:
    if segment_ids not in SEGMENT_IDS:
        raise AnalysisError(f"segment_ids must be 'real' or 'zeros' (sentence B keeps token type 1, or every type is "
                            f"0 as in Clark et al.'s extraction script), not {segment_ids!r}.")


def attention_statistics(model, texts_or_batch, pairs=None, segment_ids: str = "real",
                         sep_normalization: str = "clark") -> dict[str, np.ndarray]:
    """Head statistics of one batch, averaged over its documents: {name: [L, H]} NumPy.

    texts_or_batch: a text, a list of texts (with `pairs` for sentence B), a Batch, or a dict of id
    arrays. segment_ids: "real" (sentence B has type 1) or "zeros" (Clark et al.'s extraction script).
    sep_normalization: "clark" (sep_to_sep / 2, rest_to_sep / (n − 2), the default) or "count".
    For a corpus, `minibert.analysis.corpus.survey` batches, buckets and accumulates on the device.
    """
    check_segment_ids(segment_ids)
    check_sep_normalization(sep_normalization)
    batch = texts_or_batch
    if is_text(batch):
        batch = model.tokenize([batch] if isinstance(batch, str) else list(batch),
                               [pairs] if isinstance(pairs, str) else pairs)
    elif pairs is not None:
        raise AnalysisError("pairs goes with texts; a tokenized batch already holds its pairs.")
    fields = dict(batch.to_dict() if hasattr(batch, "to_dict") else batch)
    ids = np.asarray(fields["input_ids"])
    mask = np.asarray(fields.get("attention_mask", np.ones_like(ids)))
    if segment_ids == "zeros":
        fields["token_type_ids"] = np.zeros_like(ids)
    _, cache = model.run_with_cache(fields, names=PATTERNS)
    stats = _head_statistics_jit(cache.stack(PATTERN), mask, **model_token_masks(model, ids, mask),
                                 sep_normalization=sep_normalization)
    return {name: np.asarray(value).mean(0) for name, value in stats.items()}
