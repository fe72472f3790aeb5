"""The local replacement model of one input (Ameisen et al. 2025, for encoders; docs/graphs.md).

Run the model once and record, at every block l and position t, the MLP's input x_{l,t}, its output y_{l,t},
every attention pattern and every LayerNorm's σ. The replacement model then runs the model's own stages
(Model.embed / block / head) with:

    attention patterns    the recorded ones (hook_pattern replaced): each head is x ↦ Σ_s A_ts x_s W_V W_O
    every LayerNorm's σ   the recorded one (hook_scale replaced):    LN(x) = γ ⊙ (x − mean x)/σ + β, affine
    the MLP's output      w_{l,t} + x_{l,t} W_skip                   (hook_mlp_out replaced; W_skip = 0 without a
                                                                      skip transcoder)

where w_{l,t} = Σ_i f_{l,t,i} W_dec[i] + b_dec + ε_{l,t} is what the transcoder's features and the error node
ε = y − ŷ write. From the embeddings' output e (hook_full_embed) and the writes w to the MLP inputs x and the
last hidden state h, the replacement is affine — and at the run's own e and w it *is* the run (ŷ + ε = y).
Nothing of the forward is rebuilt here: the stages run as the model runs them, only the hooked values differ.

Axis names: L layers, T positions, D model width, S latents (a transcoder's d_sae), N active features.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from minibert.analysis.corpus.result import weights_digest
from minibert.analysis.transcoders.model import TranscoderConfig, activate, pre_activations
from minibert.core.hooks import HookFn
from minibert.core.site_names import EMBED_LN, FULL_EMBED, LN2, LN_OUT, LN_SCALE, MLP_OUT, PATTERN, in_block, layernorm
from minibert.errors import AnalysisError


def mlp_input_site(model) -> str:
    """The per-block site holding the MLP's input (TranscoderConfig's hook_in): post-LN families (BERT) the
    attention's LayerNorm output ln1.hook_out, pre-LN ones (ModernBERT) the MLP's own ln2.hook_out."""
    family = model.config.family
    site = layernorm(family.stream_norms[0] if family.stream_norms else LN2, LN_OUT)
    if in_block(0, site) not in model.hook_names or in_block(0, PATTERN) not in model.hook_names:
        raise AnalysisError(f"{family.name} shows no MLP input at {site} or no attention pattern; attribution "
                            f"graphs need both (docs/graphs.md lists the families they support).")
    return site


@dataclasses.dataclass(frozen=True)
class Sites:
    """The hook names one replacement reads and replaces, per layer."""

    mlp_in: tuple[str, ...]
    mlp_out: tuple[str, ...]
    patterns: tuple[str, ...]
    scales: tuple[str, ...]  # every LayerNorm's σ inside the blocks and in the head (not the embeddings': e is given)
    final: str  # the last block's output, the head's input

    def block_scales(self, layer: int) -> tuple[str, ...]:
        return tuple(n for n in self.scales if n.startswith(f"blocks.{layer}."))

    def head_scales(self) -> tuple[str, ...]:
        return tuple(n for n in self.scales if not n.startswith("blocks."))


def sites(model) -> Sites:
    L, site = model.config.num_hidden_layers, mlp_input_site(model)
    scales = tuple(n for n in model.hook_names if n.endswith(f".{LN_SCALE}") and not n.startswith(f"{EMBED_LN}."))
    return Sites(tuple(in_block(i, site) for i in range(L)), tuple(in_block(i, MLP_OUT) for i in range(L)),
                 tuple(in_block(i, PATTERN) for i in range(L)), scales,
                 in_block(L - 1, model.config.family.block_output))


# ---- the transcoders: one per block, checked against the model -----------------------------------------------

@dataclasses.dataclass(frozen=True)
class Transcoders:
    """One transcoder per block, their parameters stacked: W_enc [L, D, S], b_enc [L, S], W_dec [L, S, D],
    b_dec [L, D], W_skip [L, D, D] (zeros for a transcoder without one)."""

    configs: tuple[TranscoderConfig, ...]
    params: tuple[dict, ...]
    stacked: dict

    @property
    def d_sae(self) -> int:
        return self.configs[0].d_sae


def _expected_hook(hook: str | None, expected: str, layer: int, what: str) -> None:
    if hook is not None and hook != expected:
        raise AnalysisError(f"the transcoder at layer {layer} reads {what} {hook!r}, but this model's block {layer} "
                            f"has it at {expected!r}: it was trained for another site or model; pass one trained "
                            f"at {expected!r}.")


def check_transcoders(model, transcoders, *, other_weights: bool = False) -> Transcoders:
    """`transcoders`: a sequence of (TranscoderConfig, params), one per block in order; each checked against the
    model (widths, layer, hook names, and — unless other_weights — the weights it was trained on, where its config
    records them) and for finite parameters."""
    L, D = model.config.num_hidden_layers, model.config.hidden_size
    if isinstance(transcoders, dict) or not hasattr(transcoders, "__len__") or len(transcoders) != L:
        raise AnalysisError(f"transcoders must be a list of {L} (TranscoderConfig, params) pairs, one per block of "
                            f"this {L}-layer model (the replacement model replaces every MLP); got "
                            f"{type(transcoders).__name__}"
                            f"{f' of {len(transcoders)}' if hasattr(transcoders, '__len__') else ''}.")
    site, configs, params, digest = mlp_input_site(model), [], [], None
    for layer, pair in enumerate(transcoders):
        if not isinstance(pair, tuple | list) or len(pair) != 2 or not isinstance(pair[0], TranscoderConfig):
            raise AnalysisError(f"transcoders[{layer}] must be a (TranscoderConfig, params) pair; got "
                                f"{type(pair).__name__}.")
        config, p = pair
        if config.layer != layer:
            raise AnalysisError(f"transcoders[{layer}] is the transcoder of layer {config.layer}; list them in block "
                                f"order, transcoders[l] for block l.")
        if (config.d_in, config.d_out) != (D, D):
            raise AnalysisError(f"the transcoder at layer {layer} maps width {config.d_in} → {config.d_out}, but this "
                                f"model's MLP maps {D} → {D}: it belongs to another model; pass one trained on this "
                                f"model.")
        _expected_hook(config.hook_in, in_block(layer, site), layer, "its input at")
        _expected_hook(config.hook_out, in_block(layer, MLP_OUT), layer, "its output at")
        if config.weights is not None and not other_weights:
            digest = digest or weights_digest(model)
            if config.weights != digest:
                raise AnalysisError(f"the transcoder at layer {layer} was trained on the model weights "
                                    f"{config.weights}, and this model's are {digest}: a graph through it would "
                                    f"explain another model's MLPs. Pass the model it was trained on, or "
                                    f"other_weights=True to use it on these weights on purpose.")
        if configs and config.d_sae != configs[0].d_sae:
            raise AnalysisError(f"the transcoders have d_sae {configs[0].d_sae} (layer 0) and {config.d_sae} (layer "
                                f"{layer}); a graph's transcoders share one width.")
        shapes = {"W_enc": (D, config.d_sae), "b_enc": (config.d_sae,), "W_dec": (config.d_sae, D), "b_dec": (D,)}
        shapes |= {"W_skip": (D, D)} if config.skip else {}
        for key, shape in shapes.items():
            if key not in p or tuple(np.shape(p[key])) != shape:
                raise AnalysisError(f"the transcoder at layer {layer}: params[{key!r}] should have shape {shape}; got "
                                    f"{np.shape(p[key]) if key in p else 'none'}.")
            if not np.all(np.isfinite(np.asarray(p[key]))):
                raise AnalysisError(f"the transcoder at layer {layer}: params[{key!r}] holds NaN or ±inf; retrain or "
                                    f"reload it.")
        configs.append(config)
        params.append({k: jnp.asarray(v, jnp.float32) for k, v in p.items()})
    stacked = {k: jnp.stack([p[k] for p in params]) for k in ("W_enc", "b_enc", "W_dec", "b_dec")}
    stacked["W_skip"] = jnp.stack([p["W_skip"] if c.skip else jnp.zeros((D, D)) for c, p in zip(configs, params)])
    return Transcoders(tuple(configs), tuple(params), stacked)


# ---- the run, and the replacement built on it ------------------------------------------------------------------

def record_names(s: Sites) -> list[str]:
    return [FULL_EMBED, *s.mlp_in, *s.mlp_out, *s.patterns, *s.scales, s.final]


def replace_with(value, ctx, new):
    return new.astype(value.dtype)


def frozen_hooks(names, frozen: dict) -> dict:
    """Hooks that replace each named value by the recorded one in `frozen`."""
    return {n: HookFn(replace_with, new=frozen[n]) for n in names}


def feature_activations(tc: Transcoders, x) -> tuple[jax.Array, jax.Array]:
    """(pre, f) [L, T, S] of MLP inputs x [L, T, D], each layer's own σ."""
    pre = jnp.stack([pre_activations(p, x[i]) for i, p in enumerate(tc.params)])
    f = jnp.stack([activate(c, p, pre[i]) for i, (c, p) in enumerate(zip(tc.configs, tc.params))])
    return pre, f


def writes_of(stacked: dict, f, errors) -> jax.Array:
    """w [L, T, D] = f W_dec + b_dec + ε: what features and error nodes write at each MLP (the skip term apart)."""
    return jnp.einsum("LTS,LSD->LTD", f, stacked["W_dec"]) + stacked["b_dec"][:, None] + errors


def replacement(model, state, inputs, frozen: dict, stacked: dict, s: Sites, embed, writes):
    """The frozen replacement on one row: (x [L, T, D], h [T, D]) from the embeddings' output embed [T, D] and the
    writes [L, T, D] (module docstring). Affine in (embed, writes). Each block runs twice, as the model runs it:
    once to read its MLP input (the skip term's and the features' x), once with its MLP output replaced; a
    compiled program keeps the second and the first's attention once."""
    resid, xs = embed[None], []
    for layer in range(model.config.num_hidden_layers):
        held = frozen_hooks((s.patterns[layer], *s.block_scales(layer)), frozen)
        reading = model.hook_points(hooks=held, names=[s.mlp_in[layer]])
        model.block(state, layer, resid, inputs, reading)
        x = reading.captured[s.mlp_in[layer]]
        written = writes[layer][None] + x @ stacked["W_skip"][layer]
        replacing = model.hook_points(hooks=held | {s.mlp_out[layer]: HookFn(replace_with, new=written)})
        resid = model.block(state, layer, resid, inputs, replacing)
        xs.append(x[0])
    return jnp.stack(xs), resid[0]


def readout(model, state, frozen: dict, s: Sites, hidden):
    """The model's head on h [T, D] (one row) with its LayerNorms' σ held at the run: an Output."""
    return model.head(state, hidden[None], frozen_hooks(s.head_scales(), frozen))
