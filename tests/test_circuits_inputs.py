"""What the circuits functions do with bad input (the docs-only tester's findings, /work/coord/findings_circuits.md):
one AnalysisError naming the problem and the fix, never a raw traceback or silent NaN; and occlusion's specials at 0
exactly."""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_hf_model

import minibert
from minibert.analysis.circuits import (
    circuit_faithfulness,
    direct_attribution,
    edge_attribution,
    path_patching,
    token_attribution,
)
from minibert.analysis.circuits.edges import receiver_labels, sender_labels
from minibert.errors import AnalysisError

TEXTS = ["abc de f", "hello world"]
CORRUPTED = ["abc xy f", "hello there"]


def logit_one(out):
    return out.logits[:, 1]


def not_a_number(out):
    return out.logits[:, 1] * jnp.nan


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-classifier-inputs")
    make_hf_model(directory, "BertForSequenceClassification", scale=0.3)
    return minibert.load(directory)


@pytest.fixture(scope="module")
def headless(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-headless-inputs")
    make_hf_model(directory, "BertModel", scale=0.3)
    return minibert.load(directory)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["integrated_gradients", "occlusion"])
def test_a_metric_that_is_not_finite_is_one_error(classifier, method):
    with pytest.raises(AnalysisError, match="not finite .* row 0, row 1; check the metric for a division by zero"):
        token_attribution(classifier, TEXTS, not_a_number, method=method, steps=2)


@pytest.mark.slow
def test_not_finite_direct_and_edges_are_one_error(classifier):
    with pytest.raises(AnalysisError, match="not finite"):
        direct_attribution(classifier, TEXTS, not_a_number)
    with pytest.raises(AnalysisError, match=r"edge scores .*: not finite \(NaN or ±inf\) at embed → 1-1.q, embed → "):
        edge_attribution(classifier, TEXTS, CORRUPTED, not_a_number)  # named by edge, not by "row"


def test_too_many_gauss_legendre_points_are_refused_before_any_work(classifier):
    with pytest.raises(AnalysisError, match="riemann_right"):
        token_attribution(classifier, TEXTS, logit_one, steps=5_000)


def test_an_array_baseline_or_method_is_an_unknown_name(classifier):
    with pytest.raises(AnalysisError, match=r"baseline must be one of \('pad', 'mask', 'zero'\); got ndarray"):
        token_attribution(classifier, TEXTS, logit_one, baseline=np.zeros(classifier.config.hidden_size))
    with pytest.raises(AnalysisError, match="method must be one of .*; got ndarray"):
        edge_attribution(classifier, TEXTS, CORRUPTED, logit_one, method=np.zeros(2))


def test_every_argument_is_checked_whatever_the_method(classifier):
    with pytest.raises(AnalysisError, match="integration must be one of"):
        token_attribution(classifier, TEXTS, logit_one, method="occlusion", integration="trapezoid")
    with pytest.raises(AnalysisError, match="steps must be a positive whole number"):
        token_attribution(classifier, TEXTS, logit_one, method="gradient_x_input", steps=0)


@pytest.mark.parametrize("method", ["integrated_gradients", "gradient_x_input"])
def test_a_riemann_sum_of_a_trillion_points_is_refused_before_any_work(classifier, method):
    """Issue 40: steps=10**12 with integration="riemann_right" raised a raw MemoryError (7.28 TiB), and so did
    gradient × input, which checks steps though it uses none."""
    with pytest.raises(AnalysisError, match="steps=1000000000000 is more than 10,000 points of the integral"):
        token_attribution(classifier, TEXTS, logit_one, method=method, steps=10**12, integration="riemann_right")


def test_steps_may_be_a_numpy_integer(classifier):
    """Issue 40: steps=np.int64(8) (a count read from an array) was refused as "not a positive int"."""
    ours = token_attribution(classifier, TEXTS, logit_one, steps=np.int64(8))
    plain = token_attribution(classifier, TEXTS, logit_one, steps=8)
    np.testing.assert_array_equal(ours.scores, plain.scores)  # one program, the same points
    graph = edge_attribution(classifier, TEXTS, CORRUPTED, logit_one, method="eap-ig", steps=np.int64(2))
    assert np.isfinite(graph.scores).all()


@pytest.mark.parametrize("call", [
    lambda model: token_attribution(model, TEXTS, logit_one),
    lambda model: direct_attribution(model, TEXTS, logit_one),
    lambda model: edge_attribution(model, TEXTS, CORRUPTED, logit_one),
    lambda model: circuit_faithfulness(model, TEXTS, CORRUPTED, logit_one, []),
    lambda model: path_patching(model, TEXTS, CORRUPTED, logit_one, "embed", ["output"]),
])
@pytest.mark.parametrize("model", [None, "sentence-transformers/all-MiniLM-L6-v2"])
def test_a_model_that_is_not_one_is_named(call, model):
    with pytest.raises(AnalysisError, match=f"model must be a minibert model .*got {type(model).__name__}"):
        call(model)


def test_occluding_a_special_token_changes_nothing_exactly(classifier):
    """[CLS], [SEP] and padding are never occluded (they keep their embedding in the baseline): 0, not F(x) − F(x)
    from two programs' rounding."""
    batch = classifier.tokenize(TEXTS)
    special = np.isin(np.asarray(batch.input_ids), [classifier.tokenizer.cls_token_id,
                                                    classifier.tokenizer.sep_token_id])
    special |= np.asarray(batch.attention_mask) == 0
    result = token_attribution(classifier, batch, logit_one, method="occlusion")
    assert special.any() and np.all(result.scores[special] == 0.0)
    assert np.all(result.scores[~special] != 0.0)


def test_a_metric_reading_a_missing_head_is_told_which(headless):
    with pytest.raises(AnalysisError, match="has no .*logits.*read out.last_hidden_state"):
        token_attribution(headless, TEXTS, logit_one, steps=2)
    with pytest.raises(AnalysisError, match="has no .*logits"):
        direct_attribution(headless, TEXTS, logit_one)


@pytest.fixture(scope="module")
def graph(classifier):
    return edge_attribution(classifier, TEXTS, CORRUPTED, logit_one)


@pytest.mark.parametrize("receivers, said", [
    (["1-1.q"], r"no edge 2-1 → 1-1.q .* 2-1 reaches \d+ receivers, from 'MLP 2 in' to 'output'"),  # before it
    (["2-2.q"], "no edge 2-1 → 2-2.q"),  # a head of its own block
    ([], "receivers must be a non-empty list"),
    ("output", "receivers must be a non-empty list"),  # one str, not a list of them
    (["1-1"], r"'1-1' is not a receiver of this model \(did you mean '1-1.k' or '1-1.q' or '1-1.v'\?\)"),
    (["MLP 2"], r"did you mean 'MLP 2 in'"),
])
def test_path_patching_names_the_edge_that_does_not_exist(classifier, receivers, said):
    with pytest.raises(AnalysisError, match=said):
        path_patching(classifier, TEXTS, CORRUPTED, logit_one, "2-1", receivers)


@pytest.mark.slow
def test_patching_with_a_metric_that_is_not_finite_is_one_error(classifier, graph):
    with pytest.raises(AnalysisError, match="not finite"):
        circuit_faithfulness(classifier, TEXTS, CORRUPTED, not_a_number, graph.circuit(top=2))


@pytest.mark.parametrize("threshold", [float("nan"), float("inf"), -1.0, True])
def test_a_threshold_must_be_a_finite_number_at_least_0(graph, threshold):
    with pytest.raises(AnalysisError, match="threshold must be a finite number ≥ 0"):
        graph.circuit(threshold=threshold)


def test_what_circuit_faithfulness_and_the_figures_take_is_named(classifier, graph):
    import dataclasses

    from minibert.viz import circuits as figures
    from minibert.viz._check import VizError

    for wrong in (graph, None, "edges"):
        with pytest.raises(AnalysisError, match="takes a Circuit .* got"):
            circuit_faithfulness(classifier, TEXTS, CORRUPTED, logit_one, wrong)
    circuit = graph.circuit(top=3)
    as_lists = dataclasses.replace(circuit, edges=circuit.edges.tolist())
    reordered = dataclasses.replace(circuit, senders=list(reversed(circuit.senders)))
    impossible = dataclasses.replace(circuit, edges=~graph.edges)
    as_ints = dataclasses.replace(circuit, edges=circuit.edges.astype(int))  # issue 40: "got (7, 15)" alone
    shape = re.escape(str(graph.edges.shape))
    for wrong, said in [(as_lists, "must be a bool array .*; got list"),
                        (reordered, "node labels are not this model's"),
                        (as_ints, rf"must be a bool array {shape}; got int\d+ values of shape {shape} \(an int mask: "
                                  r"circuit.edges.astype\(bool\)\)"),
                        (impossible, "edges that cannot exist")]:
        with pytest.raises(AnalysisError, match=said):
            circuit_faithfulness(classifier, TEXTS, CORRUPTED, logit_one, wrong)
    with pytest.raises(AnalysisError, match=r"got an empty list: pass at least one circuit"):  # was "got list"
        circuit_faithfulness(classifier, TEXTS, CORRUPTED, logit_one, [])
    with pytest.raises(AnalysisError, match=r"takes a Circuit .* got list holding a str"):
        circuit_faithfulness(classifier, TEXTS, CORRUPTED, logit_one, [circuit, "edges"])
    with pytest.raises(AnalysisError, match=r"sizes must be a list of edge counts, e.g. graph.sweep\(\[5, 10, 20\]\)"):
        graph.sweep(5)
    with pytest.raises(VizError, match="draws what circuit_faithfulness returns"):
        figures.faithfulness_figure(graph)


def _arrays_only(value):
    """json.dumps' fallback: an array becomes a list; anything else (np.int64, np.float32) stays unserialisable."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} {value!r} is not JSON")


@pytest.mark.slow  # a faithfulness program of its own
def test_counts_and_scalars_of_results_are_python_numbers(classifier, graph):
    """Issue 40: Faithfulness.sizes came back as np.int64 (json.dumps refused them), DirectAttribution.top's
    values as np.float32. Every count and scalar of a circuits result is a Python int or float."""
    import dataclasses
    import json

    result = circuit_faithfulness(classifier, TEXTS, CORRUPTED, logit_one, graph.sweep([0, 5]))
    assert result.sizes == [0, 5] and all(type(n) is int for n in result.sizes)
    direct = direct_attribution(classifier, TEXTS, logit_one)
    circuit = graph.circuit(top=3)
    for record in (result, direct, graph, circuit):
        json.dumps(dataclasses.asdict(record), default=_arrays_only)
    json.dumps([direct.top(4), graph.top_edges(3), circuit.edge_list(), circuit.size, direct.remainder])
    assert all(type(value) is float for _, value in direct.top(4))


def hand_head_scores(scores, senders, receivers, L, H, edges, absolute):
    """head_scores by a loop over every (sender, receiver) label pair: a head's "L-H" as sender, its "L-H.q/.k/.v"
    as receiver."""
    total = np.zeros((L, H))
    for u, sender in enumerate(senders):
        for v, receiver in enumerate(receivers):
            value = abs(scores[u, v]) if absolute else scores[u, v]
            for layer in range(L):
                for h in range(H):
                    label = f"{layer + 1}-{h + 1}"
                    total[layer, h] += value * ((edges != "in") * (sender == label)
                                                + (edges != "out") * (receiver in (f"{label}.q", f"{label}.k",
                                                                                   f"{label}.v")))
    return total


@pytest.mark.parametrize("L, H", [(2, 3), (3, 1)])
def test_head_scores_sum_each_heads_edges_as_a_loop_over_labels_does(L, H):
    """Issue 40: tutorial 9 summed each head's edges by index arithmetic. head_scores against a loop over the
    labels, on random scores of graphs of two shapes (the shape alone says L and H); the sums agree to float64
    rounding of at most 3L(H+1)+1 terms (1e-12 relative is far above that, far below any misplaced edge)."""
    from minibert.analysis.circuits import head_scores
    from minibert.analysis.circuits.edges import edge_mask

    mask = edge_mask(L, H)
    scores = np.random.default_rng(L * 10 + H).normal(size=mask.shape) * mask
    senders, receivers = sender_labels(L, H), receiver_labels(L, H)
    for edges in ("both", "out", "in"):
        for absolute in (True, False):
            np.testing.assert_allclose(head_scores(scores, edges, absolute=absolute),
                                       hand_head_scores(scores, senders, receivers, L, H, edges, absolute),
                                       rtol=1e-12, atol=1e-12)
    assert (head_scores(scores, "out") + head_scores(scores, "in") == head_scores(scores)).all()
    for wrong, said in [(scores[:, :-1], r"got an array of shape \(\d+, \d+\)"), ("graph", "got str")]:
        with pytest.raises(AnalysisError, match=rf"head_scores takes a CircuitGraph .* {said}"):
            head_scores(wrong)
    with pytest.raises(AnalysisError, match=r"edges must be one of \('both', 'out', 'in'\)"):
        head_scores(scores, "q")


def test_head_scores_of_a_graph_and_of_a_circuit(graph):
    from minibert.analysis.circuits import head_scores

    L, H = graph.layers, graph.heads
    np.testing.assert_array_equal(head_scores(graph), head_scores(graph.scores))
    circuit = graph.circuit(top=6)
    counts = hand_head_scores(circuit.edges.astype(float), graph.senders, graph.receivers, L, H, "both", True)
    np.testing.assert_array_equal(head_scores(circuit), counts)  # each head's count of kept edges
    assert head_scores(circuit).dtype.kind == "i"


def test_counts_and_flags_are_checked(classifier):
    direct = direct_attribution(classifier, TEXTS, logit_one)
    for n in (-1, 2.5, True):
        with pytest.raises(AnalysisError, match="must be a whole number ≥ 0"):
            direct.top(n)
    assert len(direct.top(3)) == 3
    with pytest.raises(AnalysisError, match="words must be True .* or False"):
        token_attribution(classifier, TEXTS, logit_one, words="yes")


def test_completeness_is_asked_of_integrated_gradients_only(classifier):
    result = token_attribution(classifier, TEXTS, logit_one, method="gradient_x_input")
    with pytest.raises(AnalysisError, match="completeness holds for integrated gradients only"):
        _ = result.completeness_gap


def test_faithfulness_of_runs_with_the_same_metric_is_refused(classifier, graph):
    """m(clean) = m(corrupted): the ratio would be rounding over rounding (the tester saw 'faithfulness 5'). The
    same batch twice is refused before any run; a metric that is 0 in exact arithmetic (the sum of a 2-label
    classifier's logits less each of them) is rounding at any scale, which the relative test alone missed
    (issue 40: [-1, -3, 1]); a metric 1e-6 wide but really different still runs."""
    with pytest.raises(AnalysisError, match="the corrupted batch is the clean batch .* pass corrupted inputs"):
        circuit_faithfulness(classifier, TEXTS, TEXTS, logit_one, graph.sweep([0, 5]))

    def zero_up_to_rounding(out):
        return out.logits.sum(-1) - out.logits[:, 0] - out.logits[:, 1]

    with pytest.raises(AnalysisError, match="give the same metric .* a ratio over that difference, is undefined"):
        circuit_faithfulness(classifier, TEXTS, CORRUPTED, zero_up_to_rounding, graph.sweep([0, 5]))

    def small(out):  # 1e-6 times a metric whose clean and corrupted values differ by far more than rounding
        return 1e-6 * out.logits[:, 1]

    assert np.isfinite(circuit_faithfulness(classifier, TEXTS, CORRUPTED, small, graph.sweep([0, 5])).values).all()


def test_eap_ig_steps_are_bounded(classifier):
    with pytest.raises(AnalysisError, match="steps=1000000 is more than 1000 EAP-IG runs"):
        edge_attribution(classifier, TEXTS, CORRUPTED, logit_one, method="eap-ig", steps=10**6)


def test_token_labels_keep_wordpieces_and_word_labels_join_them(classifier):
    text = ["unbelievably good"]
    tokens = classifier.tokenize(text).tokens[0]
    assert any(token.startswith("##") for token in tokens)  # the tiny vocabulary splits it: the check is not vacuous
    by_token = token_attribution(classifier, text, logit_one, method="gradient_x_input")
    assert by_token.labels[0] == tokens
    by_word = token_attribution(classifier, text, logit_one, method="gradient_x_input", words=True)
    assert by_word.labels[0] == ["[CLS]", "unbelievably", "good", "[SEP]"]


@pytest.mark.parametrize("metric, message", [
    (lambda out: out.logits.mean(-1), r"it has no logits, nsp_logits \(None: the checkpoint has no such head\)"),
    (lambda out: out.hidden_states[-1].sum((1, 2)), r"read out.hidden_states, which an output does not have: its "
                                                    r"fields are last_hidden_state, pooler_output, logits"),
], ids=["a field left None", "no such field"])
def test_a_metric_reading_a_field_the_output_lacks_is_told_which(headless, metric, message):
    """Issue 40: a metric reading out.logits of a checkpoint with no head (or out.hidden_states, transformers'
    name) raised a raw AttributeError inside the trace; every metric-taking call names the field."""
    for call in (lambda: token_attribution(headless, TEXTS, metric, method="gradient_x_input"),
                 lambda: edge_attribution(headless, TEXTS, CORRUPTED, metric),
                 lambda: headless.grad(TEXTS, metric, "blocks.0.hook_resid_post")):
        with pytest.raises(AnalysisError, match=message):
            call()


def test_pairs_as_tuples_point_to_tokenize_with_pairs(classifier):
    """Issue 40, round 5: edge_attribution(model, clean, [("the film was", "awful")], m) said only "a batch is a
    text, a list of texts…"; (A, B) tuples now get the call that makes them sentence pairs."""
    with pytest.raises(minibert.errors.InputError, match=re.escape(
            "got list (sentence pairs as (A, B) tuples: pass model.tokenize([a for a, b in pairs], "
            "pairs=[b for a, b in pairs]))")):
        edge_attribution(classifier, [("the film was", "great")], [("the film was", "awful")], logit_one)
    with pytest.raises(minibert.errors.InputError, match=r"a Batch \(model.tokenize\) or a dict of id arrays; got "
                                                         r"list\.$"):
        classifier.inputs([1.5, 2.5])  # not pairs: no pairs hint
