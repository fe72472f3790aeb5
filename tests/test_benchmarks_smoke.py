"""Every benchmark script's --smoke run: tiny inputs and one timed call per case, with the script checking its own
outputs (finite, positive timings; shapes; counts), so a refactor that breaks a benchmark (a renamed helper, a
changed contract) fails here rather than in the next timing session.

Scripts whose smoke run has a test of its own (checking their tables) are listed in OWN_TEST and not run twice;
a test keeps SMOKED and OWN_TEST true to benchmarks/.
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
    "dense": "## hook_overhead",
    "memory": "| offload=True |",
    "one_core": "| minibert, patterns |",
    "op_profile": "| dense matmuls (q/k/v/o, FFN, pooler) |",
    "run": "### Hook machinery with nothing active",
    "scale_out": "| workers (1 core each) |",
    "survey": "| workload | programs traced (model.traces) |",
    "views": "| neuron | 128 |",
}
# Marks by how long a smoke run takes on a quiet 2-core machine (slow: ≥ 10 s; they still run in CI).
MARKS = {script: [pytest.mark.slow] for script in SMOKED}
MARKS["views"] = [pytest.mark.slow, pytest.mark.browser]  # drives headless chromium
OWN_TEST = {"gpu": "test_gpu_benchmark.py", "buckets": "test_buckets_benchmark.py", "serve": "test_serve.py",
            "probes": "test_analysis_probes.py", "sae": "test_analysis_sae.py"}
HELPERS = {"harness", "tl_worker"}  # imported or spawned by the scripts, not benchmarks themselves


def test_every_benchmark_script_is_accounted_for():
    scripts = {path.stem for path in BENCHMARKS.glob("*.py")} - HELPERS
    listed = set(SMOKED) | set(OWN_TEST)
    assert scripts == listed, f"not listed: {sorted(scripts - listed)}; listed but gone: {sorted(listed - scripts)}"
    assert not set(SMOKED) & set(OWN_TEST), "a script's smoke runs in one place"
    for script in SMOKED.keys() | OWN_TEST.keys():
        assert "--smoke" in (BENCHMARKS / f"{script}.py").read_text(), script
    tests = Path(__file__).resolve().parent
    for script, test_file in OWN_TEST.items():
        assert 'main(["--smoke"' in (tests / test_file).read_text(), (script, test_file)


@pytest.mark.parametrize("script", [pytest.param(script, marks=MARKS[script]) for script in sorted(SMOKED)])
def test_benchmark_smoke_run(script, tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setenv("MINIBERT_BENCH_CACHE", str(tmp_path / "cache"))  # scale_out writes its corpus file there
    results = (BENCHMARKS / "RESULTS.md").read_text()
    module = importlib.import_module(script)
    try:
        assert module.main(["--smoke"]) == 0
    finally:
        sys.modules.pop(script, None)
    report = capsys.readouterr().out
    assert SMOKED[script] in report and "smoke run" in report, report[-2000:]
    assert "| ---" in report  # a Markdown table was printed
    assert (BENCHMARKS / "RESULTS.md").read_text() == results, "a smoke run wrote RESULTS.md"
