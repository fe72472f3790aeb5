"""The corpus runner (minibert.analysis.corpus) against a brute-force NumPy reference, on one and on four devices.

The reference takes each document's attention maps from `model.run_with_cache` and computes the
statistics of ANALYSIS.md with loops over documents, query rows and key columns (vectorised over layers
and heads only), in float64, sharing no code with minibert.analysis.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_analysis_heads import reference_document as reference_head
from test_analysis_heads import statistic_atol, statistic_rtol
from tolerances import sum_rtol, survey_js_atol, survey_statistic_tolerances

from minibert.analysis import corpus
from minibert.errors import AnalysisError, MinibertError

STATISTICS = ("self", "next", "prev", "to_cls", "to_sep", "to_punct", "sep_to_sep", "rest_to_sep",
              "entropy", "cls_entropy", "uniform_entropy")

TEXTS = [
    "I made the mistake.",
    "The cat sat on the mat, and then it slept.",
    "Attention is all you need.",
    "Short.",
    "A reader studies every head of the model, one layer at a time.",
    "Where does the attention of the first layer go?",
    "Most heads look at the separator token.",
    "Some heads attend to the previous word, some to the next one.",
    "The river runs past the old church, the school and the court.",
    "We did it.",
    "Language models, it seems, learn a great deal about syntax without being told.",
    "Paris is the capital of France.",
    "Punctuation, commas and full stops draw a surprising share of attention.",
    "He came back.",
    "Results are in the second table of the paper, under the figure.",
    "Yes.",
    "The team played the game in the rain, and the party went on until late that night.",
    "Tokens of one word are grouped by the tokenizer.",
    "Broad heads spread their attention over the whole sentence, narrow heads do not.",
    "It was a long day.",
]
PAIRS = [
    ("The film was long.", "I liked it anyway."),
    ("Is the model right?", "Nobody knows, not even the authors."),
    ("The water was cold.", "We swam all the same, for an hour."),
    ("A house by the river.", "A church on the hill."),
    ("She wrote the report.", "He read it, twice."),
    ("Heads attend to [SEP] a lot.", "It may be a no-op."),
    ("What does BERT look at?", "An analysis of its attention."),
    ("Two sentences, one segment.", "The second has type one."),
    ("Good.", "Very good, indeed."),
    ("The court ruled on Monday, after a week of hearings.", "The decision surprised most observers."),
]
SETTINGS = dict(batch_tokens=64, buckets=(16, 32, 64), progress=False)  # several row lengths and batches


# ---- the reference ------------------------------------------------------------------------------------

def reference_document(A, tokens):
    """Every statistic for one document: A [L, H, n, n] float64 over its n real tokens; tokens [n] strings.
    Each head goes through the per-head loop reference of test_analysis_heads (rows i × keys j)."""
    cls = [int(t == "[CLS]") for t in tokens]
    sep = [int(t == "[SEP]") for t in tokens]
    punct = [int(t in (".", ",")) for t in tokens]
    s = {name: np.zeros(A.shape[:2]) for name in STATISTICS}
    for layer, head in np.ndindex(*A.shape[:2]):
        for name, value in reference_head(A[layer, head], cls, sep, punct).items():
            s[name][layer, head] = value
    return s


def reference_js(maps):
    """[L·H, L·H] Jensen–Shannon sums: loops over documents and query rows, every head pair at once."""
    L, H = maps[0].shape[:2]
    js = np.zeros((L * H, L * H))
    for A in maps:
        n = A.shape[-1]
        for i in range(n):
            p = 0.999 * A[:, :, i, :].reshape(L * H, n) + 0.001 / n
            P, Q = p[:, None, :], p[None, :, :]
            M = (P + Q) / 2
            js += (0.5 * P * np.log(P / M) + 0.5 * Q * np.log(Q / M)).sum(-1)
    return js


def document_maps(model, texts, pairs=None, segment_ids="real", max_length=None):
    """Each document's attention maps [L, H, n, n] (float64) and tokens, from run_with_cache."""
    batch = model.tokenize(texts, pairs, max_length=max_length)
    fields = batch.to_dict()
    if segment_ids == "zeros":
        fields["token_type_ids"] = np.zeros_like(fields["token_type_ids"])
    _, cache = model.run_with_cache(fields, names="blocks.*.attn.hook_pattern")
    layers = [np.asarray(cache[f"blocks.{i}.attn.hook_pattern"], np.float64)
              for i in range(model.config.num_hidden_layers)]
    out = []
    for b, n in enumerate(batch.attention_mask.sum(1)):
        out.append((np.stack([layer[b, :, :n, :n] for layer in layers]), batch.tokens[b][:n]))
    return out


def assert_same_statistics(got, want, tolerances) -> None:
    """Every statistic within (rtol, entropy atol) = tolerances.survey_statistic_tolerances."""
    rtol, entropy_atol = tolerances
    for name in STATISTICS:
        atol = entropy_atol if name.endswith("entropy") else 0
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=name)


def reference_mean(maps):
    per_document = [reference_document(A, tokens) for A, tokens in maps]
    return {name: np.mean([d[name] for d in per_document], axis=0) for name in STATISTICS}


def regrouped_tolerances(model, texts, pairs=None, row_length: int = 64) -> tuple[float, float]:
    """(rtol, entropy atol) between two surveys of the same documents run in other batches, rows, processes
    or blocks: two programs (tolerances.survey_statistic_tolerances), and the sums over documents taken in
    another order and grouping — each within (n − 1)·u of the exact sum of n non-negative terms (Higham), so
    the two differ by at most twice that, relative."""
    rtol, entropy_atol = survey_statistic_tolerances(model, texts, pairs, row_length)
    return rtol + 2 * sum_rtol(len(texts)), entropy_atol


# ---- against the reference ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def texts_result(bundled):
    return corpus.survey(bundled, TEXTS, **SETTINGS)


def test_survey_of_texts_matches_brute_force(bundled, texts_result):
    want = reference_mean(document_maps(bundled, TEXTS))
    assert texts_result.documents == len(TEXTS)
    assert set(texts_result.mean) == set(STATISTICS)
    assert_same_statistics(texts_result.mean, want, survey_statistic_tolerances(bundled, TEXTS, row_length=64))


def test_survey_of_pairs_matches_brute_force_with_js(bundled):
    first, second = [a for a, _ in PAIRS], [b for _, b in PAIRS]
    result = corpus.survey(bundled, first, second, js_divergence=True, **SETTINGS)
    maps = document_maps(bundled, first, second)
    want = reference_mean(maps)
    assert_same_statistics(result.mean, want, survey_statistic_tolerances(bundled, first, second, row_length=64))
    js = reference_js([A for A, _ in maps])
    np.testing.assert_allclose(result.js_divergence, js, rtol=0, atol=survey_js_atol(bundled, first, second, 64))
    assert result.js_divergence.shape == (72, 72)


def test_segment_ids_zeros_matches_brute_force(bundled):
    first, second = [a for a, _ in PAIRS[:4]], [b for _, b in PAIRS[:4]]
    result = corpus.survey(bundled, first, second, segment_ids="zeros", **SETTINGS)
    want = reference_mean(document_maps(bundled, first, second, segment_ids="zeros"))
    tolerances = survey_statistic_tolerances(bundled, first, second, row_length=64, zero_segments=True)
    assert_same_statistics(result.mean, want, tolerances)


def test_second_survey_compiles_nothing_and_streams(bundled, texts_result, monkeypatch):
    """The compiled step is cached per model, and a generator streamed in small chunks (documents
    waiting across chunks) gives the same numbers as the list."""
    traces = bundled.programs.traces
    monkeypatch.setattr(corpus.reading, "CHUNK", 7)
    again = corpus.survey(bundled, (text for text in TEXTS), **SETTINGS)
    assert bundled.programs.traces == traces
    assert again.documents == len(TEXTS)
    # Other chunks pack other rows: the same program, documents at other offsets (sums in other orders).
    assert_same_statistics(again.mean, texts_result.mean, survey_statistic_tolerances(bundled, TEXTS, row_length=64))


def test_work_counts(texts_result, bundled):
    lengths = bundled.tokenize(TEXTS).attention_mask.sum(1)
    counts = texts_result.counts
    assert counts["real_tokens"] == int(lengths.sum()) and counts["truncated"] == 0
    assert counts["real_tokens"] <= counts["tokens_run"] < 1.4 * counts["real_tokens"]  # rows hold several texts
    assert counts["batches"] >= 3


def test_one_document_per_row_matches_brute_force(bundled):
    result = corpus.survey(bundled, TEXTS[:8], pack=False, **SETTINGS)
    want = reference_mean(document_maps(bundled, TEXTS[:8]))
    assert result.counts["batches"] >= 2
    assert_same_statistics(result.mean, want, survey_statistic_tolerances(bundled, TEXTS[:8], row_length=64))


def test_packed_row_statistics_are_sums_over_its_documents():
    """heads.head_statistics on one row holding two documents (document numbers 1 and 2, then padding)
    equals the sum of the reference statistics of the two documents; junk outside the documents' blocks
    (other document, padding) is ignored."""
    from minibert.analysis import heads

    rng = np.random.default_rng(0)
    tokens = [["[CLS]", "a", ",", "b", "[SEP]"], ["[CLS]", "c", "[SEP]", "d", ".", "e", "[SEP]"]]
    T, L, H = 14, 2, 3
    pattern = rng.random((L, 1, H, T, T)).astype(np.float32)  # junk everywhere …
    documents = np.zeros((1, T), np.int32)
    want = dict.fromkeys(STATISTICS, 0.0)
    start = 0
    for number, words in enumerate(tokens, 1):
        n = len(words)
        logits = rng.normal(size=(L, H, n, n)) * 2
        block = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        pattern[:, 0, :, start:start + n, start:start + n] = block  # … but softmax rows in each document's block
        documents[0, start:start + n] = number
        for name, value in reference_document(block, words).items():
            want[name] = want[name] + value
        start += n
    flat = sum(tokens, []) + ["[PAD]"] * (T - start)
    masks = [np.array([[w == "[CLS]" for w in flat]], np.float32), np.array([[w == "[SEP]" for w in flat]], np.float32),
             np.array([[w in (".", ",") for w in flat]], np.float32)]
    got = heads.head_statistics(pattern, documents, *masks)
    for name in STATISTICS:
        # The same maps: only the statistics' own fp32 sums differ from the float64 reference.
        np.testing.assert_allclose(np.asarray(got[name])[0], want[name], rtol=statistic_rtol(T, T),
                                   atol=statistic_atol(T, T), err_msg=name)


# ---- several devices ----------------------------------------------------------------------------------

FOUR_DEVICES = textwrap.dedent("""
    import json, sys
    import jax
    import minibert
    from minibert.analysis import corpus

    assert jax.device_count() == 4, jax.devices()
    texts, settings = json.loads(sys.argv[1])
    model = minibert.load()
    four = corpus.survey(model, texts, js_divergence=True, **settings)
    one = corpus.survey(model, texts, js_divergence=True, devices=[jax.devices()[0]], **settings)
    try:
        corpus.survey(model, texts, batch_size=6, progress=False)
    except ValueError as error:
        message = str(error)
    print(json.dumps({"four": {k: v.tolist() for k, v in four.mean.items()}, "devices": four.settings["devices"],
                      "one": {k: v.tolist() for k, v in one.mean.items()},
                      "js_four": four.js_divergence.tolist(), "js_one": one.js_divergence.tolist(),
                      "error": message}))
""")


def test_four_cpu_devices_give_the_numbers_of_one(bundled):
    settings = dict(batch_tokens=256, buckets=(32, 64), progress=False)
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip())
    done = subprocess.run([sys.executable, "-c", FOUR_DEVICES, json.dumps([TEXTS, settings])], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["devices"] == 4
    assert "multiple of the 4 devices" in got["error"]
    parent = corpus.survey(bundled, TEXTS, js_divergence=True, **settings)
    # Per-device batches are other program shapes and the totals add in another order: two programs.
    tolerances = survey_statistic_tolerances(bundled, TEXTS, row_length=64)
    four = {name: np.array(got["four"][name]) for name in STATISTICS}
    assert_same_statistics(four, {name: np.array(got["one"][name]) for name in STATISTICS}, tolerances)
    assert_same_statistics(four, parent.mean, tolerances)
    js_atol = survey_js_atol(bundled, TEXTS, row_length=64)
    np.testing.assert_allclose(got["js_four"], got["js_one"], rtol=0, atol=js_atol)
    np.testing.assert_allclose(got["js_four"], parent.js_divergence, rtol=0, atol=js_atol)


# ---- bad inputs ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("texts, pairs, settings, message", [
    ([], None, {}, "survey got no texts"),
    ("One string.", None, {}, "not one string"),
    (["A.", "B."], ["C."], {}, "got 2 texts but 1 pairs"),
    (iter(["A.", "B."]), iter(["C."]), {}, "texts and pairs have different lengths"),
    (["A.", 3], None, {}, r"texts\[1\] is not a string but int"),
    (["A."], None, {"batch_size": 0}, "batch_size 0 must be a positive multiple"),
    (["A."], None, {"batch_tokens": 0}, "batch_tokens must be positive"),
    (["A.", "B " * 40], None, {"buckets": (16, 32)}, r"document 1 has 42 tokens but the largest bucket is 32"),
    (["A."], None, {"segment_ids": "none"}, "segment_ids must be 'real' or 'zeros'"),
    (["A."], None, {"devices": []}, "devices is empty"),
    (["A."], None, {"max_length": 2}, "max_length must lie between 3"),
    (["A."], None, {"max_length": 1000}, "model's 512 positions; got 1000"),
    (["A."], None, {"buckets": (128, 1024)}, r"buckets must be row lengths from 1 to the model's 512 positions"),
    # A batch whose patterns alone (rows × 128² × 6 layers × 12 heads × 4 bytes) exceed any machine's memory.
    (["A."], None, {"batch_tokens": 10**12}, r"batch_tokens=1000000000000 makes batches of 7,812,500,000 rows of "
                                             r"128 tokens whose attention patterns alone take"),
    (["A."], None, {"batch_size": 10**9}, r"batch_size=1000000000 makes batches of 1,000,000,000 rows"),
    # Not whole numbers: True reached NumPy as a row count (a raw TypeError), "128" a comparison with an int
    # (another), and batch_tokens=2.5 ran.
    (["A."], None, {"batch_size": True}, r"batch_size must be a whole number \(an int\); got True"),
    (["A."], None, {"max_length": "128"}, r"max_length must be a whole number \(an int\); got '128'"),
    (["A."], None, {"batch_tokens": 2.5}, r"batch_tokens must be a whole number \(an int\); got 2.5"),
])
def test_bad_inputs(bundled, texts, pairs, settings, message):
    with pytest.raises(MinibertError, match=message):
        corpus.survey(bundled, texts, pairs, progress=False, **settings)


def test_survey_of_a_corpus_file_streams_it(bundled, texts_result, tmp_path):
    """A pathlib.Path is read line by line (blank lines skipped and counted); the same documents in the same
    order give exactly the numbers of the list."""
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(TEXTS) + "\n", encoding="utf-8")
    result = corpus.survey(bundled, path, **SETTINGS)
    assert result.documents == len(TEXTS)
    assert result.counts == dict(texts_result.counts, blank_lines=len(TEXTS) - 1)  # one between each two texts
    for name in STATISTICS:
        np.testing.assert_array_equal(result.mean[name], texts_result.mean[name], err_msg=name)


def test_truncated_documents_are_counted_or_refused(bundled):
    """Documents longer than max_length are truncated and counted (and truncated exactly as the tokenizer's
    max_length does); strict=True refuses the first one by its number instead."""
    texts = ["Short one.", "word " * 30, "Also short.", "another " * 20 + "end"]  # 32 and 23 tokens with [CLS], [SEP]
    max_length = 16
    result = corpus.survey(bundled, texts, max_length=max_length, buckets=(16,), batch_tokens=64, progress=False)
    assert result.counts["truncated"] == 2
    assert result.counts["real_tokens"] == int(bundled.tokenize(texts, max_length=max_length).attention_mask.sum())
    want = reference_mean(document_maps(bundled, texts, max_length=max_length))
    assert_same_statistics(result.mean, want, survey_statistic_tolerances(bundled, texts, row_length=16))
    with pytest.raises(AnalysisError, match=r"document 1 has more than max_length=16 tokens \(2 in this chunk of 4\)"):
        corpus.survey(bundled, texts, max_length=max_length, buckets=(16,), strict=True, progress=False)


# ---- families -----------------------------------------------------------------------------------------

def test_packed_roberta_survey_matches_brute_force(tmp_path):
    """RoBERTa reads position rows from pad_token_id + 1 (config.first_position): packed rows, where each
    document's positions restart, must give every document the rows it reads alone, and row lengths stop
    at config.max_tokens (128 of the 130 rows here), not at max_position_embeddings."""
    from test_families import make_family_model, write_tokenizer

    import minibert

    vocab = write_tokenizer(tmp_path, "roberta")
    make_family_model(tmp_path / "model", "roberta", vocab_size=vocab, max_position_embeddings=130)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "model" / name).write_text((tmp_path / name).read_text())
    model = minibert.load(tmp_path / "model")
    assert (model.config.first_position, model.config.max_tokens) == (2, 128)
    texts = TEXTS[:10]
    settings = dict(batch_tokens=256, buckets=(64, 128), max_length=128, progress=False)
    packed, alone = (corpus.survey(model, texts, pack=pack, **settings) for pack in (True, False))
    assert packed.counts["tokens_run"] < alone.counts["tokens_run"]  # rows do hold several documents
    tokenizer = model.tokenizer
    names = {tokenizer.cls_token: "[CLS]", tokenizer.sep_token: "[SEP]"}  # the reference's names of the two
    maps = [(A, [names.get(t, t) for t in tokens]) for A, tokens in document_maps(model, texts)]
    assert_same_statistics(packed.mean, reference_mean(maps), survey_statistic_tolerances(model, texts, row_length=128))
    assert_same_statistics(alone.mean, packed.mean, regrouped_tolerances(model, texts, row_length=128))
    with pytest.raises(AnalysisError, match="model's 128 positions; got 130"):
        corpus.survey(model, texts, max_length=130, progress=False)
