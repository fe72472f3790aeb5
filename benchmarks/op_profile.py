"""Where a forward's time goes, op by op: minibert from jax.profiler (XLA CPU thunks), transformers from
torch.profiler, grouped into the same categories so the two can be read side by side.

    python benchmarks/op_profile.py                              # bundled MiniLM, 8×128, nothing captured
    python benchmarks/op_profile.py --model bert-base --names "blocks.*.attn.hook_pattern" --ops 25
    python benchmarks/op_profile.py --torch sdpa                 # the same for transformers
    python benchmarks/op_profile.py --smoke       # MiniLM 1×16, minibert and transformers eager, one run (CI)

XLA's CPU runtime may run independent ops at once (q, k and v projections), so op times can add up to a
little more than the wall time; shares are of the summed op time.
"""

from __future__ import annotations

import argparse
import collections
import glob
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import harness  # noqa: E402
import numpy as np  # noqa: E402

SKIP = ("ThreadpoolListener", "ThunkExecutor", "end: ", "PjitFunction", "$", "SlinkyThreadPool")
CATEGORIES = ("dense matmuls (q/k/v/o, FFN, pooler)", "attention matmuls + softmax", "GELU",
              "layout copies (transposes)", "layernorm, bias, residual, embeddings, rest")


def xla_op_times(fn, args, runs: int = 3) -> tuple[dict[str, float], float]:
    """({thunk name: seconds per run}, wall seconds per run) of the jitted `fn(*args)`."""
    import jax
    from jax.profiler import ProfileData

    jax.block_until_ready(fn(*args))
    directory = tempfile.mkdtemp()
    start = time.perf_counter()
    with jax.profiler.trace(directory):
        for _ in range(runs):
            jax.block_until_ready(fn(*args))
    wall = (time.perf_counter() - start) / runs
    data = ProfileData.from_file(glob.glob(f"{directory}/**/*.xplane.pb", recursive=True)[0])
    totals: dict[str, float] = collections.defaultdict(float)
    for plane in data.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            if line.name == "python":
                continue
            for event in line.events:
                if not event.name.startswith(SKIP):
                    totals[event.name] += event.duration_ns / 1e9 / runs
    return dict(totals), wall


def hlo_ops(hlo: str) -> dict[str, tuple[str, str]]:
    """{top-level instruction: (output shape, the opcodes it computes)} from compiled HLO text."""
    bodies, current = {}, None
    for line in hlo.splitlines():
        header = re.match(r"%?([\w.\-]+) .*\{$", line.strip())
        if header and " = " not in line:
            current, bodies[current] = header.group(1), []
            continue
        match = re.search(r" = \S+ (\w[\w-]*)\(", line)
        if current and match and match.group(1) not in ("parameter", "constant", "bitcast", "broadcast", "tuple",
                                                          "get-tuple-element"):
            bodies[current].append(match.group(1))
    ops = {}
    for line in hlo.splitlines():
        match = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (\S+) (\w[\w-]*)\(.*?\)(.*)", line)
        if match:
            name, shape, opcode, rest = match.groups()
            calls = re.search(r"calls=%?([\w.\-]+)", rest)
            ops[name] = (shape, ",".join(dict.fromkeys(bodies.get(calls.group(1), []))) if calls else opcode)
    return ops


def xla_category(shape: str, fuses: str, ffn: int) -> str:
    rank = shape.count(",") + 1 if "[" in shape else 0
    if "dot" in fuses:
        return CATEGORIES[0] if rank <= 3 and "softmax" not in fuses and "exponential" not in fuses else CATEGORIES[1]
    if any(op in fuses for op in ("erf", "tanh", "exponential")) and f"{ffn}]" in shape:
        return CATEGORIES[2]
    if rank >= 4 and ("exponential" in fuses or "select" in fuses or "reduce" in fuses):
        return CATEGORIES[1]
    if "transpose" in fuses or fuses == "copy":
        return CATEGORIES[3]
    return CATEGORIES[4]


def torch_category(name: str) -> str:
    if name in ("aten::addmm", "aten::mm"):
        return CATEGORIES[0]
    if any(k in name for k in ("scaled_dot_product", "bmm", "softmax", "baddbmm", "aten::matmul")):
        return CATEGORIES[1]
    if "gelu" in name:
        return CATEGORIES[2]
    if name in ("aten::copy_", "aten::contiguous", "aten::clone"):
        return CATEGORIES[3]
    return CATEGORIES[4]


def profile_minibert(model, batch, names=(), runs: int = 3) -> tuple[dict[str, float], float, list]:
    """({category: s per forward}, wall s per forward, [(op, s, shape, fuses)] by time)."""
    import jax

    inputs = model.inputs(batch)
    fn = jax.jit(model.forward_fn(names))
    ops = hlo_ops(fn.lower(model.state, inputs).compile().as_text())
    times, wall = xla_op_times(fn, (model.state, inputs), runs)
    by_category: dict[str, float] = collections.defaultdict(float)
    detail = []
    for name, t in times.items():
        shape, fuses = ops.get(name, ("", name))
        by_category[xla_category(shape, fuses, model.config.intermediate_size)] += t
        detail.append((name, t, shape, fuses))
    return dict(by_category), wall, sorted(detail, key=lambda row: -row[1])


def profile_transformers(model, batch, output_attentions: bool, runs: int = 3) -> tuple[dict[str, float], float, list]:
    """The same for a transformers model on a dict of NumPy id arrays (self CPU time per aten op)."""
    import torch

    tensors = {k: torch.tensor(np.asarray(v, np.int64)) for k, v in batch.items()}
    with torch.inference_mode():
        model(**tensors, output_attentions=output_attentions)
        start = time.perf_counter()
        with torch.profiler.profile() as prof:
            for _ in range(runs):
                model(**tensors, output_attentions=output_attentions)
        wall = (time.perf_counter() - start) / runs
    by_category: dict[str, float] = collections.defaultdict(float)
    detail = []
    for event in prof.key_averages():
        t = event.self_cpu_time_total / 1e6 / runs
        by_category[torch_category(event.key)] += t
        detail.append((event.key, t, "", f"{event.count // runs} calls"))
    return dict(by_category), wall, sorted(detail, key=lambda row: -row[1])


def category_table(columns: dict[str, tuple[dict[str, float], float]]) -> str:
    """Markdown: one row per category, for each profiled implementation ms per forward and share."""
    header = ["category"] + [f"{name}: ms (share)" for name in columns]
    rows = []
    for category in CATEGORIES:
        row = [category]
        for by_category, _ in columns.values():
            total = sum(by_category.values())
            t = by_category.get(category, 0.0)
            row.append(f"{t * 1e3:.0f} ({t / total:.0%})")
        rows.append(row)
    rows.append(["**sum of op times** / wall time per forward"] +
                [f"{sum(c.values()) * 1e3:.0f} / {wall * 1e3:.0f}" for c, wall in columns.values()])
    return harness.markdown_table(header, rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm", choices=("minilm", "bert-base"))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--names", default="", help="hook names to capture (glob); empty: nothing")
    parser.add_argument("--torch", choices=("eager", "sdpa"), help="profile transformers instead of minibert")
    parser.add_argument("--ops", type=int, default=15, help="also list the slowest N ops")
    parser.add_argument("--smoke", action="store_true",
                        help="MiniLM at 1×16, one profiled run of minibert and of transformers eager, checked (CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        return smoke()

    directory = (harness.bundled_dir() if args.model == "minilm"
                 else harness.make_bert_base(harness.scratch_dir() / "bert-base-random"))
    batch = harness.random_ids(args.batch, args.length)
    if args.torch:
        import torch

        torch.set_num_threads(__import__("os").cpu_count())
        label = f"transformers {args.torch}" + (" + attentions" if args.torch == "eager" else "")
        by_category, wall, detail = profile_transformers(harness.hf_model(directory, args.torch), batch,
                                                         args.torch == "eager")
    else:
        import minibert

        label = f"minibert, captured: {args.names or 'nothing'}"
        by_category, wall, detail = profile_minibert(minibert.load(directory), batch, args.names or ())
    print(f"{args.model} {args.batch}×{args.length}\n")
    print(category_table({label: (by_category, wall)}))
    print()
    print(harness.markdown_table(["op", "ms", "output", "computes"],
                                 [[n, f"{t * 1e3:.1f}", s, f] for n, t, s, f in detail[:args.ops]]))
    return 0


def smoke() -> int:
    """Both profilers on MiniLM at 1×16 (one run each): every op time is finite and non-negative, some time
    lands in the dense-matmul category, and the grouped table prints."""
    import minibert

    directory, batch = harness.bundled_dir(), harness.random_ids(1, 16)
    columns = {
        "minibert, patterns": profile_minibert(minibert.load(directory), batch, "blocks.*.attn.hook_pattern", runs=1),
        "transformers eager + attentions": profile_transformers(harness.hf_model(directory, "eager"), batch, True,
                                                                runs=1),
    }
    for name, (by_category, wall, detail) in columns.items():
        assert set(by_category) <= set(CATEGORIES), (name, by_category)
        assert by_category.get(CATEGORIES[0], 0) > 0, (name, "no dense matmul profiled", by_category)
        assert all(np.isfinite(t) and t >= 0 for _, t, _, _ in detail) and np.isfinite(wall) and wall > 0, name
    print("smoke run: all-MiniLM-L6-v2 1×16, one profiled forward each\n")
    print(category_table({name: column[:2] for name, column in columns.items()}))
    return 0


if __name__ == "__main__":
    main()
