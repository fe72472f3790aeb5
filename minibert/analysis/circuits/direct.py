"""Direct attribution: each component's direct effect on a metric along the frozen skip path.

Components of a run: the embeddings' output e, each head's output o_{l,h} = z_{l,h}·W_O[h] (attn.hook_result),
each attention's bias (what hook_attn_out holds beyond its heads: b_O), each MLP's output m_l. With the
layernorms on the stream frozen at the run (frozen.py), the final hidden state h_F is an affine function of
them: h_F = Σ_c P_c(c) + (the skip path's β, post-LN). The direct attribution of c is

    DA(c) = ⟨∂metric/∂h_F, P_c(c)⟩

(gradient at the run, summed over rows, tokens and features; the metric's mean over rows). The parts over e,
every head, every bias and every MLP, plus `constant` = ⟨∂metric/∂h_F, the carried β⟩, sum to
`linear` = ⟨∂metric/∂h_F, h_F⟩; `remainder` = metric − linear is what the readout adds beyond its linear part
(a classifier's bias; for a metric linear in h_F, the readout's constant alone). Post-LN: h_F is the last
block's output and the path runs through every later LN1 and LN2; pre-LN: h_F enters ln_final, whose σ is
frozen in the gradient.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from minibert.analysis._finite import check_finite
from minibert.analysis.circuits._checks import check_count, check_model, metric_of
from minibert.analysis.circuits.frozen import point_names, readout_hooks, scale_names, skip_path, skip_weights
from minibert.core.config import head_label
from minibert.core.contract import StaticFn, static_metric
from minibert.core.encoder import unrolled_stack
from minibert.core.hooks import HookFn, add_delta
from minibert.core.site_names import ATTN_OUT, FULL_EMBED, MLP_OUT, RESULT


@dataclasses.dataclass
class DirectAttribution:
    """Direct effects on the metric (its mean over rows): heads [L, H], mlps [L], embed, bias [L]; they and
    `constant` sum to `linear`; `metric` is the value itself and `remainder` = metric − linear."""

    heads: np.ndarray
    mlps: np.ndarray
    embed: float
    bias: np.ndarray
    constant: float
    linear: float
    metric: float

    @property
    def remainder(self) -> float:
        return self.metric - self.linear

    def top(self, n: int = 10) -> list[tuple[str, float]]:
        """The n components with the largest |DA|, as ("L-H" head label, "MLP l", "embed", "bias l"; 1-indexed
        layers), value)."""
        n = check_count("top(n): n, the number of components", n)
        named = [("embed", float(self.embed))]
        for layer, row in enumerate(self.heads):
            named += [(head_label(layer, head), float(value)) for head, value in enumerate(row)]
            named += [(f"MLP {layer + 1}", float(self.mlps[layer])), (f"bias {layer + 1}", float(self.bias[layer]))]
        return sorted(named, key=lambda item: -abs(item[1]))[:n]


def component_names(model) -> list[str]:
    """The hooks a decomposition reads: the embeddings' output, each head's output, each attention's and each
    MLP's output, the skip path's σ and the final point."""
    L = model.config.num_hidden_layers
    per_block = (RESULT, ATTN_OUT, MLP_OUT)
    return [FULL_EMBED, *[f"blocks.{i}.{site}" for site in per_block for i in range(L)],
            *scale_names(model), *point_names(model)["final"]]


def stacked(captured, model, site: str) -> jax.Array:
    """A per-block site's captured values, [L, ...]."""
    return jnp.stack([captured[f"blocks.{i}.{site}"] for i in range(model.config.num_hidden_layers)])


def _direct_parts(model, state, inputs, weights, *, metric: StaticFn) -> dict:
    """Every part of the decomposition, from one forward and one backward (compiled with model.jit)."""
    final = point_names(model)["final"][0]
    B, T = inputs.shape

    def objective(delta):
        hooks = readout_hooks(model) | {final: HookFn(add_delta, delta=delta)}
        out, captured = model.forward_fn(component_names(model), hooks)(state, inputs)
        return metric_of(metric, out, B).mean(), captured

    zeros = jnp.zeros((B, T, model.config.hidden_size), jnp.float32)
    (value, captured), g_final = jax.value_and_grad(unrolled_stack()(objective), has_aux=True)(zeros)
    skip = skip_path(model, captured, weights)
    embed, attn, mlp = captured[FULL_EMBED], stacked(captured, model, ATTN_OUT), \
        stacked(captured, model, MLP_OUT)
    heads = stacked(captured, model, RESULT)  # [L, B, T, H, D]
    _, pullback = jax.vjp(lambda e, a, m: skip.carry(e, a, m).final, embed, attn, mlp)
    g_embed, g_attn, g_mlp = pullback(g_final)  # the skip path's adjoint: ∂metric/∂ each writing point
    carried_biases = skip.carry(jnp.zeros_like(embed), jnp.zeros_like(attn), jnp.zeros_like(mlp),
                                with_biases=True).final
    return {"heads": jnp.einsum("LBTHD,LBTD->LH", heads, g_attn),
            "bias": jnp.einsum("LBTD,LBTD->L", attn - heads.sum(3), g_attn),
            "mlps": jnp.einsum("LBTD,LBTD->L", mlp, g_mlp), "embed": (embed * g_embed).sum(),
            "constant": (carried_biases * g_final).sum(), "linear": (captured[final] * g_final).sum(),
            "metric": value}


def direct_attribution(model, batch, metric: Callable) -> DirectAttribution:
    """Each head's, MLP's, bias's and the embeddings' direct effect on `metric(output)` (one value per row, or
    one for the batch; the mean over rows is decomposed) along the skip path frozen at this run (module
    docstring). Works for any metric read off the output: masked-LM logits or their differences, classifier
    logits, a dot product of a sentence vector pooled from last_hidden_state with a target (not their cosine: a
    metric unchanged when h_F is scaled has linear = 0, its parts cancel; docs/circuits.md). One forward and
    backward, one program."""
    check_model(model)
    inputs = model.inputs(batch)
    program = model.jit(_direct_parts, static_argnames=("metric",), what="direct attribution")
    parts = {k: np.asarray(v) for k, v in program(model.state, inputs, skip_weights(model),
                                                   metric=static_metric(metric)).items()}
    check_finite(parts["metric"][None], "the metric")
    check_finite(parts["heads"].ravel(), "the direct effects (the metric's gradient)")
    return DirectAttribution(parts["heads"], parts["mlps"], float(parts["embed"]), parts["bias"],
                             float(parts["constant"]), float(parts["linear"]), float(parts["metric"]))
