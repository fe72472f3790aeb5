"""Compile time against depth: a forward's trace, lowering and XLA compile at 6, 12 and 24 layers of MiniLM's width,
with the blocks scanned (encoder.Encoder.stack, the default) and unrolled (Model(..., scan=False)), and what the scan
costs a compiled call.

    python benchmarks/compile_depth.py [--smoke] [--layers 6 12 24] [--repeats 3] [--out FILE]

Each measurement builds a fresh random Model (BertModel at all-MiniLM-L6-v2's width: D 384, 12 heads, F 1536) and
times, for `jax.jit(model.forward_fn(names))` on one batch of 8 rows of 32 tokens: the Python trace (jit's
.trace), the lowering to StableHLO (.lower) and XLA's compile (.compile), in CPU seconds of the process (on a
shared machine wall time measures the other processes too), JAX's persistent compilation cache off (every
compile is real). Three programs: the plain forward; one capturing every attention pattern as Model.run compiles
it (one [L, ...] buffer per site, split outside the program: forward_fn(stacked=True)); and the same capture with
each layer's value sliced out inside the program (forward_fn's default; Model.run's program before). Unrolled, the
last two are one program (no scan, no buffer). Medians of --repeats fresh models. The last tables time a compiled
plain forward, and the gradient of a loss with respect to every weight (what a training step computes), scanned and
unrolled, in interleaved rounds (CPU seconds): the scan reads each layer's weights through a switch on the traced
layer (no stacked copy), whose backward pass adds every layer's weight cotangent in each step.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import minibert  # noqa: E402

MINILM = dict(vocab_size=30522, hidden_size=384, num_attention_heads=12, intermediate_size=1536,
              max_position_embeddings=512)
# (random_ids draws ids from 1996 up: WordPiece's first words)
SMOKE = dict(vocab_size=2100, hidden_size=32, num_attention_heads=4, intermediate_size=37, max_position_embeddings=64)
PATTERNS = "blocks.*.attn.hook_pattern"
PROGRAMS = {"plain": ((), False), "every pattern (Model.run: stacked)": (PATTERNS, True),
            "every pattern, sliced in the program": (PATTERNS, False)}  # name → (names, stacked)


def model_of(width: dict, layers: int, scan: bool) -> minibert.Model:
    return minibert.Model(minibert.BertConfig(num_hidden_layers=layers, **width), seed=0, scan=scan)


def compile_seconds(model: minibert.Model, inputs, names, stacked: bool = False) -> dict[str, float]:
    """CPU seconds of this process (time.process_time: the work, whatever the machine's load) to trace, lower and
    compile jax.jit(model.forward_fn(names, stacked=stacked)) for `inputs`."""
    fn = jax.jit(model.forward_fn(names, stacked=stacked))
    start = time.process_time()
    traced = fn.trace(model.state, inputs)
    traced_at = time.process_time()
    lowered = traced.lower()
    lowered_at = time.process_time()
    lowered.compile()
    done = time.process_time()
    return {"trace": traced_at - start, "lower": lowered_at - traced_at, "compile": done - lowered_at}


def measure(width: dict, layers: tuple[int, ...], repeats: int, rows: int, tokens: int) -> dict:
    """{(program, layers, scan): median seconds per phase} over `repeats` fresh models."""
    ids = harness.random_ids(rows, tokens, vocab=width["vocab_size"])
    warm = model_of(width, 1, True)  # the process's first compile pays one-time costs: not in the table
    compile_seconds(warm, warm.inputs(ids), ())
    results, measured = {}, {}
    for program, (names, stacked) in PROGRAMS.items():
        for depth in layers:
            for scan in (True, False):
                key = (names, stacked and scan, depth, scan)  # unrolled, stacked or not is the same program
                if key not in measured:
                    samples = []
                    for _ in range(repeats):
                        model = model_of(width, depth, scan)
                        samples.append(compile_seconds(model, model.inputs(ids), names, stacked and scan))
                    measured[key] = {phase: statistics.median(s[phase] for s in samples) for phase in samples[0]}
                results[program, depth, scan] = measured[key]
    return results


def cpu_call_seconds(cases: dict, settings: harness.Settings) -> dict[str, float]:
    """Median CPU seconds (time.process_time) per call of each case, in interleaved rounds after warm-up."""
    for fn in cases.values():
        for _ in range(max(settings.warmup, 1)):  # the first call compiles
            harness.block(fn())
    samples = {name: [] for name in cases}
    for _ in range(settings.repeats):
        for name, fn in cases.items():
            start = time.process_time()
            harness.block(fn())
            samples[name].append(time.process_time() - start)
    return {name: statistics.median(times) for name, times in samples.items()}


def call_times(width: dict, depth: int, settings: harness.Settings, rows: int, tokens: int) -> dict[str, float]:
    """{(what, stack): median CPU seconds} of a compiled plain forward and of the gradient of a loss with respect
    to every weight, scanned and unrolled."""
    ids = harness.random_ids(rows, tokens, vocab=width["vocab_size"])
    cases = {}
    for scan in (True, False):
        model = model_of(width, depth, scan)
        inputs, forward = model.inputs(ids), model.forward_fn()
        loss = jax.jit(jax.grad(lambda state: (forward(state, inputs)[0].last_hidden_state ** 2).mean()))
        stack = "scanned" if scan else "unrolled"
        cases["forward", stack] = functools.partial(jax.jit(forward), model.state, inputs)
        cases["weight gradient", stack] = functools.partial(loss, model.state)
    return cpu_call_seconds(cases, settings)


def tables(results: dict, layers: tuple[int, ...], calls: dict[str, float], depth: int) -> str:
    header = ["program", "layers", "scanned: trace + lower (CPU s)", "scanned: XLA compile", "scanned total",
              f"÷ {layers[0]} layers", "unrolled total", f"÷ {layers[0]} layers", "scanned ÷ unrolled"]
    body = []
    for program in PROGRAMS:
        base = {scan: sum(results[program, layers[0], scan].values()) for scan in (True, False)}
        for depth_here in layers:
            scanned, unrolled = results[program, depth_here, True], results[program, depth_here, False]
            total, total_unrolled = sum(scanned.values()), sum(unrolled.values())
            body.append([program, str(depth_here), harness.fmt(scanned["trace"] + scanned["lower"]),
                         harness.fmt(scanned["compile"]), harness.fmt(total), f"{total / base[True]:.2f}x",
                         harness.fmt(total_unrolled), f"{total_unrolled / base[False]:.2f}x",
                         f"{total / total_unrolled:.2f}x"])
    call_table = harness.markdown_table(
        ["compiled call", "stack", "layers", "CPU ms per call", "÷ unrolled"],
        [[what, stack, str(depth), harness.fmt(1000 * t), f"{t / calls[what, 'unrolled']:.2f}x"]
         for (what, stack), t in calls.items()])
    return harness.markdown_table(header, body) + "\n\n" + call_table + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny width, 1 and 2 layers, one repeat (CI)")
    parser.add_argument("--layers", type=int, nargs="+", default=[6, 12, 24])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, help="append the Markdown here (default: print it)")
    args = parser.parse_args(argv)
    width, layers, repeats = (SMOKE, (1, 2), 1) if args.smoke else (MINILM, tuple(args.layers), args.repeats)
    settings = harness.Settings.make(quick=False, smoke=args.smoke)
    cached = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)  # every compile is XLA's own work
    try:
        results = measure(width, layers, repeats, args.rows, args.tokens)
        calls = call_times(width, layers[-1], settings, args.rows, args.tokens)
    finally:  # a process that called main (the smoke test's) keeps its cache
        jax.config.update("jax_enable_compilation_cache", cached)
    if args.smoke:
        harness.check_times({str(key): sum(value.values()) for key, value in results.items()}
                            | {str(key): t for key, t in calls.items()})
    header = [f"## Compile time against depth ({'smoke run' if args.smoke else 'MiniLM width'}), {args.rows} rows × "
              f"{args.tokens} tokens", "",
              f"- date: {time.strftime('%Y-%m-%d %H:%M')}; cpu: {harness.cpu_model()}; jax {jax.__version__}; "
              f"load average at the end: {harness.load_average()}",
              f"- command: python benchmarks/compile_depth.py {' '.join(argv if argv is not None else sys.argv[1:])}",
              "", ""]
    text = "\n".join(header) + tables(results, layers, calls, layers[-1])
    harness.report(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
