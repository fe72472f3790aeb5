"""minibert benchmarks, one command: `./dev.sh bench` (or `python benchmarks/run.py [--quick] [--only …]`).

Prints a Markdown report and writes it into benchmarks/RESULTS.md (replacing the earlier run of the
same mode on the same CPU, keeping every other section). Sections:
  core      bundled-checkpoint load time, first-call compile, 8×128 forward
  dense     minibert vs transformers (eager + attentions, sdpa) and TransformerLens, nothing / patterns /
            everything captured, with model FLOP/s over the measured matmul peak
  hooks     cost of the hook machinery when no hook is active
  survey    corpus.survey vs the seeds' pipeline (transformers + NumPy), 1000 segments
  compile   programs compiled over mixed-length workloads
  memory    peak memory capturing everything, offload=True vs not
  gpu       bert-base bf16 MFU (only where a GPU is present)

`--smoke` (CI) runs the driver with the cheap sections (core, hooks; others with --only) at their smoke sizes
and leaves RESULTS.md alone; each section's own smoke is `python benchmarks/{dense,memory,survey}.py --smoke`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import harness  # noqa: E402

SECTIONS = ("core", "dense", "hooks", "survey", "compile", "memory", "gpu")
TITLES = {
    "core": "Core numbers (issue 2)",
    "dense": "Dense forward (issue 6)",
    "hooks": "Hook machinery with nothing active (issue 3)",
    "survey": "Corpus survey: Clark et al. statistics end to end",
    "compile": "Compilation over mixed lengths",
    "memory": "Peak memory, everything captured",
    "gpu": "GPU",
}
RESULTS = HERE / "RESULTS.md"


def run_section(name: str, settings: harness.Settings, corpus_texts) -> tuple[str, dict]:
    import dense
    import memory
    import survey

    if name == "core":
        return dense.core(settings)
    if name == "dense":
        return dense.dense(settings)
    if name == "hooks":
        return dense.hook_overhead(settings)
    if name == "survey":
        return survey.survey(settings, *corpus_texts)
    if name == "compile":
        return survey.compile_counts(settings, *corpus_texts)
    if name == "memory":
        return memory.memory(settings)
    return dense.gpu(settings)


def header(info: dict, settings: harness.Settings, load_before: str) -> str:
    lines = [f"- {key}: {value}" for key, value in info.items()]
    mode = "--smoke" if settings.smoke else "--quick" if settings.quick else "full"
    lines.append(f"- mode: {mode} ({settings.repeats} timed runs per case, "
                 f"median, after {settings.warmup} warm-up; cases interleaved round-robin)")
    lines.append(f"- load average (1, 5, 15 min) at start: {load_before}; at end: {harness.load_average()}")
    return "\n".join(lines)


def update_results(key: str, block: str) -> None:
    """Replace the run block tagged `key` in RESULTS.md, or append it."""
    begin, end = f"<!-- run: {key} -->", f"<!-- end run: {key} -->"
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    new = f"{begin}\n{block.strip()}\n{end}"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: new, text) if pattern.search(text) else text.rstrip() + "\n\n" + new + "\n"
    RESULTS.write_text(text)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="few repeats, small corpus, no 32×512 rows")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    parser.add_argument("--segments", type=int, help="corpus size for survey/compile (default 1000, quick 128)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--json", type=Path, help="also write the raw numbers here")
    parser.add_argument("--smoke", action="store_true",
                        help="sections core and hooks (or --only) at smoke size, one run per case; nothing written")
    args = parser.parse_args(argv)
    if args.smoke:
        args.only, args.no_write = args.only or ["core", "hooks"], True

    settings = harness.Settings.make(args.quick, args.smoke)
    load_before = harness.load_average()
    info = harness.machine()
    segments = args.segments or (8 if args.smoke else 128 if args.quick else 1000)
    corpus_texts = harness.english_like_texts(segments)
    parts, raw = [], {"machine": info}
    for name in args.only or SECTIONS:
        start = time.perf_counter()
        print(f"[bench] {name} …", file=sys.stderr, flush=True)
        text, numbers = run_section(name, settings, corpus_texts)
        took = time.perf_counter() - start
        print(f"[bench] {name} done in {took:.0f} s", file=sys.stderr, flush=True)
        parts.append(f"### {TITLES[name]}\n\n{text}")
        raw[name] = numbers
    mode = "smoke" if args.smoke else "quick" if settings.quick else "full"
    block = (f"## {mode} run, {info['cpu']} ({info['cores']} cores), {info['date']}\n\n"
             + header(info, settings, load_before) + "\n\n" + "\n\n".join(parts) + "\n")
    print(block)
    if not args.no_write and not args.only:
        update_results(f"{mode} {info['cpu']} {info['jax devices']}", block)
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1, default=float))
    return 0


if __name__ == "__main__":
    main()
