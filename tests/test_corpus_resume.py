"""corpus.resume: resume files give the totals of an uninterrupted run, and refuse what they cannot vouch for
(another survey, a changed corpus, a damaged file) with one line that names the file and the fix."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from test_corpus import SETTINGS, STATISTICS, TEXTS

from minibert.analysis import corpus
from minibert.analysis.corpus import resume
from minibert.app import cli
from minibert.errors import DataFileError


class Crash(Exception):
    """The stand-in for a process that dies in the middle of a survey."""


def crashing(texts, after: int):
    yield from texts[:after]
    raise Crash


def test_resume_gives_identical_totals(bundled, tmp_path, monkeypatch):
    """A survey that dies after 13 documents, started again with the same resume file, resumes from the last
    saved position (8 documents: every 8, chunks of 4) and ends with exactly the totals and counts of a
    run that was never interrupted; a finished resume file returns its result without running anything."""
    monkeypatch.setattr(corpus.reading, "CHUNK", 4)
    settings = dict(SETTINGS, every=8, js_divergence=True)
    whole = corpus.survey(bundled, TEXTS, resume=tmp_path / "whole.ckpt", **settings)
    with pytest.raises(Crash):
        corpus.survey(bundled, crashing(TEXTS, 13), resume=tmp_path / "resumed.ckpt", **settings)
    resumed = corpus.survey(bundled, TEXTS, resume=tmp_path / "resumed.ckpt", **settings)
    traces = bundled.programs.traces
    again = corpus.survey(bundled, TEXTS, resume=tmp_path / "resumed.ckpt", **settings)
    assert bundled.programs.traces == traces and again.counts == resumed.counts
    for result in (resumed, again):
        assert result.documents == whole.documents == len(TEXTS) and result.counts == whole.counts
        for name in STATISTICS:
            np.testing.assert_array_equal(result.mean[name], whole.mean[name], err_msg=name)
        np.testing.assert_array_equal(result.js_divergence, whole.js_divergence)


def test_resume_file_of_another_survey_is_refused(bundled, tmp_path):
    path = tmp_path / "run.ckpt"
    corpus.survey(bundled, TEXTS[:3], resume=path, **SETTINGS)
    with pytest.raises(ValueError, match=r"run.ckpt belongs to another survey: its max_length is 128, this run's "
                                         r"is 64; .* or delete the file"):
        corpus.survey(bundled, TEXTS[:3], resume=path, **dict(SETTINGS, max_length=64, buckets=(16, 32, 64)))
    path.write_bytes(b"not a resume file")
    with pytest.raises(ValueError, match=r"run.ckpt cannot be read .* delete it to start the survey afresh"):
        corpus.survey(bundled, TEXTS[:3], resume=path, **SETTINGS)


def test_a_corpus_file_changed_past_its_first_megabyte_is_refused(bundled, tmp_path):
    """Three texts after 1.5 MB of blank lines (skipped): a resume file's fingerprint must cover the whole
    file, so a text put in place of a blank line 1.2 MB in (same size) is a changed corpus, not old totals."""
    path = tmp_path / "corpus.txt"
    blank = " " * 999 + "\n"
    path.write_text(blank * 1500 + "\n".join(TEXTS[:3]) + "\n", encoding="utf-8")
    kept = corpus.survey(bundled, path, resume=tmp_path / "run.resume", **SETTINGS)
    assert kept.documents == 3 and kept.counts["blank_lines"] == 1500
    changed = blank * 1200 + TEXTS[3].ljust(999) + "\n" + blank * 299 + "\n".join(TEXTS[:3]) + "\n"
    path.write_text(changed, encoding="utf-8")
    assert path.stat().st_size == len(changed.encode())
    with pytest.raises(DataFileError, match=r"run.resume belongs to another survey: its corpus is .*delete the file"):
        corpus.survey(bundled, path, resume=tmp_path / "run.resume", **SETTINGS)


def test_texts_that_changed_before_the_saved_position_are_refused(bundled, tmp_path, monkeypatch):
    """Lists have no file to fingerprint: a resumed survey hashes the texts it skips and compares."""
    monkeypatch.setattr(corpus.reading, "CHUNK", 4)
    settings = dict(SETTINGS, every=8)
    with pytest.raises(Crash):
        corpus.survey(bundled, crashing(TEXTS, 13), resume=tmp_path / "run.resume", **settings)
    edited = ["Another first text."] + TEXTS[1:]
    with pytest.raises(DataFileError, match=r"run.resume: the first 8 texts differ from the ones its totals came"):
        corpus.survey(bundled, edited, resume=tmp_path / "run.resume", **settings)
    later = TEXTS[:8] + ["Edited after the saved position."] + TEXTS[9:]  # not yet read: resuming is right
    assert corpus.survey(bundled, later, resume=tmp_path / "run.resume", **settings).documents == len(TEXTS)


def damaged_files(path, good: bytes) -> dict:
    """Ways a resume file goes bad: each writer of the dict writes one to `path`."""
    with np.load(path) as stored:
        info, totals = json.loads(str(stored["info"])), {k: stored[k] for k in stored.files if k != "info"}

    def saved(info, totals):
        with path.open("wb") as file:
            np.savez(file, info=np.array(info if isinstance(info, str) else json.dumps(info)), **totals)

    return {
        "empty": lambda: path.write_bytes(b""),
        "truncated": lambda: path.write_bytes(good[: len(good) // 2]),
        "missing keys": lambda: saved({k: v for k, v in info.items() if k != "chunks"}, totals),
        "wrong shapes": lambda: saved(info, dict(totals, **{"total.entropy": np.zeros((2, 2), np.float32)})),
        "missing total": lambda: saved(info, {k: v for k, v in totals.items() if k != "total.self"}),
        "not JSON": lambda: saved("{oops", totals),
    }


@pytest.mark.parametrize("damage, message", [
    ("empty", r"cannot be read .*: it is empty, truncated or not a resume file"),
    ("truncated", r"cannot be read .*: it is empty, truncated or not a resume file"),
    ("missing keys", r"is damaged \(missing or malformed: \['chunks'\]\)"),
    ("wrong shapes", r"is damaged: its total 'entropy' has shape \(2, 2\), this survey's \(6, 12\)"),
    ("missing total", r"is damaged: its total 'self' has shape none \(missing\)"),
    ("not JSON", r"cannot be read"),
])
def test_damaged_resume_files_are_one_line_errors(bundled, tmp_path, capsys, damage, message):
    """In Python a DataFileError naming the file; from `minibert stats --resume` one line and status 2."""
    path, corpus_file = tmp_path / "run.resume", tmp_path / "corpus.txt"
    corpus_file.write_text("\n".join(TEXTS[:3]) + "\n", encoding="utf-8")
    settings = dict(max_length=128, progress=False)  # what the command line runs
    corpus.survey(bundled, corpus_file, resume=path, **settings)
    damaged_files(path, path.read_bytes())[damage]()
    with pytest.raises(DataFileError, match=f"resume file .*run.resume {message}.*afresh"):
        corpus.survey(bundled, corpus_file, resume=path, **settings)
    capsys.readouterr()
    status = cli.main(["stats", str(corpus_file), "--resume", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == cli.USER_ERROR and len(err) == 1 and err[0].startswith("minibert stats: error: resume file"), err


def test_a_resume_file_in_a_missing_folder_or_on_a_folder_is_refused_first(bundled, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"the folder .*nope of the resume file .* does not exist"):
        corpus.survey(bundled, TEXTS[:2], resume=tmp_path / "nope" / "run.resume", **SETTINGS)
    with pytest.raises(DataFileError, match=r"the resume file .* is a folder"):
        corpus.survey(bundled, TEXTS[:2], resume=tmp_path, **SETTINGS)


def test_two_writers_of_one_resume_path_never_share_a_temporary_file(tmp_path, monkeypatch):
    """Two surveys in one process saving to one path, the second while the first is mid-write: each writes its
    own temporary file, both replaces succeed, and the file left is complete (the last writer's)."""
    path = tmp_path / "run.resume"
    one, two = (resume.ResumeFile(path, {"run": name, "chunk": 4}) for name in ("one", "two"))
    totals = {"entropy": np.ones((1, 2), np.float32)}
    savez, started = np.savez, threading.Event()

    def interleaved(file, **arrays):
        if not started.is_set():  # the first save: the second runs to the end in the middle of it
            started.set()
            two.save(2, totals, (), {}, None)
        savez(file, **arrays)

    monkeypatch.setattr(np, "savez", interleaved)
    one.save(1, totals, (), {}, None)
    with np.load(path) as stored:
        assert json.loads(str(stored["info"]))["run_id"] == {"run": "one", "chunk": 4}
    assert [p.name for p in tmp_path.iterdir()] == ["run.resume"]  # no temporary file left behind
