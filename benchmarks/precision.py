"""bf16 compute against float32 on this CPU: one training step of a sequence classifier (finetune's compiled step,
fp32 master weights, dropout 0) in each compute dtype, interleaved, on the same cores; and the converts in each
step's lowered program (what the bf16 step adds: the casts of training.finetune.compute_parameters, LayerNorm's
float32 statistics, the attention softmax's float32 pattern).

Why it is measured: XLA:CPU has no bf16 matmul kernels; it converts every bf16 dot's operands to float32 and its
result back, so on a CPU bf16 compute is overhead alone. finetune warns with the ratio measured here.

    python benchmarks/precision.py [--quick]      # bundled MiniLM, B × T = 16 × 128
    python benchmarks/precision.py --smoke        # a tiny random model, 2 × 16, one timed step (CI)
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
from harness import (
    Settings,
    bundled_dir,
    command_line,
    fmt,
    load_average,
    machine,
    markdown_table,
    scratch_dir,
    time_round_robin,
    tiny_checkpoint,
)
from training import LEARNING_RATE, classifier_dir, inputs, minibert_step

import minibert
from minibert.core.hooks import writers_for
from minibert.training import optim
from minibert.training.finetune import TrainingStep, compiled_step

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def lowered_converts(model, rows: dict, dtype) -> int:
    """stablehlo.convert ops in finetune's step for `model` at `rows`' shape, lowered (not compiled)."""
    params = model.params  # the step's form of parameters
    optimizer = optim.adamw(LEARNING_RATE, mask=optim.decay_mask(params))
    leaves, writer_def = jax.tree_util.tree_flatten(writers_for(None, model.hook_names, model.config.architecture))
    step = TrainingStep(model, "sequence-classification", {}, writer_def, jnp.dtype(dtype))
    batch = {name: jnp.asarray(value) for name, value in rows.items()}
    lowered = compiled_step(step, optimizer).trace(params, {}, optimizer.init(params), batch, jax.random.key(0),
                                                    leaves).lower()
    return len(re.findall(r"stablehlo\.convert", lowered.as_text()))


def main(argv=None) -> int:
    args = command_line(__doc__, smoke="a tiny random model, 2 × 16, one timed step (CI)",
                        quick="3 timed steps per dtype instead of 7").parse_args(argv)
    settings = Settings.make(args.quick, args.smoke)
    batch, length = (2, 16) if args.smoke else (16, 128)
    scratch = scratch_dir()
    if args.smoke:
        base, label = tiny_checkpoint(scratch / "tiny-bert"), "tiny random BERT"
    else:
        base, label = bundled_dir(), "bundled all-MiniLM-L6-v2"
    directory = classifier_dir(base, scratch / f"{base.name}-classifier")
    model = minibert.load(directory)
    rows = inputs(batch, length, model.config.vocab_size)
    steps = {name: minibert_step(directory, rows, dtype)[0] for name, dtype in DTYPES.items()}
    for run in steps.values():
        run()  # compiles
    times = time_round_robin(steps, settings)
    table = [[name, fmt(seconds * 1e3, 1), fmt(batch * length / seconds, 0),
              fmt(seconds / times["float32"], 2) + "×", str(lowered_converts(model, rows, DTYPES[name]))]
             for name, seconds in times.items()]
    info = machine()
    run = "smoke" if args.smoke else "quick" if settings.quick else "full"
    print(f"## bf16 compute on a CPU — {info['cpu']}, {info['date']}, {run} run\n")
    print(f"{info['versions']}. {label} classifier, one training step at B × T = {batch} × {length}, median of "
          f"{settings.repeats} interleaved steps; load average {load_average()}.\n")
    print(markdown_table(["compute dtype", "ms / step", "tokens/s", "time / float32's", "converts (lowered)"], table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
