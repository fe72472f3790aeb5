"""Every benchmark script's --smoke run: tiny inputs and one timed call per case, so a refactor that breaks a
benchmark (a renamed private helper, a changed contract) fails here rather than in the next timing session.

Scripts with a smoke test of their own (checking their tables) are listed in OWN_TEST; scripts not yet given a
--smoke mode are listed in NO_SMOKE_YET with the reason, and a test keeps both lists true to benchmarks/.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SMOKED = {  # script → a line its report must hold
    "sweeps": "## Sweeps",
    "mixing": "## Context mixing",
    "training": "## Training",
}
OWN_TEST = {"gpu": "test_gpu_benchmark.py", "buckets": "test_buckets_benchmark.py", "serve": "test_serve.py",
            "probes": "test_analysis_probes.py", "sae": "test_analysis_sae.py"}
NO_SMOKE_YET = {  # script → why it has no --smoke run yet
    "dense": "the dense-capture tables; not yet given a smoke mode",
    "memory": "peak-memory subprocess runs; not yet given a smoke mode",
    "one_core": "pinned single-core timing; not yet given a smoke mode",
    "op_profile": "XLA op profile; not yet given a smoke mode",
    "run": "the RESULTS.md driver of the other sections; not yet given a smoke mode",
    "scale_out": "multi-process corpus runs (helper H4 is reworking the corpus); not yet given a smoke mode",
    "survey": "corpus survey timings (helper H4 is reworking the corpus); not yet given a smoke mode",
    "views": "browser timings against an older commit; not yet given a smoke mode",
}
HELPERS = {"harness", "tl_worker"}  # imported or spawned by the scripts, not benchmarks themselves


def test_every_benchmark_script_is_accounted_for():
    scripts = {path.stem for path in BENCHMARKS.glob("*.py")} - HELPERS
    listed = set(SMOKED) | set(OWN_TEST) | set(NO_SMOKE_YET)
    assert scripts == listed, f"not listed: {sorted(scripts - listed)}; listed but gone: {sorted(listed - scripts)}"
    for script in SMOKED.keys() | OWN_TEST.keys():
        assert "--smoke" in (BENCHMARKS / f"{script}.py").read_text(), script
    tests = Path(__file__).resolve().parent
    for script, test_file in OWN_TEST.items():
        assert 'main(["--smoke"' in (tests / test_file).read_text(), (script, test_file)


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SMOKED))
def test_benchmark_smoke_run(script, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    module = importlib.import_module(script)
    try:
        assert module.main(["--smoke"]) == 0
    finally:
        sys.modules.pop(script, None)
    report = capsys.readouterr().out
    assert SMOKED[script] in report and "smoke run" in report, report[-2000:]
    assert "| ---" in report  # a Markdown table was printed
