"""The compile tax (issue 28): what a new user's session costs in time, compiled programs and memory, side by side
with transformers eager, each in a fresh process.

    python benchmarks/session.py [--quick] [--smoke] [--out FILE]

1. The notebook session: 20 synthetic sentences of 4-60 words; for each, model(text), run_with_cache of every
   attn.hook_pattern, and run_with_hooks zeroing head 3.7 (a plain lambda, as a new user writes it). transformers
   eager does the same with output_attentions=True and a forward pre-hook zeroing the head's slice of the input
   to layer 3's attention output projection. minibert runs cold (a fresh process, an empty persistent compilation
   cache) and warm (a second process on that cache); transformers runs in a fresh process before each. Times are
   wall seconds of the session after loading; programs: the model's traces (model.programs.traces) and XLA compilations
   (JAX's cache-miss events: with the cache on, every compilation is one); memory: resident set growth over the
   session (/proc/self/statm).
2. The long session: 500 calls of random lengths (1-128 tokens) mixing plain calls, pattern captures and a head
   ablation in a random layer (HookFn, traced head); resident memory growth along the way, at the last call that
   traced a new program (the end of the warm-up) and since then, and the programs the model holds (at most
   model.programs.limit).
3. Fine-tuning: all-MiniLM-L6-v2 with a new classifier, 3 epochs on 2,000 synthetic examples of lognormal
   lengths (median 25 tokens) — quick: 1 epoch on 400 — in a fresh process with an empty cache: the step programs
   (result.step_lengths) and the share of the wall time spent tracing, lowering and compiling (JAX's own duration
   events).

--smoke runs each part on a tiny random model with a few sentences (CI's check that the script runs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

SITE, HEAD, LAYER = "blocks.3.attn.hook_z", 7, 3
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")
TARGETS = {"cold": 3.0, "warm": 1.0, "programs": 24, "growth_mb": 300}  # issue 28's


def rss_mb() -> float:
    """This process's resident set now, MB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def sentences(n: int, seed: int = 0, words: tuple[int, int] = (4, 60)) -> list[str]:
    """n synthetic sentences of common English words, word counts drawn evenly from `words`."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(words[0], words[1] + 1, size=n)
    return [" ".join(harness.WORDS[i] for i in rng.integers(len(harness.WORDS), size=c)).capitalize() + "."
            for c in counts]


# ---- workers: one part in this (fresh) process, a JSON line on stdout --------------------------------------------

class CompileEvents:
    """JAX's monitoring events of this process: cache misses (XLA compilations, with the cache on) and seconds spent
    tracing, lowering and compiling."""

    def __init__(self):
        import jax.monitoring

        self.misses, self.hits, self.seconds = 0, 0, 0.0
        jax.monitoring.register_event_listener(self.count)
        jax.monitoring.register_event_duration_secs_listener(self.time)

    def count(self, event, **kwargs):
        self.misses += event == "/jax/compilation_cache/cache_misses"
        self.hits += event == "/jax/compilation_cache/cache_hits"

    def time(self, event, duration, **kwargs):
        self.seconds += duration if event in COMPILE_EVENTS else 0.0


def load_minibert(smoke: bool):
    import minibert

    return minibert.load(tiny_dir() if smoke else None)


def tiny_dir() -> Path:
    """A tiny random BertModel (4 layers of 8 heads, 64 wide: head 3.7 exists) saved with transformers and the
    bundled vocabulary, for --smoke."""
    import shutil

    import torch
    import transformers

    directory = harness.scratch_dir() / "session-tiny"
    if not (directory / "model.safetensors").exists():
        directory.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        cfg = transformers.BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=4, num_attention_heads=8,
                                      intermediate_size=128, max_position_embeddings=512,
                                      architectures=["BertModel"])
        transformers.BertModel(cfg).eval().save_pretrained(directory)
        for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
            if (harness.bundled_dir() / name).exists():
                shutil.copy(harness.bundled_dir() / name, directory / name)
    return directory


def notebook_minibert(texts: list[str], smoke: bool, dump: str) -> dict:
    events = CompileEvents()
    model = load_minibert(smoke)
    before, start = rss_mb(), time.perf_counter()
    first = None
    for text in texts:
        hidden = np.asarray(model(text).last_hidden_state)
        _, cache = model.run_with_cache(text, names="blocks.*.attn.hook_pattern")
        patterns = np.stack([np.asarray(pattern) for pattern in cache.values()])  # [L, B, H, T, S]
        ablated = np.asarray(model.run_with_hooks(text, {SITE: lambda z, ctx: z.at[:, :, HEAD].set(0.0)})
                             .last_hidden_state)
        first = first or (hidden, patterns, ablated)
    seconds = time.perf_counter() - start
    np.savez(dump, hidden=first[0], patterns=first[1], ablated=first[2])
    return {"seconds": seconds, "programs": model.programs.traces, "xla_compiles": events.misses,
            "cache_hits": events.hits,
            "growth_mb": rss_mb() - before}


def notebook_transformers(texts: list[str], smoke: bool, dump: str) -> dict:
    import torch
    import transformers

    directory = tiny_dir() if smoke else harness.bundled_dir()
    model = harness.hf_model(directory, "eager")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    width = model.config.hidden_size // model.config.num_attention_heads

    def zero_head(module, args):
        context = args[0].clone()
        context[..., HEAD * width:(HEAD + 1) * width] = 0.0
        return (context,)

    projection = model.encoder.layer[LAYER].attention.output.dense
    before, start = rss_mb(), time.perf_counter()
    first = None
    with torch.no_grad():
        for text in texts:
            batch = tokenizer([text], return_tensors="pt")
            hidden = model(**batch).last_hidden_state.numpy()
            patterns = np.stack([pattern.numpy() for pattern in model(**batch, output_attentions=True).attentions])
            handle = projection.register_forward_pre_hook(zero_head)
            ablated = model(**batch).last_hidden_state.numpy()
            handle.remove()
            first = first or (hidden, patterns, ablated)
    seconds = time.perf_counter() - start
    np.savez(dump, hidden=first[0], patterns=first[1], ablated=first[2])
    return {"seconds": seconds, "growth_mb": rss_mb() - before}


def _zero_head(z, ctx, head):
    import jax.numpy as jnp

    return jnp.where(jnp.arange(z.shape[2])[None, None, :, None] == head, 0.0, z)


def long_session(calls: int, smoke: bool, program_limit: int | None = None) -> dict:
    import jax.numpy as jnp

    import minibert

    model = load_minibert(smoke)
    if program_limit is not None:  # fewer than the session needs: the least recently used are dropped and traced again
        model.programs.limit = program_limit
    rng = np.random.default_rng(0)
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    rss, start, warmed = {}, rss_mb(), (0, 0.0)
    for call in range(calls):
        traces = model.programs.traces
        ids = {"input_ids": rng.integers(1996, 30000, size=(1, int(rng.integers(1, 129))))}
        kind = call % 3
        if kind == 0:
            np.asarray(model(ids).last_hidden_state)
        elif kind == 1:
            np.stack([np.asarray(p) for p in model.run_with_cache(ids, names="blocks.*.attn.hook_pattern")[1].values()])
        else:
            hook = minibert.HookFn(_zero_head, head=jnp.int32(rng.integers(heads)))
            np.asarray(model.run_with_hooks(ids, {f"blocks.{rng.integers(layers)}.attn.hook_z": hook})
                       .last_hidden_state)
        if model.programs.traces > traces:  # the last call that traced a program ends the warm-up
            warmed = (call + 1, rss_mb() - start)
        if call + 1 in (calls // 5, calls // 2, calls):
            rss[call + 1] = rss_mb() - start
    return {"rss_growth_mb": rss, "programs": model.programs.traces, "resident": model.programs.count,
            "program_limit": model.programs.limit, "warm_after_calls": warmed[0], "rss_growth_at_warm_mb": warmed[1]}


def finetune(examples: int, epochs: int, smoke: bool) -> dict:
    from minibert import training

    events = CompileEvents()
    model = load_minibert(smoke)
    rng = np.random.default_rng(0)
    words = np.maximum(np.round(rng.lognormal(np.log(25 / 1.15), 0.6, examples)), 1).astype(int)  # ~1.15 pieces
    rows = [training.Example(" ".join(harness.WORDS[i] for i in rng.integers(len(harness.WORDS), size=n)), None,
                             int(rng.integers(2))) for n in words]
    tokens = [len(model.to_str_tokens(row.text)) for row in rows]
    before, events.seconds = events.seconds, 0.0  # loading's compiles are not the fine-tuning's
    start = time.perf_counter()
    result = training.finetune(model, rows, num_labels=2, epochs=epochs, batch_size=16, progress=False)
    wall = time.perf_counter() - start
    return {"wall_s": wall, "compile_s": events.seconds, "loading_compile_s": before,
            "step_programs": len(result.step_lengths),
            "step_lengths": list(result.step_lengths), "median_tokens": float(np.median(tokens)),
            "final_loss": result.history.loss[-1]}


def worker(args) -> None:
    texts = sentences(args.sentences)
    if args.worker == "minibert":
        report = notebook_minibert(texts, args.smoke, args.dump)
    elif args.worker == "transformers":
        report = notebook_transformers(texts, args.smoke, args.dump)
    elif args.worker == "long":
        report = long_session(args.calls, args.smoke, args.program_limit)
    else:
        report = finetune(args.examples, args.epochs, args.smoke)
    print(json.dumps(report))


# ---- the driver -------------------------------------------------------------------------------------------------

def run_worker(part: str, cache: Path, *extra: str) -> dict:
    """One part in a fresh Python process whose persistent compilation cache is `cache`."""
    env = os.environ | {"MINIBERT_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, __file__, "--worker", part, *extra], capture_output=True, text=True,
                          env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{part} worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def largest_gap(a: str, b: str) -> dict[str, float]:
    """Largest absolute difference of each output between two workers' dumps."""
    x, y = np.load(a), np.load(b)
    return {name: float(np.max(np.abs(x[name] - y[name].reshape(x[name].shape)))) for name in x.files}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fine-tune 1 epoch on 400 examples")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, 3 sentences, 30 calls, 48 examples")
    parser.add_argument("--out", help="also write the numbers as JSON here")
    parser.add_argument("--worker", choices=("minibert", "transformers", "long", "finetune"), help=argparse.SUPPRESS)
    parser.add_argument("--sentences", type=int, default=20, help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=500, help=argparse.SUPPRESS)
    parser.add_argument("--program-limit", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--examples", type=int, default=2000, help=argparse.SUPPRESS)
    parser.add_argument("--epochs", type=int, default=3, help=argparse.SUPPRESS)
    parser.add_argument("--dump", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0

    smoke = ["--smoke"] if args.smoke else []
    n = "3" if args.smoke else "20"
    calls = "30" if args.smoke else "500"
    examples, epochs = ("48", "1") if args.smoke else ("400", "1") if args.quick else ("2000", "3")
    with tempfile.TemporaryDirectory(prefix="minibert-session-") as scratch:
        scratch, cache = Path(scratch), Path(scratch) / "jax-cache"
        dumps = {name: str(scratch / f"{name}.npz") for name in ("minibert", "transformers")}
        peer_cold = run_worker("transformers", cache, "--sentences", n, "--dump", dumps["transformers"], *smoke)
        cold = run_worker("minibert", cache, "--sentences", n, "--dump", dumps["minibert"], *smoke)
        peer_warm = run_worker("transformers", cache, "--sentences", n, "--dump", dumps["transformers"], *smoke)
        warm = run_worker("minibert", cache, "--sentences", n, "--dump", dumps["minibert"], *smoke)
        gaps = largest_gap(dumps["minibert"], dumps["transformers"])
        long = run_worker("long", scratch / "long-cache", "--calls", calls, *smoke)
        tuned = run_worker("finetune", scratch / "finetune-cache", "--examples", examples, "--epochs", epochs, *smoke)

    numbers = {"machine": harness.machine(), "load_average": harness.load_average(), "cold": cold, "warm": warm,
               "transformers_cold": peer_cold, "transformers_warm": peer_warm, "largest_gap": gaps, "long": long,
               "finetune": tuned}
    print(report(numbers, args))
    if args.smoke:
        check(numbers)
    if args.out:
        Path(args.out).write_text(json.dumps(numbers, indent=2))
    return 0


def report(numbers: dict, args) -> str:
    m, cold, warm = numbers["machine"], numbers["cold"], numbers["warm"]
    peer_cold, peer_warm, long, tuned = (numbers[k] for k in ("transformers_cold", "transformers_warm", "long",
                                                              "finetune"))
    title = "## Compile tax: a session" + (" (smoke run)" if args.smoke else " (quick)" if args.quick else "")
    lines = [title, "", f"{m['cpu']}, {m['cores']} cores, {m['memory']}; {m['versions']}; {m['date']}, load "
             f"average {numbers['load_average']} (a machine shared with other work)", ""]
    rows = [["notebook session, cold (fresh process, empty cache)", f"{cold['seconds']:.2f} s",
             f"{peer_cold['seconds']:.2f} s", f"{cold['seconds'] / peer_cold['seconds']:.1f}×",
             f"{cold['programs']} ({cold['xla_compiles']} XLA)", f"{cold['growth_mb']:.0f} MB",
             f"{peer_cold['growth_mb']:.0f} MB"],
            ["notebook session, warm (second process, cache)", f"{warm['seconds']:.2f} s",
             f"{peer_warm['seconds']:.2f} s", f"{warm['seconds'] / peer_warm['seconds']:.1f}×",
             f"{warm['programs']} ({warm['xla_compiles']} XLA, {warm['cache_hits']} loaded)",
             f"{warm['growth_mb']:.0f} MB", f"{peer_warm['growth_mb']:.0f} MB"]]
    lines += [harness.markdown_table(["", "minibert", "transformers eager", "ratio",
                                      "programs traced (XLA compilations)", "minibert RSS growth",
                                      "transformers RSS growth"], rows), ""]
    lines += ["Largest difference from transformers (first sentence): " +
              ", ".join(f"{k} {v:.1e}" for k, v in numbers["largest_gap"].items()), ""]
    calls = sorted(long["rss_growth_mb"], key=int)
    lines += [harness.markdown_table(
        ["long session", *[f"RSS growth after {c} calls" for c in calls], "last new program (RSS growth then)",
         "growth since", "programs traced", "resident (cap)"],
        [["random lengths 1-128, plain / patterns / head ablation in a random layer",
          *[f"{long['rss_growth_mb'][c]:.0f} MB" for c in calls],
          f"call {long['warm_after_calls']} ({long['rss_growth_at_warm_mb']:.0f} MB)",
          f"{long['rss_growth_mb'][calls[-1]] - long['rss_growth_at_warm_mb']:+.0f} MB", str(long["programs"]),
          f"{long['resident']} ({long['program_limit']})"]]), ""]
    lines += [harness.markdown_table(
        ["fine-tuning", "wall", "tracing + lowering + compiling", "share", "step programs (row lengths)",
         "median tokens"],
        [[f"{examples_of(args)}", f"{tuned['wall_s']:.1f} s", f"{tuned['compile_s']:.1f} s",
          f"{tuned['compile_s'] / tuned['wall_s']:.0%}",
          f"{tuned['step_programs']} ({', '.join(map(str, tuned['step_lengths']))})",
          f"{tuned['median_tokens']:.0f}"]])]
    return "\n".join(lines)


def examples_of(args) -> str:
    if args.smoke:
        return "tiny model, 48 examples, 1 epoch"
    return "MiniLM, 400 examples, 1 epoch" if args.quick else "MiniLM, 2,000 examples, 3 epochs"


def check(numbers: dict) -> None:
    """A smoke run's checks: times finite and positive, the same outputs as transformers, programs counted."""
    harness.check_times({k: numbers[k]["seconds"] for k in ("cold", "warm", "transformers_cold",
                                                            "transformers_warm")})
    assert max(numbers["largest_gap"].values()) < 1e-3, numbers["largest_gap"]  # fp32 parity, far below a bug's size
    assert numbers["warm"]["xla_compiles"] == 0 < numbers["cold"]["xla_compiles"], (numbers["cold"], numbers["warm"])
    assert numbers["long"]["resident"] <= numbers["long"]["program_limit"]
    assert numbers["finetune"]["step_programs"] == len(numbers["finetune"]["step_lengths"]) > 0


if __name__ == "__main__":
    sys.exit(main())
