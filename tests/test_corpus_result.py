"""corpus.result: SurveyResult's merge, save and load, and the head table's behaviour labels."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from test_corpus import SETTINGS, STATISTICS, TEXTS, assert_same_statistics, regrouped_tolerances
from tolerances import sum_rtol, survey_js_atol

from minibert.analysis import corpus
from minibert.errors import DataFileError


def test_save_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    mean = {name: rng.random((2, 3)).astype(np.float64) for name in STATISTICS}
    mean["to_sep"][1, 2] = 0.9  # a "sep" head
    result = corpus.SurveyResult(mean, 17, rng.random((6, 6)), {"buckets": [32, 64], "model": "x"},
                                 {"batches": 2, "tokens_run": 100, "real_tokens": 80})
    npz, js = result.save(tmp_path / "out")
    assert (npz.name, js.name) == ("out.npz", "out.json")
    back = corpus.SurveyResult.load(tmp_path / "out")
    assert back.documents == 17 and back.settings == result.settings and back.counts == result.counts
    for name in STATISTICS:
        np.testing.assert_array_equal(back.mean[name], mean[name])
    np.testing.assert_array_equal(back.js_divergence, result.js_divergence)
    table = json.loads(js.read_text())["heads"]
    assert len(table) == 6 and table[5]["label"] == "2-3" and "sep" in table[5]["behaviour"]


def test_save_keeps_dots_in_the_prefix_and_drops_output_suffixes(tmp_path):
    result = corpus.SurveyResult({name: np.zeros((1, 1)) for name in STATISTICS}, 1)
    assert [p.name for p in result.save(tmp_path / "run1.5")] == ["run1.5.npz", "run1.5.json"]
    assert [p.name for p in result.save(tmp_path / "run2.json")] == ["run2.npz", "run2.json"]
    assert corpus.SurveyResult.load(tmp_path / "run1.5").documents == 1


def test_merge_weights_means_by_documents_and_adds_sums():
    one = corpus.SurveyResult({"entropy": np.array([[1.0, 2.0]])}, 1, np.full((2, 2), 0.5),
                              {"model": "m", "max_length": 128, "devices": 1, "processes": 1, "batch_size": 4},
                              {"batches": 1, "tokens_run": 16, "real_tokens": 10})
    three = corpus.SurveyResult({"entropy": np.array([[5.0, 2.0]])}, 3, np.full((2, 2), 1.5),
                                {"model": "m", "max_length": 128, "devices": 2, "processes": 1, "batch_size": 8},
                                {"batches": 2, "tokens_run": 64, "real_tokens": 30})
    merged = corpus.SurveyResult.merge([one, three])
    assert merged.documents == 4
    np.testing.assert_allclose(merged.mean["entropy"], [[(1 + 3 * 5) / 4, 2.0]], rtol=1e-15)
    np.testing.assert_array_equal(merged.js_divergence, np.full((2, 2), 2.0))
    assert merged.counts == {"batches": 3, "tokens_run": 80, "real_tokens": 40}
    assert merged.settings == {"model": "m", "max_length": 128, "devices": 3, "processes": 2, "batch_size": None,
                               "reduce": "merged"}


@pytest.mark.parametrize("change, message", [
    (dict(settings={"model": "m", "max_length": 64}), r"result 1 was surveyed with max_length=64 but result 0 with "
                                                      r"max_length=128"),
    (dict(js_divergence=None), "differ in js_divergence"),
    (dict(mean={"entropy": np.zeros((2, 2))}), "another head grid"),
])
def test_merge_refuses_results_that_measure_other_things(change, message):
    base = dict(mean={"entropy": np.zeros((1, 2))}, documents=2, js_divergence=np.zeros((2, 2)),
                settings={"model": "m", "max_length": 128})
    with pytest.raises(ValueError, match=message):
        corpus.SurveyResult.merge([corpus.SurveyResult(**base), corpus.SurveyResult(**dict(base, **change))])
    with pytest.raises(ValueError, match="non-empty list of SurveyResult"):
        corpus.SurveyResult.merge([])


def test_merged_parts_equal_one_survey_of_the_union(bundled, tmp_path):
    """Two surveys of two halves (one reduce="local", saved and loaded) merge to the survey of all texts."""
    whole = corpus.survey(bundled, TEXTS, js_divergence=True, **SETTINGS)
    first = corpus.survey(bundled, TEXTS[:7], js_divergence=True, **SETTINGS)
    second = corpus.survey(bundled, TEXTS[7:], js_divergence=True, reduce="local", **SETTINGS)
    second.save(tmp_path / "second")
    merged = corpus.SurveyResult.merge([first, corpus.SurveyResult.load(tmp_path / "second")])
    assert merged.documents == whole.documents == len(TEXTS)
    assert merged.counts["real_tokens"] == whole.counts["real_tokens"]
    assert_same_statistics(merged.mean, whole.mean, regrouped_tolerances(bundled, TEXTS))
    # each Jensen–Shannon entry is a sum of non-negative terms over every query row of every document
    rtol, atol = 2 * sum_rtol(whole.counts["real_tokens"]), survey_js_atol(bundled, TEXTS, row_length=64)
    np.testing.assert_allclose(merged.js_divergence, whole.js_divergence, rtol=rtol, atol=atol)


def small_result(documents: int = 2, **settings) -> corpus.SurveyResult:
    return corpus.SurveyResult({name: np.full((1, 2), 0.25) for name in STATISTICS}, documents, None,
                               dict({"model": "m", "max_length": 128}, **settings))


def test_merge_refuses_other_weights_saved_at_the_same_path(bundled):
    """Two checkpoints written to the same path one after the other share settings["model"]; the weights'
    hash tells them apart."""
    a, b = small_result(weights="0123456789abcdef"), small_result(weights="fedcba9876543210")
    with pytest.raises(ValueError, match=r"result 1 was surveyed with weights='fedcba9876543210' but result 0 "
                                         r"with weights='0123456789abcdef'"):
        corpus.SurveyResult.merge([a, b])
    result = corpus.survey(bundled, TEXTS[:2], **SETTINGS)
    assert result.settings["weights"] == corpus.result.weights_digest(bundled)
    assert len(result.settings["weights"]) == 16


def test_load_refuses_missing_damaged_and_foreign_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nothing.npz is not a file; pass the prefix SurveyResult.save"):
        corpus.SurveyResult.load(tmp_path / "nothing")
    npz, js = small_result().save(tmp_path / "run")
    npz.write_bytes(npz.read_bytes()[:40])  # truncated
    with pytest.raises(DataFileError, match=r"run.npz cannot be read as a saved survey .* survey again"):
        corpus.SurveyResult.load(tmp_path / "run")
    small_result().save(tmp_path / "run", overwrite=True)  # the damaged one replaced
    js.write_text(json.dumps({"name": "some other tool's file"}))
    with pytest.raises(DataFileError, match=r"run.json is not a saved survey's description \('documents'\)"):
        corpus.SurveyResult.load(tmp_path / "run")
    np.savez(npz, weights=np.zeros(3))  # a foreign .npz next to a good .json
    small_result().save(tmp_path / "other")
    js.write_text((tmp_path / "other.json").read_text())
    with pytest.raises(DataFileError, match=r"run.npz does not hold a survey's \[L, H\] statistics"):
        corpus.SurveyResult.load(tmp_path / "run")


def test_save_refuses_a_folder_and_a_missing_folder(tmp_path):
    (tmp_path / "taken.npz").mkdir()
    with pytest.raises(DataFileError, match=r"taken.npz is a folder; choose another file name"):
        small_result().save(tmp_path / "taken")
    with pytest.raises(FileNotFoundError, match=r"the folder .*no/such of the output .* does not exist"):
        small_result().save(tmp_path / "no" / "such" / "run")
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("existing", ["run.npz", "run.json"])
def test_save_refuses_an_existing_file_unless_overwrite(tmp_path, existing):
    """Issue 40: save replaced a survey (or any file) already at the prefix. Either file there is refused before
    anything is written, naming the file and the flag; overwrite=True replaces both."""
    (tmp_path / existing).write_text("mine")
    with pytest.raises(DataFileError, match=rf"{existing} already exists; pass overwrite=True to replace it"):
        small_result(documents=3).save(tmp_path / "run")
    assert (tmp_path / existing).read_text() == "mine" and len(list(tmp_path.iterdir())) == 1  # nothing written
    small_result(documents=3).save(tmp_path / "run", overwrite=True)
    assert corpus.SurveyResult.load(tmp_path / "run").documents == 3
    with pytest.raises(DataFileError, match=r"overwrite='yes': pass True or False"):
        small_result().save(tmp_path / "run", overwrite="yes")


@pytest.mark.parametrize("prefix", ["", "/", ".."])
def test_an_output_that_names_no_file_is_refused(tmp_path, capsys, prefix):
    """A prefix with no file name to add .npz to (pathlib's with_name raised a bare ValueError, and `minibert stats
    --out ''` ended in a traceback with status 1) is one line naming it."""
    with pytest.raises(DataFileError, match=f"the output {prefix!r} names no file; pass a prefix such as"):
        small_result().save(prefix)
    from minibert.app import cli

    corpus_file = tmp_path / "corpus.txt"
    corpus_file.write_text("The cat sat.\n", encoding="utf-8")
    status = cli.main(["stats", str(corpus_file), "--out", prefix])
    err = capsys.readouterr().err.strip().splitlines()
    shown = str(Path(prefix))  # the command line reads --out as a Path: '' is '.'
    assert status == cli.USER_ERROR and err == [f"minibert stats: error: the output {shown!r} names no file; pass a "
                                                f"prefix such as results/survey (it writes results/survey.npz and "
                                                f"results/survey.json)."], err


def test_broad_label_is_judged_against_the_uniform_entropy():
    """A head at 3.0 nats over documents of 20 tokens (ln 20 ≈ 3.0 nats, near uniform) is broad by default and
    not by Clark et al.'s absolute 3.8 nats; over 128-token documents the two rules draw the same line."""
    short = {"entropy": np.array([[3.0, 1.0]]), "uniform_entropy": np.full((1, 2), math.log(20))}
    assert corpus.SurveyResult(short, 1).table()[0]["behaviour"] == "broad"
    assert [row["behaviour"] for row in corpus.SurveyResult(short, 1).table(broad="absolute")] == ["", ""]
    long = {"entropy": np.array([[3.79, 3.81]]), "uniform_entropy": np.full((1, 2), math.log(128))}
    for rule in ("relative", "absolute"):
        assert [row["behaviour"] for row in corpus.SurveyResult(long, 1).table(broad=rule)] == ["", "broad"]
    with pytest.raises(ValueError, match="broad must be 'relative'"):
        corpus.SurveyResult(long, 1).table(broad="wide")
