"""Corpus surveys over several processes: jax.distributed on localhost, 2 processes × 2 forced CPU devices.

Each test starts real processes (subprocesses on a free localhost port, collectives over gloo), so they
are few and marked slow (each takes about a minute on 2 cores); CI runs them. The corpus has 205
texts, so the strided shares are uneven (103 and 102 documents). References are single-process surveys
of the same file, which test_corpus holds to a brute-force NumPy reference.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from test_corpus import STATISTICS, TEXTS, assert_same_statistics, regrouped_tolerances

from minibert.analysis import corpus

SETTINGS = dict(batch_tokens=256, buckets=(32, 64))  # several row lengths and batches per process
CHUNK = 16  # documents per chunk in the workers: several chunks, so several resume saves, per process
TEXT_COUNT = 205
# Seconds a process waits at a chunk for a peer that is alive but slow (compiling, or starved on a loaded 2-core
# machine), and the runtime's heartbeat above it: guards against a hang, never reached by a run that works.
PEER_WAIT, HEARTBEAT = 240, 300

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    lines = [f"{TEXTS[i % 20]} {TEXTS[(i * 7 + 3) % 20]}" for i in range(TEXT_COUNT)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def launch(script: str, argument: dict, processes: int = 2, timeout: float = 600) -> list[subprocess.CompletedProcess]:
    """Run `script` in `processes` processes of one jax.distributed job (2 CPU devices each); every one
    gets JSON `argument` as argv[1]. Returns the finished processes in process order; `timeout` guards
    against a hang, and a process still running then is killed with its test."""
    port = free_port()
    running = []
    for index in range(processes):
        env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
                   JAX_NUM_PROCESSES=str(processes), JAX_PROCESS_ID=str(index), PYTHONUNBUFFERED="1",
                   XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip())
        running.append(subprocess.Popen([sys.executable, "-c", script, json.dumps(argument)], env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    done = []
    try:
        for process in running:
            out, err = process.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(process.args, process.returncode, out, err))
    finally:
        for process in running:
            process.kill()  # nothing for one that has ended
    return done


def last_json(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---- global and local results --------------------------------------------------------------------------

SURVEYS = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from minibert.app.distributed import initialize
    from minibert.analysis import corpus
    from minibert.errors import DistributedError

    argument = json.loads(sys.argv[1])
    initialize(heartbeat_timeout=argument["heartbeat"])
    import jax, minibert

    corpus.reading.CHUNK = argument["chunk"]
    path, settings = Path(argument["path"]), argument["settings"]
    model = minibert.load()
    from jax.experimental import multihost_utils
    checks, assert_equal = [], multihost_utils.assert_equal  # device_put's cross-process equality check
    multihost_utils.assert_equal = lambda *args, **kwargs: checks.append(1) or assert_equal(*args, **kwargs)
    everywhere = corpus.survey(model, path, progress=False, **settings)
    mine = corpus.survey(model, path, progress=False, reduce="local", **settings)
    mine.save(argument["out"] + f"/local{jax.process_index()}")
    errors = {}
    other_settings = lambda: corpus.survey(model, path, progress=False, max_length=64 + 64 * jax.process_index())
    same_texts = lambda: corpus.survey(model, ["A text.", "Another one."], progress=False)
    for name, call in {"settings": other_settings, "same texts": same_texts}.items():
        try:
            call()
        except DistributedError as error:
            errors[name] = str(error)
    share = corpus.read_corpus(path, shard=(jax.process_index(), jax.process_count()))[0]
    print(json.dumps({"mean": {k: v.tolist() for k, v in everywhere.mean.items()}, "documents": everywhere.documents,
                      "counts": everywhere.counts, "settings": everywhere.settings, "errors": errors,
                      "share": share, "local_documents": mine.documents, "equality_checks": len(checks)}))
""")


def test_two_processes_give_the_result_of_one(bundled, corpus_file, tmp_path):
    """Strided, uneven shares read from one file: every process returns the single-process statistics and
    global counts; the processes' reduce="local" results, saved and loaded, merge to the same; a process
    with other settings, or processes all handed the same texts, stop before the first batch. No array
    goes through device_put's cross-process equality check (one all-gather per weight)."""
    done = launch(SURVEYS, dict(path=str(corpus_file), settings=dict(SETTINGS, timeout=PEER_WAIT), chunk=CHUNK,
                                out=str(tmp_path), heartbeat=HEARTBEAT))
    got = [last_json(d) for d in done]
    lines = corpus_file.read_text().splitlines()
    assert [g["share"] for g in got] == [lines[0::2], lines[1::2]]  # strided: line i goes to process i mod 2
    assert [g["local_documents"] for g in got] == [103, 102]

    one = corpus.survey(bundled, corpus_file, progress=False, **SETTINGS)
    merged = corpus.SurveyResult.merge([corpus.SurveyResult.load(tmp_path / f"local{i}") for i in range(2)])
    tolerances = regrouped_tolerances(bundled, lines)
    assert_same_statistics(merged.mean, one.mean, tolerances)
    assert merged.documents == one.documents == TEXT_COUNT
    assert merged.counts["real_tokens"] == one.counts["real_tokens"]
    assert (merged.settings["processes"], merged.settings["devices"]) == (2, 4)
    for g in got:
        assert g["documents"] == TEXT_COUNT
        assert g["counts"] == got[0]["counts"] and g["counts"]["real_tokens"] == one.counts["real_tokens"]
        assert (g["settings"]["processes"], g["settings"]["devices"], g["settings"]["reduce"]) == (2, 4, "global")
        assert_same_statistics(g["mean"], one.mean, tolerances)
        assert g["equality_checks"] == 0
        assert "processes [1] differ from process 0 in their settings" in g["errors"]["settings"]
        assert "all 2 processes were given the same texts" in g["errors"]["same texts"]


# ---- a killed process, and resuming ---------------------------------------------------------------------

STATS = textwrap.dedent("""
    import json, os, signal, sys
    from minibert.analysis import corpus
    from minibert.app import cli

    argument = json.loads(sys.argv[1])
    corpus.reading.CHUNK = argument["chunk"]
    index = int(os.environ["JAX_PROCESS_ID"])
    if argument.get("die_at") is not None:  # process 1 is killed (no exception, no cleanup) at a chunk
        wait = corpus.distributed.await_peers
        def dying(tag, chunk, timeout):
            if chunk < argument["die_at"]:  # a slow peer, alive, is waited for as in a run that must finish
                return wait(tag, chunk, argument["peer_wait"])
            if index == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            return wait(tag, chunk, timeout)
        corpus.distributed.await_peers = dying
    sys.exit(cli.main(["stats", argument["path"], "--distributed", "--out", argument["out"] + str(index),
                       "--resume", argument["resume"], "--every", "32", "--timeout", str(argument["timeout"]),
                       "--heartbeat-timeout", str(argument["heartbeat"]), "--batch-size", "4", "--max-length", "64"]))
""")


def test_killed_process_is_named_and_resume_gives_identical_totals(corpus_file, tmp_path):
    """`minibert stats --distributed`: process 1 is killed at its 6th chunk (after two resume saves);
    process 0 stops within the timeout with an error naming it. Run again with the same resume file, the
    survey resumes and gives exactly the totals of an uninterrupted run; only process 0 writes.
    At the chunks before the kill, and in the runs that must finish, the processes wait PEER_WAIT for each
    other: how far apart two live processes drift depends on the machine, so only the wait for the dead one
    is short."""
    argument = dict(path=str(corpus_file), chunk=CHUNK, resume=str(tmp_path / "resumed.resume"),
                    out=str(tmp_path / "resumed"), peer_wait=PEER_WAIT, heartbeat=HEARTBEAT)
    killed = launch(STATS, dict(argument, die_at=5, timeout=15))
    assert killed[1].returncode == -9
    assert killed[0].returncode == 2, killed[0].stderr[-3000:]
    assert ("minibert stats: error: process 0: processes [1] did not reach the same point of the survey within "
            "timeout=15 s") in killed[0].stderr
    assert (tmp_path / "resumed.resume").exists() and not (tmp_path / "resumed0.npz").exists()

    argument["timeout"] = PEER_WAIT
    resumed = launch(STATS, argument)
    whole = launch(STATS, dict(argument, resume=str(tmp_path / "whole.resume"), out=str(tmp_path / "whole")))
    for done in resumed + whole:
        assert done.returncode == 0, done.stderr[-3000:]
    assert not (tmp_path / "resumed1.npz").exists() and not (tmp_path / "whole1.npz").exists()
    a, b = corpus.SurveyResult.load(tmp_path / "resumed0"), corpus.SurveyResult.load(tmp_path / "whole0")
    assert a.documents == b.documents == TEXT_COUNT and a.counts == b.counts
    for name in STATISTICS:
        np.testing.assert_array_equal(a.mean[name], b.mean[name], err_msg=name)
