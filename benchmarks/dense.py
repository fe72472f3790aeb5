"""Dense forward passes: minibert next to transformers (eager with attentions, sdpa) and TransformerLens,
the load / first-call numbers, the cost of the hook machinery, and the GPU rows. The sections run from
benchmarks/run.py; `python benchmarks/dense.py --smoke` runs each of them on MiniLM at 1×16, once (CI)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from harness import (
    Settings,
    block,
    bundled_dir,
    check_times,
    fmt,
    hf_model,
    make_bert_base,
    markdown_table,
    random_ids,
    scratch_dir,
    time_round_robin,
    time_samples,
    timed,
    transformer_lens_python,
)

import minibert
from minibert.core.encoder import NO_HOOKS
from minibert.runtime import accounting
from minibert.runtime.model import Inputs

PATTERNS = "blocks.*.attn.hook_pattern"
PEAK_SIZE = 2048
SMOKE_SHAPE = (1, 16)  # B, T of every forward in a smoke run


def batch_shape(settings: Settings, shape: tuple[int, int] = (8, 128)) -> tuple[int, int]:
    return SMOKE_SHAPE if settings.smoke else shape


def matmul_case(size: int = PEAK_SIZE):
    """The machine's matmul limit, timed as one more case among the model calls (same load, same clocks)."""
    a, b = (jax.random.normal(k, (size, size), jnp.float32) for k in jax.random.split(jax.random.key(0)))
    matmul = jax.jit(jnp.matmul)
    return lambda: matmul(a, b).block_until_ready(), 2 * size**3


def torch_matmul_case(size: int = PEAK_SIZE):
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    return lambda: torch.mm(a, b), 2 * size**3


def capture_bytes(model, B: int, T: int, names=None) -> int:
    """Bytes of the values a run_with_cache(names) of a [B, T] batch returns (by shape, nothing run)."""
    ids = jax.ShapeDtypeStruct((B, T), jnp.int32)
    _, captured = jax.eval_shape(model.forward_fn(names), model.state, Inputs(ids, ids, ids))
    return sum(int(np.prod(v.shape)) * v.dtype.itemsize for v in captured.values())


def available_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable"):
            return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


# ---- core numbers (issue 2) -------------------------------------------------------------------------------

def core(settings: Settings) -> tuple[str, dict]:
    import torch

    torch.set_num_threads(os.cpu_count())
    loads = [timed(minibert.load)[1] for _ in range(2 if settings.quick else 4)]
    model = minibert.load()
    B, T = batch_shape(settings)
    batch = random_ids(B, T)
    tokens, shape = B * T, f"{B}×{T}"
    _, first = timed(lambda: block(model.run(batch)[0]))
    traces = model.programs.traces
    eager = hf_model(bundled_dir(), "eager")
    torch_batch = {k: torch.tensor(v.astype(np.int64)) for k, v in batch.items()}
    with torch.inference_mode():
        times = time_round_robin({"minibert": lambda: block(model.run(batch)[0]),
                                  "eager": lambda: eager(**torch_batch, output_attentions=True)}, settings)
    steady = times["minibert"]
    if settings.smoke:
        check_times(times | {"first call": first, "loads": min(loads)})
    rows = [
        ["minibert.load() of the bundled all-MiniLM-L6-v2, first in this process", f"{loads[0]:.2f} s"],
        ["minibert.load(), median of the later loads", f"{np.median(loads[1:]):.2f} s"],
        [f"first model.run at {shape} (trace + compile + run)", f"{first:.2f} s ({traces} trace)"],
        [f"later model.run at {shape}, nothing captured (median)",
         f"{steady * 1e3:.0f} ms = {tokens / steady:,.0f} tokens/s"],
        ["first-call compile overhead (first − later)", f"{first - steady:.2f} s"],
        ["transformers eager with output_attentions, same batch, interleaved (median)",
         f"{times['eager'] * 1e3:.0f} ms = {tokens / times['eager']:,.0f} tokens/s"],
    ]
    return markdown_table(["what", "time"], rows), {"load_s": loads, "first_call_s": first, "steady_s": steady,
                                                     "hf_eager_attentions_s": times["eager"]}


# ---- dense forward (issue 6) -------------------------------------------------------------------------------

def dense_configs(settings: Settings) -> list[tuple[str, Path, int, int]]:
    if settings.smoke:  # no bert-base: building and saving it takes longer than the whole smoke run
        return [("all-MiniLM-L6-v2", bundled_dir(), *SMOKE_SHAPE)]
    base = make_bert_base(scratch_dir() / "bert-base-random")
    configs = [("all-MiniLM-L6-v2", bundled_dir(), 8, 128), ("bert-base (random)", base, 8, 128)]
    if not settings.quick:
        configs.append(("bert-base (random)", base, 32, 512))
    return configs


def run_transformer_lens(directory: Path, B: int, T: int, settings: Settings, cases) -> dict[str, float] | str:
    if settings.smoke:
        return "skipped in a smoke run (a second interpreter)"
    python = transformer_lens_python()
    if python is None:
        return "not installed"
    worker = Path(__file__).with_name("tl_worker.py")
    threads = str(os.cpu_count())
    proc = subprocess.run([python, str(worker), str(directory), str(B), str(T), str(settings.repeats),
                           str(settings.warmup), threads, ",".join(cases)], capture_output=True, text=True)
    if proc.returncode != 0:
        return "failed: " + proc.stderr.strip().splitlines()[-1][:200]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def dense_cases(model, batch: dict, eager, sdpa, torch_batch: dict, fits: bool) -> dict:
    """The timed forwards of one config: minibert capturing nothing / the patterns / everything (when it
    fits in memory) next to transformers eager with attentions and sdpa."""
    cases = {
        "minibert/nothing": lambda: block(model.run(batch)[0]),
        "minibert/patterns": lambda: block(dict(model.run(batch, names=PATTERNS)[1])),
    }
    if fits:
        cases["minibert/everything"] = lambda: block(dict(model.run_with_cache(batch)[1]))
    return cases | {
        "transformers eager/patterns": lambda: eager(**torch_batch, output_attentions=True),
        "transformers sdpa/nothing": lambda: sdpa(**torch_batch),
    }


def dense(settings: Settings) -> tuple[str, dict]:
    import torch

    torch.set_num_threads(os.cpu_count())
    rows, ratio_rows, results = [], [], []
    peak_size = 256 if settings.smoke else PEAK_SIZE
    matmul, matmul_flops = matmul_case(peak_size)
    torch_mm, _ = torch_matmul_case(peak_size)
    for label, directory, B, T in dense_configs(settings):
        config_settings = settings if B * T <= 2048 else dataclasses.replace(settings, repeats=3, warmup=1)
        model = minibert.load(directory)
        batch = random_ids(B, T)
        torch_batch = {k: torch.tensor(v.astype(np.int64)) for k, v in batch.items()}
        eager, sdpa = hf_model(directory, "eager"), hf_model(directory, "sdpa")
        everything_bytes = capture_bytes(model, B, T)
        fits = everything_bytes < 0.3 * available_memory()
        cases = dense_cases(model, batch, eager, sdpa, torch_batch, fits) | {"jax matmul": matmul,
                                                                             "torch matmul": torch_mm}
        with torch.inference_mode():
            times = time_round_robin(cases, config_settings)
            if settings.smoke:
                check_times(times)
                check_forward(model, batch, sdpa(**torch_batch).last_hidden_state.numpy())
        tl = run_transformer_lens(directory, B, T, config_settings,
                                  ["nothing", "patterns"] + (["everything"] if fits else []))
        if isinstance(tl, dict):
            times |= {f"TransformerLens/{case}": t for case, t in tl.items()}
        peak = matmul_flops / times["jax matmul"]
        flops = accounting.flops_per_token(model.config, T)
        tokens = B * T
        for name, t in times.items():
            if "matmul" in name:
                rows.append([label, f"{B}×{T}", name, f"{t * 1e3:.0f}", "—", fmt(matmul_flops / t / 1e9, 1), "—"])
                continue
            impl, case = name.split("/")
            rate = tokens / t
            rows.append([label, f"{B}×{T}", f"{impl}, {case}", f"{t * 1e3:.0f}", fmt(rate, 0),
                         fmt(rate * flops / 1e9, 1), fmt(accounting.achieved_fraction(rate, flops, peak))])
        if "minibert/everything" not in cases:
            rows.append([label, f"{B}×{T}", "minibert, everything", "skipped", "—", "—",
                         f"captures {everything_bytes / 2**30:.1f} GiB > 30% of free memory"])
        if isinstance(tl, str):
            rows.append([label, f"{B}×{T}", "TransformerLens", tl, "—", "—", "—"])
        record = {"model": label, "B": B, "T": T, "times": times, "peak_flops": peak, "flops_per_token": flops,
                  "peak_size": peak_size,
                  "params": model.param_count()}
        results.append(record)
        ratio_rows += ratio_lines(record)
        del model, eager, sdpa, cases  # the closures hold the models: free them before the next config
    profile_text, profile = where_time_goes(settings)
    gemm_text, gemms = gemm_kernels(settings)
    text = (markdown_table(["model", "B×T", "implementation, captured", "ms/batch", "tokens/s", "GFLOP/s",
                            "of matmul peak"], rows)
            + "\n\nRatios (minibert tokens/s ÷ peer tokens/s) and targets:\n\n"
            + markdown_table(["model", "B×T", "comparison", "value", "target", "met"], ratio_rows)
            + "\n\n" + profile_text + "\n\n" + gemm_text)
    return text, {"dense": results, "profile": profile, "gemm": gemms}


GEMM_SHAPES = [(1024, 384, 384), (1024, 384, 1536), (1024, 1536, 384), (1024, 768, 768), (1024, 768, 3072),
               (1024, 3072, 768), (PEAK_SIZE, PEAK_SIZE, PEAK_SIZE)]


def gemm_kernels(settings: Settings) -> tuple[str, dict]:
    """x·W + b at the models' dense-layer shapes (8×128 tokens): XLA's CPU dot against torch's linear."""
    import torch

    cases, flops = {}, {}
    for m, k, n in GEMM_SHAPES[:2] if settings.smoke else GEMM_SHAPES:
        keys = jax.random.split(jax.random.key(0))
        x, w = (jax.random.normal(key, shape) for key, shape in zip(keys, ((m, k), (k, n))))
        b = jnp.zeros((n,))
        dense_jax = jax.jit(lambda x, w, b: x @ w + b)
        tx, tw, tb = torch.randn(m, k), torch.randn(n, k), torch.zeros(n)
        label = f"{m}×{k} · {k}×{n}"
        cases[f"jax {label}"] = lambda f=dense_jax, x=x, w=w, b=b: f(x, w, b).block_until_ready()
        cases[f"torch {label}"] = lambda x=tx, w=tw, b=tb: torch.nn.functional.linear(x, w, b)
        flops[label] = 2 * m * k * n
    with torch.inference_mode():
        times = time_round_robin(cases, dataclasses.replace(settings, repeats=settings.repeats * 2))
    if settings.smoke:
        check_times(times)
    rows = [[label, fmt(f / times[f"jax {label}"] / 1e9, 1), fmt(f / times[f"torch {label}"] / 1e9, 1),
             f"{times[f'torch {label}'] / times[f'jax {label}']:.2f}"] for label, f in flops.items()]
    text = ("Dense-layer matmuls alone (x·W + b, fp32, the shapes of an 8×128 batch), XLA:CPU against torch, "
            "interleaved:\n\n" + markdown_table(["m×k · k×n", "jax GFLOP/s", "torch GFLOP/s", "jax speed ÷ torch"],
                                                   rows))
    return text, {label: {"jax_s": times[f"jax {label}"], "torch_s": times[f"torch {label}"]} for label in flops}


def where_time_goes(settings: Settings) -> tuple[str, dict]:
    """Per-op profiles of the bundled MiniLM at 8×128, minibert next to transformers (benchmarks/op_profile.py)."""

    from op_profile import category_table, profile_minibert, profile_transformers

    B, T = batch_shape(settings)
    model, directory, batch = minibert.load(), bundled_dir(), random_ids(B, T)
    columns = {
        "minibert, nothing": profile_minibert(model, batch)[:2],
        "transformers sdpa": profile_transformers(hf_model(directory, "sdpa"), batch, False)[:2],
        "minibert, patterns": profile_minibert(model, batch, PATTERNS)[:2],
        "transformers eager + attentions": profile_transformers(hf_model(directory, "eager"), batch, True)[:2],
    }
    text = (f"Where the time goes (all-MiniLM-L6-v2, {B}×{T}; `python benchmarks/op_profile.py` for any model and "
            "case): op times from jax.profiler (XLA thunks) and torch.profiler (aten ops, self time), grouped.\n\n"
            + category_table(columns))
    return text, {name: {"categories": c, "wall_s": w} for name, (c, w) in columns.items()}


RATIO_TARGETS = {  # (model prefix, B, T): [(minibert case, peer case or "peak", target)]
    ("all-MiniLM", 8, 128): [("patterns", "transformers eager/patterns", 1.25),
                             ("nothing", "transformers sdpa/nothing", 1.25)],
    ("bert-base", 8, 128): [("patterns", "transformers eager/patterns", 1.0),
                            ("nothing", "transformers sdpa/nothing", 1.0), ("nothing", "peak", 0.85)],
}


def ratio_lines(record: dict) -> list[list[str]]:
    times, shape = record["times"], f"{record['B']}×{record['T']}"
    targets = next((t for (prefix, B, T), t in RATIO_TARGETS.items()
                    if record["model"].startswith(prefix) and (B, T) == (record["B"], record["T"])), [])
    lines = []
    for case in ("nothing", "patterns", "everything"):
        mine = times.get(f"minibert/{case}")
        if mine is None:
            continue
        peers = [p for p in times if p.endswith(f"/{case}") and not p.startswith("minibert")]
        for peer in peers:
            target = next((t for c, p, t in targets if c == case and p == peer), None)
            ratio = times[peer] / mine
            lines.append([record["model"], shape, f"minibert {case} vs {peer.replace('/', ', ')}", f"{ratio:.2f}×",
                          f"≥ {target}×" if target else "—",
                          ("yes" if ratio >= target else "**no**") if target else "—"])
    target = next((t for c, p, t in targets if p == "peak"), None)
    fraction = accounting.achieved_fraction(record["B"] * record["T"] / times["minibert/nothing"],
                                            record["flops_per_token"], record["peak_flops"])
    lines.append([record["model"], shape, "minibert nothing: model FLOP/s ÷ measured jax matmul peak",
                  f"{fraction:.2f}", f"≥ {target}" if target else "—",
                  ("yes" if fraction >= target else "**no**") if target else "—"])
    torch_peak = 2 * record["peak_size"]**3 / times["torch matmul"]
    lines.append([record["model"], shape, "(context) torch matmul peak ÷ jax matmul peak",
                  f"{torch_peak / record['peak_flops']:.2f}", "—", "—"])
    return lines


# ---- hook machinery overhead (issue 3) -------------------------------------------------------------------

def _program_text(jitted, *args) -> str:
    """The compiled program's instructions, without source locations (which name different Python frames)."""
    lines = jitted.lower(*args).compile().as_text().splitlines()
    instructions = [re.sub(r", (metadata|stack_frame_id)=(\{[^}]*\}|\d+)", "", line) for line in lines
                    if " = " in line and not line[:1].isdigit()]
    return "\n".join(instructions)


def hook_overhead(settings: Settings) -> tuple[str, dict]:
    """A forward with no hook active against the same module with no hook machinery at all."""
    model = minibert.load()
    graphdef, state = nnx.split(model.module)  # the public Flax module, split by Flax itself
    bare = jax.jit(lambda state, inputs: nnx.merge(graphdef, state)(inputs.input_ids, inputs.token_type_ids,
                                                                    inputs.attention_mask, NO_HOOKS))
    hooked = jax.jit(model.forward_fn())
    rows, out = [], {}
    for B, T in (SMOKE_SHAPE,) if settings.smoke else ((8, 128), SMOKE_SHAPE):
        batch = random_ids(B, T)
        inputs = model.inputs(batch)
        same = _program_text(bare, state, inputs) == _program_text(hooked, model.state, inputs)
        samples = time_samples({
            "no hook machinery (NoHooks, jitted module)": lambda: block(bare(state, inputs)),
            "hook machinery, nothing active (forward_fn)": lambda: block(hooked(model.state, inputs)),
            "public model.run(batch) from NumPy ids": lambda: block(model.run(batch)[0]),
        }, dataclasses.replace(settings, repeats=settings.repeats * 3))
        if settings.smoke:
            check_times({name: min(t) for name, t in samples.items()})
        base = samples["no hook machinery (NoHooks, jitted module)"]
        for name, t in samples.items():
            median, best = np.median(t) / np.median(base) - 1, min(t) / min(base) - 1
            checked = "forward_fn" in name
            rows.append([f"{B}×{T}", name, f"{np.median(t) * 1e3:.2f}", f"{min(t) * 1e3:.2f}", f"{median * 100:+.1f}%",
                         f"{best * 100:+.1f}%", "≤ +2%" if checked else "—",
                         ("yes" if median <= 0.02 else "**no**") if checked else "—"])
        rows.append([f"{B}×{T}", "compiled programs identical (HLO instructions)", "yes" if same else "**no**",
                     "", "", "", "", ""])
        out[f"{B}x{T}"] = {"times": samples, "identical_programs": same}
    return markdown_table(["B×T", "path", "median ms", "best ms", "vs no machinery (median)",
                           "vs no machinery (best)", "target", "met"], rows), out


# ---- GPU (only where one is present) ---------------------------------------------------------------------

def gpu(settings: Settings) -> tuple[str, dict]:
    devices = [d for d in jax.devices() if d.platform == "gpu"]
    if not devices:
        return ("No GPU in this run: the GPU rows (bert-base bf16, B=64, T=128 and 512: fused path, explicit "
                "path, everything captured; MFU against the datasheet peak) were not measured."), {}
    peak = accounting.peak_flops(devices[0], jnp.bfloat16)
    base = make_bert_base(scratch_dir() / "bert-base-random")
    model = minibert.load(base, dtype=jnp.bfloat16)
    noop = {"blocks.*.attn.hook_attn_scores": lambda value, ctx: value}  # forces the explicit path, stores nothing
    rows, out = [], {}
    for T in (128, 512):
        B = 64
        batch = random_ids(B, T)
        cases = {
            "fused (nothing captured)": lambda: block(model.run(batch)[0]),
            "explicit (no-op hook on hook_attn_scores)": lambda: block(model.run(batch, hooks=noop)[0]),
            "patterns captured": lambda: block(dict(model.run(batch, names=PATTERNS)[1])),
        }
        if capture_bytes(model, B, T) < 0.5 * (devices[0].memory_stats() or {}).get("bytes_limit", 0):
            cases["everything captured"] = lambda: block(dict(model.run_with_cache(batch)[1]))
        times = time_round_robin(cases, settings)
        flops = accounting.flops_per_token(model.config, T)
        for name, t in times.items():
            rate = B * T / t
            mfu = accounting.achieved_fraction(rate, flops, peak) if peak else None
            rows.append([devices[0].device_kind, f"{B}×{T}", name, f"{t * 1e3:.1f}", fmt(rate, 0),
                         fmt(rate * flops / 1e12, 1), fmt(mfu)])
        out[f"{B}x{T}"] = times
    header = ["device", "B×T", "path", "ms/batch", "tokens/s", "TFLOP/s",
              f"MFU (peak {fmt(peak and peak / 1e12, 0)} TFLOP/s bf16)"]
    return markdown_table(header, rows), out


# ---- smoke run (CI) ----------------------------------------------------------------------------------------

def check_forward(model, batch: dict, peer_hidden: np.ndarray) -> None:
    """minibert's and the peer's last hidden states of the timed batch are finite and [B, T, D]."""
    ours = np.asarray(model.run(batch)[0].last_hidden_state)
    expected = (*batch["input_ids"].shape, model.config.hidden_size)
    assert ours.shape == peer_hidden.shape == expected, (ours.shape, peer_hidden.shape, expected)
    assert np.isfinite(ours).all() and np.isfinite(peer_hidden).all()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", required=True,
                        help="every section on MiniLM at 1×16, one timed call per case, timings checked")
    parser.parse_args(argv)
    settings = Settings.make(quick=True, smoke=True)
    print("smoke run: all-MiniLM-L6-v2 at 1×16, one timed call per case (python benchmarks/run.py for numbers)\n")
    for section in (core, dense, hook_overhead, gpu):
        text, _ = section(settings)
        print(f"## {section.__name__}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
