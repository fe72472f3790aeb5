"""Intervention sweeps on the bundled model, one ~40-token sentence pair, minibert against the loop researchers
write in transformers (one forward per swept item, a torch forward hook doing the intervention):

- every head zero-ablated alone (6 × 12 = 72 runs): minibert's `ablation_sweep` (one compiled suffix program,
  heads vmapped) against 72 forwards with a pre-hook zeroing head h's slice of the input to W_O;
- layer × position patching of hook_resid_pre (6 × T runs): `patch_activations` against 6·T forwards with a
  pre-hook on block l replacing position p of its input with the clean run's;
- attribution patching (one forward + one backward) against the real patching it estimates: time, and the
  Pearson correlation of the two grids for several sites, per head for attn.hook_z.

Peak memory: the compiled suffix program's buffers (XLA's memory_analysis) and the process's resident set.

    python benchmarks/sweeps.py [--quick] [--torch-threads N]      # prints a Markdown section for benchmarks/RESULTS.md
    taskset -c 0 python benchmarks/sweeps.py --quick --torch-threads 1   # both peers on the same one core

A comparison gives both peers the same cores: both on every core (the default), or both pinned to one core
with taskset and one torch thread. --torch-threads 1 without taskset leaves XLA every core: not a comparison.
    python benchmarks/sweeps.py --smoke                             # a short pair, one run of each case (CI)

Only the public API: the suffix program whose memory is measured is built from Model.jit, Model.suffix and
interventions.ablate_heads, as ablation_sweep builds it.
"""

from __future__ import annotations

import os
import resource
import time

import harness
import jax
import jax.numpy as jnp
import numpy as np
from harness import Settings, bundled_dir, fmt, hf_model, load_average, machine, markdown_table, time_round_robin

import minibert
from minibert import HookFn
from minibert.analysis import interventions
from minibert.runtime import accounting

SENTENCE = "the committee approved the new budget after a long debate about schools and roads ."
PAIR = ("after hours of heated discussion , the board finally accepted the spending plan for education and "
        "public transport in the city .")
SMOKE_SENTENCE, SMOKE_PAIR = "the committee approved the budget .", "the board accepted the plan ."


# ---- the metric, in both frameworks: cosine of the mean-pooled output with the clean run's ----------------------

def jax_metric(model, clean):
    real = jnp.asarray(model.inputs(clean).attention_mask, jnp.float32)[..., None]

    def pool(out):
        pooled = (out.last_hidden_state * real).sum(1) / real.sum(1)
        return pooled / jnp.linalg.norm(pooled, axis=-1, keepdims=True)

    target = pool(model(clean))
    return lambda out: (pool(out) * target).sum(-1)


def torch_metric(hidden, target) -> float:
    import torch

    pooled = torch.nn.functional.normalize(hidden.mean(1), dim=-1)
    return float((pooled * target).sum(-1).mean())


# ---- the transformers loops ------------------------------------------------------------------------------------

def torch_ablation_sweep(hf, inputs, target) -> np.ndarray:
    """[L, H]: one forward per head, a forward pre-hook zeroing head h's K columns of the input to W_O."""
    import torch

    L, H = hf.config.num_hidden_layers, hf.config.num_attention_heads
    K = hf.config.hidden_size // H
    grid = np.zeros((L, H))
    with torch.no_grad():
        for layer in range(L):
            dense = hf.encoder.layer[layer].attention.output.dense
            for head in range(H):
                def zero_head(module, args, head=head):
                    z = args[0].clone()
                    z[..., head * K:(head + 1) * K] = 0
                    return (z,)

                handle = dense.register_forward_pre_hook(zero_head)
                try:
                    grid[layer, head] = torch_metric(hf(**inputs).last_hidden_state, target)
                finally:
                    handle.remove()
    return grid


def torch_patching_grid(hf, clean_inputs, corrupt_inputs, target) -> np.ndarray:
    """[L, T]: one forward of the corrupted input per (layer, position), a forward pre-hook on block l putting the
    clean run's residual stream at position p."""
    import torch

    with torch.no_grad():
        clean_hidden = hf(**clean_inputs, output_hidden_states=True).hidden_states  # L + 1 × [1, T, D]
        L, T = hf.config.num_hidden_layers, clean_hidden[0].shape[1]
        grid = np.zeros((L, T))
        for layer in range(L):
            for position in range(T):
                def patch(module, args, kwargs, layer=layer, position=position):
                    hidden = args[0].clone()
                    hidden[:, position] = clean_hidden[layer][:, position]
                    return (hidden, *args[1:]), kwargs

                handle = hf.encoder.layer[layer].register_forward_pre_hook(patch, with_kwargs=True)
                try:
                    grid[layer, position] = torch_metric(hf(**corrupt_inputs).last_hidden_state, target)
                finally:
                    handle.remove()
    return grid


# ---- minibert: real per-head patching, the reference for attribution patching on attn.hook_z -------------------

def _patch_head(z, ctx, layer, head, clean):
    chosen = (ctx.layer == layer) & (jnp.arange(z.shape[2]) == head)[None, None, :, None]
    return jnp.where(chosen, clean[ctx.layer], z)


def head_patching_loop(model, clean, corrupted, metric) -> np.ndarray:
    """[L, H]: the metric with head h's z at every position patched from the clean run, one forward each."""
    clean_z = model.run_with_cache(clean, names="blocks.*.attn.hook_z")[1].stack("attn.hook_z")
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    return np.array([[float(jnp.mean(metric(model.run_with_hooks(corrupted, {"blocks.*.attn.hook_z": HookFn(
        _patch_head, layer=jnp.int32(layer), head=jnp.int32(head), clean=clean_z)})))) for head in range(H)]
        for layer in range(L)])


def correlations(model, clean, corrupted, metric, sites) -> list[list[str]]:
    base = float(jnp.mean(metric(model(corrupted))))
    rows = []
    for site in sites:
        per = "head" if site == "attn.hook_z" else "position"
        estimate = interventions.attribution_patching(model, clean, corrupted, metric, site=site, per=per)
        if site == "attn.hook_z":
            real, grid = head_patching_loop(model, clean, corrupted, metric), "[L, H]: each head at every position"
        else:
            real, grid = interventions.patch_activations(model, clean, corrupted, metric, site=site), "[L, T]"
        r = np.corrcoef(estimate.ravel(), (real - base).ravel())[0, 1]
        rows.append([f"`{site}`", grid, f"{r:.3f}", f"{np.abs(real - base).max():.3f}"])
    return rows


# ---- memory ------------------------------------------------------------------------------------------------

def _ablation_suffix(model, state, inputs, layer, resid, heads, *, metric):
    """ablation_sweep's program for one chunk of heads: each head of block `layer` zero-ablated, the suffix from
    the stream entering that block, the metric's mean over rows."""
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads

    def one(head):
        mask = (jnp.arange(L)[:, None] == layer) & (jnp.arange(H)[None, :] == head)
        return metric(model.suffix(state, layer, resid, inputs, interventions.ablate_heads(mask))).mean()

    return jax.vmap(one)(heads)


def suffix_program_bytes(model, batch, metric, items: int) -> dict[str, int]:
    """XLA's buffer sizes for ablation_sweep's compiled suffix program over `items` heads."""
    inputs = model.inputs(batch)
    resid = jnp.zeros((*inputs.shape, model.config.hidden_size), jnp.float32)
    program = model.jit(_ablation_suffix, static_argnames=("metric",))
    compiled = program.lower(model.state, inputs, jnp.int32(0), resid, jnp.arange(items, dtype=jnp.int32),
                             metric=metric).compile()
    analysis = compiled.memory_analysis()
    return {"temp": analysis.temp_size_in_bytes, "arguments": analysis.argument_size_in_bytes,
            "outputs": analysis.output_size_in_bytes}


def rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main(argv=None) -> int:
    parser = harness.command_line(__doc__, smoke="a short sentence pair, one run per case (CI)")
    cores = len(os.sched_getaffinity(0))
    parser.add_argument("--torch-threads", type=int, default=cores,
                        help="PyTorch's intra-op threads (default: every core this process may use, as XLA; "
                             "1 only under taskset -c N, so that both peers have the same one core)")
    args = parser.parse_args(argv)
    settings = Settings.make(args.quick, args.smoke)
    sentence, pair = (SMOKE_SENTENCE, SMOKE_PAIR) if args.smoke else (SENTENCE, PAIR)
    import torch

    torch.set_num_threads(args.torch_threads)
    load_at_start = load_average()
    model = minibert.load()
    corrupt = sentence.replace("approved", "rejected")
    clean, corrupted = model.tokenize([sentence], [pair]), model.tokenize([corrupt], [pair])
    T = clean.input_ids.shape[1]
    assert corrupted.input_ids.shape[1] == T, "the corrupted sentence must keep the token count"
    metric = jax_metric(model, clean)

    rss_before = rss_gib()
    first = {}
    for name, fn in (("ablation", lambda: interventions.ablation_sweep(model, clean, metric)),
                     ("patching", lambda: interventions.patch_activations(model, clean, corrupted, metric)),
                     ("attribution", lambda: interventions.attribution_patching(model, clean, corrupted, metric))):
        traces = model.programs.traces
        start = time.perf_counter()
        fn()
        first[name] = (time.perf_counter() - start, model.programs.traces - traces)
    rss_after = rss_gib()

    hf = hf_model(bundled_dir(), "eager")
    as_torch = lambda batch: {k: torch.as_tensor(np.asarray(v), dtype=torch.long)  # noqa: E731
                              for k, v in batch.to_dict().items()}
    clean_t, corrupt_t = as_torch(clean), as_torch(corrupted)
    with torch.no_grad():
        target = torch.nn.functional.normalize(hf(**clean_t).last_hidden_state.mean(1), dim=-1)
    ablation_gap = np.abs(interventions.ablation_sweep(model, clean, metric)
                          - torch_ablation_sweep(hf, clean_t, target)).max()
    patching_gap = np.abs(interventions.patch_activations(model, clean, corrupted, metric)
                          - torch_patching_grid(hf, clean_t, corrupt_t, target)).max()

    times = time_round_robin({
        "minibert ablation_sweep": lambda: interventions.ablation_sweep(model, clean, metric),
        "transformers, 72 hooked forwards": lambda: torch_ablation_sweep(hf, clean_t, target),
        "minibert patch_activations": lambda: interventions.patch_activations(model, clean, corrupted, metric),
        f"transformers, {6 * T} hooked forwards": lambda: torch_patching_grid(hf, clean_t, corrupt_t, target),
        "minibert attribution_patching": lambda: interventions.attribution_patching(model, clean, corrupted, metric),
    }, settings)
    memory = suffix_program_bytes(model, clean, metric, model.config.num_attention_heads)
    forward = suffix_program_bytes(model, clean, metric, 1)

    info = machine()
    run = "smoke" if args.smoke else "quick" if settings.quick else "full"
    print(f"## Sweeps — {info['cpu']} ({info['cores']} cores), {info['date']}, "
          f"{run} run (`python benchmarks/sweeps.py"
          f"{' --' + run if run != 'full' else ''} --torch-threads {args.torch_threads}`; cores this process and "
          f"so XLA may use: {sorted(os.sched_getaffinity(0))})\n")
    if args.torch_threads != cores:
        print(f"**Not a same-cores comparison**: PyTorch had {args.torch_threads} thread(s), XLA {cores} core(s); pin "
              f"both with taskset -c N and --torch-threads 1.\n")
    print(f"{info['versions']}. Bundled all-MiniLM-L6-v2, one sentence pair of {T} tokens (B = 1); metric: cosine "
          f"of the mean-pooled output with the clean run's. Median of {settings.repeats} runs, interleaved, compiled "
          f"programs warm. Largest difference from the transformers loops: {ablation_gap:.1e} (ablation), "
          f"{patching_gap:.1e} (patching). Load average (1, 5, 15 min) at start {load_at_start}, at end "
          f"{load_average()}.\n")
    pairs = [("minibert ablation_sweep", "transformers, 72 hooked forwards"),
             ("minibert patch_activations", f"transformers, {6 * T} hooked forwards")]
    rows = []
    for ours, theirs in pairs:
        rows.append([ours, fmt(times[ours] * 1e3, 1), "1.0×"])
        rows.append([theirs, fmt(times[theirs] * 1e3, 1), fmt(times[theirs] / times[ours], 1) + "×"])
    attribution = times["minibert attribution_patching"]
    rows.append(["minibert attribution_patching (whole [L, T] grid)", fmt(attribution * 1e3, 1),
                 fmt(times["minibert patch_activations"] / attribution, 1) + "× faster than patch_activations"])
    print(markdown_table(["case", "ms", "transformers loop ÷ minibert"], rows))
    print("\nFirst call in the process (trace + compile + run), and programs traced: "
          + "; ".join(f"{name} {seconds:.2f} s ({traces} traces)" for name, (seconds, traces) in first.items()) + ".\n")
    mib = lambda n: f"{n / 2**20:.1f} MiB"  # noqa: E731
    print(f"Memory: the suffix program over all 12 heads of a layer needs {mib(memory['temp'])} of temporary buffers "
          f"({mib(memory['arguments'])} of arguments, mostly the weights), against {mib(forward['temp'])} for one "
          f"item; the default chunk (accounting.MEMORY_BUDGET = {accounting.MEMORY_BUDGET / 2**30:.0f} GiB ÷ "
          f"{mib(accounting.activation_bytes(model.config, 1, T))} estimated per item) holds every item. Peak resident "
          f"set {rss_after:.2f} GiB after the three minibert sweeps (from {rss_before:.2f} GiB after loading).\n")
    print("Attribution patching against real patching (Pearson r over the grid; largest real effect |Δ metric|):\n")
    sites = ("hook_resid_pre",) if args.smoke else ("hook_resid_pre", "hook_attn_out", "hook_mlp_out", "attn.hook_z")
    print(markdown_table(["site", "grid", "r", "max |real effect|"],
                         correlations(model, clean, corrupted, metric, sites)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
