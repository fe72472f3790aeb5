"""Probes: linear probes against scikit-learn, early stopping against its own trajectory, the bootstrap
against a loop, control tasks against Hewitt & Liang's definition, features against run_with_cache."""

from __future__ import annotations

import numpy as np
import pytest
from tolerances import assert_close_to_scale, dot_rtol, forward_rtol, sum_rtol

import minibert
from minibert.analysis import probes
from minibert.analysis.syntax import encode_words
from minibert.errors import AnalysisError, DataFileError, DataFileMissing

L2 = 1e-2


def _planted_task(seed=0, layers=3, n=240, features=8, classes=4):
    """Features [L, N, F] (generated) whose labels are a noisy linear function of layer 1's features."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(layers, n, features)).astype(np.float32)
    y = np.argmax(x[1] @ rng.normal(size=(features, classes)) + rng.normal(size=(n, classes)), -1)
    return x, y


def _softmax(z):
    z = z - z.max(-1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(-1, keepdims=True)


def _gradient(W, x, y, l2):
    """∇ of mean CE + (l2/2)‖W‖² in float64 (no bias)."""
    p = _softmax(x @ W)
    p[np.arange(len(y)), y] -= 1
    return x.T @ p / len(y) + l2 * W


@pytest.mark.slow
@pytest.mark.parametrize("vectorised", [False, True], ids=["lax.map", "vmap"])
def test_linear_probes_reach_scikit_learns_optimum(vectorised):
    """Each layer's W matches LogisticRegression(C = 1/(l2·n), no intercept) on the same features.

    The objective is l2-strongly convex, so any W lies within ‖∇f(W)‖/l2 of the optimum W*: the two
    solutions differ by at most (‖∇f(ours)‖ + ‖∇f(sklearn)‖)/l2, both gradients taken in float64 here.
    Predictions must then agree on every item whose sklearn logit margin exceeds 2·bound·‖x‖.
    """
    from sklearn.linear_model import LogisticRegression

    x, y = _planted_task()
    params, _ = probes.fit_linear_probes(x, y, l2=L2, num_classes=4, bias=False, max_steps=1000, vectorised=vectorised)
    ours_predicted = probes.predict(params, x)
    for layer in range(x.shape[0]):
        features = x[layer].astype(np.float64)
        reference = LogisticRegression(C=1 / (L2 * len(y)), tol=1e-12, max_iter=10_000, fit_intercept=False)
        theirs = reference.fit(features, y).coef_.T
        ours = params["W"][layer].astype(np.float64)
        bound = (np.linalg.norm(_gradient(ours, features, y, L2)) + np.linalg.norm(_gradient(theirs, features, y, L2)))
        bound /= L2
        assert bound < 0.05 * np.linalg.norm(theirs), f"layer {layer}: the optimality bound {bound:.1e} says nothing"
        assert np.linalg.norm(ours - theirs) <= bound, f"layer {layer}"
        logits = np.sort(features @ theirs, axis=-1)
        clear = logits[:, -1] - logits[:, -2] > 2 * bound * np.linalg.norm(features, axis=-1)
        assert clear.mean() > 0.5
        np.testing.assert_array_equal(ours_predicted[layer, clear], np.argmax(features @ theirs, -1)[clear])


@pytest.mark.slow
def test_early_stopping_keeps_the_step_with_the_lowest_dev_loss():
    """The kept parameters are those of the run's step with the lowest dev cross-entropy, found by rerunning
    L-BFGS for k = 0 (the zero initialisation), 1, 2, … steps (deterministic) and scoring each in float64 here."""
    x, y = _planted_task(seed=1)
    train, dev = slice(0, 60), slice(60, None)  # few training items: the dev loss turns up as W overfits
    kept, steps = probes.fit_linear_probes(x[:, train], y[train], num_classes=4, l2=1e-5, dev=(x[:, dev], y[dev]),
                                           max_steps=40, patience=5)
    runs = [probes.fit_linear_probes(x[:, train], y[train], num_classes=4, l2=1e-5, max_steps=k, patience=None)[0]
            for k in range(int(steps.max()) + 6)]
    for layer in range(x.shape[0]):
        losses = []
        for params in runs:
            p = _softmax(x[layer, dev].astype(np.float64) @ params["W"][layer] + params["b"][layer])
            losses.append(-np.log(p[np.arange(len(p)), y[dev]]).mean())
        best = int(np.argmin(losses[:int(steps[layer]) + 6]))
        assert best == steps[layer], f"layer {layer}: dev losses {np.round(losses, 4)}"
        np.testing.assert_array_equal(kept["W"][layer], runs[best]["W"][layer])


def test_bootstrap_resamples_whole_sentences():
    """Against a loop that, for each resample, concatenates the drawn sentences' items and takes the mean."""
    rng = np.random.default_rng(2)
    clusters = np.repeat(np.arange(12), rng.integers(1, 6, size=12))
    correct = rng.random((2, len(clusters))) < [[0.3], [0.8]]
    interval = probes.bootstrap_accuracy(correct, clusters, samples=200, seed=5)
    draws = np.random.default_rng(5).multinomial(12, np.full(12, 1 / 12), size=200)
    accuracies = []
    for draw in draws:
        items = np.concatenate([np.flatnonzero(clusters == c) for c in range(12) for _ in range(draw[c])])
        accuracies.append(correct[:, items].mean(1))
    expected = np.percentile(np.array(accuracies), [2.5, 97.5], axis=0).T
    np.testing.assert_allclose(interval, expected, rtol=0, atol=1e-12)


def test_control_labels_give_each_word_type_one_label_from_the_task_distribution():
    """Hewitt & Liang: one label per word type (case-folded), drawn from the task's empirical distribution.
    With 4,000 types, each label's share of types is within 5 binomial standard deviations of its share."""
    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in rng.integers(0, 4000, size=20_000)]
    words[:2] = ["Word", "word"]
    labels = list(rng.choice(["NOUN", "VERB", "DET"], p=[0.6, 0.3, 0.1], size=len(words)))
    control = probes.control_labels(words, labels, seed=0)
    by_type = {}
    for word, label in zip(words, control):
        assert by_type.setdefault(word.lower(), label) == label
    shares = {label: labels.count(label) / len(labels) for label in set(labels)}
    types = list(by_type.values())
    for label, share in shares.items():
        sd = np.sqrt(share * (1 - share) / len(types))
        assert abs(types.count(label) / len(types) - share) <= 5 * sd, label


@pytest.fixture(scope="module")
def tiny(tiny_mlm):
    return tiny_mlm[0]


SENTENCES = [["ab", "c", "de"], ["fgh", "a"], ["b", "cd", "e", "f"]]


@pytest.mark.parametrize("pool", ["first", "mean"])
def test_word_features_pool_the_words_pieces(tiny, pool):
    """Against a run of each sentence alone (its own padding): the first piece's row or the pieces' mean."""
    features = probes.word_features(tiny, SENTENCES, site="mlp.hook_post", pool=pool)
    column = 0
    for words in SENTENCES:
        ids, groups = encode_words(tiny.tokenizer, words)
        _, cache = tiny.run_with_cache({"input_ids": np.array([ids])}, names="blocks.*.mlp.hook_post")
        values = np.asarray(cache.stack("mlp.hook_post"))[:, 0]
        for group in groups[1:-1]:
            expected = values[:, group[0]] if pool == "first" else values[:, group].mean(1)
            assert_close_to_scale(features.values[:, column], expected, forward_rtol(tiny.config, S=len(ids)))
            column += 1
    assert column == features.values.shape[1]
    np.testing.assert_array_equal(features.sentence, [0, 0, 0, 1, 1, 2, 2, 2, 2])


def test_sentence_features_take_cls_or_the_mean_of_real_tokens(tiny):
    texts = ["ab cd", "e f g h"]
    cls = probes.sentence_features(tiny, texts, site="hook_resid_post", pool="cls")
    mean = probes.sentence_features(tiny, texts, site="hook_resid_post", pool="mean")
    for b, text in enumerate(texts):
        _, cache = tiny.run_with_cache([text], names="blocks.*.hook_resid_post")
        values = np.asarray(cache.stack("hook_resid_post"))[:, 0]
        rtol = forward_rtol(tiny.config, S=values.shape[1])
        assert_close_to_scale(cls.values[:, b], values[:, 0], rtol)
        assert_close_to_scale(mean.values[:, b], values.mean(1), rtol)


def test_token_features_of_pairs_give_every_real_token_with_its_segment(tiny):
    """Against a run of each pair alone: the non-special tokens' rows in order ([CLS] and both [SEP] left out),
    their token texts and segments (the token type ids, 1 in the pair's second text), the pair's number."""
    texts, pairs = ["ab cd", "e f g h"], ["fgh a", "b"]
    features = probes.token_features(tiny, texts, pairs, site="mlp.hook_post", batch_size=1)
    column = 0
    for b, (text, pair) in enumerate(zip(texts, pairs)):
        batch = tiny.tokenize([text], [pair])
        _, cache = tiny.run_with_cache(batch, names="blocks.*.mlp.hook_post")
        values = np.asarray(cache.stack("mlp.hook_post"))[:, 0]
        ids = list(np.asarray(batch.input_ids)[0])
        kept = [t for t, i in enumerate(ids) if i not in (tiny.tokenizer.cls_token_id, tiny.tokenizer.sep_token_id)]
        n = len(kept)
        assert_close_to_scale(features.values[:, column:column + n], values[:, kept],
                              forward_rtol(tiny.config, S=len(ids)))
        assert list(features.tokens[column:column + n]) == tiny.tokenizer.convert_ids_to_tokens([ids[t] for t in kept])
        np.testing.assert_array_equal(features.segment[column:column + n],
                                      np.asarray(batch.token_type_ids)[0, kept])
        np.testing.assert_array_equal(features.sentence[column:column + n], b)
        column += n
    assert column == len(features) and set(features.segment) == {0, 1}
    chosen = features.take(features.segment == 1)
    assert set(chosen.segment) == {1} and len(chosen.tokens) == len(chosen) == chosen.values.shape[1]


def test_word_and_text_labels_read_from_tsv(tmp_path):
    words = tmp_path / "words.tsv"
    words.write_text("# a comment\nThe\tDET\tx\ndog\tNOUN\tx\n\n\nbarks\tVERB\ty\n", encoding="utf-8")
    assert probes.read_word_labels(words) == ([["The", "dog"], ["barks"]], [["x", "x"], ["y"]])
    assert probes.read_word_labels(words, column=1) == ([["The", "dog"], ["barks"]], [["DET", "NOUN"], ["VERB"]])
    texts = tmp_path / "texts.tsv"
    texts.write_text("a cat\tanimal\n\nthe 3 cars\tthing\n", encoding="utf-8")
    assert probes.read_text_labels(texts) == (["a cat", "the 3 cars"], None, ["animal", "thing"])
    texts.write_text("a cat\tsits\tyes\nno dog\there\tno\n", encoding="utf-8")
    assert probes.read_text_labels(texts) == (["a cat", "no dog"], ["sits", "here"], ["yes", "no"])
    texts.write_text("a cat\tsits\tyes\nno dog\tno\n", encoding="utf-8")
    with pytest.raises(DataFileError, match="line 2: expected text<TAB>label"):
        probes.read_text_labels(texts)
    words.write_text("The\tDET\ndog\n", encoding="utf-8")
    with pytest.raises(DataFileError, match="line 2: expected a word and its label"):
        probes.read_word_labels(words)
    with pytest.raises(DataFileMissing, match="no TSV file"):
        probes.read_word_labels(tmp_path / "absent.tsv")
    # issue 32 C: a Latin-1 file raised a raw UnicodeDecodeError; a UTF-8 byte-order mark (Excel) is dropped
    words.write_bytes("The\tDET\ncaf\u00e9\tNOUN\n".encode("latin-1"))
    with pytest.raises(DataFileError, match="line 2: not valid UTF-8"):
        probes.read_word_labels(words)
    words.write_bytes(b"\xef\xbb\xbf" + "The\tDET\ncaf\u00e9\tNOUN\n".encode())
    assert probes.read_word_labels(words) == ([["The", "café"]], [["DET", "NOUN"]])


@pytest.mark.slow
def test_token_probe_scores_the_test_split_and_its_control(tiny):
    """Accuracy is the kept probe's on the held-out sentences; selectivity is task − control accuracy."""
    rng = np.random.default_rng(4)
    letters = list("abcdefghij")
    sentences = [[str(rng.choice(letters)) for _ in range(rng.integers(3, 8))] for _ in range(40)]
    labels = [[int(w in "abcde") for w in words] for words in sentences]  # a property of the word (generated)
    result = probes.token_probe(tiny, sentences, labels, site="hook_resid_post", samples=100)
    features = probes.word_features(tiny, sentences, site="hook_resid_post")
    test = np.isin(features.sentence, probes.split_sentences(40)["test"])
    y = np.concatenate(labels)
    expected = (probes.predict(result.params, features.values[:, test]) == y[test]).mean(1)
    np.testing.assert_array_equal(result.accuracy, expected)
    assert np.all((result.interval[:, 0] <= result.accuracy) & (result.accuracy <= result.interval[:, 1]))
    np.testing.assert_array_equal(result.selectivity, result.accuracy - result.control.accuracy)
    assert [row["layer"] for row in result.table()] == list(range(tiny.config.num_hidden_layers))


def test_probe_errors_name_the_problem(tiny):
    with pytest.raises(AnalysisError, match="not a per-layer hook site"):
        probes.word_features(tiny, SENTENCES, site="hook_resid_postt")
    with pytest.raises(AnalysisError, match="one vector per token"):
        probes.word_features(tiny, SENTENCES, site="attn.hook_pattern")
    with pytest.raises(AnalysisError, match="one label per word"):
        probes.token_probe(tiny, SENTENCES, [[0, 1], [0, 1], [0]])
    with pytest.raises(AnalysisError, match="labels must be integers"):
        probes.fit_linear_probes(np.zeros((1, 3, 2)), np.array([0, 1, 5]), num_classes=2)


def test_probes_refuse_one_class_non_finite_features_column_labels_and_no_items():
    """Each once gave a silent answer or a raw exception: one class scored 1.0 on every layer, a NaN fitted and
    predicted class 0, +inf gave accuracies like [0.25, 1.0], a column vector of labels raised a TypeError, no
    items a numpy ValueError."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 40, 5)).astype(np.float32)
    features = probes.Features(x, np.repeat(np.arange(10), 4), "hook_resid_post")
    labels = rng.integers(0, 2, 40)
    with pytest.raises(AnalysisError, match="one class"):
        probes.probe(features, [0] * 40)
    with pytest.raises(AnalysisError, match="one class"):
        probes.fit_linear_probes(x, np.zeros(40, int))
    for bad in (np.nan, np.inf, -np.inf):
        values = x.copy()
        values[1, 7, 3] = bad
        with pytest.raises(AnalysisError, match="non-finite.*layer 1, item 7, feature 3"):
            probes.probe(probes.Features(values, features.sentence, "hook_resid_post"), list(labels))
        with pytest.raises(AnalysisError, match="non-finite"):
            probes.predict({"W": np.ones((2, 5, 2)), "b": np.zeros((2, 2))}, values)
        with pytest.raises(AnalysisError, match="dev features hold 1 non-finite"):
            probes.fit_linear_probes(x, labels, dev=(values, labels))
    with pytest.raises(AnalysisError, match=r"column vector: pass labels.ravel\(\)"):
        probes.probe(features, labels[:, None])
    with pytest.raises(AnalysisError, match=r"column vector: pass labels.ravel\(\)"):
        probes.fit_linear_probes(x, labels[:, None])
    empty = np.zeros((2, 0, 5), np.float32)
    with pytest.raises(AnalysisError, match="at least one layer, item and feature"):
        probes.fit_linear_probes(empty, np.zeros(0, int))
    with pytest.raises(AnalysisError, match="at least one layer, item and feature"):
        probes.probe(probes.Features(empty, np.zeros(0, int), "hook_resid_post"), [])


def test_the_default_site_is_the_layer_output_the_probing_papers_read(tiny_mlm):
    """In post-LN BERT hook_resid_post is the sum before the block's second LayerNorm; the papers probe the layer
    output, transformers' hidden_states[l + 1]. The default features are those (first wordpiece of each word),
    up to two programs' forward rounding (tolerances.forward_rtol)."""
    import torch

    model, hf = tiny_mlm
    sentences = [["a", "c", "e"], ["f", "h"]]  # one wordpiece each in the tiny vocabulary
    features = probes.word_features(model, sentences)
    assert features.site == probes.layer_output_site(model) == "hook_normalized_resid_post"
    for b, words in enumerate(sentences):
        batch = model.tokenize([" ".join(words)])
        with torch.no_grad():
            hidden = hf(**{k: torch.tensor(np.asarray(v)) for k, v in batch.to_dict().items()},
                        output_hidden_states=True).hidden_states
        firsts = [1 + i for i in range(len(words))]  # one wordpiece per word here (asserted below)
        assert len(batch.real_tokens(0)) == len(words) + 2
        items = np.flatnonzero(features.sentence == b)
        for layer in range(model.config.num_hidden_layers):
            assert_close_to_scale(features.values[layer, items], hidden[layer + 1][0, firsts].numpy(),
                                  forward_rtol(model.config, S=len(words) + 2), f"layer {layer}")


def _typed_sentences(rng, n=60):
    """Generated sentences over 30 word types; a word's label is a property of its type (its first letter)."""
    types = [a + b for a in "abcdef" for b in "ghijk"]
    sentences = [[str(rng.choice(types)) for _ in range(rng.integers(3, 7))] for _ in range(n)]
    return sentences, [[int(w[0] in "abc") for w in words] for words in sentences]


@pytest.mark.slow
def test_token_probe_sweeps_l2_with_the_control_task_and_keeps_the_test_items(tiny):
    """l2=None with the control task: every L2_GRID value trained on task and control (each row recomputed with
    probe() at that l2), the kept one the highest mean dev selectivity; the result names its test items, their
    gold classes and every layer's predictions, which give its accuracy."""
    from minibert.analysis.probes.linear import _fit_layers

    sentences, labels = _typed_sentences(np.random.default_rng(3))
    programs = _fit_layers._cache_size()
    result = probes.token_probe(tiny, sentences, labels, samples=50)
    assert _fit_layers._cache_size() - programs <= 1  # ten fits (five l2, task and control), one program: l2 is traced
    assert [row["l2"] for row in result.sweep] == list(probes.L2_GRID)
    best = max(result.sweep, key=lambda row: row["dev_selectivity"])
    assert result.l2 == best["l2"] and result.control.l2 == best["l2"]
    features = probes.word_features(tiny, sentences)
    flat = [label for row in labels for label in row]
    words = [w for row in sentences for w in row]
    for row in result.sweep[:2]:
        task = probes.probe(features, flat, l2=row["l2"], samples=50)
        control = probes.probe(features, probes.control_labels(words, flat), l2=row["l2"], samples=50)
        assert row["dev_accuracy"] == task.dev_accuracy.mean()  # the same program on the same items
        assert row["dev_control"] == control.dev_accuracy.mean()
    y = probes.encode_labels(flat)[0]
    np.testing.assert_array_equal(result.gold, y[result.test])
    np.testing.assert_array_equal(result.predicted, probes.predict(result.params, features.take(result.test)))
    np.testing.assert_array_equal(result.accuracy, (result.predicted == result.gold).mean(1))
    typed = probes.token_probe(tiny, sentences, labels, l2=0.1, split="type", samples=50)
    test_types = {words[i] for i in typed.test}
    assert test_types and not test_types & {w for i, w in enumerate(words) if i not in set(typed.test)}
    with pytest.raises(AnalysisError, match="split='words'"):
        probes.token_probe(tiny, sentences, labels, split="words")


def test_probes_are_exported():
    assert minibert.analysis.probes is probes


# ---- structural probes -------------------------------------------------------------------------------------

# "the dog chased a cat ." : chased is the root; the → dog → chased ← cat ← a; "." → chased (hand-drawn tree)
HEADS = (2, 3, 0, 5, 3, 3)
UPOS = ("DET", "NOUN", "VERB", "DET", "NOUN", "PUNCT")


def test_tree_distances_and_depths_by_hand_and_by_shortest_paths():
    from scipy.sparse.csgraph import shortest_path

    np.testing.assert_array_equal(probes.tree_depths(HEADS), [2, 1, 0, 2, 1, 1])
    distances = probes.tree_distances(HEADS)
    assert distances[0, 3] == 4 and distances[1, 4] == 2 and distances[5, 0] == 3  # the→dog→chased←cat←a …
    rng = np.random.default_rng(6)
    for n in (1, 7, 30):
        heads = [0] + [int(rng.integers(1, i + 1)) for i in range(1, n)]  # each word hangs on an earlier one
        edges = np.zeros((n, n))
        for word, head in enumerate(heads):
            if head:
                edges[word, head - 1] = edges[head - 1, word] = 1
        np.testing.assert_array_equal(probes.tree_distances(heads), shortest_path(edges, unweighted=True))


def _trees(predicted_kind, sentences_heads, upos=None):
    """Trees of gold targets only (no features) for the metric functions."""
    W = max(map(len, sentences_heads))
    S = len(sentences_heads)
    targets = np.full((S, W, W) if predicted_kind == "distance" else (S, W), -1.0)
    punctuation = np.zeros((S, W), bool)
    for s, heads in enumerate(sentences_heads):
        n = len(heads)
        gold = probes.tree_distances(heads) if predicted_kind == "distance" else probes.tree_depths(heads)
        targets[(s, *np.ix_(*[range(n)] * gold.ndim))] = gold
        if upos is not None:
            punctuation[s, :n] = [tag == "PUNCT" for tag in upos[s]]
    roots = np.array([list(h).index(0) for h in sentences_heads])
    return probes.Trees(None, targets, np.array(list(map(len, sentences_heads))), punctuation, roots, predicted_kind)


def test_uuas_by_hand():
    """Predicted distances whose spanning tree attaches "a" to "dog" instead of "cat": 4 of 5 gold edges (the
    punctuation's edge left out: 4 gold edges among the words) → 3/4."""
    trees = _trees("distance", [HEADS], [UPOS])
    predicted = probes.tree_distances(HEADS).astype(float)
    predicted[3, 1] = predicted[1, 3] = 0.5  # a–dog is now the shortest pair
    predicted[3, 4] = predicted[4, 3] = 5.0
    assert probes.uuas([predicted], trees) == 3 / 4
    assert probes.uuas([probes.tree_distances(HEADS)], trees) == 1.0


def test_uuas_and_spearman_against_scipy():
    """UUAS against scipy's minimum spanning tree, Spearman against scipy.stats.spearmanr, both averaged the way
    Hewitt & Manning's reporter does (per-length means of per-row correlations over lengths 5–50)."""
    from scipy.sparse.csgraph import minimum_spanning_tree
    from scipy.stats import spearmanr

    rng = np.random.default_rng(7)
    sentence_heads = [[0] + [int(rng.integers(1, i + 1)) for i in range(1, n)] for n in (3, 5, 5, 8, 12)]
    upos = [["PUNCT" if rng.random() < 0.2 and i else "X" for i in range(len(h))] for h in sentence_heads]
    trees = _trees("distance", sentence_heads, upos)
    predicted = []
    correct = total = 0
    by_length = {}
    for heads, tags in zip(sentence_heads, upos):
        n = len(heads)
        points = rng.normal(size=(n, 3))
        distances = ((points[:, None] - points[None]) ** 2).sum(-1)  # distinct: one spanning tree
        predicted.append(distances)
        kept = [i for i in range(n) if tags[i] != "PUNCT"]

        def edges(matrix, kept=kept):
            tree = minimum_spanning_tree(matrix[np.ix_(kept, kept)] + 1e-9).toarray()  # +ε: scipy drops 0 weights
            return {tuple(sorted((kept[i], kept[j]))) for i, j in zip(*np.nonzero(tree))}

        gold = edges(probes.tree_distances(heads).astype(float))
        correct += len(gold & edges(distances))
        total += len(gold)
        by_length.setdefault(n, []).extend(spearmanr(p, g).statistic for p, g in zip(distances,
                                                                                     probes.tree_distances(heads)))
    assert probes.uuas(predicted, trees) == correct / total
    expected = np.mean([np.mean(by_length[n]) for n in by_length if 5 <= n <= 50])
    assert abs(probes.mean_spearman(predicted, trees) - expected) <= 1e-12


def test_root_accuracy_skips_punctuation():
    trees = _trees("depth", [HEADS, HEADS], [UPOS, UPOS])
    right = np.array([2.0, 1, 0.5, 2, 1, 0.1])  # "." is least deep, but punctuation: the root (chased) wins
    wrong = np.array([2.0, 0.2, 0.5, 2, 1, 0.1])
    assert probes.root_accuracy([right, wrong], trees) == 0.5


def _their_loss(kind, B, x, gold, n):
    """Their TwoWordPSDProbe + L1DistanceLoss, or OneWordPSDProbe + L1DepthLoss, in PyTorch."""
    import torch

    t = x @ B
    if kind == "distance":
        predicted = ((t.unsqueeze(2) - t.unsqueeze(1)) ** 2).sum(-1)
        return ((torch.abs(predicted - gold) * (gold != -1)).sum((1, 2)) / n**2).mean()
    predicted = (t**2).sum(-1)
    return ((torch.abs(predicted - gold) * (gold != -1)).sum(1) / n).mean()


def _torch_structural_run(kind, B0, x, gold, n, dev_x, dev_gold, dev_n, learning_rate, epochs):
    """Hewitt & Manning's probe, loss and regimen.py in PyTorch (float64), one batch per epoch: Adam, their
    ReduceLROnPlateau(factor 0.1, patience 0) on the dev loss, parameters saved when the dev loss beats the best
    by 1e-4, early stop once the best is more than 4 epochs old. Returns (loss per step, saved B, its dev loss)."""
    import torch

    B = torch.tensor(B0, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.Adam([B], lr=learning_rate)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.1, patience=0)
    losses, saved, min_dev_loss, min_dev_loss_epoch = [], B.detach().clone(), np.inf, -1
    for epoch in range(epochs):
        optimizer.zero_grad()
        loss = _their_loss(kind, B, x, gold, n)
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            dev_loss = _their_loss(kind, B, dev_x, dev_gold, dev_n).item()
        scheduler.step(dev_loss)
        if dev_loss < min_dev_loss - 0.0001:
            saved, min_dev_loss, min_dev_loss_epoch = B.detach().clone(), dev_loss, epoch
        elif min_dev_loss_epoch < epoch - 4:
            break
    return losses, saved.numpy(), min_dev_loss


@pytest.mark.parametrize("kind", ["distance", "depth"])
def test_structural_training_matches_their_pytorch_regimen(kind):
    """Per-step losses of every layer equal a PyTorch (float64) rendering of Hewitt & Manning's probe, L1 loss and
    training regimen (regimen.py: Adam, the learning rate ×0.1 on each dev plateau, best-dev parameters kept,
    early stopping) from the same B and batches (all training sentences: one step per epoch, so order is moot).
    The run stops at the same epoch, and the kept B's dev loss equals the reference's saved one.

    Tolerance: our float32 loss of one step rounds x·B (dot products of length F), the squares summed over the
    rank K and |·| summed over S·W² pairs: dot_rtol(F) twice + sum_rtol(K) + sum_rtol(S·W²), relative to
    the loss. Adam moves each entry by at most lr per step whatever the gradient's rounding, but rounding
    only perturbs it; we allow the step's bound to accumulate linearly over the steps taken.
    """
    import torch

    rng = np.random.default_rng(8)
    S, W, F, K, L, rate, epochs = 10, 7, 12, 4, 2, 0.05, 60
    lengths = rng.integers(3, W + 1, size=S)
    lengths[0] = W
    sentence_heads = [[0] + [int(rng.integers(1, i + 1)) for i in range(1, n)] for n in lengths]
    gold = _trees(kind, sentence_heads)
    features = rng.normal(size=(L, S, W, F)).astype(np.float32)
    trees = probes.Trees(features, gold.targets.astype(np.float32), gold.lengths, gold.punctuation, gold.roots, kind)
    train, dev = trees.take(np.arange(6)), trees.take(np.arange(6, S))
    init = rng.uniform(-0.05, 0.05, size=(L, F, K)).astype(np.float32)
    kept, losses = probes.fit_structural_probes(train, learning_rate=rate, epochs=epochs, batch_size=6, dev=dev,
                                                init=init)
    base = 2 * dot_rtol(F) + sum_rtol(K) + sum_rtol(6 * W * W)

    def tensors(part, layer):
        return [torch.tensor(a, dtype=torch.float64) for a in (part.features[layer], part.targets, part.lengths)]

    runs = []
    for layer in range(L):
        reference, _, saved_loss = _torch_structural_run(kind, init[layer], *tensors(train, layer),
                                                         *tensors(dev, layer), rate, epochs)
        runs.append(len(reference))
        for step, expected in enumerate(reference):
            assert abs(losses[step, layer] - expected) <= (step + 1) * base * expected, (step, layer)
        ours = _their_loss(kind, torch.tensor(kept[layer], dtype=torch.float64), *tensors(dev, layer)).item()
        assert abs(ours - saved_loss) <= len(reference) * base * saved_loss, layer
    assert max(runs) < epochs, "no layer stopped early: the regimen's stopping rule went untested"
    assert len(losses) == max(runs)  # training ends when the last layer stops


@pytest.mark.slow
@pytest.mark.parametrize("kind", probes.STRUCTURAL_KINDS)
def test_structural_probe_on_the_sample_treebank(tiny, kind):
    """The reported scores are the kept B's on the held-out sentences (recomputed from the treebank, the same
    split and the metric functions), and B's training started from their ±0.05 initialisation."""
    sentences = probes.read_conllu(minibert.analysis.sample_treebank())
    result = probes.structural_probe(tiny, sentences, kind, epochs=3, rank=4)
    L = tiny.config.num_hidden_layers
    assert result.B.shape == (L, tiny.config.hidden_size, 4) and result.losses.shape[1] == L
    trees = probes.tree_data(tiny, sentences, kind).take(probes.split_sentences(len(sentences))["test"])
    expected = probes.evaluate_structural(result.B, trees)
    np.testing.assert_array_equal(result.spearman, expected["spearman"])
    score = result.uuas if kind == "distance" else result.root_accuracy
    np.testing.assert_array_equal(score, expected["uuas" if kind == "distance" else "root_accuracy"])
    assert np.all((0 <= score) & (score <= 1)) and len(result.table()) == L


@pytest.mark.slow
def test_probe_benchmark_smoke(capsys, monkeypatch):
    """benchmarks/probes.py --smoke runs and prints its table (the timings themselves are not checked)."""
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import probes as benchmark

    assert benchmark.main(["--smoke"]) == 0
    printed = capsys.readouterr().out
    for row in ("all layers, one program (lax.map)", "all layers, one program (vmap)", "scikit-learn, per layer"):
        assert f"| {row} |" in printed, row
    sys.modules.pop("probes", None)


# ---- Clark et al.'s attention-based probe ------------------------------------------------------------------


def _their_distance_features(seq_len):
    """A line-by-line NumPy port of make_distance_features in Clark et al.'s Syntax_Analysis notebook."""
    distances = np.zeros((seq_len, seq_len))
    for i in range(seq_len):
        for j in range(seq_len):
            if i < j:
                distances[i, j] = (j - i) / float(seq_len)
    feature_matrices = [distances, distances.T]
    for k in range(3):
        for direction in ([1] if k == 0 else [-1, 1]):
            feature_matrices.append(np.eye(seq_len, k=k * direction))
    features = np.concatenate([np.zeros([7, seq_len, 1]), np.stack(feature_matrices)], -1)
    root = np.zeros((1, seq_len, seq_len + 1))
    root[:, :, 0] = 1
    return np.concatenate([features, root], 0)


@pytest.mark.parametrize("n", [1, 2, 7])
def test_distance_features_are_theirs(n):
    np.testing.assert_array_equal(probes.distance_features(n), _their_distance_features(n).astype(np.float32))


def _their_logits(params, attention, embeddings, kind, distances=None):
    """Their TensorFlow graph for one unpadded sentence, in NumPy float64: attention [K, n + 2, n + 2] (both
    directions, [CLS] and [SEP] kept), embeddings [n, E]."""
    n = embeddings.shape[0]
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    pairs = np.concatenate([np.repeat(embeddings[:, None], n, 1), np.repeat(embeddings[None], n, 0)], -1)
    pairs = np.concatenate([pairs, np.zeros((n, 1, pairs.shape[-1]))], 1)  # their dummy ROOT is appended …
    pairs = np.concatenate([pairs[:, -1:], pairs[:, :-1]], 1)  # … and ROOT is column 0 of the maps: align them
    if kind == "attention_and_words":
        root = p["root_start"] * attention[:, 1:-1, 0] + p["root_end"] * attention[:, 1:-1, -1]
        maps = np.concatenate([root[..., None], attention[:, 1:-1, 1:-1]], -1).transpose(1, 2, 0)
        return ((pairs @ p["W"] + p["b"]) * maps).sum(-1)
    inputs = np.concatenate([np.zeros((1, n, n + 1)), distances, pairs.transpose(2, 0, 1)]).transpose(1, 2, 0)
    return (np.tanh(inputs @ p["W1"] + p["b1"]) @ p["W2"] + p["b2"])[..., 0]


@pytest.mark.slow
@pytest.mark.parametrize("kind", probes.CLARK_PROBES)
def test_clark_logits_match_their_graph_padded_or_not(kind):
    """Logits of a 4-word sentence alone and padded to 6 words equal a NumPy rendering of their graph (float64);
    tolerance: the dense layer's dot products (length 2E or the MLP's inputs) and the sum over the K maps."""

    rng = np.random.default_rng(9)
    n, W, K, E = 4, 6, 10, 5
    attention = rng.dirichlet(np.ones(n + 2), size=(K, n + 2)).astype(np.float32)
    embeddings = rng.normal(size=(n, E)).astype(np.float32)
    params = probes.init_clark_probe(kind, K, E, seed=1)
    expected = _their_logits(params, attention.astype(np.float64), embeddings.astype(np.float64), kind,
                             probes.distance_features(n).astype(np.float64))
    padded_attention = np.zeros((K, W + 2, W + 2), np.float32)
    padded_attention[:, :n + 2, :n + 2] = attention
    padded_embeddings = np.zeros((W, E), np.float32)
    padded_embeddings[:n] = embeddings
    padded_distances = np.zeros((probes.DISTANCE_FEATURES, W, W + 1), np.float32)
    padded_distances[:, :n, :n + 1] = probes.distance_features(n)
    rtol = dot_rtol(2 * E + probes.DISTANCE_FEATURES + 1) + dot_rtol(max(K, 256))
    alone = np.asarray(probes.clark_logits(params, attention, embeddings, probes.distance_features(n), kind))
    assert_close_to_scale(alone, expected, rtol, "alone")
    padded = np.asarray(probes.clark_logits(params, padded_attention, padded_embeddings, padded_distances, kind, n))
    assert_close_to_scale(padded[:n, :n + 1], expected, rtol, "padded")
    assert np.all(np.isneginf(padded[:, n + 1:]))


@pytest.mark.slow
def test_clark_training_reports_the_loss_before_each_step_and_uas_counts_non_punct_words():
    """Step t's loss is the summed cross-entropy at the parameters after t − 1 steps (recomputed in NumPy);
    UAS counts the words whose relation is not punct."""
    rng = np.random.default_rng(10)
    S, n, K, E = 3, 4, 6, 3
    attention = np.zeros((S, K, n + 2, n + 2), np.float32)
    attention[:] = rng.dirichlet(np.ones(n + 2), size=(S, K, n + 2))
    heads = np.array([[2, 0, 2, 3], [0, 1, 1, 3], [4, 4, 4, 0]], np.int32)
    data = probes.ParseData(attention, rng.normal(size=(S, n, E)).astype(np.float32),
                            np.stack([probes.distance_features(n)] * S), heads,
                            np.array([[1, 1, 0, 1]] * S, bool))
    init = probes.init_clark_probe("attention_and_words", K, E, seed=2)
    _, losses = probes.fit_clark_probe(data, init=init, batch_size=S, epochs=2)
    logits = np.stack([_their_logits(init, attention[s].astype(np.float64), data.embeddings[s].astype(np.float64),
                                     "attention_and_words") for s in range(S)])
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = -np.take_along_axis(log_probs, heads[..., None], -1).sum()
    # float32: each logit rounds the dense layer (length 2E) and the sum over K maps, relative to the largest
    # logit; a log-softmax moves by at most twice its logits' error plus its sum's rounding (n + 1 terms); the
    # S·n words' terms are summed
    logit_error = np.abs(logits).max() * (dot_rtol(2 * E) + dot_rtol(K))
    word_error = 2 * logit_error + np.log(n + 1) * sum_rtol(n + 1)
    assert abs(losses[0] - expected) <= S * n * word_error + sum_rtol(S * n) * abs(expected)
    predicted = np.argmax(logits, -1)
    uas = probes.unlabelled_attachment(init, data)
    assert uas == (predicted == heads)[data.scored].mean()


def test_bad_l2_missing_labels_empty_words_and_ragged_labels_are_named(tiny):
    """Docs-only tester (trust) items 3, 24, 25, 26: l2=nan fitted W = 0 everywhere (chance accuracy, no error) and
    l2=-1 an unbounded objective; an empty word got [UNK]'s feature; None was a class; ragged labels named no
    sentence."""
    x, y = _planted_task()
    for bad in (float("nan"), -1.0, float("inf"), "0.1"):
        with pytest.raises(AnalysisError, match=f"l2={bad!r}: pass a finite number ≥ 0"):
            probes.fit_linear_probes(x, y, l2=bad)
    features = probes.Features(x, np.arange(x.shape[1]) // 4, "hook_resid_post")
    for missing in (None, float("nan")):
        labels = list(y)
        labels[5] = missing
        with pytest.raises(AnalysisError, match=r"labels\[5\] is missing"):
            probes.probe(features, labels)
    with pytest.raises(AnalysisError, match=r"sentences\[1\]\[0\] is an empty word"):
        probes.word_features(tiny, [["ab", "c"], ["", "a"]])
    with pytest.raises(AnalysisError, match=r"sentences\[1\] has 2 words but 1 labels"):
        probes.token_probe(tiny, SENTENCES, [[0, 1, 0], [0], [0, 1, 0, 1]])
    with pytest.raises(AnalysisError, match="3 sentences but 2 label lists"):
        probes.token_probe(tiny, SENTENCES, [[0, 1, 0], [0, 1]])


def test_a_header_row_is_not_read_as_an_example(tmp_path):
    """Docs-only tester (trust) item 7: training.examples' text<TAB>label header became a text 'text' of class
    'label'."""
    texts = tmp_path / "texts.tsv"
    texts.write_text("text\tlabel\na cat\tanimal\nthe car\tthing\n", encoding="utf-8")
    assert probes.read_text_labels(texts) == (["a cat", "the car"], None, ["animal", "thing"])
    texts.write_text("text\tpair\tlabel\na cat\tsits\tyes\n", encoding="utf-8")
    assert probes.read_text_labels(texts) == (["a cat"], ["sits"], ["yes"])
