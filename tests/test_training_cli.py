"""`minibert finetune`: a run writes a Hugging Face directory and its history; bad input is one line, exit 2."""

from __future__ import annotations

import json

import pytest

import minibert
from minibert.app.cli import main
from tests.conftest import make_hf_model

TWO_ROWS = "text\tlabel\na b\t0\nc d\t1\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny")
    make_hf_model(directory, "BertModel")
    return directory


def _one_line_error(capsys, argv, fragment):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("minibert finetune: error:") and "\n" not in err and fragment in err, err


@pytest.mark.parametrize(("content", "extra", "fragment"), [
    ("text\tlabel\na b\t0\nc d\t5\n", ["--num-labels", "2"],
     "train.tsv: row 2 (line 3)'s label 5 is out of range for num_labels=2"),
    ("text\tlabel\na b\t0\nc d\t5\ne\t1\n", [],
     "train.tsv: no row has label 2, 3, 4, but row 2 (line 3)'s label 5 makes 6 classes (0 … 5). Correct that row's "
     "label, or pass num_labels=6 (--num-labels 6)"),
    ("", [], "is empty"),
    ("text\tpair\tlabel\na\tb\t0\nc\t\t1\n", [], "row 1 (line 2) has a pair but row 2 (line 3) has none"),
    ("text\tlabel\na\t0\nb\t0\n", [], "at least 2 labels"),
    ("text\tlabel\na b\tX Y\n", ["--task", "token-classification", "--num-labels", "3"],
     "data has 2 label names"),
    ("text\tlabel\na b c\tX Y\n", ["--task", "token-classification"], "row 1 (line 2) has 3 words but 2 labels"),
    ("text\tlabel\na b\t0\n", ["--task", "masked-lm"], "has a label, which masked-LM does not use"),
    (TWO_ROWS, ["--epochs", "0"], "--epochs 0: pass a whole number, at least 1."),
    (TWO_ROWS, ["--batch-size", "0"], "--batch-size 0: pass a whole number, at least 1."),
    (TWO_ROWS, ["--dropout", "1.5"], "dropout=1.5"),
    (TWO_ROWS, ["--warmup", "-1"], "warmup=-1.0"),
    (TWO_ROWS, ["--accumulate", "0"], "--accumulate 0: pass a whole number, at least 1."),
    (TWO_ROWS, ["--learning-rate", "0"], "learning_rate=0.0"),
    (TWO_ROWS, ["--max-grad-norm", "-1"], "max_grad_norm=-1.0"),
    (TWO_ROWS, ["--weight-decay", "-0.1"], "weight_decay=-0.1"),
    (TWO_ROWS, ["--trainable", "classifier.*", "head.*"], "'head.*' matches no parameter"),
    (TWO_ROWS, ["--warmup", "nan"], "warmup=nan"),  # issue 32 C: was int(nan)'s ValueError
    (TWO_ROWS, ["--seed", "-1"], "seed=-1: pass a whole number"),  # trust findings 1: a numpy traceback, exit 1
    (TWO_ROWS, ["--learning-rate", "inf"], "learning_rate=inf: pass a positive, finite peak rate"),
    ("text\tlabel\na b\t0\nc\td\t1\n", [], "train.tsv, line 3: 3 fields but the header row has 2"),
    ("text\tlabel\na\t2\nb\tneg\nc\tpos\n", [],
     "row 1 (line 2)'s label 2 is a class number but row 2 (line 3)'s 'neg' is a name"),
    ("text\tlabel\n\t0\nb\t1\n", [], "train.tsv: row 1 (line 2) has an empty text."),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, tiny, content, extra, fragment):
    data = tmp_path / "train.tsv"
    data.write_text(content)
    _one_line_error(capsys, ["finetune", str(data), "--out", str(tmp_path / "out"), "--model", str(tiny), *extra],
                    fragment)


@pytest.mark.parametrize(("name", "content", "fragment"), [
    ("train.txt", "text\tlabel\na\t0\n", "neither TSV, CSV nor JSONL"),
    ("train.jsonl", '{"text": "a", "label": 0}\n{"text": "b", label: 1}\n', "train.jsonl:2: not a JSON object"),
    ("train.csv", "words,label\na,0\n", "has no 'text' column"),
])
def test_bad_files_are_one_line_and_exit_2(tmp_path, capsys, tiny, name, content, fragment):
    (tmp_path / name).write_text(content)
    _one_line_error(capsys, ["finetune", str(tmp_path / name), "--out", str(tmp_path / "out"), "--model", str(tiny)],
                    fragment)


def test_a_task_the_family_cannot_do(tmp_path, capsys, tiny, monkeypatch):
    """Every registered family has the three task heads, so the refusal is reached by removing one from what
    the trainer consults, the family's architectures (as a family added without a token head would be)."""
    from minibert.core.family import Family

    every = Family.architectures
    monkeypatch.setattr(Family, "architectures",
                        lambda family: {k: v for k, v in every(family).items() if "TokenClass" not in k})
    (tmp_path / "train.jsonl").write_text('{"text": "a b", "label": ["X", "Y"]}\n')
    _one_line_error(capsys, ["finetune", str(tmp_path / "train.jsonl"), "--task", "token-classification", "--out",
                             str(tmp_path / "out"), "--model", str(tiny)],
                    "BERT has no BertForTokenClassification, so minibert cannot fine-tune it for token-classification")


def test_missing_file_and_a_used_output_folder(tmp_path, capsys, tiny):
    _one_line_error(capsys, ["finetune", str(tmp_path / "nope.tsv"), "--out", str(tmp_path / "o"), "--model",
                             str(tiny)], "does not exist")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    _one_line_error(capsys, ["finetune", str(tmp_path / "nope.tsv"), "--out", str(tmp_path / "used")],
                    "is not empty; pass --resume")


@pytest.mark.slow
def test_a_run_writes_a_loadable_model_and_its_history(tmp_path, capsys, tiny):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": f"w{i} w{i + 1} a", "label": ["neg", "pos"][i % 2]}) + "\n"
                            for i in range(12)))
    argv = ["finetune", str(data), "--out", str(tmp_path / "out"), "--model", str(tiny), "--epochs", "1",
            "--batch-size", "4", "--eval", str(data)]
    assert main(argv) == 0
    history = json.loads((tmp_path / "out" / "history.json").read_text())
    assert len(history["loss"]) == 3 and history["eval"][0]["epoch"] == 1
    model = minibert.load(tmp_path / "out" / "model")
    assert model.config.architecture == "BertForSequenceClassification" and model.config.id2label == ("neg", "pos")
    assert main([*argv, "--resume"]) == 0  # the saved run is complete: resuming trains nothing more
    assert json.loads((tmp_path / "out" / "history.json").read_text())["loss"] == history["loss"]
    capsys.readouterr()  # the runs' progress bars
    _one_line_error(capsys, [*argv, "--resume", "--learning-rate", "1e-3"], "holds a run with other settings")


def test_latin1_data_and_an_eval_label_the_training_data_lack(tmp_path, capsys, tiny):
    """Issue 32 C: a Latin-1 file was a UnicodeDecodeError traceback; an eval label outside the training classes
    a ValueError traceback (a name) or a NaN evaluation (a number)."""
    (tmp_path / "latin.tsv").write_bytes("text\tlabel\ncaf\xe9\t0\n".encode("latin-1"))
    _one_line_error(capsys, ["finetune", str(tmp_path / "latin.tsv"), "--out", str(tmp_path / "out"), "--model",
                             str(tiny)], "latin.tsv, line 2: not valid UTF-8 (byte 0xe9)")
    (tmp_path / "train.tsv").write_text("text\tlabel\na b\tneg\nc d\tpos\n")
    (tmp_path / "eval.tsv").write_text("text\tlabel\na b\tneutral\n")
    _one_line_error(capsys, ["finetune", str(tmp_path / "train.tsv"), "--eval", str(tmp_path / "eval.tsv"), "--out",
                             str(tmp_path / "out"), "--model", str(tiny)],
                    f"{tmp_path / 'eval.tsv'}: row 1 (line 2)'s label 'neutral' is not one of the training labels "
                    f"['neg', 'pos']")


def test_out_is_a_file_or_a_folder_of_the_users_files(tmp_path, capsys, tiny):
    """Issue 32 B, C: --out notes.txt (a file) was a NotADirectoryError traceback; --resume on a folder holding the
    user's model/ and history.json but no run trained from scratch and overwrote both."""
    data = tmp_path / "train.tsv"
    data.write_text(TWO_ROWS)
    (tmp_path / "notes.txt").write_text("mine")
    _one_line_error(capsys, ["finetune", str(data), "--out", str(tmp_path / "notes.txt"), "--model", str(tiny)],
                    "notes.txt is a file; --out names a folder")
    mine = tmp_path / "mine"
    (mine / "model").mkdir(parents=True)
    (mine / "model" / "config.json").write_text('{"mine": true}')
    (mine / "history.json").write_text("{}")
    _one_line_error(capsys, ["finetune", str(data), "--out", str(mine), "--resume", "--model", str(tiny)],
                    f"{mine} holds no run to resume (no checkpoints folder)")
    assert (mine / "model" / "config.json").read_text() == '{"mine": true}'
    assert sorted(p.name for p in mine.iterdir()) == ["history.json", "model"]
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_a_diverged_run_writes_no_model(tmp_path, capsys, tiny):
    """Issue 32 A4: --learning-rate 1e6 exited 0 and wrote model.safetensors of non-finite weights."""
    data = tmp_path / "train.tsv"
    data.write_text("text\tlabel\n" + "".join(f"w{i} w{i + 3} a b\t{i % 2}\n" for i in range(16)))
    assert main(["finetune", str(data), "--out", str(tmp_path / "out"), "--model", str(tiny), "--learning-rate",
                 "1e6", "--epochs", "2", "--batch-size", "4", "--dropout", "0"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar's lines
    assert last.startswith("minibert finetune: error: training diverged: ") and "Lower the learning rate" in last
    assert not (tmp_path / "out" / "model").exists() and not (tmp_path / "out" / "history.json").exists()


def test_out_under_a_file_and_a_resume_with_nothing_to_resume(tmp_path, capsys, tiny, monkeypatch):
    """Docs-only tester (trust) items 15, 21: --out afile.txt/sub was a NotADirectoryError traceback (exit 1);
    --resume into a folder with no run (a typo) trained from scratch without a word."""
    from minibert import training
    from minibert.errors import InputError

    data = tmp_path / "train.tsv"
    data.write_text(TWO_ROWS)
    (tmp_path / "afile.txt").write_text("mine")
    _one_line_error(capsys, ["finetune", str(data), "--out", str(tmp_path / "afile.txt" / "sub"), "--model", str(tiny)],
                    f"{tmp_path / 'afile.txt'} is a file; --out names a folder")
    assert (tmp_path / "afile.txt").read_text() == "mine"

    def stop(*args, **kwargs):
        raise InputError("stopped here")

    monkeypatch.setattr(training, "finetune", stop)
    assert main(["finetune", str(data), "--out", str(tmp_path / "neverran"), "--resume", "--model", str(tiny)]) == 2
    assert f"no run saved in {tmp_path / 'neverran'}: starting a new one" in capsys.readouterr().err


def test_minibert_warnings_print_as_one_line_others_as_python_does():
    """Docs-only tester (compile 3) item 8: a warning on the command line printed Python's file, line number and the
    source line that raised it. Inside main, minibert's own warnings (raised from a file of the package) are one
    line; another package's keep Python's format, which its authors chose. Only the text changes: filters and
    recorders (pytest's, test_cli's) see every warning as before, and the format is restored afterwards."""
    import warnings
    from pathlib import Path

    from minibert.app.cli import _one_line_warnings

    ours = ("a long\n  message", UserWarning, str(Path(minibert.__file__).parent / "training" / "guards.py"), 3)
    theirs = ("theirs", DeprecationWarning, "/elsewhere/package/module.py", 7)
    before = warnings.formatwarning(*ours)
    with _one_line_warnings("finetune"):
        assert warnings.formatwarning(*ours) == "minibert finetune: warning: a long message\n"
        assert warnings.formatwarning(*theirs) == "/elsewhere/package/module.py:7: DeprecationWarning: theirs\n"
        # minibert's own classes point at the caller's line, outside the package: still ours
        recompile = ("compiled 8\n programs", minibert.RecompileWarning, "/home/me/run.py", 12)
        assert warnings.formatwarning(*recompile) == "minibert finetune: warning: compiled 8 programs\n"
    assert warnings.formatwarning(*ours) == before and "guards.py:3: UserWarning: a long" in before


@pytest.mark.slow  # a whole (one-update) run in a new process
def test_a_runs_warning_is_one_line(tmp_path, tiny):
    """A real run's warning as the command prints it (a process of its own: pytest records warnings rather than
    printing them). 2 rows in one batch, one epoch, is one update, which the default warm-up (0.1 of the run,
    rounded up: 1 update) covers whole (guards.check_warmup)."""
    import subprocess
    import sys

    data = tmp_path / "train.tsv"
    data.write_text(TWO_ROWS)
    argv = ["finetune", str(data), "--out", str(tmp_path / "out"), "--model", str(tiny), "--epochs", "1",
            "--batch-size", "2"]
    done = subprocess.run([sys.executable, "-c", "import sys; from minibert.app.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", *argv], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert [line for line in lines if "warmup" in line] == [
        "minibert finetune: warning: warmup=0.1 is 1 update but the run has 1: the learning rate never reaches its "
        "peak and the first update's is 0; with one update the model does not change. Pass a smaller warmup "
        "(--warmup), or train for more updates."], done.stderr
