"""The sparse autoencoder itself: parameters in SAELens' names and shapes, encoder, decoder and losses.

    pre  = (x − b_dec) W_enc + b_enc                  W_enc [D, S], b_enc [S] (S latents, D the site's width)
    a    = ReLU(pre)                                  "relu": the standard SAE (Anthropic 2023; SAELens "standard")
         = ReLU(TopK_k(pre))                          "topk": Gao et al. 2024 (the k largest kept, the rest 0)
    x̂    = a W_dec + b_dec                            W_dec [S, D] (rows unit-norm), b_dec [D]

Losses, averaged over the tokens of a batch:
- reconstruction: ‖x̂ − x‖² (summed over D);
- "relu": + λ Σ_j a_j ‖W_dec,j‖ (SAELens' standard L1 penalty, λ ramped up linearly over l1_warmup steps);
- "topk": + α ‖e − W_dec^T-decode of z_aux‖² (Gao et al.'s AuxK): e = x − x̂ with no gradient, z_aux the
  k_aux largest pre-activations among the dead latents (ReLU'd), decoded without b_dec as in the paper; α = 1/32.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from minibert.analysis._finite import refuse_nonfinite
from minibert.errors import AnalysisError

ARCHITECTURES = ("topk", "relu")
SAELENS_ARCHITECTURE = {"topk": "topk", "relu": "standard"}  # our name → cfg.json's "architecture"


@dataclasses.dataclass(frozen=True)
class SAEConfig:
    """What an SAE is: its width, sparsity mechanism and where in the model it reads (a hook name)."""

    d_in: int
    d_sae: int
    architecture: str = "topk"
    k: int = 32  # topk: latents kept per token
    k_aux: int | None = None  # topk: dead latents used by AuxK (None: d_in // 2, Gao et al.'s heuristic)
    aux_coefficient: float = 1 / 32  # topk: α of the AuxK loss
    l1_coefficient: float = 5.0  # relu: λ
    l1_warmup: int = 0  # relu: steps over which λ ramps up from 0
    hook_name: str | None = None  # e.g. "blocks.3.hook_resid_post"
    model_name: str | None = None

    def __post_init__(self):
        python_numbers(self)
        if self.architecture not in ARCHITECTURES:
            raise AnalysisError(f"architecture={self.architecture!r}: pick 'topk' (Gao et al. 2024) or 'relu' (L1).")
        least = {"d_in": 1, "d_sae": 1, "k": 1, "l1_warmup": 0} | ({"k_aux": 1} if self.k_aux is not None else {})
        for name, smallest in least.items():
            value = getattr(self, name)
            if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < smallest:
                raise AnalysisError(f"SAEConfig {name}={value!r} must be a whole number ≥ {smallest}.")
        if self.architecture == "topk" and self.k > self.d_sae:
            raise AnalysisError(f"k={self.k} latents kept of d_sae={self.d_sae}: k must be at most d_sae.")
        for name in ("aux_coefficient", "l1_coefficient"):
            value = getattr(self, name)
            if not isinstance(value, int | float | np.floating) or isinstance(value, bool) or not 0 <= value < np.inf:
                raise AnalysisError(f"SAEConfig {name}={value!r} must be a finite number ≥ 0.")

    @property
    def aux_k(self) -> int:
        return min(self.d_sae, self.k_aux if self.k_aux is not None else max(1, self.d_in // 2))


def python_numbers(config) -> None:
    """Replace a frozen config's NumPy integers and floats (np.int64(384), np.float32(0.5)) by Python's int and
    float, in place, before it is checked: the trainers' checkpoints and the SAELens cfg.json are JSON, which holds
    no NumPy scalar. NumPy bools are left alone (they are no count, and the checks refuse them where a count is
    asked for)."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if isinstance(value, np.integer):
            object.__setattr__(config, field.name, int(value))
        elif isinstance(value, np.floating):
            object.__setattr__(config, field.name, float(value))


def checked_finite(x: np.ndarray, what: str, why: str) -> None:
    """Refuse activations [N, d] holding NaN or ±inf, naming the first row; `why` says what they would do."""
    refuse_nonfinite(x, lambda bad: f"{what} holds {bad.count} non-finite activations (NaN or ±inf), the first in row "
                                    f"{bad.first[0]}; {why}. Drop those rows.")


def init_params(config: SAEConfig, seed: int = 0) -> dict[str, jax.Array]:
    """Decoder rows random unit vectors, the encoder their transpose (Gao et al.), biases zero."""
    W_dec = jax.random.normal(jax.random.key(seed), (config.d_sae, config.d_in), jnp.float32)
    W_dec = W_dec / jnp.linalg.norm(W_dec, axis=-1, keepdims=True)
    return {"W_enc": W_dec.T, "b_enc": jnp.zeros(config.d_sae), "W_dec": W_dec, "b_dec": jnp.zeros(config.d_in)}


def pre_activations(params, x):
    return (x - params["b_dec"]) @ params["W_enc"] + params["b_enc"]


def _top_k(values, k: int):
    """values with all but the k largest of each row set to 0 (then ReLU'd)."""
    kept, index = jax.lax.top_k(values, k)
    rows = jnp.zeros_like(values)
    return jax.nn.relu(jnp.put_along_axis(rows, index, kept, axis=-1, inplace=False))


def activate(config: SAEConfig, pre):
    return _top_k(pre, config.k) if config.architecture == "topk" else jax.nn.relu(pre)


def encode(config: SAEConfig, params, x):
    """Latent activations [..., S] of inputs [..., D]."""
    return activate(config, pre_activations(params, x))


def decode(params, latents):
    return latents @ params["W_dec"] + params["b_dec"]


def reconstruct(config: SAEConfig, params, x):
    return decode(params, encode(config, params, x))


def losses(config: SAEConfig, params, x, dead, step):
    """({"total", "mse", "aux" | "l1"}, latents) for a batch x [N, D]; dead [S] bool (AuxK), step (L1 warm-up)."""
    pre = pre_activations(params, x)
    latents = activate(config, pre)
    error = x - decode(params, latents)
    mse = jnp.mean(jnp.sum(error**2, -1))
    if config.architecture == "topk":

        def aux_loss(pre, W_dec, error):
            aux_latents = _top_k(jnp.where(dead, pre, -jnp.inf), config.aux_k)  # live latents: −inf, ReLU'd to 0
            return jnp.mean(jnp.sum((error - aux_latents @ W_dec) ** 2, -1))

        # no dead latent, no AuxK loss: the branch (a top-k over every latent) is skipped, not multiplied by 0
        aux = jax.lax.cond(jnp.any(dead), aux_loss, lambda *_: jnp.zeros((), x.dtype), pre, params["W_dec"],
                           jax.lax.stop_gradient(error))
        return {"total": mse + config.aux_coefficient * aux, "mse": mse, "aux": aux}, latents
    ramp = jnp.minimum(1.0, (step + 1) / config.l1_warmup) if config.l1_warmup else 1.0
    l1 = jnp.mean(jnp.sum(latents * jnp.linalg.norm(params["W_dec"], axis=-1), -1))
    return {"total": mse + config.l1_coefficient * ramp * l1, "mse": mse, "l1": l1}, latents


def unit_decoder(params):
    """Decoder rows rescaled to unit norm (after each update): the sparsity penalty cannot shrink by scaling."""
    W_dec = params["W_dec"]
    return params | {"W_dec": W_dec / jnp.maximum(jnp.linalg.norm(W_dec, axis=-1, keepdims=True), 1e-12)}


def as_numpy(params) -> dict[str, np.ndarray]:
    return {name: np.asarray(value, np.float32) for name, value in params.items()}
