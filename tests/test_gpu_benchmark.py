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


@pytest.mark.slow
def test_gpu_quick_smoke_prints_every_row(tmp_path, monkeypatch, capsys):
    """--quick --smoke: every case of the ≤ 4-minute GPU run at tiny sizes on this CPU, with the attention kernel
    this platform takes (unwatched: attention.choose's CPU branch), no cuDNN call in a CPU program, and the
    profile's top ops, each a compiled-HLO instruction with its shape."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setenv("MINIBERT_BENCH_CACHE", str(tmp_path / "cache"))
    import gpu

    out = tmp_path / "quick.md"
    assert gpu.main(["--quick", "--smoke", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| attention kernel |" in text and "unwatched: CPU" in text
    for case in ("minibert bf16, nothing captured (fused)", "minibert bf16, every pattern captured",
                 "transformers sdpa bf16", "minibert bf16 step, dropout 0.0", "minibert bf16 step, dropout 0.1",
                 "PyTorch fp32 (no GPU) step, dropout 0.0", "PyTorch fp32 (no GPU) step, dropout 0.1"):
        assert text.count(f"| {case} | 2x16 |") == 1, case
    assert "| True |" not in text  # no program here calls cuDNN
    profile = text.split("### profile (minibert bf16 step, dropout 0)")[1]
    assert 1 <= profile.count("\n| ") - 2 <= 10  # the header and its rule, then up to 10 ops
    assert "skipped" not in text
    assert "minibert bf16 step, dropout 0.0" in capsys.readouterr().err  # printed as measured
    sys.modules.pop("gpu", None)
