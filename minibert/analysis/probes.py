"""Probes: small models trained on a frozen encoder's activations, every layer at once (docs/probes.md).

Linear probes (Alain & Bengio 2016; Hewitt & Liang 2019) are multinomial logistic regressions, one per layer,
on the activations of one hook site ("hook_resid_post", "mlp.hook_post", "attn.hook_z" flattened over
heads, …). Token-level probes label words: a word's feature is its first wordpiece's activation or the
mean of its wordpieces' ("first" | "mean", as word-level attention pools rows). Sentence-level probes
label texts: the [CLS] position or the mean over real tokens. token_features gives every token of texts or
pairs as the model tokenizes them, for labels computed from the tokenization ("the token is in sentence B").
Labels come as lists, or from TSV files (read_word_labels, read_text_labels); trees from CoNLL-U.

Every layer's probe trains in one compiled program (`jax.vmap` over layers on accelerators, `lax.map` on CPU,
where batched matmuls are slow) on the objective

    mean_i CE(x_i W + b, y_i) + (l2 / 2)·‖W‖²            (b is not penalised)

which is scikit-learn's LogisticRegression with C = 1 / (l2 · n_train). The solver is full-batch L-BFGS
(optax), so the probe reaches the convex optimum; with a dev split it stops early, keeping the parameters
of the step with the lowest dev cross-entropy once `patience` steps bring no improvement.

Control tasks (Hewitt & Liang 2019): each word type gets a random label drawn from the task's label
distribution; a probe that scores well on the control task memorises types rather than reading the
property. Selectivity = task accuracy − control accuracy, per layer.

    result = token_probe(model, words, labels, site="hook_resid_post", pool="first", control=True)
    result.accuracy, result.interval, result.selectivity    # [L], [L, 2] (bootstrap 95%), [L]
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Hashable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu

from minibert.analysis.syntax import encode_words, read_conllu
from minibert.errors import AnalysisError, DataFileError, DataFileMissing
from minibert.hooks import site_axes
from minibert.training.optim import adamw

WORD_POOLS = ("first", "mean")
SENTENCE_POOLS = ("cls", "mean")


# ---- features ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Features:
    """Activations of one hook site for every layer: values [L, N, F] (N items: words, tokens or sentences),
    and the sentence each item comes from ([N], for splits and the bootstrap that resample sentences).
    token_features also gives each token's text and segment (0: first text, 1: the pair's second) [N]."""

    values: np.ndarray
    sentence: np.ndarray
    site: str
    tokens: np.ndarray | None = None
    segment: np.ndarray | None = None

    def __len__(self) -> int:
        return self.values.shape[1]

    def take(self, items: np.ndarray) -> Features:
        return Features(self.values[:, items], self.sentence[items], self.site,
                        *(None if a is None else a[items] for a in (self.tokens, self.segment)))


def _checked_site(model, site: str) -> str:
    """`site` without a block prefix, checked to be a per-layer hook with a token axis (not a [T, S] map)."""
    name = f"blocks.0.{site}"
    if name not in model.hook_names:
        examples = sorted({n.split(".", 2)[2] for n in model.hook_names if n.startswith("blocks.0.")})
        raise AnalysisError(f"{site!r} is not a per-layer hook site of this model; pick one of {', '.join(examples)}.")
    axes = site_axes(name)
    if axes[:2] != ["B", "T"] or "S" in axes:
        raise AnalysisError(f"{site!r} has axes {axes}: a probe needs one vector per token ([B, T, ...]); "
                            f"try 'hook_resid_post', 'mlp.hook_post' or 'attn.hook_z'.")
    return site


def _padded(rows: Sequence[Sequence[int]]) -> dict[str, np.ndarray]:
    """Token id rows padded on the right, as a batch (segment ids 0)."""
    ids = np.zeros((len(rows), max(map(len, rows))), np.int32)
    mask = np.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, :len(row)], mask[b, :len(row)] = row, 1
    return dict(input_ids=ids, token_type_ids=np.zeros_like(ids), attention_mask=mask)


def _encoded_runs(model, encoded, names, batch_size: int):
    """(sentence indices, Cache) per batch of encoded sentences (syntax.encode_words), similar lengths together."""
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]))
    for start in range(0, len(order), batch_size):
        chosen = order[start:start + batch_size]
        yield chosen, model.run_with_cache(_padded([encoded[i][0] for i in chosen]), names=names)[1]


def _encoded_sentences(model, sentences: Sequence[Sequence[str]]) -> list:
    """syntax.encode_words of each sentence, checked to fit the model's positions."""
    if not sentences or any(len(words) == 0 for words in sentences):
        raise AnalysisError("pass at least one sentence, each a non-empty list of words.")
    encoded = [encode_words(model.tokenizer, words) for words in sentences]
    too_long = [i for i, (ids, _) in enumerate(encoded) if len(ids) > model.config.max_tokens]
    if too_long:
        raise AnalysisError(f"sentence {too_long[0]} has {len(encoded[too_long[0]][0])} tokens, more than the model's "
                            f"{model.config.max_tokens} positions; split it or leave it out.")
    return encoded


def _pool_words(values: np.ndarray, groups: Sequence[Sequence[int]], pool: str) -> np.ndarray:
    """[L, T, F] of one sentence → [L, W, F]: each word's first wordpiece, or the mean of its wordpieces."""
    if pool == "first":
        return values[:, [group[0] for group in groups]]
    return np.stack([values[:, group].mean(1) for group in groups], axis=1)


def word_features(model, sentences: Sequence[Sequence[str]], site: str = "hook_resid_post", pool: str = "first",
                  batch_size: int = 32) -> Features:
    """Per-word features [L, N, F] of pre-split sentences (lists of words, e.g. a CoNLL-U treebank's).

    Each word is tokenized on its own (syntax.encode_words), between [CLS] and [SEP]; a word's feature is its
    first wordpiece's activation ("first") or the mean over its wordpieces ("mean").
    """
    site = _checked_site(model, site)
    if pool not in WORD_POOLS:
        raise AnalysisError(f"pool={pool!r}: a word's feature is its 'first' wordpiece's or the 'mean' of its pieces.")
    encoded = _encoded_sentences(model, sentences)
    pooled: list[np.ndarray | None] = [None] * len(encoded)
    for chosen, cache in _encoded_runs(model, encoded, f"blocks.*.{site}", batch_size):
        values = np.asarray(cache.stack(site), np.float32)
        values = values.reshape(*values.shape[:3], -1)
        for b, i in enumerate(chosen):
            pooled[i] = _pool_words(values[:, b], encoded[i][1][1:-1], pool)  # [CLS] and [SEP] are no words
    sentence = np.concatenate([np.full(len(words), i) for i, words in enumerate(sentences)])
    return Features(np.concatenate(pooled, axis=1), sentence, site)


def _checked_texts(texts, pairs) -> list:
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts or (pairs is not None and len(pairs) != len(texts)):
        raise AnalysisError(f"pass at least one text (and one pair per text): {len(texts)} texts, "
                            f"{'no' if pairs is None else len(pairs)} pairs.")
    return texts


def _text_runs(model, texts: list, pairs, site: str, batch_size: int, max_length: int | None):
    """(first text's index, Batch, the site's values [L, B, T, F] flattened per token) per batch of texts."""
    for start in range(0, len(texts), batch_size):
        batch = model.tokenize(texts[start:start + batch_size],
                               None if pairs is None else list(pairs[start:start + batch_size]), max_length=max_length)
        _, cache = model.run_with_cache(batch, names=f"blocks.*.{site}")
        values = np.asarray(cache.stack(site), np.float32)
        yield start, batch, values.reshape(*values.shape[:3], -1)


def sentence_features(model, texts, pairs=None, site: str = "hook_resid_post", pool: str = "cls",
                      batch_size: int = 32, max_length: int | None = None) -> Features:
    """Per-text features [L, N, F]: the [CLS] position's activation ("cls") or the mean over real tokens."""
    site = _checked_site(model, site)
    if pool not in SENTENCE_POOLS:
        raise AnalysisError(f"pool={pool!r}: a sentence's feature is its 'cls' position's or the 'mean' of its tokens.")
    texts = _checked_texts(texts, pairs)
    chunks = []
    for _, batch, values in _text_runs(model, texts, pairs, site, batch_size, max_length):
        if pool == "cls":
            chunks.append(values[:, :, 0])
        else:
            mask = np.asarray(batch.attention_mask, np.float32)[None, :, :, None]
            chunks.append((values * mask).sum(2) / mask.sum(2))
    return Features(np.concatenate(chunks, axis=1), np.arange(len(texts)), site)


def token_features(model, texts, pairs=None, site: str = "hook_resid_post", batch_size: int = 32,
                   max_length: int | None = None) -> Features:
    """Per-token features [L, N, F] of texts (and pairs, second texts) as the model tokenizes them: every real
    token but the special ones ([CLS], [SEP], …), with its text (`tokens`) and segment (`segment`: 1 in the
    pair's second text) for labels computed from the tokenization, e.g. "the token is in sentence B"."""
    site = _checked_site(model, site)
    texts = _checked_texts(texts, pairs)
    values, sentence, tokens, segment = [], [], [], []
    for start, batch, stacked in _text_runs(model, texts, pairs, site, batch_size, max_length):
        # the tokenizer's sequence ids: 0 in the text, 1 in its pair, None on special tokens and padding
        sequence = np.array([[-1 if i is None else i for i in row] for row in batch.sequence_ids])
        rows, columns = np.nonzero(sequence >= 0)
        values.append(stacked[:, rows, columns])
        sentence.append(start + rows)
        tokens += model.tokenizer.convert_ids_to_tokens(np.asarray(batch.input_ids)[rows, columns].tolist())
        segment.append(sequence[rows, columns])
    return Features(np.concatenate(values, axis=1), np.concatenate(sentence), site, np.array(tokens, dtype=object),
                    np.concatenate(segment))


# ---- labels from files, splits, control tasks ----------------------------------------------------------


def _tsv_rows(path):
    """(line number, tab-separated columns) of a TSV file's lines, blank lines as [] and '#' comments skipped."""
    path = Path(path)
    if not path.is_file():
        raise DataFileMissing(f"no TSV file at {path}; pass the path of a tab-separated file.")
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.startswith("#"):
            yield number, line.split("\t") if line.strip() else []


def read_word_labels(path, column: int = -1) -> tuple[list[list[str]], list[list[str]]]:
    """(sentences, labels) for token_probe from a TSV file: one word per line, the word in the first column and
    its label in `column` (default the last; CoNLL-style files work with the column's index), a blank line
    between sentences, lines starting with '#' ignored."""
    sentences, labels, words, tags = [], [], [], []
    for number, columns in _tsv_rows(path):
        if not columns:
            if words:
                sentences.append(words)
                labels.append(tags)
            words, tags = [], []
            continue
        if len(columns) < 2 or not -len(columns) <= column < len(columns) or not columns[0]:
            raise DataFileError(f"{path}, line {number}: expected a word and its label separated by a tab (label in "
                                f"column {column}); found {len(columns)} column(s).")
        words.append(columns[0])
        tags.append(columns[column])
    if words:
        sentences.append(words)
        labels.append(tags)
    if not sentences:
        raise DataFileError(f"{path} holds no labelled words; write one word<TAB>label per line.")
    return sentences, labels


def read_text_labels(path) -> tuple[list[str], list[str] | None, list[str]]:
    """(texts, pairs or None, labels) for sentence_probe from a TSV file: text<TAB>label per line, or
    text<TAB>second text<TAB>label for pairs (every line alike); blank lines and '#' lines ignored."""
    rows = [(number, columns) for number, columns in _tsv_rows(path) if columns]
    if not rows:
        raise DataFileError(f"{path} holds no labelled texts; write one text<TAB>label per line.")
    width = len(rows[0][1])
    for number, columns in rows:
        if len(columns) != width or width not in (2, 3):
            raise DataFileError(f"{path}, line {number}: expected text<TAB>label or text<TAB>pair<TAB>label like "
                                f"the first line ({width} columns); found {len(columns)} column(s).")
    texts, labels = [c[0] for _, c in rows], [c[-1] for _, c in rows]
    return texts, ([c[1] for _, c in rows] if width == 3 else None), labels


def encode_labels(labels: Sequence[Hashable], classes: Sequence[Hashable] | None = None) -> tuple[np.ndarray, tuple]:
    """(integer labels [N], the classes in order): classes sorted by their text unless given."""
    classes = tuple(sorted(set(labels), key=str)) if classes is None else tuple(classes)
    index = {c: i for i, c in enumerate(classes)}
    unknown = [label for label in labels if label not in index]
    if unknown:
        raise AnalysisError(f"label {unknown[0]!r} is not one of the classes {classes[:10]}; pass classes=None.")
    return np.array([index[label] for label in labels], np.int32), classes


def control_labels(words: Sequence[str], labels: Sequence[Hashable], seed: int = 0) -> list:
    """Hewitt & Liang's control task: every word type (its text, lowercased) gets one label drawn at random
    from the task's empirical label distribution; each word occurrence takes its type's label."""
    if len(words) != len(labels):
        raise AnalysisError(f"{len(words)} words but {len(labels)} labels; pass one label per word.")
    rng = np.random.default_rng(seed)
    types = sorted({w.lower() for w in words})
    drawn = rng.choice(len(labels), size=len(types))  # a uniformly drawn occurrence: the label distribution
    by_type = {t: labels[i] for t, i in zip(types, drawn)}
    return [by_type[w.lower()] for w in words]


def split_sentences(n_sentences: int, dev: float = 0.1, test: float = 0.2, seed: int = 0) -> dict[str, np.ndarray]:
    """{"train", "dev", "test"}: sentence indices shuffled and cut by the fractions (dev may be 0)."""
    if not (0 <= dev < 1 and 0 < test < 1 and dev + test < 1):
        raise AnalysisError(f"dev={dev}, test={test}: fractions in [0, 1) with dev + test < 1 and a test split.")
    order = np.random.default_rng(seed).permutation(n_sentences)
    n_test, n_dev = max(1, round(test * n_sentences)), round(dev * n_sentences)
    if n_test + n_dev >= n_sentences:
        raise AnalysisError(f"{n_sentences} sentences leave nothing to train on with dev={dev}, test={test}.")
    return {"test": np.sort(order[:n_test]), "dev": np.sort(order[n_test:n_test + n_dev]),
            "train": np.sort(order[n_test + n_dev:])}


# ---- training every layer's probe at once --------------------------------------------------------------


def _cross_entropy(params, x, y):
    logits = x @ params["W"] + params.get("b", 0.0)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def _objective(params, x, y, l2):
    return _cross_entropy(params, x, y) + 0.5 * l2 * jnp.sum(params["W"] ** 2)


def _fit_one_layer(x, y, x_dev, y_dev, init, l2, max_steps, patience, tol):
    """L-BFGS on one layer's probe; returns (parameters with the best dev loss, the step they come from)."""
    objective = functools.partial(_objective, x=x, y=y, l2=l2)
    # Without a dev split the "dev loss" is the objective itself, which L-BFGS's line search never increases: it
    # stops improving (patience runs out) once float32 can no longer lower it.
    monitor = (lambda p: _cross_entropy(p, x_dev, y_dev)) if x_dev is not None else objective
    solver = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(objective)

    def running(carry):
        _, state, _, _, step, since_best = carry
        gradient_norm = otu.tree_norm(otu.tree_get(state, "grad"))
        return (step < max_steps) & (since_best <= patience) & ((step == 0) | (gradient_norm > tol))

    def step_once(carry):
        params, state, best, best_loss, step, since_best = carry
        value, grad = value_and_grad(params, state=state)
        updates, state = solver.update(grad, state, params, value=value, grad=grad, value_fn=objective)
        params = optax.apply_updates(params, updates)
        loss = monitor(params)
        better = loss < best_loss
        best = jax.tree.map(lambda new, old: jnp.where(better, new, old), params, best)
        return (params, state, best, jnp.where(better, loss, best_loss), step + 1,
                jnp.where(better, 0, since_best + 1))

    carry = (init, solver.init(init), init, monitor(init), jnp.array(0), jnp.array(0))
    _, _, best, _, steps, since_best = jax.lax.while_loop(running, step_once, carry)
    return best, steps - since_best


def vectorised_layers() -> bool:
    """Whether to train the layers' probes side by side (vmap) or one after another in the same program (lax.map).

    On CPU, XLA's batched matmul [L, N, F] × [L, F, C] runs several times slower than L plain ones, and a
    vmapped loop runs every layer until the slowest has converged; accelerators gain from running them together.
    """
    return jax.default_backend() != "cpu"


@functools.partial(jax.jit, static_argnames=("num_classes", "bias", "vectorised"))
def _fit_layers(x, y, x_dev, y_dev, l2, tol, max_steps, patience, *, num_classes, bias, vectorised):
    """Every layer's probe in one program: x [L, N, F], y [N] → ({"W": [L, F, C], "b": [L, C]}, steps [L])."""
    init = {"W": jnp.zeros((x.shape[-1], num_classes), x.dtype)}
    if bias:
        init["b"] = jnp.zeros((num_classes,), x.dtype)
    fit = functools.partial(_fit_one_layer, y=y, y_dev=y_dev, init=init, l2=l2, max_steps=max_steps,
                            patience=patience, tol=tol)
    if vectorised:
        return jax.vmap(fit)(x, x_dev=x_dev)
    return jax.lax.map(lambda layer: fit(layer[0], x_dev=layer[1]), (x, x_dev))


def fit_linear_probes(features, labels, *, num_classes: int | None = None, l2: float = 1e-3, dev=None,
                      max_steps: int = 500, patience: int | None = 20, tol: float = 1e-6, bias: bool = True,
                      vectorised: bool | None = None):
    """Train one multinomial logistic probe per layer, all in one compiled program (layers side by side with
    vmap, or in turn with lax.map: vectorised=None picks by device, see vectorised_layers).

    features [L, N, F] (a Features or an array), labels [N] integers in [0, C). dev: (features [L, M, F],
    labels [M]) for early stopping: keep the step with the lowest dev cross-entropy, stop after `patience`
    steps without a better one (None: run to ‖∇‖ ≤ tol or max_steps). Without dev, `patience` steps that do
    not lower the objective end the run. bias=False fits no b (scikit-learn's fit_intercept=False). Returns
    ({"W": [L, F, C], "b": [L, C]} as NumPy, steps [L]: the step of the kept parameters).
    """
    x = np.asarray(getattr(features, "values", features), np.float32)
    y = np.asarray(labels)
    if x.ndim != 3 or y.shape != (x.shape[1],):
        raise AnalysisError(f"features must be [L, N, F] with one label per item; got {x.shape} and {y.shape}.")
    num_classes = int(y.max()) + 1 if num_classes is None else num_classes
    if y.min() < 0 or y.max() >= num_classes:
        raise AnalysisError(f"labels must be integers in [0, {num_classes}); found {y.min()}…{y.max()}.")
    x_dev = y_dev = None
    if dev is not None:
        x_dev = np.asarray(getattr(dev[0], "values", dev[0]), np.float32)
        y_dev = np.asarray(dev[1])
        if x_dev.shape[0] != x.shape[0] or x_dev.shape[2] != x.shape[2] or y_dev.shape != (x_dev.shape[1],):
            raise AnalysisError(f"dev features {x_dev.shape} / labels {y_dev.shape} do not match the training "
                                f"features {x.shape}; pass the same layers and feature size.")
    params, steps = _fit_layers(jnp.asarray(x), jnp.asarray(y), x_dev, y_dev, jnp.float32(l2), jnp.float32(tol),
                                jnp.int32(max_steps), jnp.int32(max_steps if patience is None else patience),
                                num_classes=num_classes, bias=bias,
                                vectorised=vectorised_layers() if vectorised is None else vectorised)
    return jax.tree.map(np.asarray, params), np.asarray(steps)


def predict(params, features) -> np.ndarray:
    """Predicted class per layer and item: [L, N] from features [L, N, F]."""
    x = np.asarray(getattr(features, "values", features), np.float32)
    logits = np.einsum("LNF,LFC->LNC", x, params["W"])
    return np.argmax(logits + params["b"][:, None] if "b" in params else logits, axis=-1)


# ---- accuracy with a bootstrap interval ----------------------------------------------------------------


def bootstrap_accuracy(correct, clusters=None, samples: int = 1000, level: float = 0.95,
                       seed: int = 0) -> np.ndarray:
    """[L, 2] percentile bootstrap interval of the accuracy of each row of correct [L, N] (booleans).

    clusters [N]: resample whole clusters (the sentences words come from, whose errors are correlated)
    instead of single items. Each resample draws as many clusters as there are, with replacement.
    """
    correct = np.asarray(correct, np.float64)
    clusters = np.arange(correct.shape[1]) if clusters is None else np.asarray(clusters)
    ids, cluster_of = np.unique(clusters, return_inverse=True)
    hits = np.zeros((correct.shape[0], len(ids)))
    np.add.at(hits.T, cluster_of, correct.T)  # [L, K] correct items per cluster
    sizes = np.bincount(cluster_of, minlength=len(ids)).astype(np.float64)
    draws = np.random.default_rng(seed).multinomial(len(ids), np.full(len(ids), 1 / len(ids)), size=samples)
    accuracy = (draws @ hits.T) / (draws @ sizes)[:, None]  # [R, L]
    tail = 100 * (1 - level) / 2
    return np.percentile(accuracy, [tail, 100 - tail], axis=0).T


@dataclasses.dataclass
class ProbeResult:
    """Test accuracy of each layer's probe with its bootstrap interval; the control task's, when run."""

    accuracy: np.ndarray  # [L] on the test split
    interval: np.ndarray  # [L, 2] bootstrap interval (sentences resampled)
    params: dict  # {"W": [L, F, C], "b": [L, C]}
    steps: np.ndarray  # [L] L-BFGS step of the kept parameters
    classes: tuple
    site: str
    control: ProbeResult | None = None

    @property
    def selectivity(self) -> np.ndarray:
        """Task accuracy − control-task accuracy per layer (Hewitt & Liang 2019)."""
        if self.control is None:
            raise AnalysisError("no control task was run; pass control=True.")
        return self.accuracy - self.control.accuracy

    def table(self) -> list[dict]:
        """One row per layer (0-indexed): accuracy, interval, and control accuracy and selectivity when run."""
        rows = []
        for layer, (accuracy, (low, high)) in enumerate(zip(self.accuracy, self.interval)):
            row = {"layer": layer, "accuracy": float(accuracy), "low": float(low), "high": float(high)}
            if self.control is not None:
                row |= {"control": float(self.control.accuracy[layer]), "selectivity": float(self.selectivity[layer])}
            rows.append(row)
        return rows


def probe(features: Features, labels: Sequence[Hashable], *, dev: float = 0.1, test: float = 0.2, l2: float = 1e-3,
          max_steps: int = 500, patience: int = 20, seed: int = 0, samples: int = 1000,
          classes: Sequence[Hashable] | None = None) -> ProbeResult:
    """Split by sentence, train every layer's probe (early stopping on dev), score on test with a bootstrap."""
    if len(labels) != len(features):
        raise AnalysisError(f"{len(features)} items but {len(labels)} labels; pass one label per word or sentence.")
    y, classes = encode_labels(labels, classes)
    splits = split_sentences(int(features.sentence.max()) + 1, dev, test, seed)
    part = {name: np.isin(features.sentence, chosen) for name, chosen in splits.items()}
    dev_set = (features.take(part["dev"]), y[part["dev"]]) if part["dev"].any() else None
    params, steps = fit_linear_probes(features.take(part["train"]), y[part["train"]], num_classes=len(classes), l2=l2,
                                      dev=dev_set, max_steps=max_steps, patience=patience)
    tested = features.take(part["test"])
    correct = predict(params, tested) == y[part["test"]]
    return ProbeResult(correct.mean(1), bootstrap_accuracy(correct, tested.sentence, samples, seed=seed), params,
                       steps, classes, features.site)


def token_probe(model, sentences: Sequence[Sequence[str]], labels: Sequence[Sequence[Hashable]], *,
                site: str = "hook_resid_post", pool: str = "first", control: bool = True, **options) -> ProbeResult:
    """A probe of word labels on every layer (labels: one list per sentence, one label per word), with
    Hewitt & Liang's control task when `control`. options: probe()'s (dev, test, l2, seed, …)."""
    if len(labels) != len(sentences) or any(len(w) != len(t) for w, t in zip(sentences, labels)):
        raise AnalysisError("labels must hold one list per sentence with one label per word.")
    features = word_features(model, sentences, site, pool)
    flat = [label for sentence_labels in labels for label in sentence_labels]
    result = probe(features, flat, **options)
    if control:
        words = [word for words in sentences for word in words]
        result.control = probe(features, control_labels(words, flat, options.get("seed", 0)), **options)
    return result


def sentence_probe(model, texts, labels: Sequence[Hashable], *, pairs=None, site: str = "hook_resid_post",
                   pool: str = "cls", **options) -> ProbeResult:
    """A probe of text labels on every layer ([CLS] or mean-pooled features). options: probe()'s."""
    return probe(sentence_features(model, texts, pairs, site, pool), labels, **options)


# ---- structural probes (Hewitt & Manning 2019) ----------------------------------------------------------

STRUCTURAL_KINDS = ("distance", "depth")
PUNCTUATION = ("PUNCT",)  # UD's tag; their PTB code left out '' , . : `` -LRB- -RRB-
SPEARMAN_LENGTHS = range(5, 51)  # sentence lengths whose Spearman means are averaged, as their reports do


def tree_depths(heads: Sequence[int]) -> np.ndarray:
    """Edges from each word up to the root word (heads 1-indexed, 0 = ROOT as in CoNLL-U): [W]."""
    depths = np.zeros(len(heads), np.int64)
    for word in range(len(heads)):
        step, seen = word, 0
        while heads[step] != 0:
            step, seen = heads[step] - 1, seen + 1
            if seen > len(heads):
                raise AnalysisError(f"heads {list(heads)} contain a cycle; each word's chain must reach the root.")
        depths[word] = seen
    return depths


def tree_distances(heads: Sequence[int]) -> np.ndarray:
    """Path length between every two words of the tree: [W, W] (through their lowest common ancestor)."""
    chains = []
    for word in range(len(heads)):
        chain = [word]
        while heads[chain[-1]] != 0:
            chain.append(heads[chain[-1]] - 1)
        chains.append({node: steps for steps, node in enumerate(chain)})
    n = len(heads)
    distances = np.zeros((n, n), np.int64)
    for i in range(n):
        for j in range(n):
            distances[i, j] = min(steps + chains[j][node] for node, steps in chains[i].items() if node in chains[j])
    tree_depths(heads)  # a cycle would have looped above; heads past the sentence are the reader's error
    return distances


def _probe_values(B, x, kind):
    """Squared distances ‖B(h_i − h_j)‖² [..., W, W] or squared norms ‖B h_i‖² [..., W] of x [..., W, F]."""
    t = x @ B
    if kind == "depth":
        return jnp.sum(t**2, -1)
    return jnp.sum((t[..., :, None, :] - t[..., None, :, :]) ** 2, -1)


def structural_loss(B, x, targets, lengths, kind):
    """Their L1 loss: per sentence Σ |predicted − gold| over real words (pairs), divided by n (depth) or n²
    (distance), then the mean over the batch's sentences. x [S, W, F], targets [S, W(, W)] (−1: padding)."""
    real = targets >= 0
    per_sentence = jnp.sum(jnp.abs(_probe_values(B, x, kind) - targets) * real, axis=tuple(range(1, targets.ndim)))
    n = lengths.astype(x.dtype)
    return jnp.mean(per_sentence / (n if kind == "depth" else n**2))


@dataclasses.dataclass(frozen=True)
class Trees:
    """Sentences padded to W words: features [L, S, W, F], gold distances [S, W, W] or depths [S, W] (−1 on
    padding), lengths [S], punctuation [S, W] (UPOS PUNCT) and each sentence's root word [S]."""

    features: np.ndarray
    targets: np.ndarray
    lengths: np.ndarray
    punctuation: np.ndarray
    roots: np.ndarray
    kind: str

    def take(self, chosen) -> Trees:
        return Trees(self.features[:, chosen], self.targets[chosen], self.lengths[chosen], self.punctuation[chosen],
                     self.roots[chosen], self.kind)


def tree_data(model, sentences, kind: str = "distance", site: str = "hook_resid_post", pool: str = "mean") -> Trees:
    """Features and gold targets of CoNLL-U trees (syntax.Sentence list) for a structural probe; a word's feature is
    the mean of its wordpieces' by default, as their BERT features are."""
    if kind not in STRUCTURAL_KINDS:
        raise AnalysisError(f"kind={kind!r}: a structural probe predicts 'distance' (word pairs) or 'depth' (words).")
    flat = word_features(model, [s.words for s in sentences], site, pool)
    lengths = np.array([len(s.words) for s in sentences])
    S, W = len(sentences), int(lengths.max())
    features = np.zeros((flat.values.shape[0], S, W, flat.values.shape[-1]), np.float32)
    targets = np.full((S, W, W) if kind == "distance" else (S, W), -1.0, np.float32)
    punctuation = np.zeros((S, W), bool)
    start = 0
    for s, sentence in enumerate(sentences):
        n = lengths[s]
        features[:, s, :n] = flat.values[:, start:start + n]
        start += n
        gold = tree_distances(sentence.heads) if kind == "distance" else tree_depths(sentence.heads)
        targets[(s, *np.ix_(*[range(n)] * gold.ndim))] = gold
        punctuation[s, :n] = [tag in PUNCTUATION for tag in sentence.upos or [""] * n]
    roots = np.array([sentence.heads.index(0) for sentence in sentences])
    return Trees(features, targets, lengths, punctuation, roots, kind)


@functools.partial(jax.jit, static_argnames=("kind", "optimizer"))
def _structural_step(B, state, x, targets, lengths, scale, *, kind, optimizer):
    """One Adam step of every layer's probe: B [L, F, K], x [L, S, W, F], scale [L] (each layer's learning rate over
    the optimiser's: Adam's step is linear in it, as when torch's scheduler lowers the rate) → (B, state, loss [L])."""
    def one_layer(B, state, x, scale):
        loss, grad = jax.value_and_grad(structural_loss)(B, x, targets, lengths, kind)
        updates, state = optimizer.update(grad, state, B)
        return optax.apply_updates(B, jax.tree.map(lambda u: u * scale, updates)), state, loss

    return jax.vmap(one_layer)(B, state, x, scale)


@functools.partial(jax.jit, static_argnames="kind")
def _structural_losses(B, x, targets, lengths, *, kind):
    return jax.vmap(structural_loss, in_axes=(0, 0, None, None, None))(B, x, targets, lengths, kind)


@dataclasses.dataclass
class _Regimen:
    """Hewitt & Manning's regimen.py, per layer: ReduceLROnPlateau(mode="min", factor=0.1, patience=0) on the dev
    loss (torch's defaults: threshold 1e-4 relative, eps 1e-8), parameters kept when the dev loss falls below the
    best kept − 1e-4, and training stopped once the best is more than 4 epochs old."""

    rate: np.ndarray  # [L] each layer's learning rate
    plateau_best: np.ndarray  # [L] the scheduler's best dev loss
    kept_loss: np.ndarray  # [L] dev loss of the kept parameters
    kept_epoch: np.ndarray  # [L]
    stopped: np.ndarray  # [L] bool

    @classmethod
    def start(cls, layers: int, learning_rate: float) -> _Regimen:
        return cls(np.full(layers, learning_rate), np.full(layers, np.inf), np.full(layers, np.inf),
                   np.full(layers, -1), np.zeros(layers, bool))

    def epoch_end(self, epoch: int, dev_loss: np.ndarray) -> np.ndarray:
        """Update every running layer after an epoch; returns [L] whether to keep its current parameters."""
        running = ~self.stopped
        plateau = running & ~(dev_loss < self.plateau_best * (1 - 1e-4))  # patience 0: one bad epoch lowers the rate
        self.plateau_best = np.where(running & ~plateau, dev_loss, self.plateau_best)
        lowered = self.rate * 0.1
        self.rate = np.where(plateau & (self.rate - lowered > 1e-8), lowered, self.rate)
        keep = running & (dev_loss < self.kept_loss - 1e-4)
        self.kept_loss = np.where(keep, dev_loss, self.kept_loss)
        self.kept_epoch = np.where(keep, epoch, self.kept_epoch)
        self.stopped |= running & ~keep & (self.kept_epoch < epoch - 4)
        return keep


def fit_structural_probes(trees: Trees, *, rank: int | None = None, learning_rate: float = 1e-3, epochs: int = 40,
                          batch_size: int = 20, dev: Trees | None = None, seed: int = 0,
                          init=None) -> tuple[np.ndarray, np.ndarray]:
    """Train every layer's B [F, rank] (rank None: F, their configs' full rank) with Adam on their L1 loss, B
    uniform in ±0.05 (theirs) unless init [L, F, rank] is given, batches of 20 sentences, up to 40 epochs.

    With dev, each layer follows their regimen (_Regimen): its learning rate drops ×0.1 after each epoch whose dev
    loss is no better, the B of its best epoch is kept, and it stops 5 epochs after that; training ends when every
    layer has stopped. Without dev, the last epoch's B is returned. Returns (B [L, F, rank], training loss per step
    [steps, L]; a stopped layer's steps do not move its B)."""
    L, _, _, F = trees.features.shape
    if init is None:
        init = jax.random.uniform(jax.random.key(seed), (L, F, rank or F), jnp.float32, -0.05, 0.05)
    B = jnp.asarray(init, jnp.float32)
    optimizer = adamw(learning_rate, max_grad_norm=None)  # Adam: no weight decay, no clipping, as theirs
    state = jax.vmap(optimizer.init)(B)
    rng = np.random.default_rng(seed)
    regimen = _Regimen.start(L, learning_rate)
    losses, best = [], B
    for epoch in range(epochs):
        scale = jnp.asarray(np.where(regimen.stopped, 0.0, regimen.rate / learning_rate), jnp.float32)
        order = rng.permutation(len(trees.lengths))
        for start in range(0, len(order), batch_size):
            part = trees.take(order[start:start + batch_size])
            B, state, loss = _structural_step(B, state, part.features, part.targets, part.lengths, scale,
                                              kind=trees.kind, optimizer=optimizer)
            losses.append(np.asarray(loss))
        if dev is None:
            best = B
            continue
        keep = regimen.epoch_end(epoch, np.asarray(_structural_losses(B, dev.features, dev.targets, dev.lengths,
                                                                      kind=trees.kind)))
        best = jnp.where(keep[:, None, None], B, best)
        if regimen.stopped.all():
            break
    return np.asarray(best), np.array(losses)


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1…n with ties given their average rank (as Spearman's ρ needs)."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(a, b) -> float:
    """Spearman's ρ: Pearson's correlation of the ranks (NaN when either side is constant)."""
    ra, rb = _ranks(np.asarray(a, np.float64)), _ranks(np.asarray(b, np.float64))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = np.sqrt((ra**2).sum() * (rb**2).sum())
    return float((ra * rb).sum() / denominator) if denominator > 0 else float("nan")


def spanning_tree_edges(distances: np.ndarray, punctuation: np.ndarray) -> set[tuple[int, int]]:
    """Edges (i < j) of the minimum spanning tree of the words that are not punctuation (Kruskal: pairs by
    increasing distance, ties in row-major order, as their evaluation builds it)."""
    kept = np.flatnonzero(~punctuation)
    parent = {int(i): int(i) for i in kept}

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    pairs = [(i, j) for i in kept for j in kept]
    edges = set()
    for i, j in sorted(pairs, key=lambda pair: distances[pair]):
        a, b = root(int(i)), root(int(j))
        if a != b:
            parent[a] = b
            edges.add((int(min(i, j)), int(max(i, j))))
    return edges


def uuas(predicted: Sequence[np.ndarray], trees: Trees) -> float:
    """Undirected unlabelled attachment score: the share of gold edges (the spanning tree of the gold
    distances, punctuation left out) that the spanning tree of the predicted distances has, over all sentences."""
    correct = total = 0
    for s, distances in enumerate(predicted):
        n = trees.lengths[s]
        gold = spanning_tree_edges(trees.targets[s, :n, :n], trees.punctuation[s, :n])
        correct += len(gold & spanning_tree_edges(np.asarray(distances)[:n, :n], trees.punctuation[s, :n]))
        total += len(gold)
    return correct / total


def mean_spearman(predicted: Sequence[np.ndarray], trees: Trees) -> float:
    """Spearman between predicted and gold values, per word's row (distance) or per sentence (depth), averaged
    within each sentence length, then over lengths 5–50 (their report); NaN when no sentence has 5–50 words."""
    by_length: dict[int, list[float]] = {}
    for s, values in enumerate(predicted):
        n = int(trees.lengths[s])
        cut = (slice(0, n),) * (2 if trees.kind == "distance" else 1)
        values, gold = np.asarray(values)[cut], trees.targets[s][cut]
        rows = zip(values, gold) if trees.kind == "distance" else [(values, gold)]
        by_length.setdefault(n, []).extend(spearman(p, g) for p, g in rows)
    means = [np.mean(by_length[n]) for n in SPEARMAN_LENGTHS if n in by_length]
    return float(np.mean(means)) if means else float("nan")


def root_accuracy(predicted: Sequence[np.ndarray], trees: Trees) -> float:
    """Share of sentences whose least deep predicted word (punctuation left out) is the gold root."""
    hits = []
    for s, depths in enumerate(predicted):
        n = trees.lengths[s]
        depths = np.where(trees.punctuation[s, :n], np.inf, np.asarray(depths)[:n])
        hits.append(int(np.argmin(depths)) == trees.roots[s])
    return float(np.mean(hits))


@dataclasses.dataclass
class StructuralResult:
    """Per layer on the test sentences: UUAS and distance Spearman, or root accuracy and depth Spearman."""

    kind: str
    spearman: np.ndarray  # [L]
    uuas: np.ndarray | None  # [L], distance probes
    root_accuracy: np.ndarray | None  # [L], depth probes
    B: np.ndarray  # [L, F, rank]
    losses: np.ndarray  # [steps, L] training loss

    def table(self) -> list[dict]:
        score = self.uuas if self.kind == "distance" else self.root_accuracy
        name = "uuas" if self.kind == "distance" else "root_accuracy"
        return [{"layer": layer, name: float(score[layer]), "spearman": float(self.spearman[layer])}
                for layer in range(len(self.spearman))]


def evaluate_structural(B: np.ndarray, trees: Trees) -> dict[str, np.ndarray]:
    """Their metrics for every layer's B on `trees`: {"spearman", "uuas" | "root_accuracy"} each [L]."""
    scores: dict[str, list[float]] = {}
    for layer in range(B.shape[0]):
        predicted = np.asarray(_probe_values(jnp.asarray(B[layer]), trees.features[layer], trees.kind))
        scores.setdefault("spearman", []).append(mean_spearman(predicted, trees))
        if trees.kind == "distance":
            scores.setdefault("uuas", []).append(uuas(predicted, trees))
        else:
            scores.setdefault("root_accuracy", []).append(root_accuracy(predicted, trees))
    return {name: np.array(values) for name, values in scores.items()}


def structural_probe(model, sentences, kind: str = "distance", *, site: str = "hook_resid_post",
                     pool: str = "mean", dev: float = 0.1, test: float = 0.2, seed: int = 0,
                     **options) -> StructuralResult:
    """Hewitt & Manning's distance or depth probe on every layer, trained on a split of the trees and scored
    on the held-out test sentences. sentences: syntax.Sentence list or a CoNLL-U path. options:
    fit_structural_probes' (rank, learning_rate, epochs, batch_size)."""
    sentences = read_conllu(sentences) if isinstance(sentences, str) or hasattr(sentences, "read_text") else sentences
    trees = tree_data(model, sentences, kind, site, pool)
    splits = split_sentences(len(sentences), dev, test, seed)
    B, losses = fit_structural_probes(trees.take(splits["train"]),
                                      dev=trees.take(splits["dev"]) if len(splits["dev"]) else None, seed=seed,
                                      **options)
    scores = evaluate_structural(B, trees.take(splits["test"]))
    return StructuralResult(kind, scores["spearman"], scores.get("uuas"), scores.get("root_accuracy"), B, losses)


# ---- Clark et al.'s attention-based probe (2019, section 5, Table 3) ----------------------------------------

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
    S, W, E = len(sentences), max(lengths), model.hook_sites["embed.hook_embed"][0][-1]
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    attention = np.zeros((S, 2 * L * H, W + 2, W + 2), np.float32)
    embeddings = np.zeros((S, W, E), np.float32)
    heads, scored = np.full((S, W), -1, np.int32), np.zeros((S, W), bool)
    distances = np.zeros((S, DISTANCE_FEATURES, W, W + 1), np.float32)
    for chosen, cache in _encoded_runs(model, encoded, ["blocks.*.attn.hook_pattern", "embed.hook_embed"],
                                       batch_size):
        pattern = np.asarray(cache.stack("attn.hook_pattern"), np.float32)  # [L, B, H, T, S]
        embedded = np.asarray(cache["embed.hook_embed"], np.float32)
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
