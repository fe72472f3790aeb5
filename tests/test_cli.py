"""The `minibert` command, run in-process through `main` (and once as the installed entry point):
what each command writes is there, holds the model's numbers, escapes user text, and mistakes in
the input end with one line on stderr and status 2."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minibert.app import cli, demo
from minibert.viz import report
from minibert.analysis.heads import attention_statistics, behaviour_labels

COMMANDS = ("demo", "view", "stats", "hooks", "convert")
DEMO_FILES = {
    *(f"figures/{name}{suffix}" for name in ("pca", "attention_to_word", "head_heatmap", "head_grid", "neuron",
                                            "head_statistics", "head_mds") for suffix in (".png", ".svg")),
    "head_view.html", "model_view.html", "neuron_view.html", "index.html",
    "head_statistics.csv", "head_statistics.json", "head_statistics.npz",
}
HOSTILE = "<img src=x onerror=alert(1)>"
TOLERANCE = 1e-5


@pytest.fixture
def bundled_load(monkeypatch, bundled):
    """`minibert COMMAND` without --model reuses the session's bundled model (loading is tested by the demo)."""
    load = cli._load
    monkeypatch.setattr(cli, "_load", lambda name: bundled if name is None else load(name))


def run(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main([str(a) for a in argv])
    return status, out.getvalue(), err.getvalue()


def view_data(page: str) -> list[dict]:
    """The data (kind, meta) of every view on a page, from its JSON script elements."""
    found = re.findall(r'<script type="application/json" class="mbv-data">(.*?)</script>', page, re.S)
    return [json.loads(text) for text in found]


def statistics_table(path: Path) -> dict[str, np.ndarray]:
    """{statistic: [L, H]} from a saved survey JSON's per-head rows."""
    rows = json.loads(path.read_text())["heads"]
    shape = (max(r["layer"] for r in rows) + 1, max(r["head"] for r in rows) + 1)
    names = [k for k, v in rows[0].items() if isinstance(v, float)]
    table = {name: np.zeros(shape) for name in names}
    for row in rows:
        for name in names:
            table[name][row["layer"], row["head"]] = row[name]
    return table


def assert_matches(table: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert set(expected) <= set(table)
    for name, values in expected.items():
        np.testing.assert_allclose(table[name], values, atol=TOLERANCE, err_msg=name)


# ---- demo -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "out"
    status, stdout, stderr = run("demo", "--out", out)
    assert status == 0, stderr
    return out, stdout


def test_demo_writes_and_prints_every_file(demo_run):
    out, stdout = demo_run
    written = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert written == DEMO_FILES
    printed = set(stdout.splitlines())
    for name in DEMO_FILES:
        path = out / name
        assert str(path) in printed, name
        data = path.read_bytes()
        assert len(data) > 1000, name
        if path.suffix == ".png":
            assert data.startswith(b"\x89PNG\r\n\x1a\n"), name
        elif path.suffix == ".svg":
            assert b"<svg" in data[:2000], name
        elif path.suffix == ".html":
            assert data.startswith(b"<!DOCTYPE html>"), name


def test_demo_index_links_everything(demo_run):
    out, _ = demo_run
    index = (out / "index.html").read_text()
    linked = set(re.findall(r'(?:href|src)="([^"]+)"', index))
    assert linked == DEMO_FILES - {"index.html"}


def test_demo_views_show_the_pair(demo_run, bundled):
    out, _ = demo_run
    text = demo.demo_text()
    tokens = bundled.tokenize([text.text], [text.pair]).tokens[0]
    for kind in ("head", "model", "neuron"):
        (data,) = view_data((out / f"{kind}_view.html").read_text())
        assert data["kind"] == kind
        assert data["meta"]["tokens"] == tokens
        assert data["meta"]["b_start"] == tokens.index("[SEP]") + 1


def test_demo_statistics_are_the_models(demo_run, bundled):
    """The demo's head statistics equal attention_statistics over the same sentences; CSV and JSON agree."""
    out, _ = demo_run
    table = statistics_table(out / "head_statistics.json")
    assert_matches(table, attention_statistics(bundled, demo.demo_text().sentences))
    with (out / "head_statistics.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == table["prev"].size
    for row in rows:
        assert float(row["prev"]) == pytest.approx(table["prev"][int(row["layer"]), int(row["head"])])
    with np.load(out / "head_statistics.npz") as arrays:
        np.testing.assert_allclose(arrays["to_cls"], table["to_cls"], atol=TOLERANCE)


def test_demo_summary_names_the_top_heads(demo_run):
    out, stdout = demo_run
    table = statistics_table(out / "head_statistics.json")
    for statistic, meaning in report.RANKINGS.items():
        line = next(line for line in stdout.splitlines() if line.strip().startswith(meaning))
        layer, head = np.unravel_index(table[statistic].argmax(), table[statistic].shape)
        assert line.split()[len(meaning.split())] == f"{layer + 1}-{head + 1}", line
    labels = behaviour_labels(table)
    assert f"cls {sum('cls' in label.split('+') for label in labels.ravel())}" in stdout


def test_demo_head_heatmap_is_the_strongest_object_to_verb_head(bundled):
    text = demo.demo_text()
    layer, head, doc = demo.strongest_head(bundled, text.head_sentence, text.head_from, text.head_to)
    source, target = doc.tokens.index(text.head_from), doc.tokens.index(text.head_to)
    assert doc.attention[layer, head, source, target] == doc.attention[:, :, source, target].max()


# ---- view -------------------------------------------------------------------------------------------

def test_view_escapes_user_text(tmp_path, bundled_load):
    page = tmp_path / "view.html"
    status, stdout, _ = run("view", HOSTILE, "--pair", HOSTILE, "--out", page)
    assert status == 0 and stdout.strip() == str(page)
    html = page.read_text()
    assert "&lt;img" in html
    assert "<img src=x" not in html
    assert [data["kind"] for data in view_data(html)] == ["head", "model", "neuron"]


@pytest.mark.parametrize("kind", ["head", "neuron"])
def test_view_opens_on_the_chosen_layer_and_head(tmp_path, bundled_load, kind):
    page = tmp_path / f"{kind}.html"
    status, _, stderr = run("view", "The cat sat on the mat.", "--pair", "It slept.", "--kind", kind,
                            "--layer", 4, "--head", 7, "--query", 3, "--out", page)
    assert status == 0, stderr
    (data,) = view_data(page.read_text())
    meta = data["meta"]
    assert meta["layers"][meta["layer"]] == 4
    if kind == "head":
        assert meta["active"] == [h == 7 for h in range(12)]
    else:
        assert meta["heads"][meta["head"]] == 7 and meta["query"] == 3


def test_view_default_file_name(tmp_path, bundled_load, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run("view", "Hello there.", "--kind", "model")[0] == 0
    assert (tmp_path / "model_view.html").stat().st_size > 1000


@pytest.mark.parametrize("option, value, message", [
    ("--layer", 6, "--layer 6 is out of range: the model has 6 layers, numbered 0 to 5"),
    ("--head", -1, "--head -1 is out of range: the model has 12 heads, numbered 0 to 11"),
    ("--query", 40, "--query 40 is out of range"),
])
def test_view_index_out_of_range(tmp_path, bundled_load, option, value, message):
    status, stdout, stderr = run("view", "Hello there.", option, value, "--out", tmp_path / "v.html")
    assert status == cli.USER_ERROR and stdout == ""
    assert stderr.count("\n") == 1 and stderr.startswith("minibert view: error: ") and message in stderr
    assert not (tmp_path / "v.html").exists()


def test_unknown_model_is_one_line(tmp_path):
    status, _, stderr = run("view", "Hello.", "--model", tmp_path / "no-such-checkpoint")
    assert status == cli.USER_ERROR
    assert stderr.count("\n") == 1 and "no-such-checkpoint" in stderr


# ---- stats ------------------------------------------------------------------------------------------

TEXTS = ["The cat sat on the mat.", "It was tired, so it slept.", "Dogs bark."]
PAIRS = ["A cat sat.", "The dog, too, slept.", "Cats do not."]


@pytest.mark.parametrize("layout", ["txt", "tsv", "txt --pairs"])
def test_stats_saves_the_survey(tmp_path, bundled_load, bundled, layout):
    paired = layout != "txt"
    lines = [f"{a}\t{b}" if paired else a for a, b in zip(TEXTS, PAIRS)]
    corpus_file = tmp_path / f"corpus.{layout.split()[0]}"
    corpus_file.write_text("\n".join(lines) + "\n\n")
    prefix = tmp_path / "results" / "survey"
    status, stdout, stderr = run("stats", corpus_file, *layout.split()[1:], "--out", prefix, "--batch-size", 2)
    assert status == 0, stderr
    assert stderr.strip(), "the progress bar goes to stderr"
    paths = [prefix.with_suffix(s) for s in (".npz", ".json", ".csv")]
    assert stdout.splitlines()[:3] == [str(p) for p in paths]
    assert json.loads(paths[1].read_text())["documents"] == len(TEXTS)
    expected = attention_statistics(bundled, TEXTS, PAIRS if paired else None)
    assert_matches(statistics_table(paths[1]), expected)
    layer, head = np.unravel_index(expected["to_cls"].argmax(), expected["to_cls"].shape)
    assert re.search(rf"\[CLS\]\s+{layer + 1}-{head + 1} ", stdout), stdout


def test_stats_default_prefix(tmp_path, bundled_load, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "news.txt").write_text("One line.\nAnother line.\n")
    monkeypatch.chdir(tmp_path)
    assert run("stats", "data/news.txt")[0] == 0
    assert sorted(p.name for p in tmp_path.glob("news_heads.*")) == ["news_heads.csv", "news_heads.json",
                                                                      "news_heads.npz"]


@pytest.mark.parametrize("content, name, message", [
    (None, "missing.txt", "missing.txt is not a file"),
    ("a\tb\nno tab here\n", "pairs.tsv", "[2]"),
    ("a\tb\nno tab here\n", "pairs.txt --pairs", "lines [2] do not hold exactly two tab-separated texts"),
    ("\n\n", "empty.txt", "holds no text"),
])
def test_stats_bad_input_is_one_line(tmp_path, bundled_load, content, name, message):
    name, *options = name.split()
    if content is not None:
        (tmp_path / name).write_text(content)
    status, stdout, stderr = run("stats", tmp_path / name, *options, "--out", tmp_path / "s")
    assert status == cli.USER_ERROR and stdout == ""
    assert stderr.count("\n") == 1 and stderr.startswith("minibert stats: error: ") and message in stderr


# ---- hooks, convert, help ---------------------------------------------------------------------------


def test_convert_missing_file_is_one_line(tmp_path):
    status, _, stderr = run("convert", tmp_path / "pytorch_model.bin")
    assert status == cli.USER_ERROR and stderr.count("\n") == 1 and "pytorch_model.bin" in stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: minibert {command}") and "0-indexed" in text
    described = re.sub(r"\s+", " ", text.split("\n\n")[1])
    assert len(described) > 60, described


def test_bad_command_line_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["view"])
    assert exit_info.value.code == 2
    assert "the following arguments are required: TEXT" in capsys.readouterr().err


def test_installed_entry_point_help():
    executable = Path(sys.executable).with_name("minibert")
    result = subprocess.run([executable, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert all(re.search(rf"^\s+{command}\s", result.stdout, re.M) for command in COMMANDS), result.stdout
