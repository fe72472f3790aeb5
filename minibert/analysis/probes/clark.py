"""Clark et al.'s attention-based dependency probe (2019, section 5, Table 3): heads predicted from every layer's
attention maps and the words' embeddings, or from distance features (their baseline)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from minibert.analysis.probes.features import _encoded_runs, _encoded_sentences, split_sentences
from minibert.analysis.syntax import read_conllu
from minibert.core.site_names import EMBED, PATTERN, every_block
from minibert.errors import AnalysisError
from minibert.training.optim import adamw

CLARK_PROBES = ("attention_and_words", "distances_and_words")
DISTANCE_FEATURES = 8  # (j − i)/n ahead, behind; i = j, ±1, ±2 indicators; the ROOT indicator


def distance_features(n: int) -> np.ndarray:
    """[8, n, n + 1] their baseline's features of candidate head j (column 0 = ROOT, j ≥ 1 = word j) for word i:
    how far ahead or behind (÷ n), whether it is 0, ±1, ±2 words away, and whether it is ROOT."""
    ahead = np.triu(np.subtract.outer(np.arange(n), np.arange(n)).T, 1) / n  # (j − i)/n where i < j
    words = [ahead, ahead.T] + [np.eye(n, k=k) for k in (0, -1, 1, -2, 2)]
    features = np.concatenate([np.zeros((7, n, 1)), np.stack(words)], -1)
    root = np.zeros((1, n, n + 1))
    root[:, :, 0] = 1
    return np.concatenate([features, root]).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class ParseData:
    """Sentences padded to W words: word-level attention maps of every head in both directions with [CLS] and
    [SEP] kept ([S, 2·L·H, W + 2, W + 2]), word embeddings [S, W, E], distance features [S, 8, W, W + 1],
    gold heads [S, W] (0 = ROOT, −1 on padding) and which words are scored [S, W] (relation not "punct")."""

    attention: np.ndarray
    embeddings: np.ndarray
    distances: np.ndarray
    heads: np.ndarray
    scored: np.ndarray

    def take(self, chosen) -> ParseData:
        return ParseData(*(getattr(self, f.name)[chosen] for f in dataclasses.fields(self)))


def parse_data(model, sentences, mode: str = "mean", batch_size: int = 32) -> ParseData:
    """Inputs of Clark et al.'s probes for CoNLL-U trees: word-level attention (words.py's pooling; mode "mean"
    or "first" for a word's row) and each word's input embedding (the mean of its wordpieces' rows of the model's
    own embedding table — in place of their GloVe vectors)."""
    from minibert.analysis.words import word_attention

    encoded = _encoded_sentences(model, [s.words for s in sentences])
    lengths = [len(s.words) for s in sentences]
    S, W, E = len(sentences), max(lengths), model.hook_sites[EMBED][0][-1]
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    attention = np.zeros((S, 2 * L * H, W + 2, W + 2), np.float32)
    embeddings = np.zeros((S, W, E), np.float32)
    heads, scored = np.full((S, W), -1, np.int32), np.zeros((S, W), bool)
    distances = np.zeros((S, DISTANCE_FEATURES, W, W + 1), np.float32)
    for chosen, cache in _encoded_runs(model, encoded, [every_block(PATTERN), EMBED],
                                       batch_size):
        pattern = np.asarray(cache.stack(PATTERN), np.float32)  # [L, B, H, T, S]
        embedded = np.asarray(cache[EMBED], np.float32)
        for b, i in enumerate(chosen):
            n, groups = lengths[i], encoded[i][1]
            maps = word_attention(pattern[:, b], groups, mode).reshape(L * H, n + 2, n + 2)
            both = np.concatenate([maps, np.swapaxes(maps, -1, -2)])  # α_ij, then α_ji
            attention[i, :, :n + 2, :n + 2] = both
            embeddings[i, :n] = [embedded[b, group].mean(0) for group in groups[1:-1]]
            distances[i, :, :n, :n + 1] = distance_features(n)
            heads[i, :n] = sentences[i].heads
            scored[i, :n] = [relation != "punct" for relation in sentences[i].relations]
    return ParseData(attention, embeddings, distances, heads, scored)


def init_clark_probe(kind: str, maps: int, width: int, seed: int = 0) -> dict:
    """Parameters as their TensorFlow graph makes them: Glorot-uniform dense layers, zero biases."""
    if kind not in CLARK_PROBES:
        raise AnalysisError(f"kind={kind!r}: Clark et al.'s probes are {CLARK_PROBES}.")
    keys = jax.random.split(jax.random.key(seed), 3)

    def glorot(key, shape):
        limit = np.sqrt(6 / sum(shape)) if len(shape) == 2 else np.sqrt(3)
        return jax.random.uniform(key, shape, jnp.float32, -limit, limit)

    if kind == "attention_and_words":
        return {"W": glorot(keys[0], (2 * width, maps)), "b": jnp.zeros(maps),
                "root_start": glorot(keys[1], ()), "root_end": glorot(keys[2], ())}
    features = 1 + DISTANCE_FEATURES + 2 * width  # a zero "attention" map, the distances, v_i ⊕ v_j
    return {"W1": glorot(keys[0], (features, 256)), "b1": jnp.zeros(256), "W2": glorot(keys[1], (256, 1)),
            "b2": jnp.zeros(1)}


def _pair_embeddings(embeddings):
    """[W, W + 1, 2E]: v_i ⊕ v_j for word i and candidate j (ROOT, column 0: zeros, their dummy)."""
    n = embeddings.shape[0]
    pairs = jnp.concatenate([jnp.broadcast_to(embeddings[:, None], (n, n, embeddings.shape[1])),
                             jnp.broadcast_to(embeddings[None], (n, n, embeddings.shape[1]))], -1)
    return jnp.concatenate([jnp.zeros((n, 1, pairs.shape[-1]), pairs.dtype), pairs], 1)


def clark_logits(params, attention, embeddings, distances, kind: str, n=None):
    """Scores [W, W + 1] of candidate heads (ROOT, then each word) for every word of one sentence of n real words
    (default: all W) padded to W; candidates past word n score −inf.

    attention_and_words: s_ij = Σ_k (W(v_i ⊕ v_j) + b)_k · α^k_ij over the 2·L·H maps (both directions), where
    ROOT's α is root_start·α(word → [CLS]) + root_end·α(word → [SEP]) as in their code. distances_and_words: a
    256-unit tanh layer over (0, distance features, v_i ⊕ v_j), then one output.
    """
    W = embeddings.shape[0]
    n = W if n is None else n
    pairs = _pair_embeddings(embeddings)
    if kind == "attention_and_words":
        words = attention[:, 1:W + 1]  # the words' rows ([CLS] first; [SEP] at position n + 1)
        sep = jnp.take_along_axis(words, jnp.broadcast_to(n + 1, words.shape[:2])[..., None], -1)[..., 0]
        root = params["root_start"] * words[:, :, 0] + params["root_end"] * sep
        maps = jnp.concatenate([root[..., None], words[:, :, 1:W + 1]], -1)  # [K, W, W + 1]
        logits = jnp.einsum("WVK,KWV->WV", pairs @ params["W"] + params["b"], maps)
    else:
        inputs = jnp.concatenate([jnp.zeros_like(distances[:1]), distances, jnp.moveaxis(pairs, -1, 0)], 0)
        hidden = jnp.tanh(jnp.moveaxis(inputs, 0, -1) @ params["W1"] + params["b1"])
        logits = (hidden @ params["W2"] + params["b2"])[..., 0]
    return jnp.where(jnp.arange(W + 1)[None] <= n, logits, -jnp.inf)


def _clark_loss(params, attention, embeddings, distances, heads, lengths, kind):
    """Their loss: summed cross-entropy of the gold head over the words of the sentences (padding masked)."""

    def one(attention, embeddings, distances, heads, n):
        logits = clark_logits(params, attention, embeddings, distances, kind, n)
        per_word = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(heads, 0))
        return jnp.sum(jnp.where(heads >= 0, per_word, 0.0))

    return jnp.sum(jax.vmap(one)(attention, embeddings, distances, heads, lengths))


@functools.partial(jax.jit, static_argnames=("kind", "optimizer"))
def _clark_step(params, state, attention, embeddings, distances, heads, lengths, *, kind, optimizer):
    loss, grad = jax.value_and_grad(_clark_loss)(params, attention, embeddings, distances, heads, lengths, kind)
    updates, state = optimizer.update(grad, state, params)
    return optax.apply_updates(params, updates), state, loss


@functools.partial(jax.jit, static_argnames="kind")
def _clark_predictions(params, attention, embeddings, distances, lengths, *, kind):
    return jax.vmap(lambda a, e, d, n: jnp.argmax(clark_logits(params, a, e, d, kind, n), -1))(
        attention, embeddings, distances, lengths)


def fit_clark_probe(data: ParseData, kind: str = "attention_and_words", *, learning_rate: float = 0.002,
                    epochs: int = 1, batch_size: int = 1, seed: int = 0, init=None):
    """Train one of Clark et al.'s probes with Adam (their settings: lr 0.002, one sentence per step, one epoch;
    the loss sums over a step's words). Returns (parameters, loss per step)."""
    params = init if init is not None else init_clark_probe(kind, data.attention.shape[1], data.embeddings.shape[-1],
                                                           seed)
    optimizer = adamw(learning_rate, max_grad_norm=None)
    state, losses = optimizer.init(params), []
    lengths = (data.heads >= 0).sum(1)
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = rng.permutation(len(lengths))
        for start in range(0, len(order), batch_size):
            chosen = order[start:start + batch_size]
            params, state, loss = _clark_step(params, state, data.attention[chosen], data.embeddings[chosen],
                                              data.distances[chosen], data.heads[chosen], lengths[chosen], kind=kind,
                                              optimizer=optimizer)
            losses.append(float(loss))
    return params, np.array(losses)


def unlabelled_attachment(params, data: ParseData, kind: str = "attention_and_words") -> float:
    """UAS: the share of scored words (relation not "punct", as their evaluation) whose argmax candidate is the
    gold head (0 = ROOT)."""
    lengths = (data.heads >= 0).sum(1)
    predicted = np.asarray(_clark_predictions(params, data.attention, data.embeddings, data.distances, lengths,
                                              kind=kind))
    return float((predicted == data.heads)[data.scored].mean())


def clark_probe(model, sentences, kind: str = "attention_and_words", *, mode: str = "mean", dev: float = 0.0,
                test: float = 0.2, seed: int = 0, **options) -> tuple[float, dict]:
    """Train Clark et al.'s attention-and-words probe (or their distances-and-words baseline) on a split of the
    trees and return (test UAS, parameters). options: fit_clark_probe's (learning_rate, epochs, batch_size)."""
    sentences = read_conllu(sentences) if isinstance(sentences, str) or hasattr(sentences, "read_text") else sentences
    data = parse_data(model, sentences, mode)
    splits = split_sentences(len(sentences), dev, test, seed)
    params, _ = fit_clark_probe(data.take(splits["train"]), kind, seed=seed, **options)
    return unlabelled_attachment(params, data.take(splits["test"]), kind), params
