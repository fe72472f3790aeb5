"""Context mixing on the bundled model, one ~40-token aspect question / review pair (seed 002):

- value zeroing: minibert's one compiled program (every block vmapped over the zeroed token) against the
  reference's loop over tokens in transformers — Mohebbi et al.'s code runs one BertLayer per (layer, token)
  on the stored hidden states, with the value vector zeroed (here by a forward hook on the value Linear);
  also against a loop of whole transformers forward passes per (layer, token), as the tests' reference does;
- attention attribution, m = 20 steps: minibert's batched integrated gradient (each layer run from the residual
  stream entering it) against a per-step loop of the same compiled gradient, and against Hao et al.'s way in
  transformers: per layer and step a whole eager forward with that layer's probabilities replaced by (k/m)·A_l
  (a registered AttentionInterface function) and a backward; the two results are compared first.

    taskset -c 0 python benchmarks/mixing.py [--quick]   # one core: prints a Markdown table for RESULTS.md
    python benchmarks/mixing.py --smoke                  # a short pair, 2 steps, one run per case (CI)

On one core, as benchmarks/one_core.py: on a shared 2-vCPU machine PyTorch's two OpenMP threads stall on
each other (spin-waits on a descheduled peer) in a loop of thousands of small calls, which measures the load
rather than the method; one core and one torch thread compare the work done.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from harness import Settings, block, bundled_dir, command_line, fmt, hf_model, machine, markdown_table, time_round_robin

import minibert
from minibert import HookFn
from minibert.analysis import mixing

QUESTION = "what do you think of the food and the service at this place ?"
REVIEW = "the food was great , the pasta especially , but the service was slow and the waiter forgot our drinks ."
SMOKE_QUESTION, SMOKE_REVIEW = "how was the food ?", "the food was great ."


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
    program (the same suffix program as minibert's, not batched over the steps): the fastest per-step loop."""
    inputs = model.inputs(batch)
    _, cache = model.run_with_cache(inputs, names=[mixing.PATTERNS, "blocks.*.hook_resid_pre"])
    step_gradient = model.jit(_step_gradient, static_argnames=("target_fn",))
    result = []
    for layer in range(model.config.num_hidden_layers):
        pattern, resid = cache[f"blocks.{layer}.attn.hook_pattern"], cache[f"blocks.{layer}.hook_resid_pre"]
        total = 0
        for k in range(1, steps + 1):
            total = total + step_gradient(model.state, inputs, resid, jnp.int32(layer), k / steps * pattern,
                                          target_fn=target_fn)
        result.append(np.asarray(pattern * total / steps))
    return np.stack(result)


def _in_layer(pattern, ctx, layer, replacement):
    """Block `layer`'s pattern becomes `replacement`; the other blocks keep theirs."""
    return jnp.where(ctx.layer == layer, replacement, pattern).astype(pattern.dtype)


def _step_gradient(model, state, inputs, resid, layer, pattern, *, target_fn):
    """∂ Σ_rows F / ∂ pattern of block `layer`, at `pattern`, run from the stream entering block `layer`."""
    def target(pattern):
        hooks = {mixing.PATTERNS: HookFn(_in_layer, layer=layer, replacement=pattern)}
        return target_fn(model.suffix(state, layer, resid, inputs, hooks)).sum()
    return jax.grad(target)(pattern)


SWAPPED = "swapped_eager"  # the attention implementation torch_attribution registers with transformers
_swaps: dict = {}  # layer index → the probabilities [B, H, T, S] that layer uses instead of its own


def _swapped_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' eager attention, except in a layer listed in _swaps: there the given probabilities mix the
    values (the scores are not computed)."""
    import torch
    from transformers.models.bert.modeling_bert import eager_attention_forward

    if module.layer_idx not in _swaps:
        return eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    weights = _swaps[module.layer_idx]
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def swapped_model():
    """The bundled checkpoint in transformers, with _swapped_attention as its attention implementation."""
    import transformers

    transformers.AttentionInterface.register(SWAPPED, _swapped_attention)
    return hf_model(bundled_dir(), SWAPPED)


def torch_attribution(hf, ids, types, steps: int) -> np.ndarray:
    """Attr [L, 1, H, T, S] for F = last_hidden_state[0, 0, 0], as Hao et al.'s code does it: for every layer
    and step a whole forward with that layer's probabilities replaced by (k/m)·A_l, a leaf tensor, and a
    backward of F to it."""
    import torch

    _swaps.clear()
    with torch.no_grad():
        patterns = hf(input_ids=ids, token_type_ids=types, output_attentions=True).attentions  # L × [1, H, T, S]
    result = []
    for layer, pattern in enumerate(patterns):
        total = torch.zeros_like(pattern)
        for k in range(1, steps + 1):
            scaled = (k / steps * pattern).requires_grad_()
            _swaps[layer] = scaled
            target = hf(input_ids=ids, token_type_ids=types).last_hidden_state[0, 0, 0]
            total += torch.autograd.grad(target, scaled)[0]
        _swaps.clear()
        result.append((pattern * total / steps).numpy())
    return np.stack(result)


def main(argv=None) -> int:
    args = command_line(__doc__, smoke="a short pair, 2 steps, one run per case (CI)").parse_args(argv)
    settings = Settings.make(args.quick, args.smoke)
    steps = 2 if args.smoke else 20
    question, review = (SMOKE_QUESTION, SMOKE_REVIEW) if args.smoke else (QUESTION, REVIEW)
    import torch

    torch.set_num_threads(1)
    model = minibert.load()
    hf = hf_model(bundled_dir(), "eager")
    batch = model.tokenize([question], [review])
    ids = torch.as_tensor(np.asarray(batch.input_ids), dtype=torch.long)
    T = ids.shape[1]
    types = torch.as_tensor(np.asarray(batch.token_type_ids), dtype=torch.long)

    print(f"{T} tokens; checking agreement", flush=True)
    ours = mixing.value_zeroing(model, batch, normalize=False)[:, 0]
    theirs = torch_value_zeroing(hf, ids, types, per_layer=True)
    agreement = np.abs(ours - theirs).max()
    target = lambda out: out.last_hidden_state[:, 0, 0]
    swapped = swapped_model()
    ours_attr = mixing.attention_attribution(model, batch, target, steps)
    attr_agreement = np.abs(ours_attr - torch_attribution(swapped, ids, types, steps)).max()
    attr_scale = np.abs(ours_attr).max()
    print(f"attribution: largest |difference| minibert vs transformers {attr_agreement:.1e} "
          f"(largest |Attr| {attr_scale:.1e})", flush=True)
    vz = time_round_robin({
        "minibert value_zeroing": lambda: mixing.value_zeroing(model, batch),
        "transformers, one BertLayer per (layer, token)": lambda: torch_value_zeroing(hf, ids, types, True),
        "transformers, whole forward per (layer, token)": lambda: torch_value_zeroing(hf, ids, types, False),
    }, settings)
    print("value zeroing:", {name: round(t, 3) for name, t in vz.items()}, flush=True)
    attr = time_round_robin({
        f"minibert attention_attribution ({steps} steps)":
            lambda: mixing.attention_attribution(model, batch, target, steps),
        f"per-step loop of the same compiled gradient ({steps} steps)":
            lambda: block(attribution_loop(model, batch, target, steps)),
        "transformers, whole forward + backward per (layer, step) — Hao et al.'s loop":
            lambda: torch_attribution(swapped, ids, types, steps),
    }, settings)
    info = machine()
    run = "smoke" if args.smoke else "quick" if settings.quick else "full"
    print(f"## Context mixing — {info['cpu']}, one core, {info['date']}, "
          f"{run} run (`taskset -c 0 python benchmarks/mixing.py{' --' + run if run != 'full' else ''}`)\n")
    print(f"{info['versions']}. Bundled all-MiniLM-L6-v2, one pair of {T} tokens; median of {settings.repeats} "
          f"runs, compiled programs warm. Largest |1 − cos| difference, minibert vs the transformers loop: "
          f"{agreement:.1e}. Attention attribution, largest |difference| minibert vs the transformers loop: "
          f"{attr_agreement:.1e} (largest |Attr| {attr_scale:.1e}).\n")
    rows = []
    for times, ours_name in ((vz, "minibert value_zeroing"), (attr, f"minibert attention_attribution ({steps} steps)")):
        for name, seconds in times.items():
            rows.append([name, fmt(seconds * 1e3, 1), fmt(seconds / times[ours_name], 1) + "×"])
    print(markdown_table(["case", "ms", "time / minibert's"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
