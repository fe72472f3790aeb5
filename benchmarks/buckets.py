"""Length buckets: what padding a batch to its bucket costs against the exact-length program, per bucket rule,
and how many programs each rule compiles.

    python benchmarks/buckets.py [--smoke] [--batch 8] [--repeats 5] [--out FILE]

Model.run (model(batch), run_with_cache, run_with_hooks with position-wise hooks) pads rows to a bucket length so
that sentence lengths share compiled programs. For each length T below, the same forward — capturing every
attention pattern, and capturing nothing — runs as one program compiled for T and one compiled for each rule's
bucket of T (model.forward_fn jitted here, on model.inputs padded with model.padded: the public API). The table
gives bucket ÷ exact per rule; the lengths are the worst cases of each rule (one past a bucket) and 147 (issue 19).
A second table counts the programs each rule compiles for a stream of batches of mixed lengths, and the time
compiling them takes.
Times are CPU seconds of this process (time.process_time). The two programs of a ratio run in pairs, --repeats
rounds after one warm-up call each, alternating which goes first; the ratio is the median of the rounds' ratios
and the exact-length time the least of its calls. On a shared machine the load drifts by 10-20% between one
program's calls and the other's (timing each program's calls in a block, as before, gave 1.15-1.19x for a
bucket that pairs put at 1.05x), but hardly within one round. Run it pinned to one core (taskset -c 1) so that
CPU time is the work of one thread.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import minibert  # noqa: E402
from minibert.runtime.accounting import flops_per_token  # noqa: E402
from minibert.runtime.buckets import bucket_length, length_buckets  # noqa: E402

RULES = {  # name → (smallest, per_octave) of buckets.length_buckets
    "buckets.COARSE (model.programs.length_buckets): 16, then 2 per octave": (16, 2),
    "8 per octave": (1, 8),
    "buckets.FINE: 16 per octave": (1, 16),
}
LENGTHS = (17, 33, 65, 129, 147, 257)
CASES = {"patterns captured": "blocks.*.attn.hook_pattern", "nothing captured": ()}


def cpu_seconds(fn) -> float:
    """The CPU time of one call of fn, to its results."""
    start = time.process_time()
    jax.block_until_ready(fn())
    return time.process_time() - start


def paired(exact, bucket, repeats: int) -> tuple[float, float]:
    """(least CPU seconds of `exact`, median of bucket ÷ exact over `repeats` rounds): each function is called
    once first (compiling), then each round times one call of both, the first of the two alternating."""
    jax.block_until_ready(exact())
    jax.block_until_ready(bucket())
    times, ratios = [], []
    for round_ in range(repeats):
        if round_ % 2:
            b, e = cpu_seconds(bucket), cpu_seconds(exact)
        else:
            e, b = cpu_seconds(exact), cpu_seconds(bucket)
        times.append(e)
        ratios.append(b / e)
    return min(times), float(np.median(ratios))


def measure(model, batch_size: int, lengths, repeats: int, rules) -> list[dict]:
    rows = []
    vocab = model.config.vocab_size
    for T in lengths:
        ids = np.random.default_rng(T).integers(1000 if vocab > 2000 else 5, vocab, size=(batch_size, T))
        inputs = model.inputs({"input_ids": ids, "attention_mask": np.ones_like(ids)})
        for case, names in CASES.items():
            forward = jax.jit(model.forward_fn(names))
            exact = lambda: forward(model.state, inputs)  # noqa: E731
            row = {"T": T, "case": case, "exact": None}
            for rule in rules:
                smallest, per_octave = RULES[rule]
                bucket = bucket_length(T, length_buckets(model.config.max_tokens, smallest, per_octave))
                if bucket == T:  # the exact-length program itself
                    row[rule] = (bucket, 1.0)
                    continue
                padded = model.padded(inputs, bucket)
                seconds, ratio = paired(exact, lambda padded=padded: forward(model.state, padded), repeats)
                row["exact"] = seconds if row["exact"] is None else min(row["exact"], seconds)
                row[rule] = (bucket, ratio)
            if row["exact"] is None:  # every rule runs T itself
                row["exact"] = paired(exact, exact, repeats)[0]
            rows.append(row)
    return rows


def work(config, T: int, bucket: int) -> float:
    """The bucket's forward matmul FLOPs over the exact length's (accounting.flops_per_token: linear layers per
    token, attention per token and key): what padding costs with no load or timing noise in it."""
    return bucket * flops_per_token(config, bucket) / (T * flops_per_token(config, T))


def table(rows: list[dict], config, rules) -> str:
    lines = ["Each cell: bucket: measured CPU time ÷ exact (median of paired rounds) (work: matmul FLOPs ÷ exact).", "",
             "| T | case | exact-length program | " + " | ".join(rules) + " |",
             "| --- | --- | --- | " + " | ".join("---" for _ in rules) + " |"]
    for row in rows:
        cells = [f"{row[rule][0]}: {row[rule][1]:.2f}× (work {work(config, row['T'], row[rule][0]):.2f}×)"
                 for rule in rules]
        lines.append(f"| {row['T']} | {row['case']} | {row['exact'] * 1e3:.1f} ms | " + " | ".join(cells) + " |")
    worst = {rule: max(row[rule][1] for row in rows) for rule in rules}
    lines += ["", "| rule | worst bucket ÷ exact above | most work over exact, every length 1…max (at T) | programs "
              "for every length 1…max | most padding (tokens) |", "| --- | --- | --- | --- | --- |"]
    for rule in rules:
        buckets = length_buckets(config.max_tokens, *RULES[rule])
        lengths = range(1, config.max_tokens + 1)
        most, at = max((work(config, T, bucket_length(T, buckets)), T) for T in lengths)
        padding = max(bucket_length(T, buckets) / T for T in lengths)
        lines.append(f"| {rule} | {worst[rule]:.2f}× | {most:.3f}× ({at}) | {len(buckets)} | {padding:.2f}× |")
    return "\n".join(lines)


def compiles(model, n_batches: int, batch_size: int, rules) -> str:
    """What each rule compiles for a stream of mixed lengths: `n_batches` batches of `batch_size` sentence pairs
    (harness.english_like_texts, lengths as they come), run twice through a fresh jit of the forward (nothing
    captured) at the exact lengths and padded to each rule's buckets. Programs: distinct row lengths run;
    compiling: CPU seconds of the first pass minus the second (which compiles nothing)."""
    longest = min(128, model.config.max_tokens)
    texts, pairs = harness.english_like_texts(n_batches * batch_size, seed=1, max_tokens=longest)
    if model.tokenizer is None:  # the smoke run's random model: ids of random lengths instead
        rng = np.random.default_rng(1)
        batches = [model.inputs({"input_ids": rng.integers(5, model.config.vocab_size, (batch_size, n))})
                   for n in rng.integers(8, longest + 1, n_batches)]
    else:
        batches = [model.inputs(model.tokenize(texts[i:i + batch_size], pairs[i:i + batch_size]))
                   for i in range(0, len(texts), batch_size)]
    lengths = sorted({b.shape[1] for b in batches})
    lines = ["", f"{len(batches)} batches of {batch_size} sentence pairs, {len(lengths)} distinct lengths "
             f"{lengths[0]}–{lengths[-1]}, each pass run in turn:", "",
             "| lengths run | programs compiled | first pass (CPU s) | second pass | compiling (difference) |",
             "| --- | --- | --- | --- | --- |"]
    for rule in ("exact lengths", *rules):
        forward_fn = model.forward_fn(())
        forward = jax.jit(lambda state, inputs: forward_fn(state, inputs))  # a new function: nothing compiled yet
        if rule == "exact lengths":
            runs = batches
        else:
            buckets = length_buckets(model.config.max_tokens, *RULES[rule])
            runs = [model.padded(b, bucket_length(b.shape[1], buckets)) for b in batches]
        passes = [sum(cpu_seconds(lambda run=run: forward(model.state, run)) for run in runs) for _ in range(2)]
        lines.append(f"| {rule} | {len({run.shape[1] for run in runs})} | {passes[0]:.1f} | {passes[1]:.1f} | "
                     f"{passes[0] - passes[1]:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny random model and two lengths (CI)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lengths", type=int, nargs="+", default=LENGTHS, help="row lengths to time")
    parser.add_argument("--rules", nargs="+", choices=list(RULES), default=list(RULES), help="bucket rules to time")
    parser.add_argument("--batches", type=int, default=24, help="batches of mixed lengths for the compile table")
    parser.add_argument("--compiles-only", action="store_true", help="only the compile table")
    parser.add_argument("--out", type=Path, help="append the Markdown here (default: print it)")
    args = parser.parse_args(argv)
    if args.smoke:
        model = minibert.Model(minibert.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                                   num_attention_heads=4, intermediate_size=37,
                                                   max_position_embeddings=64), seed=0)
        rows, batch = measure(model, 2, (17, 33), 1, args.rules), 2
        compiled = compiles(model, 3, 2, args.rules)
    else:
        model, batch = minibert.load(), args.batch
        rows = [] if args.compiles_only else measure(model, batch, args.lengths, args.repeats, args.rules)
        compiled = compiles(model, args.batches, batch, args.rules)
    header = [f"## Length buckets, {batch} rows ({'smoke' if args.smoke else model.source})", "",
              f"- date: {time.strftime('%Y-%m-%d %H:%M')}; cpu: {harness.cpu_model()}; cores this process may use: "
              f"{sorted(os.sched_getaffinity(0))}; load average at the end: {harness.load_average()}",
              f"- command: python benchmarks/buckets.py {' '.join(argv if argv is not None else sys.argv[1:])}", "", ""]
    text = "\n".join(header) + (table(rows, model.config, args.rules) if rows else "") + "\n" + compiled + "\n"
    harness.report(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
