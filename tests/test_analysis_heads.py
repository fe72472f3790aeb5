"""Clark et al. head statistics (minibert.analysis.heads) against a brute-force NumPy reference.

The reference below is written from docs/definitions.md with explicit loops over documents, query rows and
key columns (and over head pairs for Jensen–Shannon), in float64, sharing no code with the library.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from tolerances import survey_statistic_tolerances

from minibert.analysis import heads
from minibert.errors import AnalysisError

# ---- the reference ------------------------------------------------------------------------------------


def reference_document(A, cls, sep, punct, sep_normalization="clark"):
    """Every statistic for one head of one document. A: [n, n] real rows × real keys; cls/sep/punct: [n] 0/1.
    [SEP] rows divide by 2 and the other rows by n − 2 (Clark et al.), or by their counts ("count")."""
    n = A.shape[0]
    s = dict.fromkeys(heads.STATISTICS, 0.0)
    n_sep = sum(sep)
    sep_rows, rest_rows = (2, n - 2) if sep_normalization == "clark" else (n_sep, n - n_sep)
    for i in range(n):
        for j in range(n):
            a = float(A[i, j])
            if j == i:
                s["self"] += a / n
            if j == i + 1:
                s["next"] += a / n
            if j == i - 1:
                s["prev"] += a / n
            if cls[j]:
                s["to_cls"] += a / n
            if sep[j]:
                s["to_sep"] += a / n
                if sep[i]:
                    s["sep_to_sep"] += a / sep_rows
                else:
                    s["rest_to_sep"] += a / rest_rows
            if punct[j]:
                s["to_punct"] += a / n
    n_cls = sum(cls)
    for i in range(n):
        row_entropy = 0.0
        for j in range(n):
            p = 0.9999 * float(A[i, j]) + 0.0001 / n
            row_entropy -= p * math.log(p)
        s["entropy"] += row_entropy / n
        if cls[i]:
            s["cls_entropy"] += row_entropy / n_cls
    s["uniform_entropy"] = math.log(n)
    return s


def reference_statistics(pattern, mask, is_cls, is_sep, is_punct, sep_normalization="clark"):
    """{name: [B, L, H]} from pattern [L, B, H, T, S] by looping over documents, layers and heads."""
    L, B, H = pattern.shape[:3]
    out = {name: np.zeros((B, L, H)) for name in heads.STATISTICS}
    for b in range(B):
        n = int(mask[b].sum())
        for layer in range(L):
            for h in range(H):
                A = np.asarray(pattern[layer, b, h, :n, :n], np.float64)
                doc = reference_document(A, is_cls[b, :n], is_sep[b, :n], is_punct[b, :n], sep_normalization)
                for name, value in doc.items():
                    out[name][b, layer, h] = value
    return out


def reference_js(pattern, mask, doc_mask):
    """[L·H, L·H] Jensen–Shannon matrix with loops over head pairs, documents, rows and keys."""
    L, B, H = pattern.shape[:3]
    flat = [(layer, h) for layer in range(L) for h in range(H)]
    js = np.zeros((L * H, L * H))
    for x, (l1, h1) in enumerate(flat):
        for y, (l2, h2) in enumerate(flat):
            total = 0.0
            for b in range(B):
                if not doc_mask[b]:
                    continue
                n = int(mask[b].sum())
                for i in range(n):
                    for j in range(n):
                        p = 0.999 * float(pattern[l1, b, h1, i, j]) + 0.001 / n
                        q = 0.999 * float(pattern[l2, b, h2, i, j]) + 0.001 / n
                        m = (p + q) / 2
                        total += 0.5 * p * math.log(p / m) + 0.5 * q * math.log(q / m)
            js[x, y] = total
    return js


U = 2.0**-24  # fp32 unit roundoff


def statistic_atol(T: int, S: int) -> float:
    """Absolute slack for entropies (nats), see statistic_rtol."""
    return statistic_rtol(T, S)


def statistic_rtol(T: int, S: int) -> float:
    """Relative error bound of a statistic computed in fp32 from fp32 maps [T, S], against float64.

    Every statistic is a sum of non-negative terms (A ≥ 0, weights 1/n, −p ln p ≥ 0 for p ≤ 1): summed over
    keys then over query rows, each term passes through at most (S − 1) + (T − 1) additions, and a sum of
    non-negative terms keeps the relative error of its terms (Higham 2002, §4.2). Forming one term takes
    at most 8 roundings (smoothing 3, ln 2, product 1, weight 1/n 2). Hence (T + S + 8)·u relative.
    One exception: ln p of p near 1 carries p's absolute rounding u, not a relative one, so an entropy
    term −p ln p is off by up to u·p absolute; Σ_j p = 1 per row and the row weights sum to 1, so
    entropies also get (T + S + 8)·u absolute (statistic_atol).
    """
    return (T + S + 8) * U


# ---- random attention maps --------------------------------------------------------------------------


def random_maps(rng, L=2, B=4, H=3, T=11, lengths=(11, 7, 4, 9)):
    """Softmax rows over each document's real keys (exact zeros at padding keys, junk in padding rows)
    and random [CLS]/[SEP]/punctuation positions, with at least one [SEP] and one non-[SEP] token."""
    pattern = rng.normal(size=(L, B, H, T, T)).astype(np.float32) * 3  # padding rows keep this junk
    mask = np.zeros((B, T), np.float32)
    is_cls, is_sep, is_punct = (np.zeros((B, T), np.float32) for _ in range(3))
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        logits = rng.normal(size=(L, H, n, n)) * 2
        rows = np.exp(logits - logits.max(-1, keepdims=True))
        pattern[:, b, :, :n, :n] = rows / rows.sum(-1, keepdims=True)
        pattern[:, b, :, :n, n:] = 0.0
        roles = rng.permutation(n)
        is_cls[b, roles[0]] = 1
        is_sep[b, roles[1:1 + rng.integers(1, 3)]] = 1
        is_punct[b, rng.choice(n, size=rng.integers(0, 3), replace=False)] = 1
        is_punct[b] *= 1 - is_sep[b]
    return pattern, mask, is_cls, is_sep, is_punct


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("normalization", heads.SEP_NORMALIZATIONS)
def test_head_statistics_match_brute_force(seed, normalization):
    pattern, mask, cls, sep, punct = random_maps(np.random.default_rng(seed))
    statistics = jax.jit(heads.head_statistics, static_argnames="sep_normalization")
    got = statistics(pattern, mask, cls, sep, punct, sep_normalization=normalization)
    want = reference_statistics(pattern, mask, cls, sep, punct, normalization)
    assert set(got) == set(heads.STATISTICS)
    for name in heads.STATISTICS:
        assert got[name].shape == (4, 2, 3), name
        np.testing.assert_allclose(np.asarray(got[name]), want[name], rtol=statistic_rtol(11, 11),
                                   atol=statistic_atol(11, 11), err_msg=name)


def test_bool_masks_and_padding_keys_with_small_weight():
    """Boolean masks work, and the ~0 weight a real softmax leaves on padding keys is not counted."""
    pattern, mask, cls, sep, punct = random_maps(np.random.default_rng(2))
    leaky = pattern.copy()
    for b, n in enumerate(mask.sum(1).astype(int)):
        leaky[:, b, :, :n, n:] = 1e-9
    got = heads.head_statistics(leaky, mask.astype(bool), cls > 0, sep > 0, punct > 0)
    want = heads.head_statistics(pattern, mask, cls, sep, punct)
    for name in heads.STATISTICS:  # padding keys are zeroed before any sum: the same program on the same values
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]), err_msg=name)


def js_atol(mask, doc_mask, S: int) -> float:
    """Absolute error bound of the fp32 JS sums against float64 (terms of either sign, so not relative to JS).

    Smoothed values p ≥ 0.001/S and m ≤ 1, so |ln(p/m)| ≤ c = |ln(0.001/S)| + ln 2 and a row's terms
    ½p ln(p/m) + ½q ln(q/m) have Σ|terms| ≤ c (Σp = Σq = 1). Errors: ln p and ln m are each off by
    ≤ u·|ln(0.001/S)|, times p (Σ ≤ 1 per row, two logs, two heads); smoothing, m and the products
    ≤ 6u relative per term; the sum over S keys and then the rows ≤ (S + rows)·u relative to Σ|terms|.
    """
    rows = float((np.asarray(mask) * np.asarray(doc_mask)[:, None]).sum())
    c = abs(math.log(0.001 / S)) + math.log(2)
    return rows * (c * (S + rows + 6) + 4 * abs(math.log(0.001 / S))) * U


def test_js_divergence_matches_brute_force():
    pattern, mask, *_ = random_maps(np.random.default_rng(3), L=2, H=2)
    doc_mask = np.array([1.0, 1.0, 0.0, 1.0], np.float32)  # the third document is padding
    got = np.asarray(jax.jit(heads.js_divergence_batch)(pattern, mask, doc_mask))
    want = reference_js(pattern, mask, doc_mask)
    np.testing.assert_allclose(got, want, rtol=0, atol=js_atol(mask, doc_mask, pattern.shape[-1]))
    assert np.array_equal(got, got.T)
    assert np.all(np.diag(got) == 0) and np.all(got[~np.eye(4, dtype=bool)] > 0)


def test_js_divergence_is_zero_between_identical_heads():
    pattern, mask, *_ = random_maps(np.random.default_rng(4), L=1, H=2)
    pattern[:, :, 1] = pattern[:, :, 0]
    js = np.asarray(heads.js_divergence_batch(pattern, mask, np.ones(4, np.float32)))
    assert np.all(js == 0.0)  # p = q bitwise, so m = (p + p)/2 = p exactly and every term is 0·0


# ---- hand-built maps -----------------------------------------------------------------------------------


def one_document(rows: np.ndarray, *, cls=(0,), sep=(), punct=(), width=None):
    """A [1, 1, H, T, T] pattern (padded to `width`) and its masks from per-head [H, n, n] maps."""
    H, n = rows.shape[0], rows.shape[-1]
    T = width or n
    pattern = np.zeros((1, 1, H, T, T), np.float32)
    pattern[0, 0, :, :n, :n] = rows
    mask = np.zeros((1, T), np.float32)
    mask[0, :n] = 1
    marks = []
    for positions in (cls, sep, punct):
        m = np.zeros((1, T), np.float32)
        m[0, list(positions)] = 1
        marks.append(m)
    return pattern, mask, *marks


def test_previous_token_head():
    n = 6
    prev = np.zeros((n, n))
    prev[0, 0] = 1
    prev[np.arange(1, n), np.arange(n - 1)] = 1
    stats = heads.head_statistics(*one_document(prev[None], sep=(n - 1,), width=9))
    mean = {name: np.asarray(v).mean(0) for name, v in stats.items()}
    assert mean["prev"][0, 0] == pytest.approx((n - 1) / n)
    assert mean["self"][0, 0] == pytest.approx(1 / n)
    assert mean["next"][0, 0] == 0
    assert mean["uniform_entropy"][0, 0] == pytest.approx(math.log(n))
    p_hit, p_miss = 0.9999 + 0.0001 / n, 0.0001 / n  # one-hot rows, smoothed
    assert mean["entropy"][0, 0] == pytest.approx(-(p_hit * math.log(p_hit) + (n - 1) * p_miss * math.log(p_miss)),
                                                  rel=1e-5)
    assert heads.behaviour_labels(mean).tolist() == [["prev"]]
    [row] = heads.head_table(mean)
    assert (row["layer"], row["head"], row["label"], row["behaviour"]) == (0, 0, "1-1", "prev")
    assert row["prev"] == pytest.approx((n - 1) / n) and isinstance(row["prev"], float)


def test_uniform_and_sep_heads():
    """Uniform attention has entropy ln n; all-on-[SEP] gives to_sep = 1 and both [SEP] fractions 1."""
    n = 8
    uniform = np.full((n, n), 1 / n)
    to_sep = np.zeros((n, n))
    to_sep[:, n - 1] = 1
    stats = heads.head_statistics(*one_document(np.stack([uniform, to_sep]), sep=(n - 1,)))
    mean = {name: np.asarray(v)[0] for name, v in stats.items()}
    np.testing.assert_allclose(mean["entropy"][0], [math.log(n), mean["entropy"][0, 1]], rtol=1e-6)
    np.testing.assert_allclose(mean["cls_entropy"][0, 0], math.log(n), rtol=1e-6)
    assert mean["to_sep"][0, 1] == pytest.approx(1.0)
    # One [SEP]: Clark's constants give 1/2 and (n − 1)/(n − 2), not fractions.
    assert mean["sep_to_sep"][0, 1] == pytest.approx(1 / 2)
    assert mean["rest_to_sep"][0, 1] == pytest.approx((n - 1) / (n - 2))
    assert mean["to_cls"][0, 0] == pytest.approx(1 / n)
    # Uniform over 8 tokens is as broad as a row can be: broad against ln 8, not against Clark's 3.8 nats.
    assert heads.behaviour_labels(mean).tolist() == [["broad", "sep"]]
    assert heads.behaviour_labels(mean, broad="absolute").tolist() == [["", "sep"]]


@pytest.mark.parametrize("normalization", heads.SEP_NORMALIZATIONS)
def test_clark_denominators_on_a_pair(normalization):
    """With two [SEP]s, sep_to_sep is Σ/2 and rest_to_sep is Σ/(n − 2) either way (the counts are 2, n − 2)."""
    rng = np.random.default_rng(5)
    n, seps = 9, (4, 8)
    rows = rng.dirichlet(np.ones(n), size=n).astype(np.float32)
    stats = heads.head_statistics(*one_document(rows[None], sep=seps), sep_normalization=normalization)
    sep_cols = rows.astype(np.float64)[:, list(seps)].sum(1)
    rtol = statistic_rtol(n, n)
    assert float(stats["sep_to_sep"][0, 0, 0]) == pytest.approx(sep_cols[list(seps)].sum() / 2, rel=rtol)
    rest = [i for i in range(n) if i not in seps]
    assert float(stats["rest_to_sep"][0, 0, 0]) == pytest.approx(sep_cols[rest].sum() / (n - 2), rel=rtol)


@pytest.mark.parametrize("normalization, sep_to_sep, rest_to_sep", [
    ("clark", 0.4 / 2, (0.4 + 0.25 + 0.5) / (4 - 2)),  # Clark's constants: / 2 and / (n − 2), one [SEP] or two
    ("count", 0.4 / 1, (0.4 + 0.25 + 0.5) / 3),         # / the [SEP] count and the other tokens' count
])
def test_one_sep_by_hand(normalization, sep_to_sep, rest_to_sep):
    """[CLS] a b [SEP]: the [SEP] column holds 0.4, 0.25, 0.5 in the other rows and 0.4 in its own row."""
    rows = np.array([[0.1, 0.2, 0.3, 0.4],
                     [0.25, 0.25, 0.25, 0.25],
                     [0.0, 0.0, 0.5, 0.5],
                     [0.2, 0.2, 0.2, 0.4]], np.float32)
    stats = heads.head_statistics(*one_document(rows[None], sep=(3,), width=6), sep_normalization=normalization)
    rtol = statistic_rtol(4, 4)  # the hand values are exact decimals; fp32 holds them to u each
    assert float(stats["sep_to_sep"][0, 0, 0]) == pytest.approx(sep_to_sep, rel=rtol)
    assert float(stats["rest_to_sep"][0, 0, 0]) == pytest.approx(rest_to_sep, rel=rtol)
    assert float(stats["to_sep"][0, 0, 0]) == pytest.approx((0.4 + 0.25 + 0.5 + 0.4) / 4, rel=rtol)


def test_unknown_sep_normalization_names_the_choices():
    rows = np.full((1, 3, 3), 1 / 3, np.float32)
    with pytest.raises(AnalysisError, match="'clark'.*'count'"):
        heads.head_statistics(*one_document(rows, sep=(2,)), sep_normalization="sep_count")


def test_behaviour_labels_thresholds_and_joining():
    zero = np.zeros((1, 4))
    mean = {"entropy": np.array([[4.0, 3.0, 3.9, 1.0]]), "next": np.array([[0, 0.51, 0, 0]]),
            "prev": zero, "to_cls": np.array([[0, 0, 0, 0.6]]), "to_sep": np.array([[0.7, 0, 0, 0.61]]),
            "to_punct": zero}
    assert heads.behaviour_labels(mean).tolist() == [["broad+sep", "next", "broad", "sep"]]
    assert heads.behaviour_labels({"next": np.array([[0.2]])}).tolist() == [[""]]
    rows = heads.head_table(mean)
    assert [r["label"] for r in rows] == ["1-1", "1-2", "1-3", "1-4"]
    assert rows[0]["behaviour"] == "broad+sep" and rows[1]["next"] == pytest.approx(0.51)


def test_token_masks_from_ids():
    ids = np.array([[101, 7, 1012, 102, 1010, 102], [101, 1010, 102, 0, 0, 0]])
    mask = (ids != 0).astype(int)
    ids[1, 3:] = 1012  # padding that happens to hold a punctuation id stays unmarked
    masks = heads.token_masks_from_ids(ids, mask, cls_id=101, sep_id=102, punct_ids=[1012, 1010])
    assert masks["is_cls"].tolist() == [[1, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]]
    assert masks["is_sep"].tolist() == [[0, 0, 0, 1, 0, 1], [0, 0, 1, 0, 0, 0]]
    assert masks["is_punct"].tolist() == [[0, 0, 1, 0, 1, 0], [0, 1, 0, 0, 0, 0]]
    assert all(m.dtype == np.float32 for m in masks.values())


# ---- the bundled checkpoint ----------------------------------------------------------------------------

TEXTS = ["The cat sat on the mat.", "Hello, world. Attention heads look at punctuation, often.", "Short."]
PAIR = ("Where is the station?", "It is near the old bridge, by the river.")


def reference_for_batch(model, batch, zero_segments=False):
    fields = batch.to_dict()
    if zero_segments:
        fields["token_type_ids"] = np.zeros_like(fields["input_ids"])
    _, cache = model.run_with_cache(fields, names="blocks.*.attn.hook_pattern")
    pattern = np.asarray(cache.stack("attn.hook_pattern"))
    tokens = batch.tokens
    marks = [np.array([[t == name for t in row] for row in tokens], np.float32) for name in ("[CLS]", "[SEP]")]
    punct = np.array([[t in (".", ",") for t in row] for row in tokens], np.float32)
    return pattern, reference_statistics(pattern, batch.attention_mask, marks[0], marks[1], punct)


@pytest.mark.parametrize("pair, segment_ids", [(False, "real"), (True, "real"), (True, "zeros")])
def test_attention_statistics_on_the_bundled_checkpoint(bundled, pair, segment_ids):
    batch = bundled.tokenize([PAIR[0]], [PAIR[1]]) if pair else bundled.tokenize(TEXTS)
    _, want = reference_for_batch(bundled, batch, zero_segments=segment_ids == "zeros")
    got = heads.attention_statistics(bundled, batch, segment_ids=segment_ids)
    for name in heads.STATISTICS:
        assert got[name].shape == (bundled.config.num_hidden_layers, bundled.config.num_attention_heads)
        # The same captured patterns feed both: only the statistics' own fp32 sums differ (plus the mean
        # over ≤ 3 documents, 2 roundings).
        T = batch.input_ids.shape[1]
        np.testing.assert_allclose(got[name], want[name].mean(0), rtol=statistic_rtol(T, T) + 2 * U,
                                   atol=statistic_atol(T, T), err_msg=name)
    if pair:  # the same tokens through the same program
        from_texts = heads.attention_statistics(bundled, PAIR[0], pairs=PAIR[1], segment_ids=segment_ids)
        np.testing.assert_array_equal(from_texts["to_sep"], got["to_sep"])


def test_js_divergence_on_the_bundled_checkpoint(bundled):
    batch = bundled.tokenize(TEXTS)
    pattern, _ = reference_for_batch(bundled, batch)
    first_two_layers = pattern[:2]  # 24 heads keep the looped reference quick
    doc_mask = np.ones(len(TEXTS), np.float32)
    got = np.asarray(heads.js_divergence_batch(first_two_layers, batch.attention_mask, doc_mask))
    np.testing.assert_allclose(got, reference_js(first_two_layers, batch.attention_mask, doc_mask), rtol=0,
                               atol=js_atol(batch.attention_mask, doc_mask, first_two_layers.shape[-1]))


def test_survey_agrees_with_attention_statistics(bundled):
    """corpus.survey (buckets, padding documents, jit) averages the same per-document statistics."""
    from minibert.analysis import corpus

    result = corpus.survey(bundled, TEXTS, batch_size=2, progress=False)
    want = heads.attention_statistics(bundled, TEXTS)
    assert result.documents == len(TEXTS)
    rtol, entropy_atol = survey_statistic_tolerances(bundled, TEXTS)  # two programs: derivation there
    for name in heads.STATISTICS:
        np.testing.assert_allclose(result.mean[name], want[name], rtol=rtol,
                                   atol=entropy_atol if name.endswith("entropy") else 0, err_msg=name)


def test_attention_statistics_rejects_unknown_segment_mode(bundled):
    with pytest.raises(ValueError, match="segment_ids"):
        heads.attention_statistics(bundled, TEXTS, segment_ids="none")


