"""Token attributions: how much of a metric's value each input token (or word) accounts for.

They act on the word embeddings x = W_E[input_ids] (the hook embed.hook_embed), positions and segments held at
the input's, as captum's LayerIntegratedGradients on embeddings.word_embeddings does. The baseline x' is the
embedding of [PAD] (baseline="pad"), of [MASK] ("mask") or 0 ("zero") at every position that is not a special
token; [CLS], [SEP] and padding keep their own embedding (docs/circuits.md):

    integrated_gradients   IG_t = Σ_E (x_t − x'_t) ⊙ ∫₀¹ ∂F(x' + α(x − x'))/∂x_t dα   (Sundararajan et al. 2017)
    gradient_x_input       Σ_E x_t ⊙ ∂F(x)/∂x_t
    occlusion              F(x) − F(x with the pieces of one word (or one token) replaced by the baseline's)

The integral is captum's Gauss–Legendre rule over `steps` points (default) or the right Riemann sum
α = k/steps, k = 1..steps. Completeness: Σ_t IG_t = F(x) − F(x') up to the rule's error and rounding.
Each call is one compiled program: the steps (or the occluded words) run `chunk` at a time inside it, their
number traced, so every count of a bucket (analysis.sweeps.padded_count: 1 to 16, 17 to 32, 33 to 64, …) shares
it; integrated gradients and gradient × input (one point) share one too.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from minibert.analysis._finite import check_finite
from minibert.analysis.circuits._checks import check_choice, check_model, metric_of
from minibert.analysis.gradients import _special_ids
from minibert.analysis.sweeps import live_chunk, live_map, live_sum, padded
from minibert.analysis.words import word_groups, word_labels
from minibert.core.contract import StaticFn, static_metric
from minibert.core.encoder import unrolled_stack
from minibert.core.hooks import HookFn
from minibert.core.site_names import EMBED
from minibert.errors import AnalysisError, AnalysisWarning, is_whole, outside_minibert
from minibert.io.tokenizer import Batch
from minibert.runtime.accounting import activation_bytes
from minibert.runtime.model import is_text

METHODS = ("integrated_gradients", "gradient_x_input", "occlusion")
MAX_STEPS = 10_000  # points of any rule: each a forward and backward, so 10,000 is hours on a CPU already
MAX_GAUSS_LEGENDRE = 1000  # numpy's leggauss solves a dense steps × steps eigenproblem: 8 MB and ~1 s at 1,000
BASELINES = ("pad", "mask", "zero")
# Integrated gradients warns for a row whose |Σ_t IG_t − (F(x) − F(x'))| is more than this fraction of
# |F(x) − F(x')| (and more than rounding: ROUNDING_EPS machine epsilons of |F(x)| + |F(x')|).
COMPLETENESS_FRACTION = 0.05
ROUNDING_EPS = 100
INTEGRATIONS = ("gausslegendre", "riemann_right")


def integration_points(steps: int, integration: str = "gausslegendre") -> tuple[np.ndarray, np.ndarray]:
    """(α [steps], weights [steps]) of the rule on [0, 1], as captum's approximation_parameters gives them:
    Gauss–Legendre's nodes and weights moved from [−1, 1] to [0, 1], or α = k/steps with weight 1/steps."""
    if not is_whole(steps) or steps < 1:
        raise AnalysisError(f"steps must be a positive whole number (points of the integral; captum's default is "
                            f"50); got {steps!r}.")
    steps = int(steps)
    check_choice("integration", integration, INTEGRATIONS)
    if integration == "gausslegendre" and steps > MAX_GAUSS_LEGENDRE:
        raise AnalysisError(f"steps={steps} is more Gauss–Legendre points than {MAX_GAUSS_LEGENDRE} (their nodes take "
                            f"memory growing as steps²; captum's default is 50); pass fewer, or "
                            f"integration='riemann_right' for many points.")
    if steps > MAX_STEPS:
        raise AnalysisError(f"steps={steps} is more than {MAX_STEPS:,} points of the integral (each a forward and "
                            f"backward of the model: hours on a CPU, and memory for every point); captum's default "
                            f"is 50 — pass fewer.")
    if integration == "gausslegendre":
        nodes, weights = np.polynomial.legendre.leggauss(steps)
        return 0.5 * (nodes + 1), 0.5 * weights
    return np.arange(1, steps + 1) / steps, np.full(steps, 1 / steps)


@dataclasses.dataclass
class TokenAttribution:
    """Scores per token [B, T] (per word [B, W] for words=True; a row with fewer words ends in zeros), the
    labels of each row's scored tokens or words, F(x) and F(x') per row [B]."""

    scores: np.ndarray
    labels: list[list[str]]
    metric: np.ndarray
    baseline_metric: np.ndarray
    method: str

    @property
    def total(self) -> np.ndarray:
        """Σ of each row's scores [B]."""
        return self.scores.sum(1)

    @property
    def completeness_gap(self) -> np.ndarray:
        """Σ_t IG_t − (F(x) − F(x')) per row [B]: the integral rule's error plus rounding (integrated
        gradients; the other methods make no such promise, so asking them is an AnalysisError)."""
        if self.method != "integrated_gradients":
            raise AnalysisError(f"completeness holds for integrated gradients only: {self.method} scores need not "
                                f"add up to F(x) − F(x'); compare .total with .metric − .baseline_metric yourself, "
                                f"or use method='integrated_gradients'.")
        return self.total - (self.metric - self.baseline_metric)


def _replace(value, ctx, new):
    return new.astype(value.dtype)


def _metric_at(model, state, inputs, metric: StaticFn, embedded) -> jax.Array:
    """F per row [B] with the word embeddings replaced by `embedded` [B, T, E] (positions and segments held)."""
    out, _ = model.forward_fn((), {EMBED: HookFn(_replace, new=embedded)})(state, inputs)
    values = metric_of(metric, out, inputs.shape[0])
    if values.ndim == 0:  # checked while tracing, before anything runs
        raise AnalysisError(f"token attributions are per row: the metric must return one value per batch row, shape "
                            f"({inputs.shape[0]},), not one value for the batch; return e.g. out.logits[:, 0, c] "
                            f"rather than its mean.")
    return values


def _integrated(model, state, inputs, start, end, baseline, alphas, weights, steps, *, metric: StaticFn,
                chunk: int):
    """(Σ_E (end − start) ⊙ Σ_k w_k ∂F(start + α_k(end − start)), F(end), F(baseline)) over the first `steps`
    (traced) of the padded points — IG from start = x', gradient × input from start = 0 with the one point α = 1
    (compiled with model.jit)."""
    def weighted_gradient(point):
        alpha, weight = point
        gradient = jax.grad(unrolled_stack()(lambda x: _metric_at(model, state, inputs, metric, x).sum()))
        return weight * gradient(start + alpha * (end - start))

    mean_gradient = live_sum(weighted_gradient, (alphas, weights), steps, chunk)
    return (((end - start) * mean_gradient).sum(-1), _metric_at(model, state, inputs, metric, end),
            _metric_at(model, state, inputs, metric, baseline))


def _occluded(model, state, inputs, embedded, baseline, masks, units, *, metric: StaticFn, chunk: int):
    """(F(x) − F(x with masks[k]'s positions from the baseline) [K, B] for the first `units` (traced) of the padded
    masks, 0 past them; F(x), F(x')) (model.jit)."""
    full = _metric_at(model, state, inputs, metric, embedded)
    occlude = lambda mask: full - _metric_at(model, state, inputs, metric,  # noqa: E731
                                             jnp.where(mask[..., None], baseline, embedded))
    return live_map(occlude, masks, units, chunk), full, _metric_at(model, state, inputs, metric, baseline)


def _baseline_embeddings(model, inputs, baseline: str) -> tuple[jax.Array, jax.Array]:
    """(x [B, T, E], x' [B, T, E], special bool [B, T]): the word embeddings and the baseline's, the specials and
    padding (where x' keeps x) marked."""
    if model.tokenizer is None:
        raise AnalysisError("token attributions keep the special tokens in the baseline, so they need the model's "
                            "tokenizer; load the model with its tokenizer files.")
    ids = inputs.input_ids
    special = jnp.isin(ids, jnp.asarray(_special_ids(model))) | (inputs.attention_mask == 0)
    table = model.W_E
    embedded = table[ids]
    if baseline == "zero":
        replaced = jnp.zeros_like(embedded)
    else:
        replaced = jnp.broadcast_to(table[getattr(model.tokenizer, f"{baseline}_token_id")], embedded.shape)
    return embedded, jnp.where(special[..., None], embedded, replaced), np.asarray(special)


def _units(batch, inputs, words: bool) -> list[list[list[int]]]:
    """Per row, the positions of each unit scored: each word's pieces (words=True), else each real token."""
    mask = np.asarray(inputs.attention_mask)
    if not words:
        return [[[t] for t in np.flatnonzero(row)] for row in mask]
    if not isinstance(batch, Batch):
        raise AnalysisError("words=True needs the tokenizer's word boundaries: pass texts or a Batch "
                            "(model.tokenize), not id arrays.")
    return [word_groups(batch.word_ids[b], batch.sequence_ids[b], mask[b]) for b in range(len(mask))]


def _labels(model, batch, inputs, units, words: bool) -> list[list[str]]:
    """Each unit's label: a word's pieces joined without "##" (words=True), else the token as it is ("##bel")."""
    if isinstance(batch, Batch):
        tokens = batch.tokens
    else:
        tokens = model.to_str_tokens(np.asarray(inputs.input_ids))
    if not words:
        return [[tokens[b][t] for (t,) in row] for b, row in enumerate(units)]
    return [word_labels(tokens[b], row) for b, row in enumerate(units)]


def _unit_masks(units, shape) -> np.ndarray:
    """bool [K, B, T]: item k covers the k-th unit of every row (nothing in a row with fewer units)."""
    masks = np.zeros((max(len(row) for row in units), *shape), bool)
    for b, row in enumerate(units):
        for k, positions in enumerate(row):
            masks[k, b, positions] = True
    return masks


def _per_unit(token_scores: np.ndarray, units) -> np.ndarray:
    """[B, T] token scores → [B, W]: each unit's tokens summed."""
    out = np.zeros((len(units), max(len(row) for row in units)), token_scores.dtype)
    for b, row in enumerate(units):
        for k, positions in enumerate(row):
            out[b, k] = token_scores[b, positions].sum()
    return out


def token_attribution(model, batch, metric: Callable, method: str = "integrated_gradients", baseline: str = "pad",
                      steps: int = 50, integration: str = "gausslegendre", words: bool = False) -> TokenAttribution:
    """Per-token (or, with words=True, per-word: a word's pieces summed, or occluded together) attributions of
    `metric(output)`, one value per row [B], to the input tokens → TokenAttribution (module docstring).

    method: "integrated_gradients" (`steps` points of `integration`, "gausslegendre" or "riemann_right"),
    "gradient_x_input" or "occlusion" (every word, or token, of every row in one program).
    baseline: "pad", "mask" or "zero" (specials and padding keep their own embedding, and are never occluded).
    Every argument is checked whatever the method; gradient × input uses no baseline, steps or integration.
    Integrated gradients warns (AnalysisWarning) when a row's |completeness_gap| is more than 5 % of
    |F(x) − F(x')| (and more than rounding, 100 machine epsilons of |F(x)| + |F(x')|), naming the rows and about
    how many steps the worst would need.
    """
    check_model(model)
    check_choice("method", method, METHODS)
    check_choice("baseline", baseline, BASELINES)
    if not isinstance(words, bool):
        raise AnalysisError(f"words must be True (a score per word) or False (per token); got {words!r}.")
    alphas, weights = integration_points(steps, integration)  # checked whatever the method, used by IG only
    if is_text(batch):
        batch = model.tokenize(batch)
    inputs = model.inputs(batch)
    B, T = inputs.shape
    keyed = static_metric(metric)
    embedded, base, special = _baseline_embeddings(model, inputs, baseline)
    units = _units(batch, inputs, words)
    forward_bytes = activation_bytes(model.config, B, T, itemsize=jnp.dtype(model.dtype).itemsize)
    if method == "occlusion":
        masks = _unit_masks(units, (B, T)) & ~special[None]  # specials and padding are never occluded
        program = model.jit(_occluded, static_argnames=("metric", "chunk"), what="token attribution (occlusion)")
        changes, full, at_baseline = program(model.state, inputs, embedded, base, jnp.asarray(padded(masks, False)),
                                             jnp.int32(len(masks)), metric=keyed,
                                             chunk=live_chunk(forward_bytes, len(masks)))
        # a unit with nothing occluded (a special token, a row's missing words) is 0 exactly, not F(x) − F(x)
        # from two programs
        per_unit = np.where(masks.any(2), np.asarray(changes)[:len(masks)], 0.0).T  # [B, K]
        scores = per_unit if words else np.einsum("BK,KBT->BT", per_unit, masks)
    else:
        if method == "gradient_x_input":
            alphas, weights = [1.0], [1.0]
        start = base if method == "integrated_gradients" else jnp.zeros_like(embedded)
        program = model.jit(_integrated, static_argnames=("metric", "chunk"), what="token attribution (gradients)")
        step_bytes = forward_bytes * model.config.num_hidden_layers * 2  # a backward keeps every block's values
        token_scores, full, at_baseline = program(
            model.state, inputs, start, embedded, base, jnp.asarray(padded(alphas, 1.0), jnp.float32),
            jnp.asarray(padded(weights, 0.0), jnp.float32), jnp.int32(len(alphas)), metric=keyed,
            chunk=live_chunk(step_bytes, len(alphas)))
        scores = _per_unit(np.asarray(token_scores), units) if words else np.asarray(token_scores)
    full = check_finite(full, "the metric at the input")
    at_baseline = check_finite(at_baseline, f"the metric at the {baseline!r} baseline")
    result = TokenAttribution(check_finite(scores, "the attributions"), _labels(model, batch, inputs, units, words),
                              full, at_baseline, method)
    if method == "integrated_gradients":
        gap = np.abs(result.completeness_gap)
        allowed = COMPLETENESS_FRACTION * np.abs(full - at_baseline)
        rounding = ROUNDING_EPS * float(jnp.finfo(model.dtype).eps) * (np.abs(full) + np.abs(at_baseline))
        short = np.flatnonzero((gap > allowed) & (gap > rounding))
        if len(short):
            worst = short[np.argmax(gap[short] / np.maximum(allowed[short], rounding[short]))]
            ratio = gap[worst] / np.maximum(allowed[worst], rounding[worst])
            if integration == "riemann_right":  # the right Riemann sum's error falls as 1/steps
                need, law = int(np.ceil(steps * ratio)), "its error falls as 1/steps"
            else:  # Gauss–Legendre's falls at least as 1/steps² where F has a bounded second derivative
                need, law = int(np.ceil(steps * np.sqrt(ratio))), "assuming its error falls at least as 1/steps²"
            rows = ", ".join(str(int(b)) for b in short[:8]) + (", …" if len(short) > 8 else "")
            warnings.warn(f"integrated gradients with steps={steps} ({integration}): in row(s) {rows} the "
                          f"attributions add up to F(x) − F(x') only within {gap[worst]:.3g} of "
                          f"{abs(full[worst] - at_baseline[worst]):.3g} (row {worst}), more than "
                          f"{COMPLETENESS_FRACTION:.0%}; that row needs about steps={need} ({law}). Raise steps, or "
                          f"read result.completeness_gap.", AnalysisWarning, stacklevel=outside_minibert())
    return result
