"""A crosscoder training step next to a single SAE step: time and memory, on MiniLM pairs — the bundled
all-MiniLM-L6-v2 (A) and a perturbed copy of it (B: every weight + 1% of its own standard deviation of Gaussian
noise, a stand-in for a fine-tune; said so in the report), block 3's output, 384 → 4,096 latents, k = 32.

Rows: the paired stream (`diffing.paired_activations`: texts packed once, one forward of each model per batch)
against one model's stream (`sae.activations`), tokens per second; one compiled crosscoder step (BatchTopK, L1)
against one compiled TopK SAE step, milliseconds per batch of 1,024 tokens (median of interleaved calls); and the
memory XLA's compiled step reports (`memory_analysis()`: arguments + temporaries), with the state the trainer
holds (parameters + Adam's moments).

    python benchmarks/diffing.py [--smoke]     # prints a Markdown section for benchmarks/RESULTS.md
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from harness import (
    Settings,
    bundled_dir,
    command_line,
    english_like_texts,
    fmt,
    load_average,
    machine,
    markdown_table,
    scratch_dir,
    time_round_robin,
    tiny_checkpoint,
)

import minibert
from minibert.analysis import diffing, sae

FULL = dict(texts=256, width=4096, k=32, batch=1024, layer=3)
SMOKE = dict(texts=48, width=64, k=4, batch=64, layer=1)


def perturbed(model, scale: float = 0.01, seed: int = 0):
    """A copy of `model` with every weight + scale · its standard deviation · N(0, 1) noise."""
    rng = np.random.default_rng(seed)
    parameters = {name: np.asarray(value) + scale * np.asarray(value).std() * rng.normal(size=value.shape)
                  for name, value in model.named_parameters().items()}
    parameters = {name: jnp.asarray(value, jnp.float32) for name, value in parameters.items()}
    return type(model).from_parameters(model.config, parameters, model.tokenizer, source=f"{model.source} + noise")


def stream_rate(make_stream) -> tuple[int, float]:
    start, tokens = time.perf_counter(), 0
    for x in make_stream():
        tokens += len(x)
    return tokens, tokens / (time.perf_counter() - start)


def step_memory(trainer, x) -> int:
    """Bytes XLA's compiled step uses for its arguments and temporaries."""
    analysis = trainer.compiled_step(x).memory_analysis()
    return int(analysis.argument_size_in_bytes + analysis.temp_size_in_bytes)


def state_bytes(*trees) -> int:
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(trees))


def main(argv=None) -> int:
    args = command_line(__doc__, "tiny sizes: checks the script runs", quick=None).parse_args(argv)
    sizes = SMOKE if args.smoke else FULL
    directory = tiny_checkpoint(scratch_dir() / "tiny-bert") if args.smoke else bundled_dir()
    model_a = minibert.load(directory)
    model_b = perturbed(model_a)
    d_in, hook = model_a.config.hidden_size, f"blocks.{sizes['layer']}.hook_resid_post"
    texts = english_like_texts(sizes["texts"], seed=2)[0]
    options = dict(batch_size=sizes["batch"], buffer_tokens=4 * sizes["batch"])
    # the first forward of each row length and the first step compile: warm both streams on other texts first
    warm = english_like_texts(sizes["texts"], seed=1)[0]
    list(sae.activations(model_a, warm, hook, **options))
    list(diffing.paired_activations(model_a, model_b, warm, hook, **options))
    streams = {"one model (sae.activations)": stream_rate(lambda: sae.activations(model_a, texts, hook, **options)),
               "the pair (diffing.paired_activations)": stream_rate(
                   lambda: diffing.paired_activations(model_a, model_b, texts, hook, **options))}
    x = next(iter(diffing.paired_activations(model_a, model_b, texts, hook, **options)))

    trainers = {"TopK SAE": sae.Trainer(sae.SAEConfig(d_in=d_in, d_sae=sizes["width"], k=sizes["k"]))}
    for architecture in diffing.ARCHITECTURES:
        trainers[f"crosscoder, {architecture}"] = diffing.CrosscoderTrainer(diffing.CrosscoderConfig(
            d_in=d_in, d_sae=sizes["width"], k=sizes["k"], architecture=architecture))
    # a CrosscoderTrainer is an sae.Trainer too: the SAE alone reads model A's half of each pair
    batch_of = {name: x if isinstance(trainer, diffing.CrosscoderTrainer) else x[:, 0]
                for name, trainer in trainers.items()}
    step_ms = time_round_robin({name: (lambda t=trainer, b=batch_of[name]: t.step(b)) for name, trainer in
                                trainers.items()}, Settings.make(quick=False, smoke=args.smoke))
    memory = {name: step_memory(trainer, batch_of[name]) for name, trainer in trainers.items()}
    facts = machine()
    print(f"## Model diffing: a crosscoder step next to an SAE step ({'smoke run' if args.smoke else 'full run'})\n")
    print(f"{facts['cpu']}, {facts['cores']} cores, load {load_average()}; {facts['versions']}\n")
    print(f"{'tiny random BERT' if args.smoke else 'bundled all-MiniLM-L6-v2'} (A) and a perturbed copy (B: every "
          f"weight + 1% of its standard deviation of noise, not a real fine-tune), block {sizes['layer']}'s output, "
          f"{d_in} → {sizes['width']} latents, k = {sizes['k']}, batches of {sizes['batch']} tokens; "
          f"{sizes['texts']} generated texts.\n")
    base = streams["one model (sae.activations)"][1]
    print(markdown_table(["stream", "tokens", "tokens / s", "× one model"],
                         [[name, str(tokens), fmt(rate, 0), fmt(rate / base)] for name, (tokens, rate) in
                          streams.items()]))
    print()
    sae_ms, sae_memory = step_ms["TopK SAE"], memory["TopK SAE"]
    rows = [[name, fmt(1000 * step_ms[name], 1), fmt(step_ms[name] / sae_ms), fmt(memory[name] / 2**20, 1),
             fmt(memory[name] / sae_memory), fmt(state_bytes(trainer.params, trainer.opt_state) / 2**20, 1)]
            for name, trainer in trainers.items()]
    print(markdown_table(["step", "ms / batch", "× SAE", "XLA memory (MiB)", "× SAE", "state (MiB)"], rows))
    assert all(np.isfinite(t) and t > 0 for t in step_ms.values()) and all(m > 0 for m in memory.values())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
