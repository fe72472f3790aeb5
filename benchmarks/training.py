"""One training step (forward, backward, AdamW with clipping) of a sequence classifier: minibert's compiled step
(training.finetune's, built from the same public pieces) against transformers' BertForSequenceClassification
with torch.optim.AdamW, on the same cores, at B × T = 16 × 128, for the bundled MiniLM and the bert-base shape
(random weights). Both start from the same weights (training.with_head's new head, saved for transformers).

Peak memory: each implementation runs its steps again in a child process; the table gives the growth of the
child's peak resident memory over what it held once the model was loaded, next to an estimate: gradients and
AdamW's two moments (3 × parameters × 4 bytes) plus the activations a backward keeps
(minibert.runtime.accounting.activation_bytes with backward=True).

    taskset -c 0 python benchmarks/training.py [--quick]   # one core, one torch thread
    python benchmarks/training.py --all-cores              # every core the process may use, both sides
    python benchmarks/training.py --smoke                  # a tiny random model, B × T = 2 × 16, one run (CI)
    python benchmarks/training.py --compile                # the step's compile time, scanned against unrolled

--compile (issue 28): seconds to trace and lower finetune's step, and to compile it in XLA, for a random model of
the bert-base shape (12 layers × 768; --compile-model minilm: all-MiniLM-L6-v2's) in float32 and bfloat16
compute, with the blocks scanned (encoder.Encoder.stack) and unrolled (Model(..., scan=False): the stack issue 28
measured at 21.5 s / 37 s). Each case runs in a fresh process with the persistent compilation cache off; wall and
CPU seconds of that process (CPU seconds are the steadier on a shared machine: XLA compiles on one thread).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from harness import (
    Settings,
    block,
    bundled_dir,
    fmt,
    load_average,
    machine,
    make_bert_base,
    markdown_table,
    random_ids,
    scratch_dir,
    time_round_robin,
    tiny_checkpoint,
)

import minibert
from minibert import training
from minibert.core.hooks import writers_for
from minibert.runtime import accounting
from minibert.training import optim
from minibert.training.finetune import TrainingStep, compiled_step

LEARNING_RATE, WEIGHT_DECAY, MAX_GRAD_NORM = 2e-5, 0.01, 1.0
LABELS = ("negative", "positive")


def classifier_dir(base: Path, directory: Path) -> Path:
    """The base checkpoint with training.with_head's new classification head, saved where transformers loads it."""
    if not (directory / "model.safetensors").exists():
        training.with_head(minibert.load(base), labels=LABELS).save(directory)
    return directory


def inputs(batch: int, length: int, vocab: int) -> dict[str, np.ndarray]:
    rows = random_ids(batch, length, vocab=vocab)
    return rows | {"labels": np.arange(batch, dtype=np.int32) % 2, "weight": np.ones(batch, np.float32)}


def step_program(model, rows: dict, compute_dtype=jnp.float32, dropout: float = 0.0):
    """finetune's compiled step for `model` at `rows` and its arguments: (jitted step, [params, frozen, optimiser
    state, batch, key, writer leaves]). compute_dtype=jnp.bfloat16: bf16 compute with fp32 master weights;
    dropout: the one rate of finetune(dropout=…), hidden, attention and classifier alike."""
    params = jax.tree.map(lambda value: jnp.array(value, copy=True), model.params)  # the step's form
    optimizer = optim.adamw(LEARNING_RATE, weight_decay=WEIGHT_DECAY, mask=optim.decay_mask(params),
                            max_grad_norm=MAX_GRAD_NORM)
    writer_leaves, writer_def = jax.tree_util.tree_flatten(writers_for(None, model.hook_names,
                                                                       model.config.architecture))
    rates = {"hidden": dropout, "attention": dropout, "classifier": dropout} if dropout else {}
    step = TrainingStep(model, "sequence-classification", rates, writer_def, jnp.dtype(compute_dtype))
    batch = {name: jnp.asarray(value) for name, value in rows.items()}
    return compiled_step(step, optimizer), [params, {}, optimizer.init(params), batch, jax.random.key(0),
                                            writer_leaves]


def minibert_step(directory: Path, rows: dict, compute_dtype=jnp.float32, dropout: float = 0.0):
    """A function doing one step of finetune's compiled program on `rows` (step_program), carrying its parameters
    and state, and the model."""
    model = minibert.load(directory)
    train, args = step_program(model, rows, compute_dtype, dropout)

    def run():
        args[0], args[2], loss = train(*args)
        return float(block(loss))

    return run, model


def torch_step(directory: Path, rows: dict, device: str = "cpu", amp: bool = False, dropout: float = 0.0):
    """One step of transformers' classifier with torch.optim.AdamW (decay off biases and LayerNorm, as Trainer).
    amp: the forward and backward under torch.autocast(bfloat16) with fp32 weights and optimiser (PyTorch's
    mixed precision, what minibert's compute_dtype=bfloat16 does; bf16 needs no loss scaling). dropout: every
    torch.nn.Dropout's rate (sdpa drops attention inside its kernel)."""
    import contextlib

    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    hf = transformers.BertForSequenceClassification.from_pretrained(str(directory), attn_implementation="sdpa")
    hf.to(device)
    hf.train()  # dropout's rates set below: the same computation as minibert's step
    for module in hf.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = dropout  # the attention's too: it passes its Dropout's p to sdpa
    decay = [p for n, p in hf.named_parameters() if optim.decays(_minibert_like(n))]
    rest = [p for n, p in hf.named_parameters() if not optim.decays(_minibert_like(n))]
    # fused on CUDA: one kernel for every parameter, the Trainer's default optimiser there (adamw_torch_fused)
    adamw = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": rest, "weight_decay": 0.0}],
                              lr=LEARNING_RATE, fused=device == "cuda" or None)
    batch = {name: torch.as_tensor(rows[name], dtype=torch.long, device=device)
             for name in ("input_ids", "token_type_ids", "attention_mask", "labels")}

    def autocast():
        return torch.autocast(device, dtype=torch.bfloat16) if amp else contextlib.nullcontext()

    def run():
        adamw.zero_grad()
        with autocast():
            loss = hf(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), MAX_GRAD_NORM)
        adamw.step()
        return float(loss.detach())  # waits for the device

    return run


def _minibert_like(name: str) -> str:
    """A transformers parameter name in the form optim.decays reads (biases and LayerNorm gains end alike)."""
    return name.replace("LayerNorm.weight", "ln.scale")


def child_peak(implementation: str, directory: Path, batch: int, length: int, steps: int) -> dict:
    """Peak resident memory growth of `steps` steps, in a fresh process (a process's peak never goes down)."""
    command = [sys.executable, __file__, "--child", implementation, str(directory), str(batch), str(length),
               str(steps)]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def peak_resident_bytes() -> int:
    """This process's peak resident memory (VmHWM). Not getrusage's ru_maxrss: that survives execve, so a child
    started by a large parent reports the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status: peak memory is measured on Linux only")


def child(implementation: str, directory: str, batch: str, length: str, steps: str) -> int:
    config = minibert.load(directory).config
    rows = inputs(int(batch), int(length), config.vocab_size)
    if implementation == "minibert":
        run = minibert_step(Path(directory), rows)[0]
    else:
        run = torch_step(Path(directory), rows)
    loaded = peak_resident_bytes()
    for _ in range(int(steps)):
        run()
    peak = peak_resident_bytes()
    print(json.dumps({"loaded": loaded, "peak": peak}))
    return 0


def estimate_bytes(model, batch: int, length: int) -> tuple[int, int]:
    """(gradients + AdamW moments, activations kept for the backward), fp32."""
    parameters = sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(model.state))
    layers = model.config.num_hidden_layers
    return 3 * 4 * parameters, accounting.activation_bytes(model.config, batch, length, blocks=layers, backward=True)


# ---- --compile: the step's compile time against the stack ------------------------------------------------------

SHAPES = {"bert-base": dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                           intermediate_size=3072, max_position_embeddings=512),
          "minilm": dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                         intermediate_size=1536, max_position_embeddings=512),  # all-MiniLM-L6-v2's
          "tiny": dict(vocab_size=30522, hidden_size=64, num_hidden_layers=12, num_attention_heads=4,
                       intermediate_size=128, max_position_embeddings=512)}  # --smoke


def step_compile(shape: str, scan: bool, compute_dtype: str, batch: int, length: int, dropout: float) -> dict:
    """Wall and CPU seconds to trace and lower finetune's step (step_program) for a random classifier of `shape`,
    then to compile it in XLA; in this process, whose persistent compilation cache is off."""
    config = minibert.BertConfig(**SHAPES[shape], architecture="BertForSequenceClassification", id2label=LABELS)
    model = minibert.Model(config, seed=0, scan=scan)
    rows = inputs(batch, length, config.vocab_size)
    train, args = step_program(model, rows, jnp.dtype(compute_dtype), dropout)
    times = [(time.perf_counter(), time.process_time())]
    lowered = train.lower(*args)
    times.append((time.perf_counter(), time.process_time()))
    lowered.compile()
    times.append((time.perf_counter(), time.process_time()))
    (w0, c0), (w1, c1), (w2, c2) = times
    return {"lower_wall": w1 - w0, "lower_cpu": c1 - c0, "compile_wall": w2 - w1, "compile_cpu": c2 - c1}


def compile_table(shape: str, batch: int, length: int, dropout: float) -> str:
    """Each case (stack × compute dtype) in a fresh process; a Markdown table with the scanned/unrolled ratio."""
    rows, totals = [], {}
    for dtype in ("float32", "bfloat16"):
        for scan in (False, True):
            env = os.environ | {"MINIBERT_COMPILATION_CACHE": "0"}
            command = [sys.executable, __file__, "--compile-child", shape, str(scan), dtype, str(batch), str(length),
                       str(dropout)]
            out = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
            seconds = json.loads(out.stdout.strip().splitlines()[-1])
            totals[scan, dtype] = seconds["lower_cpu"] + seconds["compile_cpu"]
            rows.append([shape, "scanned" if scan else "unrolled", dtype, fmt(seconds["lower_wall"]),
                         fmt(seconds["compile_wall"]), fmt(seconds["lower_wall"] + seconds["compile_wall"]),
                         fmt(totals[scan, dtype]), fmt(totals[scan, dtype] / totals[False, dtype]) + "×"])
    return markdown_table(["model", "stack", "compute", "trace + lower (wall s)", "XLA compile (wall s)",
                           "total (wall s)", "total (CPU s)", "CPU ÷ unrolled"], rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 timed steps per case instead of 7")
    parser.add_argument("--smoke", action="store_true", help="a tiny random model, 2 × 16, one step per case (CI)")
    parser.add_argument("--all-cores", action="store_true", help="torch uses every allowed core (default: one thread)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--compile", action="store_true", help="the step's compile time, scanned and unrolled, "
                        "fp32 and bf16 (each in a fresh process)")
    parser.add_argument("--compile-model", choices=("bert-base", "minilm"), default="bert-base",
                        help="--compile's model shape (random weights)")
    parser.add_argument("--dropout", type=float, default=0.0, help="--compile's dropout rate (finetune's: 0.1)")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--compile-child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(*args.child)
    if args.compile_child:
        shape, scan, dtype, batch, length, dropout = args.compile_child
        print(json.dumps(step_compile(shape, scan == "True", dtype, int(batch), int(length), float(dropout))))
        return 0
    if args.compile:
        batch, length = (2, 16) if args.smoke else (args.batch, args.length)
        shape = "tiny" if args.smoke else args.compile_model
        info = machine()
        print(f"## Training step compile (issue 28) — {info['cpu']}, {info['date']}, load average {load_average()}"
              f" at the start\n\n{info['versions']}. finetune's step (forward, backward, AdamW with clipping) of a "
              f"random {shape}-shaped 2-class classifier at B × T = {batch} × {length}, dropout {args.dropout}; "
              f"persistent cache off; each case a fresh process.\n")
        print(compile_table(shape, batch, length, args.dropout))
        print(f"\nLoad average at the end: {load_average()}")
        return 0
    import torch

    settings = Settings.make(args.quick, args.smoke)
    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(cores if args.all_cores else 1)
    batch, length = (2, 16) if args.smoke else (args.batch, args.length)
    scratch = scratch_dir()
    if args.smoke:
        bases = {"tiny BERT (random)": tiny_checkpoint(scratch / "tiny-bert")}
    else:
        bases = {"bundled all-MiniLM-L6-v2": bundled_dir(), "bert-base shape (random)": make_bert_base(
            scratch / "bert-base")}
    rows = []
    for label, base in bases.items():
        directory = classifier_dir(base, scratch / f"{base.name}-classifier")
        config = minibert.load(directory).config
        data = inputs(batch, length, config.vocab_size)
        ours, model = minibert_step(directory, data)
        theirs = torch_step(directory, data)
        first = {"minibert": ours(), "transformers": theirs()}  # compiles; the first losses start equal
        times = time_round_robin({"minibert": ours, "transformers": theirs}, settings)
        gradients_and_moments, activations = estimate_bytes(model, batch, length)
        for name, seconds in times.items():
            peak = child_peak(name, directory, batch, length, 1 if args.smoke else 3)
            rows.append([label, name, fmt(first[name], 4), fmt(seconds * 1e3, 1),
                         fmt(batch * length / seconds, 0), fmt(seconds / times["minibert"], 2) + "×",
                         fmt((peak["peak"] - peak["loaded"]) / 2**20, 0),
                         fmt((gradients_and_moments + activations) / 2**20, 0)])
    info = machine()
    run = "smoke" if args.smoke else "quick" if settings.quick else "full"
    where = f"all {cores} allowed cores" if args.all_cores else f"one torch thread on {cores} allowed core(s)"
    print(f"## Training — {info['cpu']}, {where}, {info['date']}, {run} run\n")
    print(f"{info['versions']}. One step of a 2-class sequence classifier at B × T = {batch} × {length}, dropout 0, "
          f"AdamW (lr {LEARNING_RATE}, weight decay {WEIGHT_DECAY}, clipping at {MAX_GRAD_NORM}); median of "
          f"{settings.repeats} steps, interleaved, compiled program warm. Load average "
          f"{load_average()} (1, 5, 15 min) at the end: a shared machine, under load.\n")
    print(markdown_table(["model", "implementation", "first loss", "ms / step", "tokens/s", "time / minibert's",
                          "peak growth MiB", "estimate MiB (grads + moments + activations)"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
