"""Token attributions (analysis.circuits.tokens) against references that do not share their code: a loop of
model.grad at the integration points, literal forward passes with the occluded ids, and captum's
LayerIntegratedGradients on a transformers model."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import make_hf_model
from tolerances import dot_rtol, forward_rtol, sum_rtol

import minibert
from minibert.analysis.circuits import integration_points, token_attribution
from minibert.core.hooks import HookFn
from minibert.errors import AnalysisError, AnalysisWarning

TEXTS = ["abc de f", "hello world"]


def logit_one(out):
    return out.logits[:, 1]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """(minibert model, transformers model) of one tiny random BertForSequenceClassification."""
    directory = tmp_path_factory.mktemp("tiny-classifier")
    hf_model = make_hf_model(directory, "BertForSequenceClassification", scale=0.3)
    return minibert.load(directory), hf_model


def gradient_rtol(model, T: int, steps: int) -> float:
    """Error of an attribution relative to the scale Σ_E |x − x'|·|ḡ| of its terms, for two programs: each
    gradient goes back through the same chain of reductions as the forward (forward_rtol, two programs, is the
    bound for one), the positive weights of the rule add `steps` of them (sum_rtol) and the sum over E one dot."""
    return forward_rtol(model.config, S=T) + sum_rtol(steps) + dot_rtol(model.config.embed_dim)


def metric_atol(model, T: int, values) -> float:
    """Error of a difference of two classifier logits from two programs: each logit carries the hidden states'
    forward error (forward_rtol, relative to its scale) and the classifier's dot over D."""
    return 2 * (forward_rtol(model.config, S=T) + dot_rtol(model.config.hidden_size)) * np.abs(values).max()


def _replace(value, ctx, new):
    return new


def test_integration_points_are_captums_rules():
    alphas, weights = integration_points(3, "riemann_right")
    np.testing.assert_allclose(alphas, [1 / 3, 2 / 3, 1])
    np.testing.assert_allclose(weights, [1 / 3] * 3)
    alphas, weights = integration_points(2)  # Gauss–Legendre nodes ±1/√3 on [−1, 1], weights 1, moved to [0, 1]
    np.testing.assert_allclose(alphas, [(1 - 3**-0.5) / 2, (1 + 3**-0.5) / 2])
    np.testing.assert_allclose(weights, [0.5, 0.5])


@pytest.mark.slow
@pytest.mark.parametrize("integration", ["gausslegendre", "riemann_right"])
def test_integrated_gradients_is_the_sum_of_gradients_at_the_points(classifier, integration):
    model, _ = classifier
    batch = model.tokenize(TEXTS)
    steps = 4
    ours = token_attribution(model, batch, logit_one, steps=steps, integration=integration, baseline="mask")
    ids = np.asarray(batch.input_ids)
    special = np.isin(ids, [2, 3, 0])  # [CLS], [SEP], [PAD] in the test vocabulary
    table = np.asarray(model.W_E)
    x = table[ids]
    x_base = np.where(special[..., None], x, table[4])  # [MASK] is id 4
    total = np.zeros_like(x)
    for alpha, weight in zip(*integration_points(steps, integration)):
        point = x_base + alpha * (x - x_base)
        _, grads = model.grad(batch, logit_one, "embed.hook_embed", hooks={"embed.hook_embed": HookFn(_replace,
                                                                                                     new=point)})
        total += weight * np.asarray(grads["embed.hook_embed"])
    terms = (x - x_base) * total
    scale = np.abs(terms).sum(-1).max()
    assert np.abs(ours.scores - terms.sum(-1)).max() <= gradient_rtol(model, ids.shape[1], steps) * scale
    assert np.all(ours.scores[special] == 0)  # specials keep their embedding in the baseline: x − x' = 0


def test_completeness_within_rounding(classifier):
    """Σ_t IG_t = F(x) − F(x') up to the rule's error and rounding. The integrand is analytic along the path and
    50 Gauss–Legendre points integrate polynomials of degree 99 exactly, so the rule's error is far below
    rounding here; rounding: the attribution's bound on the scale of its terms summed over T tokens, and the
    two logits'."""
    model, _ = classifier
    result = token_attribution(model, TEXTS, logit_one)
    T = result.scores.shape[1]
    scale = np.abs(result.scores).sum(1)
    bound = gradient_rtol(model, T, 50) * scale + sum_rtol(T) * scale + metric_atol(model, T, np.concatenate(
        [result.metric, result.baseline_metric]))
    assert np.all(np.abs(result.completeness_gap) <= bound)
    assert np.all(np.abs(result.metric - result.baseline_metric) > 100 * bound)  # the check is not vacuous


@pytest.mark.slow
def test_occlusion_is_literal_forward_passes(classifier):
    model, _ = classifier
    batch = model.tokenize(TEXTS)
    result = token_attribution(model, batch, logit_one, method="occlusion", words=True)
    ids = np.asarray(batch.input_ids)
    full = np.asarray(logit_one(model(batch)))
    fields = batch.to_dict()
    for b, labels in enumerate(result.labels):
        assert labels == (["[CLS]", "abc", "de", "f", "[SEP]"] if b == 0 else ["[CLS]", "hello", "world", "[SEP]"])
        words = [[t for t in range(ids.shape[1]) if batch.word_ids[b][t] == w] for w in range(len(labels) - 2)]
        for k, positions in enumerate(words, start=1):  # word k follows [CLS]
            occluded = ids.copy()
            occluded[b, positions] = 0  # [PAD]: positions and segments held, as the hook holds them
            literal = full[b] - np.asarray(logit_one(model(fields | {"input_ids": occluded})))[b]
            assert abs(result.scores[b, k] - literal) <= metric_atol(model, ids.shape[1], full)


@pytest.mark.slow
def test_word_scores_sum_their_pieces(classifier):
    model, _ = classifier
    tokens = token_attribution(model, TEXTS, logit_one, method="gradient_x_input")
    words = token_attribution(model, TEXTS, logit_one, method="gradient_x_input", words=True)
    # "abc" is [a, ##b, ##c] at positions 1..3, "de" 4..5, "f" 6 (exact: the same program's scores, summed)
    np.testing.assert_array_equal(words.scores[0, 1:4], [tokens.scores[0, 1:4].sum(dtype=np.float32),
                                                          tokens.scores[0, 4:6].sum(dtype=np.float32),
                                                          tokens.scores[0, 6]])


@pytest.mark.slow
def test_one_program_per_method(classifier):
    model, _ = classifier
    before = model.programs.traces
    token_attribution(model, ["a b", "c"], logit_one, steps=7, baseline="zero")
    token_attribution(model, ["a b", "c"], logit_one, method="occlusion")
    assert model.programs.traces - before == 2


def test_bad_arguments_are_named(classifier):
    model, _ = classifier
    with pytest.raises(AnalysisError, match="method must be one of"):
        token_attribution(model, TEXTS, logit_one, method="saliency")
    with pytest.raises(AnalysisError, match="baseline must be one of"):
        token_attribution(model, TEXTS, logit_one, baseline="unk")
    with pytest.raises(AnalysisError, match="one value per batch row"):
        token_attribution(model, TEXTS, lambda out: out.logits[:, 1].mean())
    with pytest.raises(AnalysisError, match="words=True needs"):
        token_attribution(model, model.tokenize(TEXTS).to_dict(), logit_one, words=True)


@pytest.mark.slow
def test_equals_captum_layer_integrated_gradients(classifier):
    """captum's LayerIntegratedGradients on bert.embeddings.word_embeddings, baselines [PAD] ids with the specials
    kept, 50 Gauss–Legendre steps (its defaults) — the computation this module reproduces."""
    import torch
    from captum.attr import LayerIntegratedGradients

    model, hf_model = classifier
    batch = model.tokenize(TEXTS)
    fields = {k: torch.as_tensor(np.asarray(v)) for k, v in batch.to_dict().items()}
    ids = fields["input_ids"]
    baseline_ids = torch.where(torch.isin(ids, torch.tensor([0, 2, 3])), ids, torch.zeros_like(ids))

    def forward(input_ids, token_type_ids, attention_mask):
        return hf_model(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask).logits[:, 1]

    lig = LayerIntegratedGradients(forward, hf_model.bert.embeddings.word_embeddings)
    theirs = lig.attribute(ids, baselines=baseline_ids, additional_forward_args=(fields["token_type_ids"],
                                                                                 fields["attention_mask"]))
    theirs = theirs.detach().numpy().astype(np.float64)
    ours = token_attribution(model, batch, logit_one)
    scale = np.abs(theirs).sum(-1).max()
    assert np.abs(ours.scores - theirs.sum(-1)).max() <= gradient_rtol(model, ids.shape[1], 50) * scale


@pytest.mark.slow
def test_a_short_integral_warns_with_the_steps_it_needs(classifier):
    """Before: one Riemann point left the attributions far from F(x) − F(x') without a word. The warning names
    the rows past 5 % of |F(x) − F(x')| and the steps the worst needs (its error falls as 1/steps, so steps ×
    |gap| / allowed), at the caller's line; 50 Gauss–Legendre points (test_completeness_within_rounding's bound
    on this model) do not warn."""
    model, _ = classifier
    with pytest.warns(AnalysisWarning, match=r"integrated gradients with steps=1 \(riemann_right\)") as caught:
        result = token_attribution(model, TEXTS, logit_one, steps=1, integration="riemann_right")
    gap = np.abs(result.completeness_gap)
    allowed = 0.05 * np.abs(result.metric - result.baseline_metric)
    assert np.any(gap > allowed)  # the case warns for a reason the result shows
    rows = np.flatnonzero(gap > allowed)
    worst = rows[np.argmax(gap[rows] / allowed[rows])]
    message = str(caught[0].message)
    assert f"in row(s) {', '.join(map(str, rows))} " in message
    assert f"needs about steps={int(np.ceil(gap[worst] / allowed[worst]))} (its error falls as 1/steps)" in message
    assert caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error", AnalysisWarning)
        token_attribution(model, TEXTS, logit_one)
