"""compare_models against a NumPy float64 loop over texts; relation_accuracy on examples whose answer is known
by construction (uniform attention) and against a per-example loop on the bundled model."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_hf_model

import minibert
from minibert.analysis import compare
from minibert.analysis.compare import RelationExample
from minibert.errors import AnalysisError

EPS32 = float(np.finfo(np.float32).eps)
JS_SMOOTHING = 1e-3  # Clark et al.'s smoothing of rows before the Jensen–Shannon divergence (ANALYSIS.md)


def tiny(tmp_path_factory, name, **config):
    directory = tmp_path_factory.mktemp(name)
    make_hf_model(directory, "BertModel", seed=len(name), **config)
    return minibert.load(directory)


@pytest.fixture(scope="module")
def pair_of_models(tmp_path_factory):
    return tiny(tmp_path_factory, "model-a"), tiny(tmp_path_factory, "model-bb")


TEXTS = ["a b c d e f", "w3 w4 ab", "x", "the cat sat on the mat"]


def patterns_of(model, text) -> np.ndarray:
    """One text alone (no padding): [L, H, n, n] float64."""
    _, cache = model.run_with_cache([text], names="blocks.*.attn.hook_pattern")
    return np.asarray(cache.stack("attn.hook_pattern"), np.float64)[:, 0]


def reference_comparison(model_a, model_b, texts):
    cosines, divergences = [], []
    for text in texts:
        a, b = patterns_of(model_a, text), patterns_of(model_b, text)
        n = a.shape[-1]
        cosines.append((a * b).sum((-2, -1)) / np.sqrt((a * a).sum((-2, -1)) * (b * b).sum((-2, -1))))
        p, q = ((1 - JS_SMOOTHING) * x + JS_SMOOTHING / n for x in (a, b))
        m = (p + q) / 2
        divergences.append((0.5 * (p * np.log(p / m)).sum(-1) + 0.5 * (q * np.log(q / m)).sum(-1)).mean(-1))
    return np.mean(cosines, 0), np.mean(divergences, 0)


def test_compare_models_matches_a_loop_over_texts(pair_of_models):
    model_a, model_b = pair_of_models
    similarity, divergence = reference_comparison(model_a, model_b, TEXTS)
    result = compare.compare_models(model_a, model_b, TEXTS, batch_size=3)  # two chunks, padding in both
    assert result.similarity.shape == result.js_divergence.shape == (2, 4) and result.n_inputs == 4
    # Patterns of one model batched (padded) vs alone differ by float32 rounding of a forward pass,
    # 16 eps per stage (test_analysis_mixing.block_noise) over L + 1 stages, on values of scale 1.
    tol = 16 * EPS32 * (model_a.config.num_hidden_layers + 1)
    np.testing.assert_allclose(result.similarity, similarity, atol=tol, rtol=0)
    np.testing.assert_allclose(result.js_divergence, divergence, atol=tol, rtol=0)
    assert (divergence > 1e-3).all() and (similarity < 0.999).all()  # different models: the check has teeth
    same = compare.compare_models(model_a, model_a, TEXTS)
    np.testing.assert_allclose(same.similarity, 1.0, atol=tol)
    np.testing.assert_allclose(same.js_divergence, 0.0, atol=tol)


def test_compare_models_on_the_bundled_model_with_sharper_attention(bundled):
    """The bundled checkpoint against itself with every W_Q doubled (each head's scores ×2, its rows sharper)."""
    params = bundled.params
    for block in params["blocks"].values():
        block["attn"]["W_Q"], block["attn"]["b_Q"] = 2 * block["attn"]["W_Q"], 2 * block["attn"]["b_Q"]
    sharper = minibert.Model(bundled.config, params, bundled.tokenizer)
    texts = ["the food was great but the service was slow .", "what about the service ?"]
    similarity, divergence = reference_comparison(bundled, sharper, texts)
    result = compare.compare_models(bundled, sharper, texts)
    tol = 16 * EPS32 * (bundled.config.num_hidden_layers + 1)  # as in the tiny test above
    np.testing.assert_allclose(result.similarity, similarity, atol=tol, rtol=0)
    np.testing.assert_allclose(result.js_divergence, divergence, atol=tol, rtol=0)
    assert similarity.min() < 0.99 and divergence.max() > 100 * tol  # the change is far above the tolerance


def test_compare_models_names_what_differs(pair_of_models, tmp_path_factory):
    model_a, _ = pair_of_models
    with pytest.raises(AnalysisError, match="3 layers"):
        compare.compare_models(model_a, tiny(tmp_path_factory, "deeper", num_hidden_layers=3), TEXTS)
    with pytest.raises(AnalysisError, match="vocabularies"):
        compare.compare_models(model_a, tiny(tmp_path_factory, "other-vocab", vocab_size=98), TEXTS)
    with pytest.raises(AnalysisError, match="empty"):
        compare.compare_models(model_a, model_a, [])


def test_compare_models_refuses_one_string_and_a_batch_size_below_one(pair_of_models):
    """One string used to be compared one character at a time; batch_size 0 looped forever over empty chunks
    (−1 dropped the last text). Both are refused, as survey refuses them."""
    model_a, model_b = pair_of_models
    for texts in ("a string", b"bytes"):  # bytes were read as a list of ints
        with pytest.raises(AnalysisError, match="not one string"):
            compare.compare_models(model_a, model_b, texts)
    with pytest.raises(AnalysisError, match="texts must be a list of texts; got NoneType"):  # a raw TypeError before
        compare.compare_models(model_a, model_b, None)
    for size in (0, -1, True):
        with pytest.raises(AnalysisError, match="batch_size must be a positive int"):
            compare.compare_models(model_a, model_b, TEXTS, batch_size=size)


# ---- relation accuracy ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def uniform(pair_of_models):
    """The tiny model with W_Q, W_K and their biases zeroed: every score is 0, so every head attends
    uniformly over the real tokens, and a word's share of a row is its number of wordpieces over n."""
    model = pair_of_models[0]
    params = model.params
    for block in params["blocks"].values():
        for name in ("W_Q", "W_K", "b_Q", "b_K"):
            block["attn"][name] = jnp.zeros_like(block["attn"][name])
    return minibert.Model(model.config, params, model.tokenizer)


def test_relation_accuracy_on_uniform_attention(uniform):
    """'abcd' is four wordpieces (a ##b ##c ##d): under uniform attention every query word's row peaks there."""
    assert uniform.tokenize(["x abcd y"]).tokens[0] == ["[CLS]", "x", "a", "##b", "##c", "##d", "y", "[SEP]"]
    examples = [RelationExample("x abcd y", "x", "abcd"),                      # right in every head
                RelationExample("x abcd y", "y", ["x", "z"]),                  # wrong in every head
                RelationExample("x", "x", "abcd", pair="x abcd", target_segment=1),  # right, in sentence B
                RelationExample("x y", "x", "x", pair="abcd x", target_segment=1)]   # wrong: peak at abcd
    result = compare.relation_accuracy(uniform, examples, batch_size=2)
    L, H = uniform.config.num_hidden_layers, uniform.config.num_attention_heads
    np.testing.assert_array_equal(result.correct, np.broadcast_to(np.array([1, 0, 1, 0], bool)[:, None, None],
                                                                  (4, L, H)))
    np.testing.assert_array_equal(result.accuracy, np.full((L, H), 0.5))
    assert (result.predicted == "abcd").all()
    assert result.best_heads(2) == [("1-1", 0.5), ("1-2", 0.5)]


def test_relation_baselines_on_uniform_attention(uniform):
    """Words of "x abcd y" are [CLS] x abcd y [SEP] (indices 0..4); with a pair, [CLS] A [SEP] B [SEP]. Under
    uniform attention a word's column holds its number of wordpieces, so "abcd" is the most-attended word."""
    examples = [RelationExample("x abcd y", "x", "abcd"),              # abcd = x + 1; most attended: right
                RelationExample("x abcd y", "y", "x"),                 # x = y − 2; most attended (abcd): wrong
                RelationExample("x", "x", "abcd", pair="x abcd", target_segment=1),  # x at 1, abcd at 4 (+3)
                RelationExample("x y", "x", "x", pair="abcd x", target_segment=1)]   # x at 1 and 5 (+4)
    result = compare.relation_accuracy(uniform, examples)
    assert result.offset_accuracy == {-3: 0.0, -2: 0.25, -1: 0.0, 0: 0.0, 1: 0.25, 2: 0.0}
    assert result.best_offset == (-2, 0.25)  # ties: the first offset
    np.testing.assert_array_equal(result.most_attended_correct, [True, False, True, False])
    assert result.most_attended_accuracy == 0.5


def test_bootstrap_interval_against_the_normal_approximation():
    """N = 400 examples, half right: the accuracy's sampling distribution is close to normal with σ =
    √(p(1 − p)/N) = 0.025, so the 95% interval is 0.5 ± 1.96σ. The bootstrap's own error: each quantile of
    R = 2000 resamples has standard deviation √(q(1 − q)/R)/density = 0.0015 (density φ(1.96)/σ), and the
    accuracies move in steps of 1/N; 4 standard deviations plus one step bound it."""
    correct = np.arange(400) % 2 == 0
    low, high = compare.bootstrap_interval(correct, 0.95, resamples=2000, seed=0)
    sigma = np.sqrt(0.25 / 400)
    tolerance = 4 * np.sqrt(0.025 * 0.975 / 2000) / (np.exp(-1.96**2 / 2) / np.sqrt(2 * np.pi) / sigma) + 1 / 400
    assert abs(low - (0.5 - 1.96 * sigma)) < tolerance and abs(high - (0.5 + 1.96 * sigma)) < tolerance
    low, high = compare.bootstrap_interval(np.ones((7, 2, 3), bool))  # every example right: no spread
    np.testing.assert_array_equal(low, np.ones((2, 3)))
    np.testing.assert_array_equal(high, np.ones((2, 3)))
    with pytest.raises(AnalysisError, match="level must lie between 0 and 1"):
        compare.bootstrap_interval(correct, 95)


def test_relation_accuracy_errors_name_the_example(uniform):
    with pytest.raises(AnalysisError, match=r"examples\[1\].*'q'"):
        compare.relation_accuracy(uniform, [RelationExample("x y", "x", "y"), RelationExample("x y", "q", "y")])
    with pytest.raises(AnalysisError, match=r"examples\[0\]: no target"):
        compare.relation_accuracy(uniform, [RelationExample("x y", "x", "y", pair="z", target_segment=1)])
    with pytest.raises(AnalysisError, match="one word"):
        compare.relation_accuracy(uniform, [RelationExample("x y", "x y", "y")])
    # Two words the vocabulary lacks both become [UNK]: the query used to be the first [UNK], whichever word it was.
    assert uniform.tokenize(["x ☃ y ♞"]).tokens[0] == ["[CLS]", "x", "[UNK]", "y", "[UNK]", "[SEP]"]
    with pytest.raises(AnalysisError, match=r"examples\[0\].query '♞' is not in the vocabulary"):
        compare.relation_accuracy(uniform, [RelationExample("x ☃ y ♞", "♞", "y")])
    with pytest.raises(AnalysisError, match=r"examples\[0\].targets '☃' is not in the vocabulary"):
        compare.relation_accuracy(uniform, [RelationExample("x ☃ y ♞", "y", "☃")])
    for size in (0, -1):
        with pytest.raises(AnalysisError, match="batch_size must be a positive int"):
            compare.relation_accuracy(uniform, [RelationExample("x y", "x", "y")], batch_size=size)
    # One example or one string instead of a list: a raw TypeError / AttributeError before.
    with pytest.raises(AnalysisError, match=r"examples must be a list of RelationExample\(.*got RelationExample. "
                                            r"Wrap a single example in a list"):
        compare.relation_accuracy(uniform, RelationExample("x y", "x", "y"))
    with pytest.raises(AnalysisError, match=r"got a list of \['RelationExample', 'str'\]"):
        compare.relation_accuracy(uniform, [RelationExample("x y", "x", "y"), "x y"])
    with pytest.raises(AnalysisError, match="examples must be a list of RelationExample.*got str"):
        compare.relation_accuracy(uniform, "x y")


def reference_relation(model, example: RelationExample) -> np.ndarray:
    """One example alone, word rows by explicit loops (mean of the query's token rows, sum over a word's
    columns), → bool [L, H]: does the row's largest entry sit on a target word."""
    batch = model.tokenize([example.text], None if example.pair is None else [example.pair])
    _, cache = model.run_with_cache(batch, names="blocks.*.attn.hook_pattern")
    a = np.asarray(cache.stack("attn.hook_pattern"), np.float64)[:, 0]  # [L, H, n, n]
    tokens, words_of, segments = batch.tokens[0], batch.word_ids[0], batch.sequence_ids[0]
    spans, texts, segs = [], [], []  # each word's token positions, its text and its sentence
    for t, (word, seg) in enumerate(zip(words_of, segments)):
        if word is not None and spans and (words_of[t - 1], segments[t - 1]) == (word, seg):
            spans[-1].append(t)
            texts[-1] += tokens[t].removeprefix("##")
        else:
            spans.append([t])
            texts.append(tokens[t])
            segs.append(seg)
    query = [w for w in range(len(spans)) if texts[w] == example.query and segs[w] == example.query_segment][0]
    targets = [w for w in range(len(spans)) if texts[w] in example.targets and w != query
               and (example.target_segment is None or segs[w] == example.target_segment)]
    L, H = a.shape[:2]
    right = np.zeros((L, H), bool)
    for layer in range(L):
        for head in range(H):
            row = [sum(a[layer, head, t, s] for t in spans[query] for s in span) / len(spans[query]) for span in spans]
            right[layer, head] = int(np.argmax(row)) in targets
    return right


def test_relation_accuracy_matches_a_loop_on_the_bundled_model(bundled):
    """Seed 002's aspect question / review pairs: the aspect word in the question should attend to its mention
    (or a word of the same aspect) in the review."""
    examples = [RelationExample("what do you think of the food ?", "food", ["food", "pizza"],
                                pair="the food was great but the service was slow .", target_segment=1),
                RelationExample("what do you think of the service ?", "service", ["waiter", "service"],
                                pair="the waiter was rude .", target_segment=1),
                RelationExample("the pizza was cold", "pizza", "cold")]
    result = compare.relation_accuracy(bundled, examples)
    expected = np.stack([reference_relation(bundled, e) for e in examples])
    np.testing.assert_array_equal(result.correct, expected)
    np.testing.assert_array_equal(result.accuracy, expected.mean(0))
    assert 0 < result.accuracy.max() and result.accuracy.min() < 1  # some heads right, some wrong
