"""Context mixing on the bundled model, one ~40-token aspect question / review pair (seed 002):

- value zeroing: minibert's one compiled program (every block vmapped over the zeroed token) against the
  reference's loop over tokens in transformers — Mohebbi et al.'s code runs one BertLayer per (layer, token)
  on the stored hidden states, with the value vector zeroed (here by a forward hook on the value Linear);
  also against a loop of whole transformers forward passes per (layer, token), as the tests' reference does;
- attention attribution, m = 20 steps: minibert's batched integrated gradient against a per-step loop
  (one call of the same compiled gradient per layer and step, as Hao et al.'s loop over the scaled patterns).

    taskset -c 0 python benchmarks/mixing.py [--quick]   # one core: prints a Markdown table for RESULTS.md

On one core, as benchmarks/one_core.py: on a shared 2-vCPU machine PyTorch's two OpenMP threads stall on
each other (spin-waits on a descheduled peer) in a loop of thousands of small calls, which measures the load
rather than the method; one core and one torch thread compare the work done.
"""

from __future__ import annotations

import argparse
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from harness import Settings, block, bundled_dir, fmt, hf_model, machine, markdown_table, time_round_robin

import minibert
from minibert.analysis import mixing

QUESTION = "what do you think of the food and the service at this place ?"
REVIEW = "the food was great , the pasta especially , but the service was slow and the waiter forgot our drinks ."


def torch_value_zeroing(hf, ids, types, per_layer: bool) -> np.ndarray:
    """1 − cos [L, T, T] for one unpadded row, by a Python loop over (layer, zeroed token) in transformers."""
    import torch

    layers = hf.encoder.layer
    with torch.no_grad():
        hidden = hf(input_ids=ids, token_type_ids=types, output_hidden_states=True).hidden_states  # L + 1 × [1, T, D]
        T = ids.shape[1]
        result = np.zeros((len(layers), T, T))
        for layer_index, layer in enumerate(layers):
            for token in range(T):
                def zero_value(module, args, output, token=token):
                    output = output.clone()
                    output[:, token] = 0  # the value vector of `token`, every head (heads are slices of D)
                    return output

                handle = layer.attention.self.value.register_forward_hook(zero_value)
                try:
                    if per_layer:
                        out = layer(hidden[layer_index])
                        out = out[0] if isinstance(out, tuple) else out
                    else:
                        outputs = hf(input_ids=ids, token_type_ids=types, output_hidden_states=True)
                        out = outputs.hidden_states[layer_index + 1]
                finally:
                    handle.remove()
                result[layer_index, :, token] = 1 - torch.nn.functional.cosine_similarity(
                    out[0], hidden[layer_index + 1][0], dim=-1).numpy()
    return result


def attribution_loop(model, batch, target_fn, steps: int) -> np.ndarray:
    """Attr per layer by a Python loop over (layer, step), each step one call of a compiled gradient
    program (the same program as minibert's, not batched over the steps): the fastest per-step loop."""
    inputs = model.inputs(batch)
    _, cache = model.run_with_cache(batch, names="blocks.*.attn.hook_pattern")
    result = []
    for layer in range(model.config.num_hidden_layers):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
        total = 0
        for k in range(1, steps + 1):
            total = total + _step_gradient(model, model.state, inputs, target_fn, jnp.int32(layer), k / steps * pattern)
        result.append(np.asarray(pattern * total / steps))
    return np.stack(result)


@partial(jax.jit, static_argnames=("model", "target_fn"))
def _step_gradient(model, state, inputs, target_fn, layer, pattern):
    """∂ Σ_rows F / ∂ pattern of block `layer`, at `pattern`."""
    return jax.grad(partial(mixing._target_total, model, state, inputs, target_fn, layer))(pattern)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 timed runs per case instead of 7")
    settings = Settings.make(parser.parse_args().quick)
    import torch

    torch.set_num_threads(1)
    model = minibert.load()
    hf = hf_model(bundled_dir(), "eager")
    batch = model.tokenize([QUESTION], [REVIEW])
    ids = torch.as_tensor(np.asarray(batch.input_ids), dtype=torch.long)
    T = ids.shape[1]
    types = torch.as_tensor(np.asarray(batch.token_type_ids), dtype=torch.long)

    print(f"{T} tokens; checking agreement", flush=True)
    ours = mixing.value_zeroing(model, batch, normalize=False)[:, 0]
    theirs = torch_value_zeroing(hf, ids, types, per_layer=True)
    agreement = np.abs(ours - theirs).max()
    target = lambda out: out.last_hidden_state[:, 0, 0]
    vz = time_round_robin({
        "minibert value_zeroing": lambda: mixing.value_zeroing(model, batch),
        "transformers, one BertLayer per (layer, token)": lambda: torch_value_zeroing(hf, ids, types, True),
        "transformers, whole forward per (layer, token)": lambda: torch_value_zeroing(hf, ids, types, False),
    }, settings)
    print("value zeroing:", {name: round(t, 3) for name, t in vz.items()}, flush=True)
    attr = time_round_robin({
        "minibert attention_attribution (20 steps)": lambda: mixing.attention_attribution(model, batch, target, 20),
        "per-step loop of one compiled gradient (20 steps)": lambda: block(attribution_loop(model, batch, target, 20)),
    }, settings)
    info = machine()
    print(f"## Context mixing — {info['cpu']}, one core, {info['date']}, "
          f"{'quick' if settings.quick else 'full'} run (`taskset -c 0 python benchmarks/mixing.py"
          f"{' --quick' if settings.quick else ''}`)\n")
    print(f"{info['versions']}. Bundled all-MiniLM-L6-v2, one pair of {T} tokens; median of {settings.repeats} "
          f"runs, compiled programs warm. Largest |1 − cos| difference, minibert vs the transformers loop: "
          f"{agreement:.1e}.\n")
    rows = []
    for times, ours_name in ((vz, "minibert value_zeroing"), (attr, "minibert attention_attribution (20 steps)")):
        for name, seconds in times.items():
            rows.append([name, fmt(seconds * 1e3, 1), fmt(seconds / times[ours_name], 1) + "×"])
    print(markdown_table(["case", "ms", "time / minibert's"], rows))


if __name__ == "__main__":
    main()
