"""Heads side by side: one head under two checkpoints, and heads against word pairs a user labelled.

    result = compare_models(pretrained, finetuned, texts)     # Kovaleva, Romanov, Rogers & Rumshisky 2019
    result.similarity                                         # [L, H] mean cosine of the two heads' maps
    found = relation_accuracy(model, [RelationExample("what about the service ?", "service", "waiter",
                                                      pair="the waiter was rude .")])
    found.accuracy, found.best_heads()                        # [L, H]; the best "L-H" heads (seed 002)
    found.offset_accuracy, found.most_attended_accuracy       # baselines a head must beat
    low, high = found.confidence_interval()                   # [L, H] 95% bootstrap interval over examples

Layers and heads are 0-indexed in arrays; "L-H" labels are 1-indexed, as in the papers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from minibert.analysis import heads, words
from minibert.core.config import head_label
from minibert.core.site_names import PATTERN
from minibert.core.sites import PATTERNS
from minibert.errors import AnalysisError
from minibert.runtime.accounting import EXACT


def _positive_batch_size(batch_size) -> int:
    if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) or batch_size < 1:
        raise AnalysisError(f"batch_size must be a positive int (how many inputs run at a time); got {batch_size!r}.")
    return int(batch_size)


def _kinds(items) -> str:
    """What `items` is, for a message: its type, and for a list the types it holds."""
    if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
        return type(items).__name__
    return f"a {type(items).__name__} of {sorted({type(item).__name__ for item in items})}"


def _pattern_chunks(models, texts: Sequence[str], pairs: Sequence[str] | None, batch_size: int):
    """For every `batch_size` texts: (attention_mask [B, T], one pattern [L, B, H, T, S] per model)."""
    batch = models[0].tokenize(list(texts), None if pairs is None else list(pairs))
    arrays = batch.to_dict()
    for start in range(0, len(texts), batch_size):
        chunk = {name: values[start:start + batch_size] for name, values in arrays.items()}
        chunk = {name: values[:, :chunk["attention_mask"].sum(1).max()] for name, values in chunk.items()}
        yield chunk["attention_mask"], [m.run_with_cache(chunk, names=PATTERNS)[1].stack(PATTERN)
                                        for m in models]


# ---- checkpoints side by side -----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Comparison:
    """How each head's attention differs between two checkpoints on the same inputs.

    similarity [L, H] (the main array): cosine similarity of the head's two attention maps, each
    flattened over real query × key pairs, averaged over inputs (1 = the same map up to scale).
    js_divergence [L, H]: Jensen–Shannon divergence (nats, ≤ ln 2) between the two heads' rows, smoothed as
    0.999·A + 0.001/n (Clark et al.), averaged over real query rows and then over inputs.
    """

    similarity: np.ndarray
    js_divergence: np.ndarray
    n_inputs: int


@jax.jit
def _head_agreement(a, b, attention_mask) -> tuple[jax.Array, jax.Array]:
    """Two models' patterns [L, B, H, T, S] → (cosine [L, B, H], mean row JS divergence [L, B, H])."""
    _, same, n = heads._documents(attention_mask)
    a, b = heads._real_pattern(a, same), heads._real_pattern(b, same)
    dot = partial(jnp.einsum, "LBHTS,LBHTS->LBH", precision=EXACT)
    cosine = dot(a, b) / jnp.sqrt(dot(a, a) * dot(b, b))
    p, q = (heads._smoothed(x, same, n, heads.JS_SMOOTHING) for x in (a, b))
    m = 0.5 * (p + q)
    log = lambda x: jnp.log(jnp.where(x > 0, x, 1.0))  # 0 at padding, where the factor in front is 0 too
    rows = (0.5 * p * (log(p) - log(m)) + 0.5 * q * (log(q) - log(m))).sum(-1)  # [L, B, H, T]
    real = jnp.asarray(attention_mask > 0, jnp.float32)
    return cosine, jnp.einsum("LBHT,BT->LBH", rows, real) / real.sum(1)[:, None]


def _check_comparable(model_a, model_b) -> None:
    """Same tokenizer (vocabulary and lower-casing) and the same number of layers and heads, or an error."""
    ca, cb = model_a.config, model_b.config
    shape_a, shape_b = (ca.num_hidden_layers, ca.num_attention_heads), (cb.num_hidden_layers, cb.num_attention_heads)
    if shape_a != shape_b:
        raise AnalysisError(f"the models have different shapes: {shape_a[0]} layers × {shape_a[1]} heads "
                            f"({model_a.source}) vs {shape_b[0]} layers × {shape_b[1]} heads ({model_b.source}); "
                            f"compare checkpoints of one architecture, e.g. a pretrained model and its fine-tuned "
                            f"version.")
    check_same_tokenizer(model_a, model_b)


def check_same_tokenizer(model_a, model_b) -> None:
    """The same vocabulary and lower-casing, or an error naming what differs: the same text must become the same
    tokens in both models."""
    ta, tb = model_a.tokenizer, model_b.tokenizer
    # WordPiece has a do_lower_case switch; the other families' tokenizers keep it in their normalizer (None here).
    if ta is None or tb is None or ta.vocab != tb.vocab or \
            getattr(ta, "do_lower_case", None) != getattr(tb, "do_lower_case", None):
        what = ("a tokenizer is missing" if ta is None or tb is None else
                f"vocabularies of {len(ta.vocab)} and {len(tb.vocab)} entries differ" if ta.vocab != tb.vocab else
                f"lower-casing differs ({getattr(ta, 'do_lower_case', None)} vs {getattr(tb, 'do_lower_case', None)})")
        raise AnalysisError(f"the models do not share a tokenizer ({what}: {model_a.source} vs {model_b.source}); "
                            f"the same text would become different tokens. Compare checkpoints made from one "
                            f"tokenizer.")


def compare_models(model_a, model_b, texts: Sequence[str], pairs: Sequence[str] | None = None, *,
                   batch_size: int = 16) -> Comparison:
    """Per-head similarity of two checkpoints' attention on the same `texts` (Kovaleva et al. 2019).

    Both models must share the tokenizer and the number of layers and heads (AnalysisError otherwise).
    Texts run `batch_size` at a time through both models; see Comparison for the two measures.
    """
    _check_comparable(model_a, model_b)
    if isinstance(texts, (str, bytes)) or (pairs is not None and isinstance(pairs, (str, bytes))):
        raise AnalysisError("texts (and pairs) must be a list of texts, not one string (which would be compared one "
                            "character at a time); pass [text] for a single text.")
    if not hasattr(texts, "__len__"):
        raise AnalysisError(f"texts must be a list of texts; got {type(texts).__name__}.")
    batch_size = _positive_batch_size(batch_size)
    if len(texts) == 0:
        raise AnalysisError("texts is empty; pass at least one text to compare the models on.")
    cosines, divergences = [], []
    for attention_mask, (a, b) in _pattern_chunks((model_a, model_b), texts, pairs, batch_size):
        cosine, js = _head_agreement(a, b, attention_mask)
        cosines.append(np.asarray(cosine))
        divergences.append(np.asarray(js))
    mean = lambda parts: np.concatenate(parts, axis=1).mean(1)
    return Comparison(mean(cosines), mean(divergences), len(texts))


# ---- relation accuracy (seed 002) -------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class RelationExample:
    """One user-labelled word relation: in this input, the word `query` should attend to a word of `targets`.

    text, pair: the input, sentence A and optionally sentence B ([CLS] text [SEP] pair [SEP]).
    query: one word, searched in sentence `query_segment` (0: text, 1: pair); its `occurrence`-th
        appearance there (0: the first) is the query.
    targets: one word or several; every appearance of any of them in sentence `target_segment` (None:
        either sentence) counts as right, except the query word itself.
    Words are compared as the tokenizer writes them (lower-cased for uncased models, wordpieces joined).
    Seed 002's aspect head: RelationExample("what do you think of the service ?", "service", "waiter",
    pair="the waiter was rude .", target_segment=1).
    """

    text: str
    query: str
    targets: str | Sequence[str]
    pair: str | None = None
    query_segment: int = 0
    target_segment: int | None = None
    occurrence: int = 0


OFFSETS = tuple(range(-3, 3))  # Clark et al.'s fixed-offset baseline: always predict word i + k, k in −3…2


def bootstrap_interval(correct, level: float = 0.95, resamples: int = 1000, seed: int = 0):
    """Percentile bootstrap interval of the accuracy mean(correct, axis 0) over examples → (low, high), each of
    correct's shape without axis 0: the examples are resampled with replacement `resamples` times (NumPy seed
    `seed`) and the (1 − level)/2 and (1 + level)/2 quantiles of the resampled accuracies are returned."""
    correct = np.asarray(correct, np.float64)
    n = len(correct)
    if not 0 < level < 1 or n == 0:
        raise AnalysisError(f"level must lie between 0 and 1 (e.g. 0.95) and there must be examples; got level "
                            f"{level!r} and {n} examples.")
    counts = np.random.default_rng(seed).multinomial(n, np.full(n, 1 / n), size=resamples)  # [R, N]
    accuracies = counts @ correct.reshape(n, -1) / n  # [R, ...]
    low, high = np.quantile(accuracies, [(1 - level) / 2, (1 + level) / 2], axis=0)
    return low.reshape(correct.shape[1:]), high.reshape(correct.shape[1:])


@dataclasses.dataclass(frozen=True)
class RelationResult:
    """accuracy [L, H] (the main array): the share of examples whose query row peaks at a target word;
    correct [N, L, H] bool per example; predicted [N, L, H]: the text of the word each head peaks at.

    Baselines a head must beat, per example: offset_correct [N, len(OFFSETS)], whether the word at the query's
    index + k (k in OFFSETS, counting [CLS] and [SEP] as words) is a target (Clark et al.'s fixed offsets);
    most_attended_correct [N], whether the word that receives the most attention in the input (summed over
    every layer, head and query word) is a target — the attention sink, when it is one."""

    accuracy: np.ndarray
    correct: np.ndarray
    predicted: np.ndarray
    offset_correct: np.ndarray
    most_attended_correct: np.ndarray

    @property
    def offset_accuracy(self) -> dict[int, float]:
        """{k: accuracy of always predicting word query + k} for k in OFFSETS."""
        return {k: float(a) for k, a in zip(OFFSETS, self.offset_correct.mean(0))}

    @property
    def best_offset(self) -> tuple[int, float]:
        """(k, accuracy) of the best fixed offset (ties: the first k in OFFSETS), as Clark et al. report it."""
        accuracies = self.offset_correct.mean(0)
        return OFFSETS[int(np.argmax(accuracies))], float(accuracies.max())

    @property
    def most_attended_accuracy(self) -> float:
        return float(self.most_attended_correct.mean())

    def confidence_interval(self, level: float = 0.95, resamples: int = 1000, seed: int = 0):
        """(low, high) [L, H]: each head's bootstrap interval over examples (bootstrap_interval); apply
        bootstrap_interval to offset_correct or most_attended_correct for the baselines'."""
        return bootstrap_interval(self.correct, level, resamples, seed)

    def best_heads(self, k: int = 5) -> list[tuple[str, float]]:
        """The k most accurate heads as ("L-H" 1-indexed label, accuracy), best first (ties: lower layer, head)."""
        order = np.argsort(-self.accuracy.ravel(), kind="stable")[:k]
        n_heads = self.accuracy.shape[1]
        return [(head_label(*divmod(int(i), n_heads)), float(self.accuracy.ravel()[i])) for i in order]


def _one_word(model, word: str, role: str, index: int) -> str:
    """The tokenizer's text of a single word ("Waiter" → "waiter"), or an error if it makes several words."""
    made = words.target_words(model, word)
    if len(made) != 1:
        raise AnalysisError(f"examples[{index}].{role} {word!r} is {len(made)} words to the tokenizer ({made}); "
                            f"give one word (label multi-word targets by their head word).")
    unknown = getattr(model.tokenizer, "unk_token", None)
    if unknown is not None and unknown.lower() in made[0]:
        raise AnalysisError(f"examples[{index}].{role} {word!r} is not in the vocabulary: the tokenizer writes it "
                            f"{made[0]!r}, like every other unknown word, so it could not be told apart from them. "
                            f"Label a word the vocabulary knows.")
    return made[0]


def _relation_words(model, example: RelationExample, index: int, labels: list[str],
                    segments: list[int | None]) -> tuple[int, list[int]]:
    """(query word index, target word indices) within one document's words."""
    query = _one_word(model, example.query, "query", index)
    targets = [example.targets] if isinstance(example.targets, str) else list(example.targets)
    targets = {_one_word(model, t, "targets", index) for t in targets}
    hits = [w for w, (text, seg) in enumerate(zip(labels, segments)) if text == query and seg == example.query_segment]
    if len(hits) <= example.occurrence:
        raise AnalysisError(f"examples[{index}]: the query word {query!r} appears {len(hits)} time(s) in sentence "
                            f"{example.query_segment}, so there is no occurrence {example.occurrence}; its words are "
                            f"{[t for t, s in zip(labels, segments) if s == example.query_segment]}.")
    query_word = hits[example.occurrence]
    found = [w for w, (text, seg) in enumerate(zip(labels, segments)) if text in targets and w != query_word
             and (example.target_segment is None or seg == example.target_segment)]
    if not found:
        where = "the input" if example.target_segment is None else f"sentence {example.target_segment}"
        raise AnalysisError(f"examples[{index}]: no target word {sorted(targets)} in {where} besides the query; "
                            f"its words are {labels}.")
    return query_word, found


def relation_accuracy(model, examples: Sequence[RelationExample], *, batch_size: int = 16) -> RelationResult:
    """Per-head accuracy on user-labelled word relations (seed 002's proposed study, after Clark et al.).

    For each example, each head's word-level attention (words.word_attention, mode="mean": a word's row
    is the mean of its tokens' rows, attention to a word the sum over its tokens; [CLS] and [SEP] are
    words of their own) is read at the query word's row; the head is right when that row's largest
    entry is at a target word. Examples with and without a pair run as separate batches. The result also
    holds two baselines (fixed offsets, the most-attended word) and gives bootstrap intervals.
    """
    batch_size = _positive_batch_size(batch_size)
    if isinstance(examples, (str, bytes, RelationExample)) or not hasattr(examples, "__len__") or not all(
            isinstance(example, RelationExample) for example in examples):
        raise AnalysisError(f"examples must be a list of RelationExample(text, query, targets, pair=...); got "
                            f"{_kinds(examples)}. Wrap a single example in a list.")
    if len(examples) == 0:
        raise AnalysisError("examples is empty; pass RelationExample(text, query, targets, pair=...) items.")
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    correct = np.zeros((len(examples), L, H), bool)
    predicted = np.empty((len(examples), L, H), object)
    offset_correct = np.zeros((len(examples), len(OFFSETS)), bool)
    most_attended_correct = np.zeros(len(examples), bool)
    for has_pair in (False, True):
        chosen = [i for i, e in enumerate(examples) if (e.pair is not None) == has_pair]
        for start in range(0, len(chosen), batch_size):
            part = chosen[start:start + batch_size]
            batch = model.tokenize([examples[i].text for i in part],
                                   [examples[i].pair for i in part] if has_pair else None)
            patterns = np.asarray(model.run_with_cache(batch, names=PATTERNS)[1].stack(PATTERN))
            for b, i in enumerate(part):
                groups = words.word_groups(batch.word_ids[b], batch.sequence_ids[b], batch.attention_mask[b])
                labels = [w.lower() for w in words.word_labels(batch.tokens[b], groups)]
                segments = [batch.sequence_ids[b][g[0]] for g in groups]
                query, targets = _relation_words(model, examples[i], i, labels, segments)
                attention = words.word_attention(patterns[:, b], groups, "mean")  # [L, H, W, W]
                peaks = attention[:, :, query].argmax(-1)
                correct[i] = np.isin(peaks, targets)
                predicted[i] = np.asarray(labels, object)[peaks]
                offset_correct[i] = [query + k in targets for k in OFFSETS]
                most_attended_correct[i] = int(attention.sum((0, 1, 2)).argmax()) in targets
    return RelationResult(correct.mean(0), correct, predicted, offset_correct, most_attended_correct)
