"""minibert against TransformerLens' HookedEncoder and transformers eager on the everyday workloads, side by side.

The bundled all-MiniLM-L6-v2, every implementation on one pinned core with one thread, process CPU time per call
(median of interleaved rounds: CPU time barely moves with a shared machine's load, wall time does), outputs checked
to agree before anything is timed:

- every attention pattern captured, 8 × 128 and 8 × 147 (recurring: warmed up, so under the length policy it runs
  at its tight bucket), and 8 × 147 under bucket_rule=FINE;
- the head-ablation sweep (all 72 heads, 8 × 14): analysis.ablation_sweep against a loop of 72 hooked forwards;
- residual patching over (layer, position), 4 pairs of 14 tokens: analysis.patch_activations against 6 · 14 hooked
  forwards;
- d metric / d pattern at every layer, 8 × 14: model.grad against a backward through the captured patterns;
- the first result in a fresh process: import, load and every pattern of 8 × 128 captured, wall seconds from the
  process's start to the result (minibert on an empty persistent cache and on the cache a first process filled),
  each process pinned to the same core, medians of interleaved rounds.

TransformerLens runs in a second process (an interpreter that has TransformerLens < 4, which still has
HookedEncoder: harness.transformer_lens_python; its pieces here run there), pinned to the same core; its outputs
come back in a .npz and are compared with minibert's.

    python benchmarks/peers.py [--quick]     # a Markdown section for benchmarks/RESULTS.md
    python benchmarks/peers.py --smoke       # tiny sizes, one round, outputs checked (CI)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import harness  # noqa: E402
import numpy as np  # noqa: E402

PATTERNS = "blocks.*.attn.hook_pattern"
# Agreement before timing, each relative to the peak of the compared values: one fp32 forward of a 6-layer model
# against another implementation agrees to ~1e-6 of its scale (DESIGN's parity bound is 1e-5 absolute on tiny
# configs); the grids are means of a metric of such forwards; a gradient runs the roundings forward and back.
AGREE = {"patterns": 1e-5, "grid": 1e-5, "gradient": 1e-4}


def workloads(smoke: bool) -> dict[str, tuple[int, int]]:
    """name → (rows, tokens)."""
    if smoke:
        return {"patterns 2×16": (2, 16), "ablation 2×8": (2, 8), "patching 2×8": (2, 8), "grad 2×8": (2, 8)}
    return {"patterns 8×128": (8, 128), "patterns 8×147": (8, 147), "patterns 8×147 FINE": (8, 147),
            "ablation 8×14": (8, 14), "patching 4×14": (4, 14), "grad 8×14": (8, 14)}


def direction(width: int) -> np.ndarray:
    """The metric's fixed direction: metric(out) = out's [CLS] hidden state · direction, one value per row."""
    return np.random.default_rng(7).standard_normal(width).astype(np.float32)


def inputs(rows: int, tokens: int, seed: int = 0) -> dict[str, np.ndarray]:
    return harness.random_ids(rows, tokens, seed=seed)


def cpu_medians(cases: dict, repeats: int, warmup: int) -> dict[str, float]:
    """Median process CPU seconds per call of each case, interleaved round-robin (harness.SETTLE_S between)."""
    for fn in cases.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            time.sleep(harness.SETTLE_S)
            start = time.process_time()
            fn()
            samples[name].append(time.process_time() - start)
    return {name: statistics.median(t) for name, t in samples.items()}


# ---- the torch side: transformers eager and TransformerLens, the loops researchers write --------------------------

def torch_inputs(batch: dict):
    import torch

    return {k: torch.as_tensor(v.astype(np.int64)) for k, v in batch.items()}


def hf_cases(hf, work: dict, d) -> tuple[dict, dict]:
    """transformers eager: (cases to time, outputs to compare) for each workload."""
    import torch

    L, H = hf.config.num_hidden_layers, hf.config.num_attention_heads
    K = hf.config.hidden_size // H
    hf.requires_grad_(False)
    d = torch.as_tensor(d)
    cases, outputs = {}, {}
    for name, (B, T) in work.items():
        batch = torch_inputs(inputs(B, T))
        if name.startswith("patterns"):
            def patterns(batch=batch):
                with torch.inference_mode():
                    return torch.stack(hf(**batch, output_attentions=True).attentions)
            cases[name], outputs[name] = patterns, lambda f=patterns: f().numpy()
        elif name.startswith("ablation"):
            def ablation(batch=batch):
                grid = np.zeros((L, H))
                with torch.inference_mode():
                    for layer in range(L):
                        for head in range(H):
                            def zero(module, args, head=head):
                                z = args[0].clone()
                                z[..., head * K:(head + 1) * K] = 0
                                return (z,)
                            handle = hf.encoder.layer[layer].attention.output.dense.register_forward_pre_hook(zero)
                            grid[layer, head] = float((hf(**batch).last_hidden_state[:, 0] @ d).mean())
                            handle.remove()
                return grid
            cases[name], outputs[name] = ablation, ablation
        elif name.startswith("patching"):
            corrupted = torch_inputs(inputs(B, T, seed=1))

            def patching(batch=batch, corrupted=corrupted):
                grid = np.zeros((L, T))
                with torch.inference_mode():
                    clean = hf(**batch, output_hidden_states=True).hidden_states
                    for layer in range(L):
                        for position in range(T):
                            def patch(module, args, kwargs, layer=layer, position=position):
                                hidden = args[0].clone()
                                hidden[:, position] = clean[layer][:, position]
                                return (hidden, *args[1:]), kwargs
                            handle = hf.encoder.layer[layer].register_forward_pre_hook(patch, with_kwargs=True)
                            grid[layer, position] = float((hf(**corrupted).last_hidden_state[:, 0] @ d).mean())
                            handle.remove()
                return grid
            cases[name], outputs[name] = patching, patching
        else:
            def grad(batch=batch):  # weights frozen: the gradient flows from the embedded stream up, no further
                handle = hf.embeddings.register_forward_hook(lambda module, args, out: out.requires_grad_())
                out = hf(**batch, output_attentions=True)
                handle.remove()
                for pattern in out.attentions:
                    pattern.retain_grad()
                (out.last_hidden_state[:, 0] @ d).sum().backward()
                return np.stack([pattern.grad.numpy() for pattern in out.attentions])
            cases[name], outputs[name] = grad, grad
    return cases, outputs


def tl_cases(model, work: dict, d) -> tuple[dict, dict]:
    """TransformerLens' HookedEncoder: the same workloads through its hooks (run in the TransformerLens process)."""
    import torch

    L, H = model.cfg.n_layers, model.cfg.n_heads
    d = torch.as_tensor(d)
    model.requires_grad_(False)
    cases, outputs = {}, {}

    def call(batch):
        return dict(input=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                    one_zero_attention_mask=batch["attention_mask"])

    def named(suffix):
        return lambda name: name.endswith(suffix)

    for name, (B, T) in work.items():
        batch = torch_inputs(inputs(B, T))
        if name.startswith("patterns"):
            def patterns(batch=batch):
                with torch.inference_mode():
                    _, cache = model.run_with_cache(**call(batch), names_filter=named("hook_pattern"))
                    return torch.stack([cache[f"blocks.{i}.attn.hook_pattern"] for i in range(L)])
            cases[name], outputs[name] = patterns, lambda f=patterns: f().numpy()
        elif name.startswith("ablation"):
            def ablation(batch=batch):
                grid = np.zeros((L, H))
                with torch.inference_mode():
                    for layer in range(L):
                        for head in range(H):
                            def zero(z, hook, head=head):
                                z[:, :, head] = 0
                                return z
                            hook = (f"blocks.{layer}.attn.hook_z", zero)
                            out = model.run_with_hooks(**call(batch), fwd_hooks=[hook])
                            grid[layer, head] = float((out[:, 0] @ d).mean())
                return grid
            cases[name], outputs[name] = ablation, ablation
        elif name.startswith("patching"):
            corrupted = torch_inputs(inputs(B, T, seed=1))

            def patching(batch=batch, corrupted=corrupted):
                grid = np.zeros((L, T))
                with torch.inference_mode():
                    _, clean = model.run_with_cache(**call(batch), names_filter=named("hook_resid_pre"))
                    for layer in range(L):
                        site = f"blocks.{layer}.hook_resid_pre"
                        for position in range(T):
                            def patch(resid, hook, position=position, site=site):
                                resid[:, position] = clean[site][:, position]
                                return resid
                            out = model.run_with_hooks(**call(corrupted), fwd_hooks=[(site, patch)])
                            grid[layer, position] = float((out[:, 0] @ d).mean())
                return grid
            cases[name], outputs[name] = patching, patching
        else:
            def grad(batch=batch):
                kept = []

                def keep(pattern, hook):
                    pattern.retain_grad()
                    kept.append(pattern)
                hooks = [("hook_full_embed", lambda x, hook: x.requires_grad_()),  # weights frozen, as above
                         (named("hook_pattern"), keep)]
                out = model.run_with_hooks(**call(batch), fwd_hooks=hooks)
                (out[:, 0] @ d).sum().backward()
                return np.stack([pattern.grad.numpy() for pattern in kept])
            cases[name], outputs[name] = grad, grad
    return cases, outputs


def tl_worker(argv: list[str]) -> None:
    """In the TransformerLens interpreter: `--tl DIR OUT.npz SMOKE REPEATS WARMUP CORE` → one JSON line of CPU
    medians; the outputs to compare go to OUT.npz."""
    directory, out, smoke, repeats, warmup, core = argv[0], argv[1], argv[2] == "1", *map(int, argv[3:6])
    os.sched_setaffinity(0, {core})
    import tl_worker as tl
    import torch

    torch.set_num_threads(1)
    model = tl.load(directory)
    work = workloads(smoke)
    cases, outputs = tl_cases(model, work, direction(model.cfg.d_model))
    np.savez(out, **{name: fn() for name, fn in outputs.items()})
    print(json.dumps(cpu_medians(cases, repeats, warmup)))


def run_transformer_lens(directory: Path, settings, core: int) -> tuple[dict, dict] | str:
    """(CPU medians, outputs) from the TransformerLens process, or why it did not run."""
    python = harness.transformer_lens_python()
    if python is None:
        return "not installed (TransformerLens < 4 in this interpreter, $TRANSFORMER_LENS_PYTHON or /tmp/tlvenv)"
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "tl.npz"
        done = subprocess.run([python, __file__, "--tl", str(directory), str(out), str(int(settings.smoke)),
                               str(settings.repeats), str(settings.warmup), str(core)],
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(HERE)})
        if done.returncode != 0:
            return f"failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
        with np.load(out) as saved:
            outputs = {name: saved[name] for name in saved.files}
        return json.loads(done.stdout.strip().splitlines()[-1]), outputs


# ---- minibert ----------------------------------------------------------------------------------------------------

def minibert_cases(work: dict, d) -> tuple[dict, dict, dict]:
    """(cases to time, outputs to compare, the padded length each workload runs at)."""
    import jax
    import jax.numpy as jnp

    import minibert
    from minibert.analysis import interventions
    from minibert.runtime.buckets import FINE

    model, fine = minibert.load(), minibert.load()
    fine.programs.bucket_rule = FINE
    d = jnp.asarray(d)

    def metric(out):
        return out.last_hidden_state[:, 0] @ d

    cases, outputs, lengths = {}, {}, {}
    for name, (B, T) in work.items():
        batch = inputs(B, T)
        which = fine if name.endswith("FINE") else model
        if name.startswith("patterns"):
            def patterns(which=which, batch=batch):
                return jax.block_until_ready(which.run(batch, names=PATTERNS)[1])
            cases[name] = patterns
            outputs[name] = lambda f=patterns: np.stack([np.asarray(v) for v in f().values()])
            patterns()  # the shape's first call: from its second on, it runs at its tight bucket
            lengths[name] = which.programs.padded_length(T, B)
        elif name.startswith("ablation"):
            cases[name] = outputs[name] = lambda batch=batch: interventions.ablation_sweep(model, batch, metric)
        elif name.startswith("patching"):
            corrupted = inputs(B, T, seed=1)
            cases[name] = outputs[name] = lambda batch=batch, corrupted=corrupted: interventions.patch_activations(
                model, batch, corrupted, metric)
        else:
            def grad(batch=batch):
                return jax.block_until_ready(model.grad(batch, metric, PATTERNS)[1])
            cases[name] = grad
            outputs[name] = lambda f=grad: np.stack([np.asarray(v) for v in f().values()])
    return cases, outputs, lengths


def gap(ours, theirs) -> float:
    """max |ours − theirs| relative to the peak of |theirs|."""
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


def kind(name: str) -> str:
    return {"patterns": "patterns", "grad": "gradient"}.get(name.split()[0], "grid")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--tl"]:
        tl_worker(argv[1:])
        return 0
    parser = harness.command_line(__doc__, smoke="tiny batches, one round, outputs checked (CI)")
    args = parser.parse_args(argv)
    settings = harness.Settings.make(args.quick, args.smoke)
    core = min(os.sched_getaffinity(0))
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})  # before jax and torch start their thread pools
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code = report(settings, *measure(settings, core))
        fresh_report(fresh_first_results(settings, core), settings)
        return code
    finally:  # a smoke run inside pytest leaves its process as it found it
        os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)


def measure(settings, core: int):
    work = workloads(settings.smoke)
    directory = harness.bundled_dir()
    hf = harness.hf_model(directory, "eager")
    d = direction(hf.config.hidden_size)
    ours, our_outputs, lengths = minibert_cases(work, d)
    theirs, their_outputs = hf_cases(hf, work, d)
    gaps = {"transformers": {name: gap(our_outputs[name](), their_outputs[name]()) for name in work}}
    tl = run_transformer_lens(directory, settings, core)
    if not isinstance(tl, str):
        gaps["TransformerLens"] = {name: gap(our_outputs[name](), tl[1][name]) for name in work}
    for peer, found in gaps.items():
        bad = {n: g for n, g in found.items() if not g <= AGREE[kind(n)]}
        assert not bad, f"minibert and {peer} disagree (max gap ÷ peak): {bad}"
    cases = {f"minibert {n}": f for n, f in ours.items()} | {f"transformers {n}": f for n, f in theirs.items()}
    times = cpu_medians(cases, settings.repeats, settings.warmup)
    return work, times, tl, gaps, lengths


# ---- the first result in a fresh process --------------------------------------------------------------------------

# Each peer's whole first session, run by `python -c`: what a script does from its first line to its first result.
# The clock starts in the parent just before the process is started; the child prints time.time() at its result.
FRESH = {
    "minibert": """
import os, sys
os.sched_setaffinity(0, {int(sys.argv[3])})  # before any thread pool starts
import time, numpy as np, jax
import minibert
model = minibert.load(sys.argv[1])
batch = {k: np.asarray(v) for k, v in np.load(sys.argv[2]).items()}
jax.block_until_ready(model.run_with_cache(batch, names="blocks.*.attn.hook_pattern")[1].stack("hook_pattern"))
print(time.time())""",
    "transformers": """
import os, sys
os.sched_setaffinity(0, {int(sys.argv[3])})  # before any thread pool starts
import time, numpy as np, torch, transformers
torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
model = transformers.BertModel.from_pretrained(sys.argv[1], attn_implementation="eager").eval()
batch = {k: torch.as_tensor(v.astype(np.int64)) for k, v in np.load(sys.argv[2]).items()}
with torch.inference_mode():
    torch.stack(model(**batch, output_attentions=True).attentions)
print(time.time())""",
    "TransformerLens": """
import os, sys
os.sched_setaffinity(0, {int(sys.argv[3])})  # before any thread pool starts
import time, numpy as np, torch
torch.set_num_threads(1)
import tl_worker
model = tl_worker.load(sys.argv[1])
batch = {k: torch.as_tensor(v.astype(np.int64)) for k, v in np.load(sys.argv[2]).items()}
with torch.inference_mode():
    _, cache = model.run_with_cache(batch["input_ids"], token_type_ids=batch["token_type_ids"],
                                    one_zero_attention_mask=batch["attention_mask"],
                                    names_filter=lambda name: name.endswith("hook_pattern"))
print(time.time())""",
}


def fresh_first_results(settings, core: int) -> dict[str, float]:
    """Median wall seconds to the first result in a fresh process: minibert on an empty cache and on a warm one,
    transformers eager, TransformerLens where an interpreter has it; rounds interleaved (a smoke run: one round,
    minibert cold and transformers)."""
    directory = harness.bundled_dir()
    rows, tokens = (2, 16) if settings.smoke else (8, 128)
    tl_python = None if settings.smoke else harness.transformer_lens_python()
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        batch = Path(scratch) / "batch.npz"
        np.savez(batch, **inputs(rows, tokens))
        warm_cache = Path(scratch) / "warm"

        def run(peer: str, python: str, env: dict) -> float:
            start = time.time()
            done = subprocess.run([python, "-c", FRESH[peer], str(directory), str(batch), str(core)],
                                  capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(HERE), **env})
            assert done.returncode == 0, f"{peer}'s fresh process failed: {done.stderr.strip()[-2000:]}"
            return float(done.stdout.strip().splitlines()[-1]) - start

        if not settings.smoke:  # a smoke run checks the cold path and the peer's (the warm one differs by a folder)
            run("minibert", sys.executable, {"MINIBERT_CACHE_DIR": str(warm_cache)})  # fills the warm cache
        for round_ in range(1 if settings.smoke else settings.repeats):
            cold = Path(scratch) / f"cold{round_}"
            samples.setdefault("minibert, empty cache", []).append(
                run("minibert", sys.executable, {"MINIBERT_CACHE_DIR": str(cold)}))
            if not settings.smoke:
                samples.setdefault("minibert, warm cache", []).append(
                    run("minibert", sys.executable, {"MINIBERT_CACHE_DIR": str(warm_cache)}))
            samples.setdefault("transformers eager", []).append(run("transformers", sys.executable, {}))
            if tl_python:
                samples.setdefault("TransformerLens", []).append(run("TransformerLens", tl_python, {}))
    return {name: statistics.median(t) for name, t in samples.items()}


def fresh_report(times: dict[str, float], settings) -> None:
    rows, tokens = (2, 16) if settings.smoke else (8, 128)
    peers = [name for name in ("transformers eager", "TransformerLens") if name in times]
    print(f"\nThe first result in a fresh process (import, load, every pattern of {rows} × {tokens} captured), wall "
          f"seconds from the process's start, one pinned core, median of "
          f"{1 if settings.smoke else settings.repeats} rounds:\n")
    table = [[name, f"{t:.2f}", *(f"{times[p] / t:.2f}×" for p in peers)] for name, t in times.items()
             if name.startswith("minibert")]
    print(harness.markdown_table(["minibert", "seconds", *(f"vs {p} ({times[p]:.2f} s)" for p in peers)], table))


def report(settings, work, times, tl, gaps, lengths) -> int:
    if settings.smoke:
        harness.check_times(times)
    tl_times = tl[0] if not isinstance(tl, str) else {}
    print(f"{'smoke run: ' if settings.smoke else ''}bundled all-MiniLM-L6-v2, one core ({harness.cpu_model()}), "
          f"one thread each, CPU-time medians of {settings.repeats} interleaved rounds, load average "
          f"{harness.load_average()}; TransformerLens: {'3.x, its own process' if tl_times else tl}\n")
    rows = []
    for name in work:
        ours = times[f"minibert {name}"]
        hf = times[f"transformers {name}"]
        tl_t = tl_times.get(name)
        rows.append([name, str(lengths.get(name, "—")), f"{ours * 1e3:.1f}", f"{hf * 1e3:.1f}",
                     f"{tl_t * 1e3:.1f}" if tl_t else "—", f"{tl_t / ours:.2f}×" if tl_t else "—", f"{hf / ours:.2f}×",
                     " / ".join(f"{gaps[p][name]:.0e}" for p in gaps)])
    print(harness.markdown_table(
        ["workload", "minibert runs at T", "minibert CPU ms", "transformers eager CPU ms", "TransformerLens CPU ms",
         "vs TransformerLens", "vs transformers eager", "gap ÷ peak (transformers / TL)"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
