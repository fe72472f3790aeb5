"""The corpus survey (Clark et al. head statistics over many segments) against the seeds' pipeline, and
how many programs a mixed-length workload compiles. The sections run from benchmarks/run.py;
`python benchmarks/survey.py --smoke` runs both on 8 segments, once, and checks their numbers (CI)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
from harness import (
    Settings,
    block,
    bundled_dir,
    check_times,
    english_like_texts,
    hf_model,
    markdown_table,
    random_ids,
    timed,
)

import minibert
from minibert.analysis import corpus, heads

SEEDS_BATCH = 16  # Clark et al.'s extract_attention.py: --batch_size default 16
SEEDS_LENGTH = 128  # and --max_sequence_length 128: every example padded to 128 tokens
ABLATION = dict(pack=False, buckets=(32, 64, 96, 128))  # the runner without packing: one document per row


# ---- the seeds' pipeline: transformers eager with output_attentions, NumPy statistics per document ----------

def document_statistics(att: np.ndarray, ids: np.ndarray, cls_id: int, sep_id: int, punct_ids) -> dict:
    """ANALYSIS.md's statistics of one document: att [L, H, n, n] over its n real tokens, ids [n]."""
    n = att.shape[-1]
    sep, cls, punct = ids == sep_id, ids == cls_id, np.isin(ids, punct_ids)
    to = lambda columns, rows=slice(None): att[:, :, rows][..., columns].sum((-1, -2))
    p = 0.9999 * att + 0.0001 / n
    row_entropy = -(p * np.log(p)).sum(-1)  # [L, H, n]
    return {
        "self": np.trace(att, axis1=-2, axis2=-1) / n,
        "next": np.trace(att, offset=1, axis1=-2, axis2=-1) / n,
        "prev": np.trace(att, offset=-1, axis1=-2, axis2=-1) / n,
        "to_cls": to(cls) / n,
        "to_sep": to(sep) / n,
        "to_punct": to(punct) / n,
        "sep_to_sep": to(sep, sep) / sep.sum(),
        "rest_to_sep": to(sep, ~sep) / (n - sep.sum()),
        "entropy": row_entropy.mean(-1),
        "cls_entropy": row_entropy[..., 0],
        "uniform_entropy": np.full(att.shape[:2], np.log(n)),
    }


def seeds_pipeline(tokenizer, model, texts, pairs) -> tuple[dict, dict]:
    """What Clark et al.'s extract_attention.py and notebook do, with transformers: batches of 16 in corpus
    order, every example padded to 128 tokens, BertModel (eager attention) with output_attentions, each
    document's maps cropped to its n real tokens, statistics per document in NumPy, averaged.
    Returns ({statistic: [L, H]}, {"tokenize" | "forward" | "statistics": seconds, "padded_tokens": n})."""
    import torch

    vocab = tokenizer.get_vocab()
    punct_ids = [vocab[p] for p in (".", ",")]
    totals, documents = None, 0
    spent = dict(tokenize=0.0, forward=0.0, statistics=0.0, padded_tokens=0)
    with torch.inference_mode():
        for start in range(0, len(texts), SEEDS_BATCH):
            t0 = time.perf_counter()
            enc = tokenizer(texts[start:start + SEEDS_BATCH], pairs[start:start + SEEDS_BATCH], padding="max_length",
                            truncation=True, max_length=SEEDS_LENGTH, return_tensors="pt")
            t1 = time.perf_counter()
            att = torch.stack(model(**enc, output_attentions=True).attentions).numpy()  # [L, B, H, T, T]
            t2 = time.perf_counter()
            for b, n in enumerate(enc["attention_mask"].sum(1).tolist()):
                stats = document_statistics(att[:, b, :, :n, :n], enc["input_ids"][b, :n].numpy(),
                                            tokenizer.cls_token_id, tokenizer.sep_token_id, punct_ids)
                totals = stats if totals is None else {k: totals[k] + v for k, v in stats.items()}
                documents += 1
            t3 = time.perf_counter()
            spent["tokenize"] += t1 - t0
            spent["forward"] += t2 - t1
            spent["statistics"] += t3 - t2
            spent["padded_tokens"] += int(enc["input_ids"].numel())
    return {k: v / documents for k, v in totals.items()}, spent


def clocked(fn):
    """(result, wall seconds, CPU seconds of this process, all threads)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def measure(texts, pairs, rounds: int, ablation: bool = True) -> dict:
    """Interleaved rounds of: the seeds' pipeline; corpus.survey on a freshly loaded model (compiles its
    programs); the same call again (programs cached per model); with `ablation`, survey with one document
    per row in length buckets (ABLATION, compiled before the rounds). Medians of wall and CPU seconds,
    the seeds' time split, the survey's counts and the largest difference between the two pipelines'
    [L, H] means."""
    import transformers

    directory = bundled_dir()
    tokenizer = transformers.BertTokenizerFast.from_pretrained(str(directory))
    hf = hf_model(directory, "eager")
    run = lambda model, **kw: corpus.survey(model, texts, pairs, progress=False, **kw)
    cases = ("seeds", "cold", "warm") + (("one_bucket",) if ablation else ())
    samples = {k: [] for k in cases}
    if ablation:
        unpacked = minibert.load()
        run(unpacked, **ABLATION)
    for _ in range(rounds):
        (reference, spent), *seeds = clocked(lambda: seeds_pipeline(tokenizer, hf, texts, pairs))
        samples["seeds"].append(seeds)
        model = minibert.load()  # a new model: nothing compiled for it yet
        result, *cold = clocked(lambda: run(model))
        traces = model.programs.traces
        samples["cold"].append(cold)
        samples["warm"].append(clocked(lambda: run(model))[1:])
        assert model.programs.traces == traces, "the second survey call compiled again"
        if ablation:
            one_bucket, *seconds = clocked(lambda: run(unpacked, **ABLATION))
            samples["one_bucket"].append(seconds)
    out = {"wall_s": {k: statistics.median(s[0] for s in v) for k, v in samples.items()},
           "cpu_s": {k: statistics.median(s[1] for s in v) for k, v in samples.items()},
           "samples": samples, "seeds_split": spent, "counts": result.counts, "settings": result.settings,
           "documents": result.documents,
           "traces_first_call": traces,
           "max_abs_diff": max(float(np.abs(result.mean[k] - reference[k]).max()) for k in heads.STATISTICS),
           "tokenize_s": clocked(lambda: model.tokenize(texts, pairs, max_length=128))[1]}
    if ablation:
        out["one_bucket_counts"] = one_bucket.counts
    return out


def measure_one_core(segments: int, rounds: int) -> dict:
    """measure() without the ablation in a fresh interpreter pinned to one core (sched_setaffinity before
    it starts), so XLA sizes its thread pool to one CPU and PyTorch runs one thread."""
    here = os.path.dirname(os.path.abspath(__file__))
    start = (f"import os, runpy, sys; os.sched_setaffinity(0, {{{max(os.sched_getaffinity(0))}}}); "
             f"sys.path.insert(0, {here!r}); sys.argv = ['survey.py', '--one-core', '{segments}', '{rounds}']; "
             f"runpy.run_path({os.path.join(here, 'survey.py')!r}, run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", start], env=dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1"),
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the one-core survey worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def survey(settings: Settings, texts, pairs) -> tuple[str, dict]:
    """The seeds' pipeline against corpus.survey, on both cores (defaults) and pinned to one core."""
    rounds = 1 if settings.quick else 3
    numbers = {"default_threads": measure(texts, pairs, rounds), "one_core": measure_one_core(len(texts), rounds),
               "rounds": rounds}
    return report(numbers, texts, pairs), numbers


def report(numbers: dict, texts, pairs) -> str:
    """The Markdown section for survey()'s numbers (also from a saved --json file's "survey" entry)."""
    numbers, single, rounds = numbers["default_threads"], numbers["one_core"], numbers["rounds"]
    used, traces = numbers["settings"], numbers["traces_first_call"]
    model = minibert.load()
    lengths = np.asarray(model.tokenize(texts, pairs, max_length=128).attention_mask.sum(1))
    met = lambda ratio: "yes" if ratio >= 3 else "**no**"

    def row(label, threads, run, key, tokens, target=True):
        speed = run["wall_s"]["seeds"] / run["wall_s"][key]
        return [label, threads, f"{run['wall_s'][key]:.1f} s", f"{run['cpu_s'][key]:.1f} s",
                f"{len(texts) / run['wall_s'][key]:.0f}", f"{tokens:,}", f"{speed:.2f}×",
                "≥ 3×" if target and key != "seeds" else "—" if key != "seeds" else "",
                met(speed) if target and key != "seeds" else "—" if key != "seeds" else ""]

    seeds_label = (f"seeds' pipeline: transformers BertTokenizerFast + BertModel eager with output_attentions, "
                   f"batches of {SEEDS_BATCH} padded to {SEEDS_LENGTH} (Clark et al.'s extract_attention.py), "
                   f"NumPy statistics per document")
    programs = lambda n: f"{n} program{'s' if n != 1 else ''}"
    lengths_text = ", ".join(map(str, used["buckets"]))
    cold_label = (f"minibert.corpus.survey(model, texts, pairs), first call on a new model ({programs(traces)} "
                  f"compiled; documents packed into rows of {lengths_text} tokens, {used['batch_tokens']} tokens per "
                  f"batch)")
    warm_label = "the same call again (the jitted step is cached per model: nothing compiles)"
    rows = []
    for threads, run in (("both cores (defaults)", numbers), ("one core", single)):
        rows += [row(seeds_label, threads, run, "seeds", run["seeds_split"]["padded_tokens"]),
                 row(cold_label, threads, run, "cold", run["counts"]["tokens_run"]),
                 row(warm_label, threads, run, "warm", run["counts"]["tokens_run"])]
    rows.append(row(f"(ablation) survey with one document per row in length buckets {ABLATION['buckets']} "
                    f"(pack=False; programs compiled before timing)",
                    "both cores", numbers, "one_bucket", numbers["one_bucket_counts"]["tokens_run"], target=False))

    def where(run, name):
        spent, counts = run["seeds_split"], run["counts"]
        compile_s = run["wall_s"]["cold"] - run["wall_s"]["warm"]
        steps_s = run["wall_s"]["warm"] - run["tokenize_s"]
        return (f"{name}: the seeds' pipeline spent {spent['forward']:.1f} s in the forward (with the copy of the "
                f"attentions to NumPy; {spent['padded_tokens'] / spent['forward']:,.0f} tokens/s), "
                f"{spent['statistics']:.1f} s in NumPy statistics and {spent['tokenize']:.1f} s tokenizing; "
                f"corpus.survey {run['tokenize_s']:.1f} s tokenizing (minibert's pure-Python WordPiece), "
                f"{compile_s:.1f} s compiling ({programs(run['traces_first_call'])}: first call − second call) "
                f"and {steps_s:.1f} s in the jitted steps (second call − tokenizing; "
                f"{counts['tokens_run'] / steps_s:,.0f} tokens/s through forward and statistics).")

    def factors(run, name):
        """The warm speed-up as a product: fewer tokens × faster per token × the seeds' work beside the forward
        ÷ our tokenizing beside the steps."""
        spent, counts = run["seeds_split"], run["counts"]
        steps_s = run["wall_s"]["warm"] - run["tokenize_s"]
        fewer = spent["padded_tokens"] / counts["tokens_run"]
        per_token = (counts["tokens_run"] / steps_s) / (spent["padded_tokens"] / spent["forward"])
        beside = run["wall_s"]["seeds"] / spent["forward"]
        ours = run["wall_s"]["warm"] / steps_s
        needed = counts["tokens_run"] / (run["wall_s"]["seeds"] / 3 - run["tokenize_s"])
        return (f"Second-call speed-up, {name}: {fewer:.2f} (fewer tokens) × {per_token:.2f} (tokens/s of our "
                f"forward + statistics over transformers' forward) × {beside:.2f} (the seeds' statistics and "
                f"tokenizing beside their forward) ÷ {ours:.2f} (our tokenizing beside the steps) = "
                f"{fewer * per_token * beside / ours:.2f}×; 3× would take {needed:,.0f} tokens/s through forward "
                f"and statistics ({needed / (spent['padded_tokens'] / spent['forward']):.2f}× transformers' forward).")

    text = (
        f"{len(texts)} sentence pairs `[CLS] A [SEP] B [SEP]` (benchmarks/harness.py english_like_texts, seed 0), "
        f"{lengths.min()}–{lengths.max()} tokens (mean {lengths.mean():.0f}; {int(lengths.sum()):,} real tokens), "
        f"all-MiniLM-L6-v2, all {len(heads.STATISTICS)} Clark statistics for every head, end to end (tokenize → "
        f"forward → statistics), real segment ids in both pipelines. Largest difference between the two "
        f"pipelines' [L, H] means: {numbers['max_abs_diff']:.1e} (one core: {single['max_abs_diff']:.1e}). "
        f"Models are loaded before timing; median of {rounds} interleaved round(s). CPU time counts every thread "
        f"of the process. \"One core\" runs both pipelines again in a fresh interpreter pinned to one core (XLA's "
        f"pool sees one CPU, PyTorch is set to one thread): on this shared 2-core machine PyTorch's two OpenMP threads "
        f"slow down sharply whenever another job holds a core, so the one-core rows measure the work itself.\n\n"
        + markdown_table(["pipeline", "threads", "wall time", "CPU time", "segments/s", "tokens run (padded)",
                          "speed-up (wall)", "target", "met"], rows)
        + "\n\nWhere the time goes. " + where(numbers, "Both cores") + " " + where(single, "One core")
        + " " + factors(numbers, "both cores") + " " + factors(single, "one core")
        + " Fewer tokens: several documents share a row (first fit), so rows carry little padding. Per token: "
        "the last layer's values, output projection and FFN are not computed (XLA drops what no statistic reads: "
        "10 of the 72 D² units of dense work in 6 layers), the statistics stay on the device, and attention in "
        "a packed row is over 128 keys like the seeds'."
    )
    return text


# ---- compilation over mixed lengths ----------------------------------------------------------------------

def compile_counts(settings: Settings, texts, pairs) -> tuple[str, dict]:
    rows, out = [], {}
    model = minibert.load()
    _, first = timed(lambda: corpus.survey(model, texts, pairs, progress=False))
    _, again = timed(lambda: corpus.survey(model, texts, pairs, progress=False))
    rows.append([f"corpus.survey, {len(texts)} segments (packed into rows of {corpus.default_buckets(128)[0]} "
                 f"tokens; second pass: the jitted step is cached per model)",
                 str(model.programs.traces), f"{first:.1f} s", f"{again:.1f} s", f"{first - again:.1f} s"])
    out["survey"] = {"traces": model.programs.traces, "first_s": first, "again_s": again}

    rng = np.random.default_rng(0)
    lengths = rng.choice(np.arange(8, 129), size=2 if settings.smoke else 8 if settings.quick else 24, replace=False)
    batches = [random_ids(8, int(T), seed=i) for i, T in enumerate(lengths)]
    for label, pad in (("model.run, 8 rows each, lengths as they come", False),
                       ("model.run, the same batches padded up to a power of two", True)):
        model = minibert.load()
        prepared = [padded_to_bucket(b) if pad else b for b in batches]
        run_all = lambda: [block(model.run(b)[0]) for b in prepared]
        _, first = timed(run_all)
        _, again = timed(run_all)
        rows.append([f"{label} ({len(batches)} lengths {lengths.min()}–{lengths.max()})", str(model.programs.traces),
                     f"{first:.1f} s", f"{again:.1f} s", f"{first - again:.1f} s"])
        out[label] = {"traces": model.programs.traces, "first_s": first, "again_s": again}
    header = ["workload", "programs traced (model.programs.traces)", "first pass", "second pass",
              "compile time (difference)"]
    return markdown_table(header, rows), out


def padded_to_bucket(batch: dict) -> dict:
    T = batch["input_ids"].shape[1]
    size = next(s for s in (16, 32, 64, 128) if s >= T)
    return {k: np.pad(v, ((0, 0), (0, size - T))) for k, v in batch.items()}


SMOKE_SEGMENTS = 8


def check_measured(numbers: dict, segments: int) -> None:
    """A smoke run's check of measure(): every pipeline timed, every segment surveyed, and the two pipelines'
    statistics finite (their agreement is tests/test_analysis_corpus.py's business, not a smoke run's)."""
    check_times(numbers["wall_s"])
    assert numbers["documents"] == segments, (numbers["documents"], segments)
    assert np.isfinite(numbers["max_abs_diff"]), numbers["max_abs_diff"]


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", required=True,
                        help=f"both sections on {SMOKE_SEGMENTS} segments, one round, numbers checked")
    parser.parse_args(argv)
    settings = Settings.make(quick=True, smoke=True)
    texts, pairs = english_like_texts(SMOKE_SEGMENTS)
    text, numbers = survey(settings, texts, pairs)
    for run in (numbers["default_threads"], numbers["one_core"]):
        check_measured(run, SMOKE_SEGMENTS)
    compiled, counts = compile_counts(settings, texts, pairs)
    check_times({name: entry["again_s"] for name, entry in counts.items()})
    print(f"smoke run of the survey and compile sections, {SMOKE_SEGMENTS} segments\n\n{text}\n\n{compiled}")
    return 0


if __name__ == "__main__":  # survey.py --smoke, or the one-core worker: survey.py --one-core SEGMENTS ROUNDS
    import harness
    import torch

    if sys.argv[1:2] == ["--smoke"]:
        sys.exit(main(sys.argv[1:]))
    torch.set_num_threads(1)
    _, _, segments, rounds = sys.argv
    print(json.dumps(measure(*harness.english_like_texts(int(segments)), int(rounds), ablation=False), default=float))
