"""The walk of one call (issue 42): how many times its arrays cross from the host to the device, counted by JAX's own
transfer guard (jax.transfer_guard("log_explicit") logs every host-to-device transfer, explicit ones included);
and how many times a hook function is keyed (contract.behaviour_key, counted by wrapping it) and its body runs (a
counter in the hook: each run is a trace) in a cold call and a warm repeat. JAX's guard logs each array a
jax.device_put is given, whether or not it copies it: the calls are counted too (by wrapping jax.device_put), and
the arrays it copied (its device array's buffer is not the NumPy array's: on a CPU device_put adopts a contiguous
buffer aligned for XLA, and copies any other).

    python benchmarks/walks.py [--smoke]

A tiny random BERT (2 layers, D = 8, 64 positions), a batch of 2 rows of 4 and 3 tokens; each call runs twice
first, so the count is of a warm call (no compile, no padding probe). Device-to-host moves are not counted: on a
CPU minibert reads device arrays as NumPy views (runtime.device.host_view), which copy nothing and which JAX does
not log. Printed as Markdown tables; benchmarks/RESULTS.md keeps them, with the machine. The model is tiny
already: --smoke (CI's check that the script runs) runs the same calls.
"""

from __future__ import annotations

import argparse
import contextlib
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


def device_puts(call) -> tuple[int, int]:
    """(jax.device_put calls, NumPy arrays they copied) during `call()`: an array is copied where its device array's
    buffer is not the NumPy array's own (on a CPU, device_put adopts a contiguous buffer aligned for XLA)."""
    import jax

    put, counts = jax.device_put, [0, 0]

    def counted(x, *args, **kwargs):
        moved = put(x, *args, **kwargs)
        counts[0] += 1
        for host, device in zip(jax.tree.leaves(x), jax.tree.leaves(moved)):
            counts[1] += isinstance(host, np.ndarray) and host.size > 0 and (
                device.unsafe_buffer_pointer() != host.ctypes.data)
        return moved

    jax.device_put = counted
    try:
        call()
    finally:
        jax.device_put = put
    return counts[0], counts[1]


class CountedHook:
    """A hook z ↦ z · factor that counts the runs of its body, and the static keys computed of it while `counting`."""

    def __init__(self):
        self.runs = self.keys = 0

    def hook(self, z, ctx, factor=0.5):
        self.runs += 1
        return z * factor

    @contextlib.contextmanager
    def counting(self):
        from minibert.core import contract

        key = contract.behaviour_key

        def counted(fn):
            self.keys += fn == self.hook  # a bound method: equal each time, not the same object
            return key(fn)

        contract.behaviour_key = counted
        try:
            yield
        finally:
            contract.behaviour_key = key


def hook_walk(model, hook: CountedHook, call) -> tuple[int, int, int]:
    """(keys of the hook, runs of its body, programs traced) during call()."""
    hook.runs = hook.keys = 0
    before = model.programs.traces
    with hook.counting():
        call()
    return hook.keys, hook.runs, model.programs.traces - before


def hook_rows() -> list[str]:
    """A plain hook and a HookFn at blocks.1.attn.hook_z, each on a fresh model: a cold call padded to its bucket
    (the padding probe traces the hook at two lengths), its warm repeat, and a cold call at a bucket's own length
    (no probe: padding would change nothing)."""
    import jax.numpy as jnp

    import minibert
    from minibert.core.config import Config

    exact = {"input_ids": np.full((3, 64), 5)}  # 64: a bucket's length (the model's positions)
    forms = {"plain function": lambda hook: hook.hook,
             "HookFn": lambda hook: minibert.HookFn(hook.hook, factor=jnp.float32(0.5))}
    rows = []
    for form, wrap in forms.items():
        model, hook, site = minibert.Model(Config(**TINY), seed=1), CountedHook(), "blocks.1.attn.hook_z"
        calls = {"cold, padded": lambda: model.run_with_hooks(BATCH, {site: wrap(hook)}),
                 "warm repeat": lambda: model.run_with_hooks(BATCH, {site: wrap(hook)}),
                 "cold, at a bucket's length": lambda: model.run_with_hooks(exact, {site: wrap(hook)})}
        for name, call in calls.items():
            keys, runs, traces = hook_walk(model, hook, call)
            rows.append(f"| {form} | {name} | {keys} | {runs} | {traces} |")
    return rows


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
        puts, copied = device_puts(call)
        rows.append(f"| `{name}` | {len(shapes)} | {puts} | {copied} | {', '.join(shapes)} |")
    m = harness.machine()
    print(f"## The walk of one call{' (smoke run)' if args.smoke else ''}\n\nmachine: {m}\n\n"
          "| call | host→device transfers (arrays) | jax.device_put calls | arrays JAX copied | "
          "their shapes, in order |\n| --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    print("\n| `run_with_hooks(batch, hook)` | call | keys of the hook | runs of its body | programs traced |\n"
          "| --- | --- | --- | --- | --- |")
    print("\n".join(hook_rows()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
