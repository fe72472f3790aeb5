"""Linear probes: every layer's multinomial logistic regression fitted at once (L-BFGS), bootstrap intervals,
control tasks and selectivity (Hewitt & Liang 2019); the package docstring gives the objective."""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from collections.abc import Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu

from minibert.analysis._finite import refuse_nonfinite
from minibert.analysis.probes.features import (
    Features,
    control_labels,
    encode_labels,
    sentence_features,
    split_sentences,
    word_features,
)
from minibert.errors import AnalysisError

DEFAULT_L2 = 1e-3  # probe() and fit_linear_probes: a weak penalty, the optimum of a nearly unregularised probe
L2_GRID = (1e-3, 1e-2, 1e-1, 1.0, 10.0)  # token_probe's sweep with the control task (Hewitt & Liang 2019)
SPLITS = ("sentence", "type")


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


def fit_linear_probes(features, labels, *, num_classes: int | None = None, l2: float = DEFAULT_L2, dev=None,
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
    if not (isinstance(l2, numbers.Real) and 0 <= l2 < math.inf):  # NaN fitted W = 0, a negative l2 no optimum
        raise AnalysisError(f"l2={l2!r}: pass a finite number ≥ 0, the weight penalty (token_probe also takes None "
                            f"to choose it by selectivity).")
    x = checked_features(features)
    y = _checked_labels(labels, x.shape[1])
    num_classes = int(y.max()) + 1 if num_classes is None else num_classes
    if y.min() < 0 or y.max() >= num_classes:
        raise AnalysisError(f"labels must be integers in [0, {num_classes}); found {y.min()}…{y.max()}.")
    if num_classes < 2:
        raise AnalysisError("the labels hold one class: every probe would score accuracy 1.0 by predicting it. "
                            "Pass labels of at least two classes.")
    x_dev = y_dev = None
    if dev is not None:
        x_dev = checked_features(dev[0], "dev features")
        y_dev = _checked_labels(dev[1], x_dev.shape[1], "dev labels")
        if x_dev.shape[0] != x.shape[0] or x_dev.shape[2] != x.shape[2]:
            raise AnalysisError(f"dev features {x_dev.shape} / labels {y_dev.shape} do not match the training "
                                f"features {x.shape}; pass the same layers and feature size.")
    params, steps = _fit_layers(jnp.asarray(x), jnp.asarray(y), x_dev, y_dev, jnp.float32(l2), jnp.float32(tol),
                                jnp.int32(max_steps), jnp.int32(max_steps if patience is None else patience),
                                num_classes=num_classes, bias=bias,
                                vectorised=vectorised_layers() if vectorised is None else vectorised)
    return jax.tree.map(np.asarray, params), np.asarray(steps)


def checked_features(features, what: str = "features") -> np.ndarray:
    """features (a Features or an array) as float32 [L, N, F], refused where empty or not finite: a NaN or an
    infinity fits and predicts a class (argmax of NaN logits is 0) without any sign of the fault."""
    x = np.asarray(getattr(features, "values", features), np.float32)
    if x.ndim != 3 or 0 in x.shape:
        raise AnalysisError(f"{what} must be [L, N, F] with at least one layer, item and feature; got {x.shape}.")
    return refuse_nonfinite(x, lambda bad: (
        f"{what} hold {bad.count} non-finite values (NaN or ±inf), the first at layer {bad.first[0]}, item "
        f"{bad.first[1]}, feature {bad.first[2]} ({bad.value}); a probe on them is meaningless. Drop or fix those "
        f"items (an activation overflowed, or the input carried NaN)."))


def _checked_labels(labels, n: int, what: str = "labels") -> np.ndarray:
    """labels as integers [n]; a column vector [n, 1] is refused by name rather than broadcast."""
    y = np.asarray(labels)
    if y.shape != (n,) or not np.issubdtype(y.dtype, np.integer):
        raise AnalysisError(f"{what} must be integers [N] = [{n}], one per item; got {y.dtype} {y.shape}"
                            + (" (a column vector: pass labels.ravel())" if y.shape == (n, 1) else "") + ".")
    return y


def predict(params, features) -> np.ndarray:
    """Predicted class per layer and item: [L, N] from features [L, N, F]."""
    x = checked_features(features)
    logits = np.einsum("LNF,LFC->LNC", x, params["W"])
    return np.argmax(logits + params["b"][:, None] if "b" in params else logits, axis=-1)


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
    test: np.ndarray | None = None  # [n] indices of the test items among the features' items
    predicted: np.ndarray | None = None  # [L, n] each layer's predicted class index per test item (classes[i])
    gold: np.ndarray | None = None  # [n] the test items' class indices
    dev_accuracy: np.ndarray | None = None  # [L] on the dev split (None without one): what l2 is chosen on
    l2: float | None = None  # the probe's l2
    sweep: list[dict] | None = None  # token_probe's l2 sweep: one row per l2 (dev accuracy, control, selectivity)

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


def probe(features: Features, labels: Sequence[Hashable], *, dev: float = 0.1, test: float = 0.2,
          l2: float = DEFAULT_L2, max_steps: int = 500, patience: int = 20, seed: int = 0, samples: int = 1000,
          classes: Sequence[Hashable] | None = None, groups=None) -> ProbeResult:
    """Split by sentence (or by `groups` [N]: items of one group stay in one split, e.g. word types), train every
    layer's probe (early stopping on dev), score on test with a bootstrap over sentences. The result keeps the
    test items' indices, their gold classes and every layer's predictions (ProbeResult.test/gold/predicted)."""
    checked_features(features)
    if np.ndim(labels) != 1:
        raise AnalysisError(f"labels must be one label per item, a flat list [N]; got shape {np.shape(labels)}"
                            + (" (a column vector: pass labels.ravel())" if np.ndim(labels) == 2 else "") + ".")
    if len(labels) != len(features):
        raise AnalysisError(f"{len(features)} items but {len(labels)} labels; pass one label per word or sentence.")
    y, classes = encode_labels(labels, classes)
    groups = features.sentence if groups is None else np.unique(np.asarray(groups), return_inverse=True)[1]
    if groups.shape != (len(features),):
        raise AnalysisError(f"groups must give one group per item ({len(features)}); got shape {groups.shape}.")
    splits = split_sentences(int(groups.max()) + 1, dev, test, seed)
    part = {name: np.isin(groups, chosen) for name, chosen in splits.items()}
    dev_set = (features.take(part["dev"]), y[part["dev"]]) if part["dev"].any() else None
    params, steps = fit_linear_probes(features.take(part["train"]), y[part["train"]], num_classes=len(classes), l2=l2,
                                      dev=dev_set, max_steps=max_steps, patience=patience)
    tested = features.take(part["test"])
    predicted = predict(params, tested)
    correct = predicted == y[part["test"]]
    dev_accuracy = None if dev_set is None else (predict(params, dev_set[0]) == dev_set[1]).mean(1)
    return ProbeResult(correct.mean(1), bootstrap_accuracy(correct, tested.sentence, samples, seed=seed), params,
                       steps, classes, features.site, test=np.flatnonzero(part["test"]), predicted=predicted,
                       gold=y[part["test"]], dev_accuracy=dev_accuracy, l2=float(l2))


def token_probe(model, sentences: Sequence[Sequence[str]], labels: Sequence[Sequence[Hashable]], *,
                site: str | None = None, pool: str = "first", control: bool = True, l2: float | None = None,
                split: str = "sentence", **options) -> ProbeResult:
    """A probe of word labels on every layer (labels: one list per sentence, one label per word), with
    Hewitt & Liang's control task when `control`. options: probe()'s (dev, test, seed, …).

    site: None reads each block's output (features.layer_output_site: hook_normalized_resid_post in post-LN
    models, the site the probing papers read). l2=None with the control task sweeps L2_GRID: at each value the
    task and control probes are trained, and the value with the highest mean dev selectivity (task − control
    accuracy on the dev split) is kept — Hewitt & Liang's advice to choose probe capacity by selectivity; a
    weak penalty lets a probe memorise each word type's control label. result.l2 says which, result.sweep
    gives every value's dev numbers. l2=None without the control task uses DEFAULT_L2.
    split="type": word types (lowercased) rather than sentences are split, so every test word is a type the
    probe never saw (a lexical-memorisation check); the bootstrap still resamples sentences.
    """
    if len(labels) != len(sentences):
        raise AnalysisError(f"{len(sentences)} sentences but {len(labels)} label lists; pass one list of labels per "
                            f"sentence, one label per word.")
    for i, (words, tags) in enumerate(zip(sentences, labels)):
        if len(words) != len(tags):
            raise AnalysisError(f"sentences[{i}] has {len(words)} words but {len(tags)} labels; pass one label per "
                                f"word.")
    if split not in SPLITS:
        raise AnalysisError(f"split={split!r}: pick 'sentence' or 'type' (unseen word types in test).")
    features = word_features(model, sentences, site, pool)
    flat = [label for sentence_labels in labels for label in sentence_labels]
    words = [word.lower() for words in sentences for word in words]
    options["groups"] = words if split == "type" else None
    if not control:
        return probe(features, flat, l2=DEFAULT_L2 if l2 is None else l2, **options)
    controls = control_labels(words, flat, options.get("seed", 0))
    rows, best = [], None
    for value in (L2_GRID if l2 is None else (l2,)):
        result = probe(features, flat, l2=value, **options)
        result.control = probe(features, controls, l2=value, **options)
        if result.dev_accuracy is None:  # no dev split: nothing to choose on
            return result
        selectivity = float(np.mean(result.dev_accuracy - result.control.dev_accuracy))
        rows.append({"l2": value, "dev_accuracy": float(result.dev_accuracy.mean()),
                     "dev_control": float(result.control.dev_accuracy.mean()), "dev_selectivity": selectivity})
        if best is None or selectivity > best[0]:
            best = (selectivity, result)
    best[1].sweep = rows
    return best[1]


def sentence_probe(model, texts, labels: Sequence[Hashable], *, pairs=None, site: str | None = None,
                   pool: str = "cls", **options) -> ProbeResult:
    """A probe of text labels on every layer ([CLS] or mean-pooled features). options: probe()'s."""
    return probe(sentence_features(model, texts, pairs, site, pool), labels, **options)


