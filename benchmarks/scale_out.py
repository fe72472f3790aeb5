"""Corpus survey throughput across processes, side by side in one run: one process, two jax.distributed
processes in lockstep (reduce="global"), two independent processes merged (reduce="local"), and a local
Ray with two actors, on the same corpus file. Then the arithmetic of 10^8 sentences on N workers.

    python benchmarks/scale_out.py [--segments 1000] [--no-write]
    python benchmarks/scale_out.py --smoke      # 8 segments, every configuration once, checked; nothing written (CI)

Every configuration uses both cores of the machine once: one process with XLA's default thread pool,
or two workers of one thread each. Each runs in fresh interpreters; models are loaded and the programs
compiled (a first survey of the same file) before the timed survey, except for Ray, whose survey_ray
call starts its actors, loads the model and compiles in each of them: it is timed as a whole (what a
user waits for; the faster of two calls).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import harness  # noqa: E402

ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"  # one core per worker
SENTENCES = 10**8
BLOCK = 250_000  # lines per Ray block in the arithmetic: minutes of one core, so a lost block is cheap
RESULT_BYTES = 11 * 72 * 8 + 200  # a block's result: 11 statistics × L·H float64 (MiniLM: 6 × 12) + counts


def worker(argument: dict) -> None:
    """One process of a configuration: survey the file twice (the first compiles), print the second's time."""
    from minibert.analysis import corpus
    from minibert.app.distributed import initialize

    if argument["processes"] > 1:
        initialize()
    import minibert

    model = minibert.load()
    path = Path(argument["path"])
    corpus.survey(model, path, progress=False, reduce=argument["reduce"])
    start = time.perf_counter()
    result = corpus.survey(model, path, progress=False, reduce=argument["reduce"])
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "documents": result.documents, "counts": result.counts}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_processes(path: Path, processes: int, reduce: str) -> dict:
    """Start `processes` workers (one thread each when there are several); the slowest one's time."""
    port, running = free_port(), []
    for index in range(processes):
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        if processes > 1:
            env.update(XLA_FLAGS=ONE_THREAD, JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
                       JAX_NUM_PROCESSES=str(processes), JAX_PROCESS_ID=str(index))
        argument = dict(path=str(path), processes=processes, reduce=reduce)
        running.append(subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(argument)], env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = []
    for process in running:
        out, err = process.communicate(timeout=1800)
        if process.returncode:
            raise RuntimeError(err[-3000:])
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    shares = outputs if reduce == "local" else outputs[:1]  # with "global" every process holds the whole result
    return {"seconds": max(o["seconds"] for o in outputs), "documents": sum(o["documents"] for o in shares),
            "tokens": sum(o["counts"]["real_tokens"] for o in shares)}


def run_ray(path: Path) -> dict:
    """survey_ray with two one-CPU actors on a local Ray (started here, outside the timing)."""
    code = f"""
import json, time, ray
from pathlib import Path
from minibert.analysis import corpus_ray
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
times = []
for _ in range(2):
    start = time.perf_counter()
    result = corpus_ray.survey_ray(Path({str(path)!r}), actors=2, block_documents=250)
    times.append(time.perf_counter() - start)
print(json.dumps({{"seconds": times, "documents": result.documents, "tokens": result.counts["real_tokens"]}}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


LABELS = {"one process": "corpus.survey(model, path), one process, XLA's threads on both cores",
          "two processes, lockstep": "2 processes × 1 thread, jax.distributed over gloo, reduce='global' "
                                     "(every process returns the whole result)",
          "two processes, local + merge": "2 processes × 1 thread, reduce='local' (no communication), "
                                          "then SurveyResult.merge",
          "Ray, two actors": "corpus_ray.survey_ray, local Ray, 2 actors × 1 CPU, blocks of 250 lines "
                             "(actor start, model load and compile included)"}


def measure(segments: int) -> dict:
    """{configuration: {seconds, documents, tokens}} for every configuration, one after another."""
    texts, pairs = harness.english_like_texts(segments)
    path = harness.scratch_dir() / f"scale_out_{segments}.tsv"
    path.write_text("".join(f"{a}\t{b}\n" for a, b in zip(texts, pairs)), encoding="utf-8")
    numbers = {"one process": run_processes(path, 1, "global"),
               "two processes, lockstep": run_processes(path, 2, "global"),
               "two processes, local + merge": run_processes(path, 2, "local")}
    ray = run_ray(path)
    numbers["Ray, two actors"] = dict(ray, seconds=min(ray["seconds"]))
    for name, n in numbers.items():
        assert n["documents"] == segments, (name, n)
    harness.check_times({name: n["seconds"] for name, n in numbers.items()})
    return numbers


def report(numbers: dict, segments: int, core_rate: float | None = None) -> str:
    """The table of the configurations and the arithmetic of 10^8 sentences at `core_rate` segments/s per
    core (default: this run's local + merge rate per worker)."""
    base = numbers["one process"]["seconds"]
    rows = [[LABELS[name], harness.fmt(n["seconds"], 1) + " s", f"{segments / n['seconds']:.0f}",
             f"{n['tokens'] / n['seconds']:,.0f}", f"{base / n['seconds']:.2f}×"] for name, n in numbers.items()]
    table = harness.markdown_table(["configuration", "wall time", "segments/s", "real tokens/s", "vs one process"],
                                   rows)
    measured = segments / numbers["two processes, local + merge"]["seconds"] / 2  # one worker, one core, steady
    rate = core_rate or measured
    blocks = SENTENCES // BLOCK
    fleet = [[str(n), f"{SENTENCES // n:,}", f"{blocks / n:,.1f}", f"{SENTENCES / (rate * n) / 3600:,.1f} h"]
             for n in (8, 64, 400, 4096)]
    source = ("the local + merge row per worker" if core_rate is None else
              f"--core-rate: the one-core rate of the survey section on a quiet machine; this run's local + merge "
              f"row gives {measured:.0f} per worker")
    texts, pairs = harness.english_like_texts(segments)
    gigabytes = SENTENCES * sum(len(f"{a}\t{b}\n".encode()) for a, b in zip(texts, pairs)) / segments / 1e9
    mean_tokens = numbers["one process"]["tokens"] / segments
    arithmetic = (f"One worker on one core surveys {rate:.0f} segments/s (mean {mean_tokens:.0f} real tokens; "
                  f"{source}). 10^8 such segments then take "
                  f"{SENTENCES / rate / 3600:,.0f} core-hours; the work is a map with no communication but a sum "
                  f"of {RESULT_BYTES / 1000:.1f} kB per block, so N workers divide it by N until the file system "
                  f"feeds them (10^8 such lines ≈ {gigabytes:.0f} GB of text). With Ray blocks of {BLOCK:,} lines "
                  f"({blocks} blocks, {blocks * RESULT_BYTES / 1e6:.1f} MB of results to the driver in all), a lost "
                  f"worker costs "
                  f"one block ({BLOCK / rate / 60:.0f} min of one core) instead of the run; past {blocks} workers "
                  f"smaller blocks keep every worker busy:\n\n"
                  + harness.markdown_table(["workers (1 core each)", "sentences each", "blocks each",
                                            "wall time for 10^8 sentences"], fleet))
    return table + "\n\n" + arithmetic


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--segments", type=int, default=1000)
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--numbers", type=Path, help="keep the measured numbers in this JSON file; if it exists, "
                                                     "report from it instead of measuring")
    parser.add_argument("--core-rate", type=float, help="segments/s of one core for the 10^8 arithmetic: the "
                                                        "one-core rate of RESULTS.md's survey section, measured on a "
                                                        "quiet machine (default: this run's local + merge rate)")
    parser.add_argument("--smoke", action="store_true",
                        help="8 segments, every configuration once, its counts checked; nothing written (CI)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(json.loads(args.worker))
    if args.smoke:
        args.segments, args.no_write, args.numbers = 8, True, None
    import run

    info, load_before = harness.machine(), harness.load_average()
    if args.numbers and args.numbers.exists():  # report again from a saved run (no timing)
        saved = json.loads(args.numbers.read_text())
        info, load_before, numbers = saved["machine"], saved["load before"], saved["numbers"]
        load_after = saved["load after"]
    else:
        numbers = measure(args.segments)
        load_after = harness.load_average()
        if args.numbers:
            args.numbers.write_text(json.dumps({"machine": info, "load before": load_before,
                                                "load after": load_after, "numbers": numbers}, indent=1))
    text = report(numbers, args.segments, args.core_rate)
    if float(load_before.split()[0]) > int(info["cores"]):
        text += (f"\n\nThe machine ran other jobs during this run (load average {load_before} on {info['cores']} "
                 f"cores): absolute rates are several times below a quiet machine's, and the ratios between rows "
                 f"are noisy too.")
    block = (f"## {'smoke run of ' if args.smoke else ''}Scale-out (issue 14), "
             f"{info['cpu']} ({info['cores']} cores), {info['date']} "
             f"(`python benchmarks/scale_out.py {' '.join(argv or sys.argv[1:])}`)\n\n"
             + "\n".join(f"- {key}: {value}" for key, value in info.items())
             + f"\n- load average (1, 5, 15 min) at start: {load_before}; at end: {load_after}\n\n"
             + f"{args.segments} sentence pairs (benchmarks/harness.py english_like_texts, seed 0) in a .tsv, "
               f"all-MiniLM-L6-v2, every Clark statistic of every head, defaults otherwise. One timed survey per "
               f"configuration after a compiling one in the same processes.\n\n" + text + "\n")
    print(block)
    if not args.no_write:
        run.update_results(f"scale-out {info['cpu']}", block)
    return 0


if __name__ == "__main__":
    main()
