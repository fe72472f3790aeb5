"""benchmarks/buckets.py --smoke: the length-bucket benchmark runs (tiny random model) and writes both tables."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.slow
def test_buckets_benchmark_smoke_writes_its_tables(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import buckets

    out = tmp_path / "buckets.md"
    assert buckets.main(["--smoke", "--out", str(out)]) == 0
    text = out.read_text()
    for rule in buckets.RULES:
        assert text.count(f"| {rule} |") == 3, rule  # its column of the timing table, its summary and compile rows
    assert text.count("| exact lengths |") == 1
    assert text.count("| patterns captured |") == text.count("| nothing captured |") == 2
    sys.modules.pop("buckets", None)
