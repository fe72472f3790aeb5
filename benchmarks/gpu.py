"""One command for a GPU machine: minibert next to transformers (sdpa, eager) on the same card.

    python benchmarks/gpu.py --quick [--out gpu.md]             # ≤ 4 minutes on one H100, compiles included
    python benchmarks/gpu.py [--bundled DIR] [--out gpu.md]     # on a GPU with jax[cuda], flax, torch, transformers
    python benchmarks/gpu.py --smoke [--quick]                  # tiny sizes on any machine (a test runs this)

--quick (random bert-base, bf16): inference at 64×512 with nothing captured (the fused path: which attention kernel
model.programs.attention_backend names, and whether the compiled program holds a cuDNN custom call) and with every
pattern captured, next to transformers' sdpa in bf16; one training step at 32×512 (finetune's, bf16 compute, fp32 master
weights) with dropout 0 and with finetune's default 0.1, each next to PyTorch AMP at the same rate; MFU against the
card's dense bf16 peak; the top 10 ops of the minibert step's profile. Each row is printed as it is measured, and
what would not fit the time budget is skipped with a row saying so.

The full run:

For bert-base (random weights, bert-base-uncased shape) and the bundled checkpoint, in float32 and
bfloat16, at B ∈ {64, 256} × T ∈ {128, 512}: tokens/s, MFU against the card's dense bf16 peak
(minibert.runtime.accounting.GPU_PEAK_FLOPS), peak device memory, compile time, for minibert with nothing
captured / every pattern captured / everything captured and offloaded to host, and transformers' sdpa
and eager attention. Also: whether the fused attention lowered to cuDNN (the compiled HLO names a
cudnn call), the corpus survey, analysis.ablation_sweep when it exists, one training step of a classifier on
the random bert-base at 16×128 and 32×512 in fp32 and bf16 compute (fp32 master weights), with MFU, minibert vs
transformers + torch.optim.AdamW (bf16: torch.autocast, PyTorch AMP; benchmarks/training.py),
TopK SAE training throughput with the bundled model's forward (benchmarks/sae.py), and linear probes on every layer
in one program (vmap and lax.map) against a per-layer loop and scikit-learn (benchmarks/probes.py).
Writes a Markdown report.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import sys
import time
from pathlib import Path

# JAX would take 75% of the card at its first array, leaving torch's side of each comparison the rest; both grow
# their pools as they need instead (XLA's allocator, torch's caching allocator).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import harness  # noqa: E402

import minibert  # noqa: E402
from minibert.runtime import accounting  # noqa: E402

FULL = dict(batches=(64, 256), lengths=(128, 512), repeats=5, survey=1000, training=((16, 128), (32, 512)))
SMOKE = dict(batches=(2,), lengths=(16,), repeats=1, survey=4, training=((2, 16),))
DTYPES = {"fp32": (jnp.float32, "float32"), "bf16": (jnp.bfloat16, "bfloat16")}


def median_seconds(fn, repeats: int) -> tuple[float, float]:
    """(first call in seconds, including compilation; median of `repeats` later calls)."""
    first = harness.timed(fn)[1]
    return first, statistics.median(harness.timed(fn)[1] for _ in range(repeats))


def jax_peak_memory() -> float | None:
    """Peak bytes in use on the first JAX device so far (GPU allocators report it; the CPU does not)."""
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def lowered_to_cudnn(model, batch) -> bool:
    """Whether the plain forward's compiled program calls cuDNN (the fused attention's flash kernel)."""
    inputs = model.inputs(batch)
    compiled = jax.jit(model.forward_fn()).lower(model.state, inputs).compile()  # the forward with no hook active
    # Only a custom call's target counts: the text's metadata also holds Python names and file paths.
    return re.search(r'custom_call_target="[^"]*cudnn', compiled.as_text(), re.IGNORECASE) is not None


def minibert_cases(model, batch) -> dict:
    return {
        "minibert, nothing captured": lambda: harness.block(model(batch).last_hidden_state),
        "minibert, patterns captured": lambda: harness.block(
            model.run_with_cache(batch, names="blocks.*.attn.hook_pattern")[1].stack("hook_pattern")),
        "minibert, everything captured (offload)": lambda: model.run_with_cache(batch, offload=True),
    }


def torch_cases(directory: Path, batch, torch_dtype, device: str) -> dict:
    import torch

    tensors = {k: torch.tensor(np.asarray(v), dtype=torch.long, device=device) for k, v in batch.items()}
    cases = {}
    for attn in ("sdpa", "eager"):
        hf = harness.hf_model(directory, attn).to(device=device, dtype=torch_dtype)

        def run(hf=hf):
            with torch.no_grad():
                out = hf(**tensors).last_hidden_state
            if device == "cuda":
                torch.cuda.synchronize()
            return out

        cases[f"transformers {attn}"] = run
    return cases


def torch_peak(device: str, fn) -> float | None:
    import torch

    if device != "cuda":
        return None
    torch.cuda.reset_peak_memory_stats()
    fn()
    return float(torch.cuda.max_memory_allocated())


def model_rows(label: str, directory: Path, sizes: dict, device: str) -> tuple[list[list[str]], list[str]]:
    """Rows of the main table for one checkpoint, and notes (cuDNN lowering per dtype)."""
    import torch

    rows, notes = [], []
    peak_device = jax.devices()[0]
    for dtype_name, (jax_dtype, torch_name) in DTYPES.items():
        model = minibert.load(directory, dtype=jax_dtype)
        peak = accounting.peak_flops(peak_device, jnp.bfloat16)  # MFU against the dense bf16 peak
        for B in sizes["batches"]:
            for T in sizes["lengths"]:
                batch = harness.random_ids(B, T, vocab=model.config.vocab_size)
                if T == sizes["lengths"][0] and B == sizes["batches"][0]:
                    notes.append(f"{label} {dtype_name}: fused attention lowered to cuDNN: "
                                 f"{'yes' if lowered_to_cudnn(model, batch) else 'no'}")
                flops = accounting.flops_per_token(model.config, T)
                cases = minibert_cases(model, batch) | torch_cases(directory, batch, getattr(torch, torch_name), device)
                for name, fn in cases.items():
                    first, seconds = median_seconds(fn, sizes["repeats"])
                    memory = jax_peak_memory() if name.startswith("minibert") else torch_peak(device, fn)
                    tokens = B * T / seconds
                    mfu = accounting.achieved_fraction(tokens, flops, peak) if peak else None
                    rows.append([label, dtype_name, str(B), str(T), name, harness.fmt(tokens, 0),
                                 harness.fmt(100 * mfu, 1) if mfu is not None else "—",
                                 harness.fmt(memory / 2**30, 2) if memory else "—",
                                 harness.fmt(first - seconds, 2) if name.startswith("minibert") else "—"])
                    # each row as it is measured: a lease that runs out mid-table keeps the rows it reached
                    print("| " + " | ".join(rows[-1]) + " |", file=sys.stderr, flush=True)
    return rows, notes


def survey_rows(directory: Path, sizes: dict) -> list[list[str]]:
    from minibert.analysis import corpus

    model = minibert.load(directory)
    texts, pairs = harness.english_like_texts(sizes["survey"])
    rows = []
    for run in ("first call (compiles)", "again"):
        _, seconds = harness.timed(lambda: corpus.survey(model, texts, pairs, progress=False))
        rows.append([f"corpus.survey, {len(texts)} segments, {run}", harness.fmt(seconds, 2),
                     harness.fmt(len(texts) / seconds, 1) + " segments/s"])
    from minibert import analysis

    if hasattr(analysis, "ablation_sweep"):
        batch = model.tokenize(texts[:8], pairs[:8])
        metric = lambda out: out.last_hidden_state[:, 0].sum(-1)  # noqa: E731 — one value per row
        _, seconds = harness.timed(lambda: np.asarray(analysis.ablation_sweep(model, batch, metric)))
        L, H = model.config.num_hidden_layers, model.config.num_attention_heads
        rows.append([f"analysis.ablation_sweep, {L}×{H} heads, 8 pairs (first call)", harness.fmt(seconds, 2),
                     harness.fmt(L * H / seconds, 0) + " heads/s"])
    return rows


def training_rows(directory: Path, sizes: dict, device: str) -> list[list[str]]:
    """One training step (forward, backward, clipping, AdamW) of a 2-class classifier on `directory`, in fp32 and in
    bf16 compute with fp32 master weights: minibert's compiled step (finetune's, compute_dtype=bfloat16 for bf16)
    against transformers + torch.optim.AdamW (fp32, or torch.autocast bf16: PyTorch AMP), same starting weights
    (benchmarks/training.py). MFU counts the step as 3 forwards (the backward does two matmuls per forward matmul:
    one for the input's gradient, one for the weight's) against the card's dense bf16 peak."""
    import training

    classifier = training.classifier_dir(directory, directory.parent / f"{directory.name}-classifier")
    config = minibert.load(classifier).config
    peak = accounting.peak_flops(jax.devices()[0], jnp.bfloat16)
    rows = []
    for B, T in sizes["training"]:
        rows_in = training.inputs(B, T, config.vocab_size)
        flops = 3 * accounting.flops_per_token(config, T, head=True)
        for dtype_name, (jax_dtype, _) in DTYPES.items():
            bf16 = dtype_name == "bf16"
            cases = {"minibert": training.minibert_step(classifier, rows_in, jax_dtype)[0],
                     "transformers + torch AdamW": training.torch_step(classifier, rows_in, device, amp=bf16)}
            rates = {name: B * T / median_seconds(fn, sizes["repeats"])[1] for name, fn in cases.items()}
            for name, rate in rates.items():
                mfu = accounting.achieved_fraction(rate, flops, peak) if peak else None
                rows.append([f"training step, {name}", f"{B}×{T}", dtype_name + (" AMP" if bf16 and name != "minibert"
                                                                                   else ""),
                             harness.fmt(B * T / rate * 1e3, 1), harness.fmt(rate, 0),
                             harness.fmt(100 * mfu, 1) if mfu is not None else "—",
                             harness.fmt(rate / rates["transformers + torch AdamW"], 2) + "×"])
            del cases  # the pair's parameters and optimiser state leave the device before the next pair
    return rows


def sae_rows(directory: Path, smoke: bool, device: str) -> list[list[str]]:
    """TopK SAE training throughput with the model's forward (benchmarks/sae.py): minibert's streamed activations
    and compiled step against transformers' forward hook + a torch SAE step, on the same device."""
    import sae

    rates = sae.throughput(directory, sae.SMOKE if smoke else sae.FULL, device)
    base = rates[sae.PYTORCH][1]
    return [[f"SAE training, {name}", str(tokens), harness.fmt(rate, 0), harness.fmt(rate / base)]
            for name, (tokens, rate) in rates.items()]


def probe_rows(smoke: bool) -> list[list[str]]:
    """Linear probes on every layer (benchmarks/probes.py): one program with the layers side by side (vmap, the
    accelerator default) or in turn (lax.map, the CPU default), one program per layer in a loop, and scikit-learn
    (host CPU); the last column is the share of predictions equal to scikit-learn's."""
    import probes

    rows, agreement = probes.run(probes.SMOKE if smoke else probes.FULL,
                                 harness.Settings(quick=smoke, repeats=1 if smoke else 3, warmup=1))
    return [[f"probes, {name}", seconds, ratio, f"{100 * agreement:.1f}%"] for name, seconds, ratio in rows]


# ---- --quick: the accelerator's rows that matter, in ≤ 4 minutes -------------------------------------------

QUICK = dict(inference=(64, 512), training=(32, 512), repeats=(10, 5), budget=225.0)
QUICK_SMOKE = dict(inference=(2, 16), training=(2, 16), repeats=(1, 1), budget=600.0)
PATTERNS = "blocks.*.attn.hook_pattern"


def has_cudnn_call(compiled_text: str) -> bool:
    """Whether a compiled program calls cuDNN (a custom call's target: the text's metadata names Python files)."""
    return re.search(r'custom_call_target="[^"]*cudnn', compiled_text, re.IGNORECASE) is not None


class Budget:
    """Seconds left of the run's budget; `fits(s)` says whether a case of about s seconds still fits."""

    def __init__(self, seconds: float):
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()

    def fits(self, seconds: float) -> bool:
        return self.left() > seconds


def timed_case(run, repeats: int) -> float:
    """Median seconds of `repeats` calls after one warm call (each call blocks until its result is ready)."""
    run()
    return statistics.median(harness.timed(run)[1] for _ in range(repeats))


def quick_inference(directory: Path, sizes: dict, device: str, peak, budget: Budget):
    """Rows: minibert's bf16 forward with nothing captured and with every pattern captured, and transformers' sdpa."""
    import torch

    B, T = sizes["inference"]
    model = minibert.load(directory, dtype=jnp.bfloat16)
    batch = harness.random_ids(B, T, vocab=model.config.vocab_size)
    inputs = model.inputs(batch)
    flops = accounting.flops_per_token(model.config, T)
    yield {"section": "inference", "case": "attention kernel", "note": str(model.programs.attention_backend(batch))}
    for case, names in (("minibert bf16, nothing captured (fused)", ()), ("minibert bf16, every pattern captured",
                                                                          PATTERNS)):
        if not budget.fits(30):
            yield {"section": "inference", "case": case, "note": f"skipped: {budget.left():.0f} s left"}
            continue
        start = time.perf_counter()
        compiled = jax.jit(model.forward_fn(names)).lower(model.state, inputs).compile()
        compile_s = time.perf_counter() - start
        seconds = timed_case(lambda compiled=compiled: harness.block(compiled(model.state, inputs)),
                             sizes["repeats"][0])
        yield quick_row("inference", case, B, T, seconds, flops, peak, compile_s=compile_s,
                        cudnn=has_cudnn_call(compiled.as_text()))
        del compiled
    if budget.fits(15):
        hf = harness.hf_model(directory, "sdpa").to(device=device, dtype=torch.bfloat16)
        tensors = {k: torch.as_tensor(np.asarray(v), dtype=torch.long, device=device) for k, v in batch.items()}

        def run():
            with torch.no_grad():
                hf(**tensors)
            if device == "cuda":
                torch.cuda.synchronize()

        yield quick_row("inference", "transformers sdpa bf16", B, T, timed_case(run, sizes["repeats"][0]), flops,
                        peak)
        del hf


def quick_training(directory: Path, sizes: dict, device: str, peak, budget: Budget):
    """Rows: finetune's bf16 step with dropout 0 and 0.1, each next to PyTorch AMP at the same rate; the profile's
    top 10 ops of the first."""
    import training

    classifier = training.classifier_dir(directory, directory.parent / f"{directory.name}-classifier")
    model = minibert.load(classifier)
    B, T = sizes["training"]
    rows = training.inputs(B, T, model.config.vocab_size)
    flops = 3 * accounting.flops_per_token(model.config, T, head=True)  # forward + backward (two matmuls per one)
    compile_guess = 60.0
    for dropout in (0.0, 0.1):
        if budget.fits(compile_guess + 10):
            train, args = training.step_program(model, rows, jnp.bfloat16, dropout)
            start = time.perf_counter()
            compiled = train.lower(*args).compile()
            compile_s = time.perf_counter() - start
            compile_guess = compile_s

            def run(compiled=compiled, args=args):
                args[0], args[2], loss = compiled(*args)
                return float(loss)  # waits for the device, as PyTorch's float(loss) does

            yield quick_row("training", f"minibert bf16 step, dropout {dropout}", B, T,
                            timed_case(run, sizes["repeats"][1]), flops, peak, compile_s=compile_s,
                            cudnn=has_cudnn_call(compiled.as_text()),
                            attention=model.programs.attention_backend(rows).name if not dropout else "—")
            if not dropout and budget.fits(compile_guess + 20):
                yield from profile_top(run, compiled.as_text(), device)
            del compiled, run
        else:
            yield {"section": "training", "case": f"minibert bf16 step, dropout {dropout}",
                   "note": f"skipped: {budget.left():.0f} s left"}
        if budget.fits(15):
            run = training.torch_step(classifier, rows, device, amp=device == "cuda", dropout=dropout)
            yield quick_row("training", f"PyTorch {'AMP' if device == 'cuda' else 'fp32 (no GPU)'} step, dropout "
                            f"{dropout}", B, T, timed_case(run, sizes["repeats"][1]), flops, peak)
            del run


def quick_row(section: str, case: str, B: int, T: int, seconds: float, flops: float, peak, **extra) -> dict:
    tokens = B * T / seconds
    mfu = accounting.achieved_fraction(tokens, flops, peak) if peak else None
    row = {"section": section, "case": case, "BxT": f"{B}x{T}", "ms": harness.fmt(seconds * 1e3, 2),
           "tokens_per_s": harness.fmt(tokens, 0), "mfu_pct": harness.fmt(100 * mfu, 1) if mfu else "—"}
    return row | {k: harness.fmt(v, 1) if isinstance(v, float) else str(v) for k, v in extra.items()}


def profile_top(run, compiled_text: str, device: str, steps: int = 3, top: int = 10):
    """Rows: the ops of `steps` calls of `run` with the most time (GPU: the device's XLA ops; CPU: the host's
    thunks), each with the output shape its compiled HLO gives it."""
    import glob
    import tempfile

    from jax.profiler import ProfileData

    shapes = dict(re.findall(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\S+) ", compiled_text, re.MULTILINE))
    directory = tempfile.mkdtemp()
    with jax.profiler.trace(directory):
        for _ in range(steps):
            run()
    data = ProfileData.from_file(glob.glob(f"{directory}/**/*.xplane.pb", recursive=True)[0])
    totals: dict[str, float] = collections.defaultdict(float)
    for plane in data.planes:
        on_device = plane.name.startswith("/device:GPU")
        if not (on_device if device == "cuda" else plane.name == "/host:CPU"):
            continue
        for line in plane.lines:
            if on_device and "XLA Ops" not in line.name or not on_device and line.name == "python":
                continue
            for event in line.events:
                name = event.name.split(":")[0].lstrip("%")
                if name in shapes:
                    totals[name] += event.duration_ns / 1e6 / steps
    total = sum(totals.values()) or 1.0
    for name, ms in sorted(totals.items(), key=lambda kv: -kv[1])[:top]:
        yield {"section": "profile (minibert bf16 step, dropout 0)", "op": name[:60], "ms_per_step": f"{ms:.3f}",
               "share_pct": f"{100 * ms / total:.1f}", "shape": shapes[name][:60]}


def quick_sections(args):
    """--quick's rows, each printed as measured, as one Markdown table per section at the end."""
    sizes = QUICK_SMOKE if args.smoke else QUICK
    budget = Budget(sizes["budget"])
    device = "cuda" if any(d.platform == "gpu" for d in jax.devices()) else "cpu"
    peak = accounting.peak_flops(jax.devices()[0], jnp.bfloat16)
    scratch = harness.scratch_dir()
    directory = (harness.tiny_checkpoint(scratch / "tiny-bert") if args.smoke
                 else harness.make_bert_base(scratch / "bert-base"))
    yield "\n".join([f"## GPU benchmark (quick{', smoke' if args.smoke else ''})", "",
                     *(f"- {key}: {value}" for key, value in harness.machine().items())])
    rows = []
    for part in (quick_inference, quick_training):
        try:
            for row in part(directory, sizes, device, peak, budget):
                rows.append(row)
                print(" | ".join(f"{k}={v}" for k, v in row.items()), file=sys.stderr, flush=True)
        except Exception as error:  # one failed part keeps the other's rows
            if args.smoke:
                raise
            rows.append({"section": part.__name__, "case": "failed", "note": f"{type(error).__name__}: {error}"})
    for section in dict.fromkeys(row["section"] for row in rows):
        chosen = [row for row in rows if row["section"] == section]
        header = list(dict.fromkeys(k for row in chosen for k in row if k not in ("section", "note")))
        header += ["note"] if any("note" in row for row in chosen) else []
        yield f"### {section}\n\n" + harness.markdown_table(header, [[row.get(k, "") for k in header]
                                                                     for row in chosen])


def sections(args):
    """The report's Markdown sections in order, each yielded as soon as it is measured (a run cut short by a time
    limit keeps what it measured); a section that fails gives its error in place of its table."""
    sizes = dict(SMOKE if args.smoke else FULL)
    sizes |= {key: value for key, value in (("batches", args.batches), ("lengths", args.lengths),
                                            ("repeats", args.repeats)) if value}
    device = "cuda" if any(d.platform == "gpu" for d in jax.devices()) else "cpu"
    scratch = harness.scratch_dir()
    random_dir = (harness.tiny_checkpoint(scratch / "tiny-bert") if args.smoke
                  else harness.make_bert_base(scratch / "bert-base"))
    bundled = random_dir if args.smoke else Path(args.bundled or harness.bundled_dir())
    # --smoke runs the tiny model only (every code path, seconds of compiling); the bundled one in full runs.
    checkpoints = {"tiny BERT (random)": random_dir} if args.smoke else {"bert-base shape (random)": random_dir,
                                                                         "bundled": bundled}
    yield "\n".join([f"## GPU benchmark ({'smoke' if args.smoke else 'full'})", "",
                     *(f"- {key}: {value}" for key, value in harness.machine().items()),
                     f"- sizes: B ∈ {sizes['batches']}, T ∈ {sizes['lengths']}, median of {sizes['repeats']}"])

    def main_table():
        header = ["model", "dtype", "B", "T", "implementation", "tokens/s", "MFU % (bf16 peak)", "peak memory GiB",
                  "compile s"]
        rows, notes = [], []
        for label, directory in checkpoints.items():
            more_rows, more_notes = model_rows(label, directory, sizes, device)
            rows += more_rows
            notes += more_notes
        return "\n".join([harness.markdown_table(header, rows), "", *(f"- {note}" for note in notes), "",
                          "Peak memory of minibert rows is the device's running peak (JAX cannot reset it): read it "
                          "as an upper bound per row; torch rows reset the peak per case."])

    tables = [
        main_table,
        lambda: harness.markdown_table(["workload", "seconds", "throughput"], survey_rows(bundled, sizes)),
        lambda: harness.markdown_table(["workload", "B×T", "dtype", "ms / step", "tokens/s", "MFU % (bf16 peak)",
                                        "× PyTorch (same dtype)"], training_rows(random_dir, sizes, device)),
        lambda: harness.markdown_table(["workload", "tokens", "tokens/s", "× PyTorch"],
                                       sae_rows(bundled, args.smoke, device)),
        lambda: harness.markdown_table(["workload", "seconds (median)", "× lax.map", "= scikit-learn"],
                                       probe_rows(args.smoke)),
    ]
    for table in tables:
        try:
            yield table()
        except Exception as error:  # one broken section must not cost the others their measurements
            if args.smoke:
                raise
            yield f"(this section failed: {type(error).__name__}: {error})"


def report(args) -> str:
    return "\n\n".join((quick_sections if args.quick else sections)(args)) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundled", default=None,
                        help="the bundled checkpoint directory (default: minibert.io.sources.resolve())")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, any machine: checks the script runs")
    parser.add_argument("--quick", action="store_true", help="the ≤ 4-minute run on one H100 (module docstring)")
    parser.add_argument("--batches", type=int, nargs="+", help="batch sizes of the main table (default 64 256)")
    parser.add_argument("--lengths", type=int, nargs="+", help="lengths of the main table (default 128 512)")
    parser.add_argument("--repeats", type=int, help="timed calls per case, after the first (default 5)")
    parser.add_argument("--out", type=Path, help="also write the Markdown report here, section by section")
    args = parser.parse_args(argv)
    if args.out:
        args.out.write_text("")
    for section in (quick_sections if args.quick else sections)(args):
        print(section + "\n", flush=True)
        if args.out:
            with args.out.open("a") as out:
                out.write(section + "\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
