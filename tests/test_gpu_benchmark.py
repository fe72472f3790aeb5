"""benchmarks/gpu.py --smoke: the GPU benchmark's code paths run on any machine, so a GPU session finds it working."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.slow
def test_gpu_benchmark_smoke_writes_its_tables(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setenv("MINIBERT_BENCH_CACHE", str(tmp_path / "cache"))
    import gpu

    out = tmp_path / "gpu.md"
    assert gpu.main(["--smoke", "--out", str(out)]) == 0
    text = out.read_text()
    for implementation in ("minibert, nothing captured", "minibert, patterns captured",
                           "minibert, everything captured (offload)", "transformers sdpa", "transformers eager"):
        assert text.count(f"| {implementation} |") == 2, implementation  # fp32 and bf16
    assert "fused attention lowered to cuDNN: no" in text  # a CPU program has no cuDNN call
    assert "corpus.survey, 4 segments" in text
    assert "| training step, minibert | 2×16 |" in text and "| training step, transformers + torch AdamW |" in text
    assert "| SAE training, minibert (activations + compiled step) |" in text
    assert "| SAE training, transformers hook + torch SAE step |" in text
    assert "| probes, all layers, one program (vmap) |" in text and "| probes, scikit-learn, per layer |" in text
    sys.modules.pop("gpu", None)
