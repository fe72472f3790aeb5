"""Interactive attention views in the style of bertviz: head view, model view, neuron view.

Two ways in. From arrays you already have, for one document, real tokens only:

    viz.head_view(tokens, attention, sentence_b_start)          # attention [L, H, T, S]
    viz.model_view(tokens, attention, sentence_b_start)
    viz.neuron_view(tokens, q, k, attention, sentence_b_start)  # q, k [L, T, H, K]

From a model and a text (or a sentence pair), which runs the model once and keeps the arrays:

    doc = viz.document(model, "The cat sat.", "It was tired.")
    doc.head_view(layer=2); doc.model_view(); doc.neuron_view(layer=2, head=5, query_index=3)

Each returns a `View` that shows inline in notebooks and `.save(path)`s as a standalone page that
loads nothing from the network. Indices in arguments are 0-indexed; the pages label layers and
heads 1-indexed in the "L-H" form of Clark et al. (tooltips give the 0-indexed numbers).

    attention  [L, H, T, S]   rows sum to 1 (softmax over keys S), from attn.hook_pattern
    q, k       [L, T, H, K]   per-head query and key vectors, from attn.hook_q and attn.hook_k

What a page holds, and how exactly (see `_html` for the packing): the head and model views carry
attention as one byte per weight, round(255·a), so each line's opacity is within 1/510 of the
weight (a step of 1/255 in opacity is invisible), and lines fainter than 0.005 are not drawn. The
neuron view carries q and k as float32 (the model's own values, exactly) and computes q×k, q·k,
q·k/√K and the softmax from them in float64; when `attention` is not that softmax (within 1e-5),
it carries `attention` as float32 too and shows it. A page of the bundled model (6 layers × 12
heads) at 512 tokens is about 3.4 MB (head, model view) and 11 MB (neuron view); `layers=` (and
`heads=` in the model and neuron views) make smaller ones; `level=` is the zlib level of the packed data
(default 6; 0 sends it uncompressed, as the live workbench does, where time matters more than size).
Pages need a browser with DecompressionStream
(Chrome 80, Firefox 113, Safari 16.4); Download saves the current drawing as PNG or SVG.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence

import numpy as np

from minibert.core.config import head_label
from minibert.core.site_names import ATTN_SCORES, C2C, C2P, P2C, PATTERN, leaf
from minibert.viz import _check
from minibert.viz._html import ZLIB_LEVEL, View

SOFTMAX_TOLERANCE = 1e-5


def head_view(tokens: Sequence[str], attention, sentence_b_start: int | None = None, *,
              layer: int | None = None, heads: Sequence[int] | None = None, layers: Sequence[int] | None = None,
              theme: str = "light", title: str | None = None, level: int = ZLIB_LEVEL) -> View:
    """Token-to-token lines for the heads of one layer, opacity = attention weight.

    tokens: the document's T tokens. attention: [L, H, T, T]. sentence_b_start: index of
    sentence B's first token for a pair (adds the A→B / B→A / A→A / B→B filter).
    layers: the layers the page's selector offers (default all; fewer make a smaller file);
    layer: the layer shown first (default the first of `layers`); heads: the heads switched on
    first (default all); all 0-indexed. In the page: a layer selector, one colour toggle per head
    (double-click: only that head), hover a token to see only its attention, click to pin it.
    """
    tokens = _check.token_list(tokens)
    a = _check.attention_array(tokens, attention)
    n_layers, n_heads = a.shape[:2]
    rows = _check.indices("layers", layers, n_layers, "layers")
    first = _shown_first("layer", rows[0] if layer is None else layer, rows, n_layers, "layers")
    shown = _check.indices("heads", heads, n_heads, "heads")
    meta = dict(tokens=tokens, b_start=_check.sentence_b(sentence_b_start, len(tokens)),
                layers=rows, layer=first, heads=list(range(n_heads)), n_heads=n_heads,
                active=[h in shown for h in range(n_heads)])
    return View("head", meta, {"attention": ([a[row] for row in rows], "unit_byte")},
                title=title or "Head view", theme=_check.theme(theme), level=level)


def _labels(rows: list[int], cols: list[int]) -> list[list[str]]:
    """The pages' head labels, [layer row][head column]: config.head_label's "L-H", 1-indexed."""
    return [[head_label(layer, head) for head in cols] for layer in rows]


def _shown_first(name: str, value, offered: list[int], size: int, what: str) -> int:
    """Position in `offered` of the index shown first; it must be one of the offered ones."""
    value = _check.index(name, value, size, what)
    if value not in offered:
        raise _check.VizError(f"{name}={value} must be among {what}={offered}; add it to {what}=, "
                              f"or leave {what} None for all.")
    return offered.index(value)


def model_view(tokens: Sequence[str], attention, sentence_b_start: int | None = None, *,
               layers: Sequence[int] | None = None, heads: Sequence[int] | None = None,
               theme: str = "light", thumbnail: str = "lines", title: str | None = None,
               level: int = ZLIB_LEVEL) -> View:
    """A layers × heads grid of thumbnails; click one to enlarge it into a head view of that head.

    layers, heads: which rows and columns to include (default all), 0-indexed.
    thumbnail: "lines" (bertviz style) or "matrix" (a query × key heat map); switchable in the page.
    Pages grow as L·H·T²: choose layers and heads to keep long documents small.
    """
    tokens, a, rows, cols = _check.layers_and_heads(tokens, attention, layers, heads)
    if thumbnail not in ("lines", "matrix"):
        raise _check.VizError(f"thumbnail must be 'lines' or 'matrix'; got {thumbnail!r}.")
    meta = dict(tokens=tokens, b_start=_check.sentence_b(sentence_b_start, len(tokens)),
                layers=rows, heads=cols, n_heads=a.shape[1], thumbnail=thumbnail, labels=_labels(rows, cols))
    return View("model", meta, {"attention": ([a[layer, cols] for layer in rows], "unit_byte")},
                title=title or "Model view", theme=_check.theme(theme), level=level)


def neuron_softmax(scaled: np.ndarray) -> np.ndarray:
    """softmax over the last axis of q·k/√K scores (no mask): the neuron view's column, here and in
    figures.neuron_terms."""
    weights = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True)


def _softmax_gap(scores: np.ndarray, attention: np.ndarray) -> float:
    """Largest |softmax(scores) − attention| over all entries, both [L, H, T, S]."""
    return float(np.abs(neuron_softmax(scores) - attention).max())


TERMS = ("c2c", "c2p", "p2c")  # DeBERTa's score terms, in the page's order
TERM_SITES = (C2C, C2P, P2C)  # their sites, in TERMS' order


def _score_terms(terms, attention: np.ndarray) -> dict[str, np.ndarray] | None:
    """DeBERTa's terms {c2c, c2p, p2c}, each [L, H, T, S] like attention (float64), or None."""
    if terms is None:
        return None
    if set(terms) != set(TERMS):
        raise _check.VizError(f"terms must hold {', '.join(TERMS)} (DeBERTa's {C2C}, {leaf(C2P)}, {leaf(P2C)}); "
                              f"got {sorted(terms)}.")
    arrays = {name: np.asarray(terms[name], np.float64) for name in TERMS}
    for name, value in arrays.items():
        if value.shape != attention.shape:
            raise _check.VizError(f"terms[{name!r}] must be [L, H, T, S] = {list(attention.shape)} like attention; "
                                  f"got shape {value.shape}.")
    return arrays


def _key_reach(key_mask, attention: np.ndarray) -> np.ndarray | None:
    """key_mask as [L, T, S] booleans (None stays None), checked against attention's [L, H, T, S]."""
    if key_mask is None:
        return None
    reach = np.asarray(key_mask)
    want = (attention.shape[0], *attention.shape[2:])
    if reach.dtype != np.bool_ or reach.shape != want:
        raise _check.VizError(f"key_mask must be booleans [L, T, S] = {list(want)} (True where the query may read the "
                              f"key); got {reach.dtype} of shape {reach.shape}.")
    return reach


def neuron_view(tokens: Sequence[str], q, k, attention, sentence_b_start: int | None = None, *,
                layer: int = 0, head: int = 0, query_index: int = 0,
                layers: Sequence[int] | None = None, heads: Sequence[int] | None = None,
                theme: str = "light", title: str | None = None, level: int = ZLIB_LEVEL, terms=None,
                key_mask=None) -> View:
    """How one query's attention is computed: q, each key's k, q×k (elementwise), q·k, q·k/√K, softmax.

    q, k: [L, T, H, K]; attention: [L, H, T, T], the model's own pattern, which the softmax column
    shows. Positive values blue, negative orange, intensity = magnitude. layer, head, query_index:
    shown first (0-indexed); layers, heads: which ones the page's selectors offer (default all;
    fewer make a smaller file: pages grow as L·H·T·K). Click a token on the left to make it the query.
    The page computes q×k, q·k and softmax(q·k/√K) from q and k (float32, exact) in float64. If
    that softmax differs from `attention` by more than 1e-5 (a bfloat16 run, a mask, another
    scale, arrays from different documents), a warning is issued, the page says so and its
    softmax column shows `attention` (then carried as float32 too: pages grow as L·H·T²).

    terms: DeBERTa's three score terms {"c2c", "c2p", "p2c"}, each [L, H, T, S] (attn.hook_c2c, hook_c2p,
    hook_p2c, already scaled): the page shows them side by side after q·k, their sum as the scores and the
    softmax of that sum (carried as float32; the check above compares that softmax with `attention`).

    key_mask: [L, T, S] booleans, True where the query may read the key, False where the model masks it (a
    ModernBERT local layer's keys beyond its window: −∞ in attn.hook_attn_scores): the scores there are −∞ before
    the softmax, here and in the page (carried as one byte per entry).
    """
    tokens = _check.token_list(tokens)
    a = _check.attention_array(tokens, attention)
    q = _check.head_vectors("q", q, a)
    k = _check.head_vectors("k", k, a)
    if k.shape != q.shape:
        raise _check.VizError(f"q and k must have the same shape [L, T, H, K]; got {q.shape} and {k.shape}.")
    rows = _check.indices("layers", layers, a.shape[0], "layers")
    cols = _check.indices("heads", heads, a.shape[1], "heads")
    layer = _shown_first("layer", layer, rows, a.shape[0], "layers")
    head = _shown_first("head", head, cols, a.shape[1], "heads")
    n_heads = a.shape[1]
    score_terms = _score_terms(terms, a)
    reach = _key_reach(key_mask, a)
    q, k, a = q[rows][:, :, cols], k[rows][:, :, cols], a[np.ix_(rows, cols)]
    if score_terms is None:
        # einsum, not a batched matmul: BLAS threads each of the L·H small products and, when another process holds
        # a core, waits for its descheduled thread at every one (benchmarks/RESULTS.md, live workbench)
        scores = np.einsum("LTHK,LSHK->LHTS", q, k) / np.sqrt(q.shape[-1])
    else:
        score_terms = {name: value[np.ix_(rows, cols)] for name, value in score_terms.items()}
        scores = sum(score_terms.values())
    if reach is not None:
        reach = reach[rows]
        scores = np.where(reach[:, None], scores, -np.inf)
    gap = _softmax_gap(scores, a)
    if gap > SOFTMAX_TOLERANCE:
        scored = "c2c + c2p + p2c" if terms is not None else "q·k/√K"
        warnings.warn(f"softmax({scored}) differs from the given attention by up to {gap:.3g}; the neuron view's "
                      "softmax column shows the given attention. That is expected from a bfloat16 or float16 run; "
                      "otherwise, were q, k and attention captured from the same document, in the same layer and "
                      "head order?", stacklevel=2)
    arrays = {"q": (q, "float32"), "k": (k, "float32")}
    arrays |= {name: (value, "float32") for name, value in (score_terms or {}).items()}
    if reach is not None:
        arrays["key_mask"] = (reach.astype(np.float32), "unit_byte")  # 1: in reach, 0: masked
    if gap > SOFTMAX_TOLERANCE:
        arrays["attention"] = (a, "float32")
    meta = dict(tokens=tokens, b_start=_check.sentence_b(sentence_b_start, len(tokens)), layers=rows,
                heads=cols, n_heads=n_heads, d_head=q.shape[-1], layer=layer, head=head,
                query=_check.index("query_index", query_index, len(tokens), "tokens"),
                mismatch=gap if gap > SOFTMAX_TOLERANCE else None, terms=list(TERMS) if score_terms else None,
                labels=_labels(rows, cols))
    return View("neuron", meta, arrays, title=title or "Neuron view", theme=_check.theme(theme), level=level)


@dataclasses.dataclass(frozen=True)
class Document:
    """One document's tokens and attention arrays, as the views take them (real tokens only).

    tokens: T strings. attention: [L, H, T, T] (attn.hook_pattern). q, k: [L, T, H, K]
    (attn.hook_q, attn.hook_k; a rotary family's rotated attn.hook_rot_q, hook_rot_k, which its scores use).
    sentence_b_start: index of sentence B's first token, or None.
    """

    tokens: list[str]
    attention: np.ndarray
    q: np.ndarray
    k: np.ndarray
    sentence_b_start: int | None
    terms: dict[str, np.ndarray] | None = None  # DeBERTa's score terms {c2c, c2p, p2c}, each [L, H, T, T]
    key_mask: np.ndarray | None = None  # [L, T, T], False where the model masks a key (a local layer's window)

    def head_view(self, **options) -> View:
        """`head_view` of this document; options: layer, heads, layers, theme, title."""
        return head_view(self.tokens, self.attention, self.sentence_b_start, **options)

    def model_view(self, **options) -> View:
        """`model_view` of this document; options: layers, heads, thumbnail, theme, title."""
        return model_view(self.tokens, self.attention, self.sentence_b_start, **options)

    def neuron_view(self, **options) -> View:
        """`neuron_view` of this document; options: layer, head, query_index, layers, heads, theme, title."""
        return neuron_view(self.tokens, self.q, self.k, self.attention, self.sentence_b_start, terms=self.terms,
                           key_mask=self.key_mask, **options)


def _one_batch(model, text, pair: str | None, max_length: int | None):
    if isinstance(text, str):
        return model.tokenize([text], None if pair is None else [pair], max_length=max_length)
    if not hasattr(text, "attention_mask"):
        raise _check.VizError(f"text must be a string or a Batch from model.tokenize; got {type(text).__name__}. "
                              "For several texts, tokenize them together and choose one with index=.")
    if pair is not None:
        raise _check.VizError("pair is for a text given as a string; a Batch already holds its pairs "
                              "(tokenize with model.tokenize(texts, pairs)).")
    return text


def document(model, text, pair: str | None = None, *, index: int = 0, max_length: int | None = None) -> Document:
    """Run `model` on one document and keep what the views need.

    text: a string (with `pair`, its sentence B), or a Batch from `model.tokenize`, of which
    document `index` is taken. Padding is dropped, so the arrays cover the real tokens only.
    """
    batch = _one_batch(model, text, pair, max_length)
    row = _check.index("index", index, len(batch.tokens), "documents in the batch")
    real = np.flatnonzero(np.asarray(batch.attention_mask)[row])
    inputs = {name: np.asarray(getattr(batch, name))[row:row + 1, real]
              for name in ("input_ids", "token_type_ids", "attention_mask")}
    family = model.config.family  # the q and k its scores use (rotated in ModernBERT), DeBERTa's score terms too
    hooks = (PATTERN, *family.query_key, ATTN_SCORES, *family.score_terms)
    _, cache = model.run_with_cache(inputs, names=[f"blocks.*.{hook}" for hook in hooks])
    attention, q, k, scores, *terms = (np.asarray(cache.stack(hook))[:, 0] for hook in hooks)
    reach = np.isfinite(scores[:, 0])  # the keys each layer's queries read (padding is dropped; a window masks)
    segment_b = np.flatnonzero(inputs["token_type_ids"][0] == 1)
    return Document(tokens=[batch.tokens[row][i] for i in real], attention=attention, q=q, k=k,
                    sentence_b_start=int(segment_b[0]) if segment_b.size else None,
                    terms={TERMS[TERM_SITES.index(site)]: term
                           for site, term in zip(family.score_terms, terms)} or None,
                    key_mask=None if reach.all() else reach)
