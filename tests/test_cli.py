"""The `minibert` command, run in-process through `main` (and once as the installed entry point):
what each command writes is there, holds the model's numbers, escapes user text, and mistakes in
the input end with one line on stderr and status 2."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
import shutil
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import make_hf_model, malicious_bin
from matplotlib.legend import Legend
from tolerances import survey_statistic_tolerances

import minibert
from minibert.analysis import corpus
from minibert.analysis.heads import attention_statistics, behaviour_labels
from minibert.app import cli, demo
from minibert.core.config import head_label
from minibert.viz import figures, report

COMMANDS = ("demo", "view", "stats", "hooks", "convert")
DEMO_FILES = {
    *(f"figures/{name}{suffix}" for name in ("pca", "attention_to_word", "head_heatmap", "head_grid", "neuron",
                                            "head_statistics", "head_mds") for suffix in (".png", ".svg")),
    "head_view.html", "model_view.html", "neuron_view.html", "index.html",
    "head_statistics.csv", "head_statistics.json", "head_statistics.npz",
}
HOSTILE = "<img src=x onerror=alert(1)>"


@pytest.fixture
def bundled_load(monkeypatch, bundled):
    """`minibert COMMAND` without --model reuses the session's bundled model (loading is tested by the demo)."""
    load = cli._load
    monkeypatch.setattr(cli, "_load", lambda name, download=False: bundled if name is None else load(name, download))


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


def assert_matches(table: dict[str, np.ndarray], expected: dict[str, np.ndarray], tolerances) -> None:
    """The survey's statistics (packed rows) against attention_statistics (a padded batch): two programs,
    within tolerances.survey_statistic_tolerances (rtol, entropy atol)."""
    rtol, entropy_atol = tolerances
    assert set(expected) <= set(table)
    for name, values in expected.items():
        np.testing.assert_allclose(table[name], values, rtol=rtol, atol=entropy_atol if name.endswith("entropy") else 0,
                                   err_msg=name)


# ---- demo -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo_log(tmp_path_factory):
    """(out, stdout, stderr, every warning raised) of one `minibert demo`."""
    out = tmp_path_factory.mktemp("demo") / "out"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status, stdout, stderr = run("demo", "--out", out)
    assert status == 0, stderr
    return out, stdout, stderr, caught


@pytest.fixture(scope="module")
def demo_run(demo_log):
    return demo_log[:2]


def test_demo_writes_and_prints_every_file(demo_run):
    out, stdout = demo_run
    written = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert written == DEMO_FILES | {demo.MANIFEST}  # the manifest: what this build wrote, so a rerun may replace it
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
    sentences = demo.demo_text().sentences
    assert_matches(table, attention_statistics(bundled, sentences), survey_statistic_tolerances(bundled, sentences))
    with (out / "head_statistics.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == table["prev"].size
    for row in rows:
        # csv writes floats with repr, which reads back to the same float
        assert float(row["prev"]) == table["prev"][int(row["layer"]), int(row["head"])]
    with np.load(out / "head_statistics.npz") as arrays:
        # The JSON holds the same float32 values as decimal text (repr round-trips exactly).
        np.testing.assert_array_equal(arrays["to_cls"], table["to_cls"])


def test_demo_summary_names_the_top_heads(demo_run, bundled):
    out, stdout = demo_run
    table = statistics_table(out / "head_statistics.json")
    for statistic, meaning in report.rankings(bundled.tokenizer).items():
        line = next(line for line in stdout.splitlines() if line.strip().startswith(meaning))
        layer, head = np.unravel_index(table[statistic].argmax(), table[statistic].shape)
        assert line.split()[len(meaning.split())] == f"{layer + 1}-{head + 1}", line
    labels = behaviour_labels(table)
    assert f"cls {sum('cls' in label.split('+') for label in labels.ravel())}" in stdout


def test_demo_reports_each_step_with_elapsed_seconds(demo_log):
    """A demo takes minutes on a loaded machine: stderr names each step as it starts, with the seconds so far."""
    _, _, stderr, _ = demo_log
    steps = [re.fullmatch(r"minibert demo: \[\s*(\d+\.\d) s\] (.+)", line) for line in stderr.splitlines()]
    assert all(steps), stderr
    seconds, said = [float(m[1]) for m in steps], [m[2] for m in steps]
    assert seconds == sorted(seconds)
    assert said[0] == "loading the model" and said[-1] == "done"
    for name in {Path(name).with_suffix("").as_posix() for name in DEMO_FILES}:  # every output is announced
        assert any(name in step for step in said), (name, said)


def test_demo_refuses_a_folder_holding_its_files_unless_asked(tmp_path, bundled_load):
    """Issue 40: `minibert demo --out DIR` replaced the user's own DIR/index.html and exited 0. It refuses before
    any work, one line naming the files, and leaves them; a file at --out is refused too."""
    (tmp_path / "index.html").write_text("mine")
    (tmp_path / "head_view.html").write_text("mine too")
    status, stdout, stderr = run("demo", "--out", tmp_path)
    assert status != 0 and stdout == ""
    message = [line for line in stderr.splitlines() if "minibert demo: error" in line]
    assert len(message) == 1 and "already holds head_view.html, index.html, which the demo would replace" in \
        message[0] and "--overwrite" in message[0], stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head_view.html", "index.html"]
    assert (tmp_path / "index.html").read_text() == "mine"
    status, _, stderr = run("demo", "--out", tmp_path / "index.html")
    assert status != 0 and "is a file; pass a folder for the demo" in stderr
    assert sorted(demo.written_names()) == sorted(DEMO_FILES)  # the check covers every file the demo writes


def test_demo_reruns_over_its_own_output_but_not_over_a_changed_file(demo_run, tmp_path, bundled_load):
    """`./dev.sh demo` twice replaces what the first run wrote (the README's first command must rerun); a file the
    user changed since is theirs and is refused, the others are not named."""
    out, _ = demo_run
    shutil.copytree(out, tmp_path / "out")
    copy = tmp_path / "out"
    assert demo._own_files(copy) == set(demo.written_names())
    (copy / "index.html").write_text("my notes")
    assert demo._own_files(copy) == set(demo.written_names()) - {"index.html"}
    status, stdout, stderr = run("demo", "--out", copy)
    message = [line for line in stderr.splitlines() if "minibert demo: error" in line]
    assert status != 0 and len(message) == 1 and "already holds index.html, which the demo" in message[0], stderr
    assert (copy / "index.html").read_text() == "my notes"


def test_demo_raises_no_warning(demo_log):
    """Legends are placed by minibert (no matplotlib 'loc="best" can be slow' warning), and nothing else warns."""
    _, _, _, caught = demo_log
    assert not caught, [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught]


def test_figure_legends_have_a_place(bundled):
    """Every legend of the demo's line and scatter figures sits in a named corner, never loc="best" (code 0),
    and the corner is free of the lines: the attention lines of the demo climb to the right."""
    text = demo.demo_text()
    for fig in (demo.pca_figure(bundled, text.groups), demo.attention_to_word_figure(bundled, text.groups)):
        legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
        assert len(legends) == len(text.groups)
        assert all(legend._loc != 0 for legend in legends)  # Legend._loc: matplotlib's location code
    fig = figures.attention_to_word_plot(np.array([[0.0, 0.2, 0.8, 1.0]]), ["rising"])
    assert fig.axes[0].get_legend()._loc == Legend.codes["upper left"]


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
    assert_matches(statistics_table(paths[1]), expected,
                   survey_statistic_tolerances(bundled, TEXTS, PAIRS if paired else None))
    layer, head = np.unravel_index(expected["to_cls"].argmax(), expected["to_cls"].shape)
    assert re.search(rf"\[CLS\]\s+{layer + 1}-{head + 1} ", stdout), stdout


def test_stats_broad_is_relative_by_default_and_absolute_on_request(tmp_path, bundled_load, bundled):
    """Three short documents (ln n < 3.8): relative to their uniform entropy some heads are broad — the heads
    heads.behaviour_labels marks on attention_statistics of the same texts — and against Clark's 3.8 nats none
    can be, in the CSV and in the printed summary."""
    corpus_file = tmp_path / "short.txt"
    corpus_file.write_text("\n".join(TEXTS) + "\n")
    broad = {}
    for rule in ("relative", "absolute"):
        prefix = tmp_path / rule
        status, stdout, stderr = run("stats", corpus_file, "--out", prefix, "--broad", rule)
        assert status == 0, stderr
        with prefix.with_suffix(".csv").open() as table:
            broad[rule] = {row["label"] for row in csv.DictReader(table) if "broad" in row["behaviour"].split("+")}
        saved = json.loads(prefix.with_suffix(".json").read_text())["heads"]
        assert {row["label"] for row in saved if "broad" in row["behaviour"].split("+")} == broad[rule]
        assert ("broad " in stdout.split("behaviour labels:")[1]) == bool(broad[rule]), stdout
    labels = behaviour_labels(attention_statistics(bundled, TEXTS))
    L, H = labels.shape
    assert broad["relative"] == {head_label(layer, head) for layer in range(L) for head in range(H)
                                 if "broad" in str(labels[layer, head]).split("+")}
    assert broad["relative"] and not broad["absolute"]
    with pytest.raises(SystemExit) as exit_info:
        run("stats", corpus_file, "--broad", "clark")
    assert exit_info.value.code == 2  # argparse's usage error, naming the choices


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


def assert_one_line_error(result, command: str, message: str) -> None:
    status, stdout, stderr = result
    assert status == cli.USER_ERROR and stdout == "", (status, stdout)
    assert stderr.count("\n") == 1 and stderr.startswith(f"minibert {command}: error: "), stderr
    assert message in stderr, stderr


@pytest.fixture
def no_survey(monkeypatch):
    """`stats` must refuse bad outputs before the survey: a survey here fails the test."""
    def survey(*args, **kwargs):
        raise AssertionError("the survey ran before the outputs were checked")

    monkeypatch.setattr(corpus, "survey", survey)


def test_stats_refuses_to_overwrite_its_input(tmp_path, monkeypatch, no_survey):
    """`stats texts.csv --out texts` would write texts.csv over the corpus; however the path is spelled."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "texts.csv").write_text("One line.\nAnother line.\n")
    (tmp_path / "link.csv").symlink_to(tmp_path / "texts.csv")
    for out in ("texts", "texts.csv", "sub/../texts", str(tmp_path / "texts"), "link"):
        assert_one_line_error(run("stats", "texts.csv", "--out", out), "stats", "is the input file texts.csv")
    assert (tmp_path / "texts.csv").read_text() == "One line.\nAnother line.\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.csv", "texts.csv"]


def test_stats_checks_its_outputs_before_the_survey(tmp_path, no_survey):
    corpus_file = tmp_path / "corpus.txt"
    corpus_file.write_text("One line.\n")
    (tmp_path / "a_file").write_text("not a folder")
    assert_one_line_error(run("stats", corpus_file, "--out", tmp_path / "a_file" / "results"), "stats",
                          f"cannot write into {tmp_path / 'a_file'}")
    (tmp_path / "results.json").mkdir()
    assert_one_line_error(run("stats", corpus_file, "--out", tmp_path / "results"), "stats",
                          f"the output {tmp_path / 'results.json'} is a folder")


def test_stats_refuses_existing_outputs_before_the_survey_unless_overwrite(tmp_path, bundled_load, no_survey):
    """Issue 40: `stats` replaced PREFIX.npz/.json/.csv already there; refused before the survey, naming the file and
    --overwrite (with which the survey runs: the no_survey fixture's assertion is the survey starting)."""
    corpus_file = tmp_path / "corpus.txt"
    corpus_file.write_text("One line.\n")
    (tmp_path / "results.csv").write_text("mine")
    assert_one_line_error(run("stats", corpus_file, "--out", tmp_path / "results"), "stats",
                          f"{tmp_path / 'results.csv'} already exists; pass --overwrite to replace it")
    with pytest.raises(AssertionError, match="the survey ran"):
        run("stats", corpus_file, "--out", tmp_path / "results", "--overwrite")


def test_view_checks_its_output_before_running(tmp_path):
    (tmp_path / "a_file").write_text("not a folder")
    assert_one_line_error(run("view", "Hello.", "--out", tmp_path / "a_file" / "v.html"), "view", "cannot write into")


def test_view_refuses_an_existing_page_or_link_unless_overwrite(tmp_path, bundled_load):
    """Issue 40, round 5 (a docs-only tester): `minibert view --out FILE` replaced an existing file, and the file
    a link points to, with no --overwrite to ask for it. Now the one rule of every writer (io.files.output_path):
    refused before the model is loaded, the file kept; --overwrite replaces the file or the link itself."""
    mine, target = tmp_path / "exists.html", tmp_path / "target.txt"
    mine.write_text("keep")
    target.write_text("keep")
    (tmp_path / "link.html").symlink_to(target)
    assert_one_line_error(run("view", "hi", "--out", mine), "view",
                          f"{mine} already exists; pass --overwrite to replace it")
    assert_one_line_error(run("view", "hi", "--out", tmp_path / "link.html"), "view", "is a symbolic link")
    assert_one_line_error(run("view", "hi", "--out", tmp_path / "v.png"), "view", "must end in .html or .htm")
    assert mine.read_text() == "keep" and target.read_text() == "keep"
    assert run("view", "hi", "--kind", "model", "--out", tmp_path / "link.html", "--overwrite")[0] == 0
    assert target.read_text() == "keep" and not (tmp_path / "link.html").is_symlink()
    assert len(view_data((tmp_path / "link.html").read_text(encoding="utf-8"))) == 1


def test_view_of_a_long_text_names_the_option(tmp_path, bundled_load):
    """The tokenizer's advice "pass max_length=512" reads as the command's option on the command line."""
    status, _, stderr = run("view", "word " * 3000, "--out", tmp_path / "v.html")
    assert status == cli.USER_ERROR and "pass --max-length 512 to truncate it" in stderr
    assert "max_length=" not in stderr and not (tmp_path / "v.html").exists()


def test_ctrl_c_is_one_line_and_status_130(tmp_path, bundled_load, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(corpus, "survey", interrupted)
    (tmp_path / "corpus.txt").write_text("One line.\n")
    status, stdout, stderr = run("stats", tmp_path / "corpus.txt", "--out", tmp_path / "s")
    assert (status, stdout, stderr.strip()) == (cli.INTERRUPTED, "", "minibert stats: interrupted")


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"minibert {minibert.__version__}\n"


def test_download_reaches_load_and_names_the_extra(tmp_path, monkeypatch):
    """Without huggingface_hub: --download says how to install it; without --download the fix names both."""
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import huggingface_hub now raises ImportError
    monkeypatch.chdir(tmp_path)
    command = ("view", "Hello.", "--model", "nobody/no-such-bert", "--out", tmp_path / "v.html")
    assert_one_line_error(run(*command, "--download"), "view",
                          "download=True fetches 'nobody/no-such-bert' through huggingface_hub, which is not "
                          "installed. Install it with `pip install 'minibert[hub]'`.")
    assert_one_line_error(run(*command), "view", "after `pip install 'minibert[hub]'`, minibert.load("
                                                 "'nobody/no-such-bert', download=True) (--download on the command "
                                                 "line) fetches it from the Hub")


@pytest.mark.parametrize("change, message", [
    ({"hidden_size": "8"}, "hidden_size must be a positive integer, got '8'"),
    ({"layer_norm_eps": "1e-12"}, "layer_norm_eps must be a small positive number such as 1e-12, got '1e-12'"),
    ([1, 2], "config.json holds a JSON list; it must hold an object"),
])
def test_view_with_a_bad_config_is_one_line(tmp_path, change, message):
    checkpoint = tmp_path / "checkpoint"
    make_hf_model(checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, **change} if isinstance(change, dict) else change))
    assert_one_line_error(run("view", "Hello.", "--model", checkpoint, "--out", tmp_path / "v.html"), "view",
                          message)
    assert not (tmp_path / "v.html").exists()


def test_convert_refuses_a_malicious_bin_and_runs_nothing(tmp_path):
    marker = tmp_path / "payload_ran"
    bin_path = malicious_bin(tmp_path / "pytorch_model.bin", marker)
    assert_one_line_error(run("convert", bin_path), "convert",
                          f"{bin_path} could not be read as a file of tensors (UnpicklingError)")
    assert not marker.exists() and not (tmp_path / "model.safetensors").exists()


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


def test_wheel_ships_the_license_types_and_data(tmp_path):
    """`pip wheel .` of a copy of the project (the checkout stays clean): LICENSE, py.typed, the data files,
    the entry point, the extras that the error messages name and every tutorial (the content of its link to
    docs/tutorials, for `minibert tutorial NAME`) are in the wheel."""
    root = Path(__file__).resolve().parent.parent
    source = tmp_path / "source"
    # The tutorials' links stay links, pointing at a copy of docs/tutorials, as in the checkout the build reads.
    shutil.copytree(root / "minibert", source / "minibert", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(root / "docs" / "tutorials", source / "docs" / "tutorials")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(root / name, source / name)
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                             "-q", str(source), "-w", str(tmp_path / "wheel")], capture_output=True, text=True,
                            timeout=600)  # a hang guard
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "wheel").glob("minibert-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = next(name.split("/")[0] for name in names if name.endswith(".dist-info/METADATA"))
        metadata = archive.read(f"{info}/METADATA").decode().splitlines()
        assert archive.read(f"{info}/licenses/LICENSE") == (root / "LICENSE").read_bytes()
        assert "minibert = minibert.app.launch:main" in archive.read(f"{info}/entry_points.txt").decode()
        tutorials = sorted((root / "docs" / "tutorials").glob("*.py"))
        assert tutorials
        for page in tutorials:
            assert archive.read(f"minibert/tutorials/{page.stem}.percent") == page.read_bytes(), page.name
    assert {"minibert/py.typed", "minibert/data/demo.json", "minibert/viz/static/views.js"} <= names
    assert {"License-Expression: Apache-2.0", "License-File: LICENSE", "Provides-Extra: hub",
            "Provides-Extra: tutorials"} <= set(metadata)
    assert (root / "LICENSE").read_text().split()[:3] == ["Apache", "License", "Version"]


def test_installed_entry_point_help():
    executable = Path(sys.executable).with_name("minibert")
    result = subprocess.run([executable, "--help"], capture_output=True, text=True, timeout=600)  # a hang guard
    assert result.returncode == 0, result.stderr
    assert all(re.search(rf"^\s+{command}\s", result.stdout, re.M) for command in COMMANDS), result.stdout


def test_serve_without_its_extra_is_one_line_before_anything_is_printed(monkeypatch, bundled_load):
    """Issue 32 C: the guard covered only minibert.app.serve's import, which needs neither starlette nor uvicorn
    at import time; with starlette missing the command printed its URL and token, then crashed."""
    for missing in ("starlette", "uvicorn"):
        with monkeypatch.context() as patch:
            patch.setitem(sys.modules, missing, None)  # what `import missing` meets when it is not installed
            assert_one_line_error(run("serve", "--no-browser", "--port", "0"), "serve",
                                  f"minibert serve needs {missing}: pip install 'minibert[serve]'")


def test_tutorial_names_and_outputs_that_cannot_be(tmp_path):
    """Issue 32 C: `minibert tutorial ²` ('²'.isdigit() but int('²') fails) and an --output inside a file were
    tracebacks."""
    assert_one_line_error(run("tutorial", "²"), "tutorial", "no tutorial '²'")
    (tmp_path / "afile").write_text("mine")
    assert_one_line_error(run("tutorial", "1", "--output", tmp_path / "afile" / "one.ipynb"), "tutorial",
                          "afile is a file")
    assert (tmp_path / "afile").read_text() == "mine"
    assert_one_line_error(run("tutorial", "6", "--output", tmp_path / "d.txt"), "tutorial", "must end in .ipynb")
    assert not (tmp_path / "d.txt").exists()


INTERRUPTED_RUN = """
import atexit, sys
from minibert.analysis import corpus
from minibert.app import cli

def interrupted(*args, **kwargs):
    raise KeyboardInterrupt

corpus.survey = interrupted
atexit.register(lambda: print("interpreter teardown ran", flush=True))
sys.argv = ["minibert", "stats", sys.argv[1], "--out", sys.argv[2]]
sys.exit(cli.main())
"""


SWALLOWED_RUN = """
import atexit, os, sys, time
from minibert.analysis import corpus
from minibert.app import cli

def swallowing(*args, **kwargs):  # as a garbage-collection callback does: the KeyboardInterrupt is lost
    print("surveying", flush=True)
    try:
        time.sleep(120)
    except KeyboardInterrupt:
        pass
    print("the command ran on", flush=True)
    os._exit(0)

corpus.survey = swallowing
atexit.register(lambda: print("interpreter teardown ran", flush=True))
sys.argv = ["minibert", "stats", sys.argv[1], "--out", sys.argv[2]]
sys.exit(cli.main())
"""


def test_ctrl_c_as_the_program_leaves_even_where_the_interrupt_would_be_swallowed(tmp_path):
    """Issue 32 C, found while reproducing it: a SIGINT that lands while Python runs a garbage-collection callback
    (JAX registers one) raises a KeyboardInterrupt that Python prints as ignored, and `minibert stats` ran on to
    the end (exit 0, 3 runs of 14 here). The program's SIGINT handler now leaves at once; the survey here
    swallows the KeyboardInterrupt the way the callback does."""
    import signal

    (tmp_path / "corpus.txt").write_text("One line.\n")
    run_ = subprocess.Popen([sys.executable, "-c", SWALLOWED_RUN, str(tmp_path / "corpus.txt"), str(tmp_path / "s")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert run_.stdout.readline() == "surveying\n"  # the handler is installed before the command runs
    run_.send_signal(signal.SIGINT)
    stdout, stderr = run_.communicate(timeout=300)  # a hang guard
    assert (run_.returncode, stdout, stderr.strip()) == (cli.INTERRUPTED, "", "minibert stats: interrupted")


def test_ctrl_c_as_the_program_exits_without_interpreter_teardown(tmp_path):
    """Issue 32 C: Ctrl-C during `minibert stats` printed "interrupted" and then sometimes died by SIGSEGV (−11):
    the interpreter's teardown ran while XLA's threads were still at work. As the program (main() reading
    sys.argv) the command now leaves at once with status 130 after its one line: no teardown (atexit) runs.
    The crash itself depends on timing (about 1 interrupt in 15 here), so the test checks its cause."""
    (tmp_path / "corpus.txt").write_text("One line.\n")
    done = subprocess.run([sys.executable, "-c", INTERRUPTED_RUN, str(tmp_path / "corpus.txt"), str(tmp_path / "s")],
                          capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout, done.stderr.strip()) == (cli.INTERRUPTED, "", "minibert stats: interrupted")


IMPORT_INTERRUPTED = """
import sys, time

class Announce:  # says when JAX's import starts, then leaves the finding to the real finders
    def find_spec(self, name, path=None, target=None):
        if name == "jax":
            print("importing jax", flush=True)
            time.sleep(0.5)
        return None

sys.meta_path.insert(0, Announce())
sys.argv = ["minibert", "hooks"]
from minibert.app import launch
sys.exit(launch.main())
"""


def test_ctrl_c_while_minibert_imports_is_one_line_and_status_130():
    """Issue 40: Ctrl-C in the first second of every command (while JAX imports) ended by SIGSEGV, or with a
    41-line ImportError traceback, or ran on: the handler was installed after the imports. The command's entry
    point (pyproject's minibert = minibert.app.launch:main) installs it before any import, and `import minibert`
    imports nothing heavy, so the interrupt lands in JAX's import here and gives the one line."""
    import signal
    import tomllib

    scripts = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["minibert"] == "minibert.app.launch:main"
    light = subprocess.run([sys.executable, "-c", "import sys, minibert; print('jax' in sys.modules)"],
                           capture_output=True, text=True, timeout=300)
    assert light.stdout == "False\n", light.stderr
    run_ = subprocess.Popen([sys.executable, "-c", IMPORT_INTERRUPTED], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert run_.stdout.readline() == "importing jax\n"
    run_.send_signal(signal.SIGINT)
    stdout, stderr = run_.communicate(timeout=300)  # a hang guard
    assert (run_.returncode, stdout, stderr.strip()) == (cli.INTERRUPTED, "", "minibert hooks: interrupted")
