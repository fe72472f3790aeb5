"""The frozen-layernorm skip path: what direct attribution, edge attribution and edge patching carry along.

Record each layernorm's σ (per token) at a run. With σ held, LN(x) = γ ⊙ (x − mean x)/σ + β is affine in x.
The *skip path* from a component that writes to the residual stream to a later point is the chain of these
frozen maps through the residual connections only, never through a later attention or MLP
(docs/circuits.md). Where a block reads and writes the stream (the family's stream_norms, block_output):

    post-LN (BERT):   attn_in[l] → + attention → LN1 → mlp_in[l] → + MLP → LN2 → attn_in[l + 1] … → final
    pre-LN (ModernBERT): attn_in[l] → + attention → mlp_in[l] → + MLP → attn_in[l + 1] … → final → ln_final

In a post-LN block every add is followed by a layernorm on the stream, so the skip path is a chain of frozen
affine maps; in a pre-LN block the layernorms sit inside the sublayers' own inputs and the skip path is the
identity up to `ln_final`, which the readout freezes (`readout_hooks`).

Everything here works on values captured through hooks (`point_names`, `scale_names`) and the weights
`Model.weights` gives (by role): no piece of the forward is rebuilt beyond the frozen layernorm itself.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from minibert.core.hooks import HookFn
from minibert.core.site_names import LN_FINAL, LN_OUT, LN_SCALE, RESID_MID, RESID_PRE, RESULT, in_block, layernorm
from minibert.errors import AnalysisError


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a family's blocks read and write the residual stream, as per-block hook names."""

    mlp_in: str  # the stream as the MLP reads it (its own input, before any layernorm of its own)
    block_out: str  # the block's output, the next block's attn_in
    norms: tuple[str, ...]  # layernorms on the stream inside each block, in order (post-LN: after each add)
    final_norm: str | None  # a layernorm between the last block and the readout (pre-LN: ln_final)


def layout(model) -> Layout:
    """The model's Layout; a model whose heads' outputs cannot be read apart (no attn.hook_result) is refused."""
    if in_block(0, RESULT) not in model.hook_names:
        raise AnalysisError(f"{model.config.family.name} has no per-head output hook ({RESULT}), so its "
                            f"heads cannot be circuit nodes; circuits need a family whose heads write z·W_O[h].")
    family = model.config.family  # what its blocks show (families/base.py: Family.stream_norms, block_output…)
    mlp_in = layernorm(family.stream_norms[0], LN_OUT) if family.stream_norms else RESID_MID
    return Layout(mlp_in, family.block_output, family.stream_norms, LN_FINAL if family.final_norm else None)


def point_names(model) -> dict[str, list[str]]:
    """The hook names of the stream's points: {"attn_in": [L], "mlp_in": [L], "final": [1]}."""
    lay, L = layout(model), model.config.num_hidden_layers
    return {"attn_in": [in_block(i, RESID_PRE) for i in range(L)],
            "mlp_in": [in_block(i, lay.mlp_in) for i in range(L)],
            "final": [in_block(L - 1, lay.block_out)]}


def scale_names(model) -> list[str]:
    """The σ hooks of the layernorms on the skip path inside the blocks, norm by norm, layer by layer."""
    L = model.config.num_hidden_layers
    return [in_block(i, layernorm(norm, LN_SCALE)) for norm in layout(model).norms for i in range(L)]


def _stop_gradient(value, ctx):
    return jax.lax.stop_gradient(value)


def readout_hooks(model) -> dict:
    """Hooks that freeze the σ of the layernorm between the last block and the readout (pre-LN's ln_final) at
    the run being differentiated: the gradient at `final` then is the skip path's last frozen map."""
    norm = layout(model).final_norm
    return {} if norm is None else {layernorm(norm, LN_SCALE): HookFn(_stop_gradient)}


@struct.dataclass
class Points:
    """Values at the stream's points: attn_in [L, ..., D], mlp_in [L, ..., D], final [..., D]."""

    attn_in: jax.Array
    mlp_in: jax.Array
    final: jax.Array


@struct.dataclass
class SkipPath:
    """The skip path of one run: for each layernorm on the stream inside a block (Layout.norms), its σ
    [L, B, T, 1] recorded at the run, its gain γ and bias β [L, D]. Empty for pre-LN families."""

    scales: tuple[jax.Array, ...]
    gains: tuple[jax.Array, ...]
    biases: tuple[jax.Array, ...]

    def through(self, k: int, layer, x, *, with_biases: bool = False):
        """x [..., B, T, D] through the k-th frozen layernorm of block `layer` (none in a pre-LN block: x)."""
        if k >= len(self.scales):
            return x
        centred = (x - x.mean(-1, keepdims=True)) / self.scales[k][layer]
        return centred * self.gains[k][layer] + self.biases[k][layer] if with_biases else centred * self.gains[k][layer]

    def carry(self, embed, attn, mlp, *, with_biases: bool = False) -> Points:
        """The stream at every point when only `embed` [B, T, D] is written at the start, `attn` [L, B, T, D] by
        each block's attention and `mlp` [L, B, T, D] by each MLP, carried through the frozen layernorms:
        linear in what is written (with_biases=False) or affine, each layernorm adding its β (True)."""
        def block(x, layer):
            index, written_attn, written_mlp = layer
            mid = self.through(0, index, x + written_attn, with_biases=with_biases)
            return self.through(1, index, mid + written_mlp, with_biases=with_biases), (x, mid)

        final, (attn_in, mlp_in) = jax.lax.scan(block, embed, (jnp.arange(attn.shape[0]), attn, mlp))
        return Points(attn_in, mlp_in, final)


def skip_weights(model) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]:
    """(gains, biases) of the skip path's layernorms, [L, D] each: passed into programs as arguments."""
    norms, weights = layout(model).norms, model.weights
    return (tuple(weights.read(f"{n}_scale") for n in norms), tuple(weights.read(f"{n}_bias") for n in norms))


def skip_path(model, captured, weights) -> SkipPath:
    """The SkipPath of a run whose `captured` values hold scale_names(model), with skip_weights(model)."""
    names, L = scale_names(model), model.config.num_hidden_layers
    scales = tuple(jnp.stack([captured[n] for n in names[k * L:(k + 1) * L]]) for k in range(len(weights[0])))
    return SkipPath(scales, *weights)
