"""resume=DIR: a run killed mid-way (SIGKILL, in a subprocess) and resumed ends with the same bits as a run
that was never interrupted — parameters, optimiser state, data order, masks and dropout keys all continue.

The run kills itself at a fixed update rather than the test killing it at some moment: a kill timed from outside
lands wherever a slow or busy machine happens to be (it could even find the run finished), so the point where
it stops would depend on the machine."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

import minibert
from minibert import training
from minibert.errors import DataFileError, InputError
from minibert.training.resume import Checkpoints
from tests.conftest import make_hf_model

SETTINGS = dict(task="sequence-classification", num_labels=2, epochs=3, batch_size=4, learning_rate=1e-3,
                dropout=0.1, seed=5, progress=False)
# The run saves every 2 updates (2, 4, 6) and dies at the save of update 8, in its first epoch of 15 updates:
# updates 7 and 8 are lost, and the resumed run does them again.
CHECKPOINT_EVERY, KILLED_AT = 2, 8
RUN = """
import json, os, signal, sys
import minibert
from minibert import training
from minibert.training.resume import Checkpoints
settings = json.loads(sys.argv[3])
rows = [training.Example(t, None, l) for t, l in json.loads(sys.argv[4])]
save = Checkpoints.save
def save_unless_killed(self, micro, state, meta):  # SIGKILL: no exception, no cleanup, update KILLED_AT unsaved
    if micro == int(sys.argv[5]):
        os.kill(os.getpid(), signal.SIGKILL)
    save(self, micro, state, meta)
Checkpoints.save = save_unless_killed
training.finetune(minibert.load(sys.argv[1]), rows, resume=sys.argv[2], checkpoint_every=int(sys.argv[6]), **settings)
"""


def _rows(n=60):
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(50)]
    return [(" ".join(rng.choice(words, size=rng.integers(2, 10))), int(rng.integers(0, 2))) for _ in range(n)]


def _leaves(model):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(model.state)]


def _checkpoints(directory):
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if directory.exists() else []


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_same_bits(tmp_path):
    make_hf_model(tmp_path / "hf", "BertForSequenceClassification", num_labels=2, scale=0.1)
    model = minibert.load(tmp_path / "hf")
    rows = _rows()
    examples = [training.Example(t, None, label) for t, label in rows]
    whole = training.finetune(model, examples, **SETTINGS)

    run_dir = tmp_path / "run"
    killed = subprocess.run([sys.executable, "-c", RUN, str(tmp_path / "hf"), str(run_dir), json.dumps(SETTINGS),
                             json.dumps(rows), str(KILLED_AT), str(CHECKPOINT_EVERY)],
                            env=os.environ | {"PYTHONPATH": os.getcwd()},
                            capture_output=True, text=True, timeout=600)  # the timeout guards against a hang
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert _checkpoints(run_dir) == [4, 6]  # the newest two saves are kept

    resumed = training.finetune(model, examples, resume=run_dir, **SETTINGS)
    assert resumed.history.loss == whole.history.loss
    for ours, theirs in zip(_leaves(resumed.model), _leaves(whole.model)):
        np.testing.assert_array_equal(ours, theirs)
    with pytest.raises(InputError, match="learning_rate: 0.001 then, 0.002 now"):
        training.finetune(model, examples, resume=run_dir, **(SETTINGS | {"learning_rate": 2e-3}))


# ---- what a resumed run must share with the saved one, and folders that are not runs (issue 32 A3, B, C) -----

QUICK = dict(task="sequence-classification", num_labels=2, epochs=1, batch_size=4, learning_rate=1e-3, dropout=0.0,
             progress=False, trainable="classifier.*")


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """(base model, rows, the folder of a finished run on them that trained the head alone)."""
    directory = tmp_path_factory.mktemp("saved")
    make_hf_model(directory / "hf", "BertModel", scale=0.1)
    model = minibert.load(directory / "hf")
    rows = _rows(8)
    training.finetune(model, rows, resume=directory / "run", **QUICK)
    return model, rows, directory / "run"


def test_resume_refuses_flipped_labels_another_base_and_other_hooks(saved_run, tmp_path):
    """Before: each of these resumed (exit 0) as if it were the saved run — every label flipped (same count),
    another encoder under the saved head (trainable='classifier.*'), a hook the run never had."""
    model, rows, run = saved_run
    flipped = [(text, 1 - label) for text, label in rows]
    with pytest.raises(InputError, match=r"other settings \(the training data \(texts, pairs and labels, as "
                                         r"tokenized\) differ\)"):
        training.finetune(model, flipped, resume=run, **QUICK)
    make_hf_model(tmp_path / "other", "BertModel", scale=0.1, seed=1)
    with pytest.raises(InputError, match=r"other settings \(the base model's weights differ\)"):
        training.finetune(minibert.load(tmp_path / "other"), rows, resume=run, **QUICK)
    with pytest.raises(InputError, match=r"other settings \(the hooks \(names, functions, their arrays\) differ\)"):
        training.finetune(model, rows, resume=run, hooks={"blocks.0.hook_resid_post": lambda v, ctx: v * 0.5},
                          **QUICK)
    again = training.finetune(model, rows, resume=run, **QUICK)  # the same run: it is complete, nothing trains
    assert len(again.history.loss) == 2


def test_a_folder_of_a_users_files_is_never_a_run(saved_run, tmp_path):
    """Before: a folder holding the user's files trained from scratch into it, a sub-folder named 7/ was a
    KeyError, and an existing file an orbax NotADirectoryError after the work."""
    model, rows, _ = saved_run
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("my notes")
    with pytest.raises(DataFileError, match=r"mine holds 'notes.txt', which is no checkpoint of a run"):
        training.finetune(model, rows, resume=tmp_path / "mine", **QUICK)
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]
    assert (tmp_path / "mine" / "notes.txt").read_text() == "my notes"
    (tmp_path / "seven" / "7").mkdir(parents=True)
    (tmp_path / "seven" / "7" / "draft.txt").write_text("mine")
    with pytest.raises(DataFileError, match=r"seven holds '7', which is no checkpoint of a run"):
        training.finetune(model, rows, resume=tmp_path / "seven", **QUICK)
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(DataFileError, match=r"a_file is a file; pass a folder"):
        training.finetune(model, rows, resume=tmp_path / "a_file", **QUICK)
    with pytest.raises(InputError, match=r"checkpoint_every=0: pass a whole number of updates, at least 1"):
        training.finetune(model, rows, checkpoint_every=0, **QUICK)


def test_a_damaged_checkpoint_is_named(saved_run, tmp_path):
    """Before: a truncated checkpoint (its metadata cut short) was a JSONDecodeError from inside orbax."""
    model, rows, run = saved_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    metadata = copy / "2" / "meta" / "metadata"
    metadata.write_bytes(metadata.read_bytes()[:40])
    with pytest.raises(DataFileError, match=r"the checkpoint .*run/2 cannot be read \(JSONDecodeError.*Delete that "
                                            r"folder to continue from the checkpoint before it"):
        training.finetune(model, rows, resume=copy, **QUICK)


def test_a_run_saved_without_fingerprints_says_so(tmp_path):
    """A run saved before its settings held fingerprints cannot be vouched for: the refusal says why, rather than
    'the training data differ'."""
    saved = Checkpoints(tmp_path / "run")
    state = {"w": np.arange(3.0, dtype=np.float32)}
    saved.save(2, state, {"settings": {"epochs": 1}, "history": {}})
    saved.close()
    with pytest.raises(InputError, match="saved by an earlier minibert, without the fingerprints"):
        Checkpoints(tmp_path / "run").restore(state, {"epochs": 1, "data": "0" * 32, "base": "1" * 32})
    assert Checkpoints(tmp_path / "run").restore(state, {"epochs": 1})[0] == 2  # settings as saved: restored


HOOKED_RUN = """
import functools, json, sys
import minibert
from minibert import training
def picked(name):  # a set literal: its frozenset constant's order follows the process's string hashes
    return name in {"blocks.0.hook_resid_post", "blocks.1.hook_resid_post", "embed.hook_out"}
def scaled(value, ctx, pick):
    return value * 0.5 if pick(ctx.name) else value
hooks = {"blocks.0.hook_resid_post": functools.partial(scaled, pick=picked)}  # a function among its arguments
rows = [tuple(row) for row in json.loads(sys.argv[3])]
result = training.finetune(minibert.load(sys.argv[1]), rows, resume=sys.argv[2], hooks=hooks, **json.loads(sys.argv[4]))
print(json.dumps(result.history.loss))
"""


@pytest.mark.slow
def test_a_finished_hooked_run_resumes_in_another_process(saved_run, tmp_path):
    """Before: resuming a finished run in a new process with the same hook was refused ("the hooks ... differ"):
    the hook's fingerprint held its frozenset constant in the order of that process's string hashes
    (PYTHONHASHSEED 0 and 2 order these three names differently), and a partial's function argument by its
    address. Resumed, the finished run gives its history with no new step."""
    model, rows, run = saved_run

    def finetune(seed):
        done = subprocess.run([sys.executable, "-c", HOOKED_RUN, str(run.parent / "hf"), str(tmp_path / "run"),
                               json.dumps(rows), json.dumps(QUICK)],
                              env=os.environ | {"PYTHONPATH": os.getcwd(), "PYTHONHASHSEED": str(seed)},
                              capture_output=True, text=True, timeout=600)  # the timeout guards against a hang
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.splitlines()[-1])

    first = finetune(0)
    assert len(first) == 2  # 8 rows in batches of 4, one epoch
    assert finetune(2) == first
