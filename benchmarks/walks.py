"""The walk of one call (issue 42): how many times its arrays cross from the host to the device, counted by JAX's own
transfer guard (jax.transfer_guard("log_explicit") logs every host-to-device transfer, explicit ones included).

    python benchmarks/walks.py [--smoke]

A tiny random BERT (2 layers, D = 8, 64 positions), a batch of 2 rows of 4 and 3 tokens; each call runs twice
first, so the count is of a warm call (no compile, no padding probe). Device-to-host moves are not counted: on a
CPU minibert reads device arrays as NumPy views (runtime.device.host_view), which copy nothing and which JAX does
not log. Printed as a Markdown table; benchmarks/RESULTS.md keeps it, with the machine. The model is tiny
already: --smoke (CI's check that the script runs) runs the same calls.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

TINY = dict(vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=12,
            max_position_embeddings=64)
BATCH = {"input_ids": np.array([[2, 7, 9, 3], [2, 8, 3, 0]]), "attention_mask": np.array([[1, 1, 1, 1],
                                                                                          [1, 1, 1, 0]])}
TRANSFER = re.compile(r"host-to-device transfer: aval=ShapedArray\(([^)]*)\)")


def transfers(call) -> list[str]:
    """The shapes of the host-to-device transfers `call()` makes, in order (JAX logs them to file descriptor 2)."""
    import jax

    read, write = os.pipe()
    saved = os.dup(2)
    os.dup2(write, 2)
    try:
        with jax.transfer_guard("log_explicit"):
            call()
    finally:
        os.dup2(saved, 2)
        os.close(write)
        os.close(saved)
    with os.fdopen(read) as logged:
        return TRANSFER.findall(logged.read())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CI's check that the script runs (the same calls)")
    args = parser.parse_args(argv)
    import minibert
    from minibert.core.config import Config

    model = minibert.Model(Config(**TINY), seed=1)
    calls = {
        "model(batch)": lambda: model(BATCH),
        "run_with_cache(batch, every pattern)": lambda: model.run_with_cache(BATCH, names="blocks.*.attn.hook_pattern"),
        "run_with_hooks(batch, one HookFn)": lambda: model.run_with_hooks(
            BATCH, {"blocks.1.attn.hook_z": minibert.HookFn(lambda z, ctx: z * 0.5)}),
    }
    rows = []
    for name, call in calls.items():
        call(), call()
        shapes = transfers(call)
        rows.append(f"| `{name}` | {len(shapes)} | {', '.join(shapes)} |")
    m = harness.machine()
    print(f"## The walk of one call{' (smoke run)' if args.smoke else ''}\n\nmachine: {m}\n\n"
          "| call | host→device transfers | their shapes, in order |\n| --- | --- | --- |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
