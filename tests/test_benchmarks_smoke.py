"""Every benchmark script's --smoke run: tiny inputs and one timed call per case, with the script checking its own
outputs (finite, positive timings; shapes; counts), so a refactor that breaks a benchmark (a renamed helper, a
changed contract) fails here rather than in the next timing session.

Scripts whose smoke run has a test of its own (checking their tables) are listed in OWN_TEST and not run twice;
a test keeps SMOKED and OWN_TEST true to benchmarks/.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import jax
import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SMOKED = {  # script → a line its report must hold
    "circuits": "## Circuits",
    "compile_depth": "## Compile time against depth",
    "diffing": "| crosscoder, batchtopk |",
    "sweeps": "## Sweeps",
    "mixing": "## Context mixing",
    "training": "## Training",
    "dense": "## hook_overhead",
    "graphs": "## Attribution graphs",
    "memory": "| offload=True |",
    "one_core": "| minibert, patterns |",
    "peers": ("| workload | minibert runs at T |", "| minibert, empty cache |"),
    "op_profile": "| dense matmuls (q/k/v/o, FFN, pooler) |",
    "precision": "| bfloat16 |",
    "run": "### Hook machinery with nothing active",
    "scale_out": "| workers (1 core each) |",
    "session": "| notebook session, cold (fresh process, empty cache) |",
    "survey": "| workload | programs traced (model.programs.traces) |",
    "views": "| neuron | 128 |",
    "walks": "| `run_with_cache(batch, every pattern)` | 6 | 2 | 0 |",
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
    cache = jax.config.jax_enable_compilation_cache
    module = importlib.import_module(script)
    try:
        assert module.main(["--smoke"]) == 0
    finally:
        sys.modules.pop(script, None)
    assert jax.config.jax_enable_compilation_cache == cache, "the smoke run left JAX's compilation cache switched"
    report = capsys.readouterr().out
    marks = SMOKED[script] if isinstance(SMOKED[script], tuple) else (SMOKED[script],)
    assert all(mark in report for mark in marks) and "smoke run" in report, report[-2000:]
    assert "| ---" in report  # a Markdown table was printed
    assert (BENCHMARKS / "RESULTS.md").read_text() == results, "a smoke run wrote RESULTS.md"


# ---- benchmarks stand on the public API, as the analyses do ------------------------------------------------------

# The one reach below it, by name: dense.py's hook-overhead baseline runs the public Flax module (model.module) with
# no hook machinery at all, through Flax's own split and merge — the thing that benchmark measures against.
BELOW_THE_API = {"dense": {"nnx.merge"}}


def private_uses(source: str) -> list[str]:
    """What a script reads that is not minibert's public API: underscored names or modules of minibert, private
    attributes of anything (a Model's `_stage`, a module's `_Keyed`), jax._src, or the Model's module graph."""
    from test_layers import boundary_violations

    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", "?")
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "minibert":
            found += [f"line {line}: from {node.module} import {a.name}" for a in node.names if a.name.startswith("_")]
            found += [f"line {line}: module {node.module}" for part in node.module.split(".") if part.startswith("_")]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.endswith("__"):
            found.append(f"line {line}: {ast.unparse(node)[:60]}")
    # and the library's boundary check (graphdef, nnx.merge, jax._src, traces) but its parameter-path rule, which is
    # for minibert's own trees (a script's dicts are its own), and the private attributes reported above
    return found + [f for f in boundary_violations(source) if "parameter path" not in f and ": ._" not in f]


@pytest.mark.parametrize("script", sorted(path.stem for path in BENCHMARKS.glob("*.py")))
def test_benchmarks_use_only_the_public_api(script):
    allowed = BELOW_THE_API.get(script, set())
    found = [f for f in private_uses((BENCHMARKS / f"{script}.py").read_text(encoding="utf-8"))
             if not any(f.endswith(a) for a in allowed)]
    assert not found, f"benchmarks/{script}.py reaches below minibert's public API: {found}"


def test_public_api_check_sees_private_reaches():
    source = ("from minibert.analysis.mixing import _suffix_target\nfrom minibert.viz._html import page\n"
              "x = interventions._Keyed(f)\ny = model._stage_jit\nz = nnx.merge(model.graphdef, s)\n"
              "state['params'] = 1\nw = model.__class__\n")
    assert sorted(private_uses(source)) == [  # not the script's own dict, not a dunder
        "line 1: from minibert.analysis.mixing import _suffix_target", "line 2: module minibert.viz._html",
        "line 3: interventions._Keyed", "line 4: model._stage_jit", "line 5: .graphdef", "line 5: nnx.merge"]
