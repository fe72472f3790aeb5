"""The transcoder itself: parameters in SAELens 6's transcoder names and shapes, encoder and decoder.

A transcoder at block l reads the MLP's input x (post-LN families: ln1's output; pre-LN: ln2's output) and
predicts the MLP's output y (`hook_mlp_out`, before the residual sum) through sparse latents
(Dunefsky, Chlenski & Nanda 2024; docs/transcoders.md):

    pre = x W_enc + b_enc                           W_enc [D, S], b_enc [S]   (no b_dec subtracted: x and y
    f   = σ(pre)                                                               live in different spaces)
    ŷ   = f W_dec + b_dec  (+ x W_skip)             W_dec [S, D], b_dec [D], W_skip [D, D] (skip transcoder,
                                                                               Paulo et al. 2025)
σ, by architecture:
- "relu":      ReLU(pre)                              (trained with L1 on ‖W_dec,i‖·f_i)
- "topk":      the k largest of each row, ReLU'd      (Gao et al. 2024)
- "batchtopk": training keeps the k·N largest over a batch of N rows; at inference a JumpReLU with one
               global threshold θ (estimated in training), as SAELens does (Bussmann et al. 2024)
- "jumprelu":  pre · [pre > θ_i]                      θ = threshold [S] (Rajamanoharan et al. 2024)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from minibert.analysis.sae.model import python_numbers
from minibert.errors import AnalysisError

ARCHITECTURES = ("relu", "topk", "batchtopk", "jumprelu")


@dataclasses.dataclass(frozen=True)
class TranscoderConfig:
    """What a transcoder is: its widths, sparsity mechanism and the block whose MLP it stands in for."""

    d_in: int
    d_sae: int
    d_out: int
    layer: int
    architecture: str = "topk"
    k: int = 32  # topk / batchtopk: latents kept per row (on average, for batchtopk)
    skip: bool = False  # a skip transcoder: ŷ + x W_skip
    hook_in: str | None = None  # e.g. "blocks.3.ln1.hook_out"
    hook_out: str | None = None  # e.g. "blocks.3.hook_mlp_out"
    model_name: str | None = None
    weights: str | None = None  # the digest of the model weights trained on (Trainer.train records it)
    # training only (docs/transcoders.md): AuxK (topk, batchtopk), L1 (relu), L0 and its pseudo-derivative
    # (jumprelu), the batch-top-k threshold's moving average (batchtopk)
    k_aux: int | None = None  # dead latents AuxK uses (None: d_out // 2, Gao et al.'s heuristic)
    aux_coefficient: float = 1 / 32
    l1_coefficient: float = 5.0
    l0_coefficient: float = 1.0
    sparsity_warmup: int = 0  # steps over which the L1 / L0 coefficient ramps up from 0
    bandwidth: float = 0.001  # jumprelu: ε of the rectangle kernel in the threshold's pseudo-derivative
    threshold_init: float = 0.001  # jumprelu: θ_i at the start of training
    threshold_rate: float = 0.01  # batchtopk: the moving average's rate, as SAELens' topk_threshold_lr

    def __post_init__(self):
        python_numbers(self)
        if self.architecture not in ARCHITECTURES:
            raise AnalysisError(f"architecture={self.architecture!r}: pick one of {', '.join(ARCHITECTURES)}.")
        for name in ("d_in", "d_sae", "d_out", "k"):
            value = getattr(self, name)
            if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < 1:
                raise AnalysisError(f"TranscoderConfig {name}={value!r} must be a whole number ≥ 1.")
        layer = self.layer
        if not isinstance(layer, int | np.integer) or isinstance(layer, bool) or layer < 0:
            raise AnalysisError(f"TranscoderConfig layer={layer!r} must be a block index ≥ 0.")
        if self.architecture in ("topk", "batchtopk") and self.k > self.d_sae:
            raise AnalysisError(f"k={self.k} latents kept of d_sae={self.d_sae}: k must be at most d_sae.")
        if self.k_aux is not None and (isinstance(self.k_aux, bool) or not isinstance(self.k_aux, int | np.integer)
                                       or self.k_aux < 1):
            raise AnalysisError(f"TranscoderConfig k_aux={self.k_aux!r} must be a whole number ≥ 1 (or None).")
        if isinstance(self.sparsity_warmup, bool) or not isinstance(self.sparsity_warmup, int | np.integer) \
                or self.sparsity_warmup < 0:
            raise AnalysisError(f"TranscoderConfig sparsity_warmup={self.sparsity_warmup!r} must be a whole number "
                                f"≥ 0.")
        for name in ("aux_coefficient", "l1_coefficient", "l0_coefficient", "threshold_init"):
            _check_number(name, getattr(self, name), positive=False)
        for name in ("bandwidth", "threshold_rate"):
            _check_number(name, getattr(self, name), positive=True)
        if self.threshold_rate > 1:
            raise AnalysisError(f"TranscoderConfig threshold_rate={self.threshold_rate!r} is a moving average's rate: "
                                f"pass a number in (0, 1].")

    @property
    def aux_k(self) -> int:
        return min(self.d_sae, self.k_aux if self.k_aux is not None else max(1, self.d_out // 2))


def _check_number(name: str, value, positive: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating) or not np.isfinite(value) \
            or value < 0 or (positive and value == 0):
        raise AnalysisError(f"TranscoderConfig {name}={value!r} must be a finite number {'>' if positive else '≥'} 0.")


def pre_activations(params, x):
    """pre [..., S] of MLP inputs x [..., D]."""
    return x @ params["W_enc"] + params["b_enc"]


def _top_k(values, k: int):
    kept, index = jax.lax.top_k(values, k)
    rows = jnp.zeros_like(values)
    return jax.nn.relu(jnp.put_along_axis(rows, index, kept, axis=-1, inplace=False))


def activate(config: TranscoderConfig, params, pre):
    """f = σ(pre) at inference (batchtopk: the JumpReLU with its global threshold)."""
    if config.architecture == "relu":
        return jax.nn.relu(pre)
    if config.architecture == "topk":
        return _top_k(pre, config.k)
    return jnp.where(pre > params["threshold"], pre, 0.0)  # jumprelu; batchtopk's threshold is one value


def encode(config: TranscoderConfig, params, x):
    """Latent activations f [..., S] of MLP inputs x [..., D]."""
    return activate(config, params, pre_activations(params, x))


def decode(config: TranscoderConfig, params, latents, x):
    """ŷ [..., D] from latents [..., S] (and, for a skip transcoder, the input x [..., D])."""
    y = latents @ params["W_dec"] + params["b_dec"]
    return y + x @ params["W_skip"] if config.skip else y


def forward(config: TranscoderConfig, params, x):
    """ŷ [..., D]: what the transcoder predicts the MLP writes for inputs x [..., D]."""
    return decode(config, params, encode(config, params, x), x)


def init_params(config: TranscoderConfig, seed: int = 0) -> dict[str, jax.Array]:
    """Decoder rows random unit vectors, the encoder their transpose where widths agree, biases zero."""
    key_dec, key_enc = jax.random.split(jax.random.key(seed))
    W_dec = jax.random.normal(key_dec, (config.d_sae, config.d_out), jnp.float32)
    W_dec = W_dec / jnp.linalg.norm(W_dec, axis=-1, keepdims=True)
    if config.d_in == config.d_out:
        W_enc = W_dec.T
    else:
        W_enc = jax.random.normal(key_enc, (config.d_in, config.d_sae), jnp.float32) / np.sqrt(config.d_in)
    params = {"W_enc": W_enc, "b_enc": jnp.zeros(config.d_sae), "W_dec": W_dec, "b_dec": jnp.zeros(config.d_out)}
    if config.skip:
        params["W_skip"] = jnp.zeros((config.d_in, config.d_out))
    if config.architecture in ("jumprelu", "batchtopk"):
        params["threshold"] = jnp.zeros(config.d_sae) if config.architecture == "jumprelu" else jnp.zeros(())
    return params
