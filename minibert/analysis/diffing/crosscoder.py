"""A crosscoder between two models at one site (Lindsey et al. 2024, acausal, one layer): shared sparse latents
read from both models' activations, and one decoder per model.

Axes: N tokens, M = 2 models (0 = A, the base; 1 = B, the fine-tune), D the site's width, S latents.

    pre  = Σ_M (x_M − b_dec[M]) W_enc[M] + b_enc      W_enc [M, D, S], b_enc [S]
    f    = BatchTopK(ReLU(pre))   or   ReLU(pre)      "batchtopk" (Minder et al. 2025) | "l1" (Lindsey et al.)
    x̂_M  = f W_dec[M] + b_dec[M]                      W_dec [M, S, D], b_dec [M, D]

BatchTopK keeps, over a whole training batch, the k·N largest values of ReLU(pre_i)·(‖W_dec[A]_i‖ + ‖W_dec[B]_i‖)
(so a latent cannot win the selection by a small decoder and a large activation) and zeroes the rest; outside
training a token keeps the latents whose value exceeds `threshold`, a running mean (decay 0.99) of the smallest
positive value kept in each training batch (the inference rule of Bussmann et al. 2024). Losses, averaged over tokens:
- reconstruction Σ_M ‖x_M − x̂_M‖²;
- "batchtopk": + α·AuxK, Gao et al.'s auxiliary loss on the dead latents' top-k_aux pre-activations, fitted to
  both models' errors (stop-gradient), α = 1/32 as the SAE's;
- "l1": + λ Σ_i f_i (‖W_dec[A]_i‖ + ‖W_dec[B]_i‖) (Lindsey et al.'s penalty; λ ramped over l1_warmup steps).
Decoders are never renormalised: their norms in each model are what the analysis reads (latents.py). Taking
b_dec off before encoding (Lindsey et al. write W_enc x + b_enc) is the same family of functions with b_enc
shifted; it starts the encoder at the data's centre once `center` has set b_dec, as for the SAE.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from minibert.analysis.sae.model import checked_finite, python_numbers
from minibert.errors import AnalysisError

ARCHITECTURES = ("batchtopk", "l1")
THRESHOLD_DECAY = 0.99  # the running mean's decay: the threshold follows the last ~100 training batches


@dataclasses.dataclass(frozen=True)
class CrosscoderConfig:
    """What a crosscoder is: its width, sparsity mechanism, the site it reads and the two models it reads it in."""

    d_in: int
    d_sae: int
    architecture: str = "batchtopk"
    k: int = 32  # batchtopk: latents kept per token on average over a batch
    k_aux: int | None = None  # batchtopk: dead latents AuxK uses (None: d_in // 2)
    aux_coefficient: float = 1 / 32
    l1_coefficient: float = 1.0  # l1: λ
    l1_warmup: int = 0
    hook_name: str | None = None
    model_names: tuple[str, str] | None = None  # (A, B), e.g. ("base", "fine-tuned"); the stream's sources

    def __post_init__(self):
        python_numbers(self)
        if self.architecture not in ARCHITECTURES:
            raise AnalysisError(f"architecture={self.architecture!r}: pick 'batchtopk' (Minder et al. 2025) or 'l1' "
                                f"(Lindsey et al. 2024).")
        least = {"d_in": 1, "d_sae": 1, "k": 1, "l1_warmup": 0} | ({"k_aux": 1} if self.k_aux is not None else {})
        for name, smallest in least.items():
            value = getattr(self, name)
            if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < smallest:
                raise AnalysisError(f"CrosscoderConfig {name}={value!r} must be a whole number ≥ {smallest}.")
        if self.architecture == "batchtopk" and self.k > self.d_sae:
            raise AnalysisError(f"k={self.k} latents kept of d_sae={self.d_sae}: k must be at most d_sae.")
        for name in ("aux_coefficient", "l1_coefficient"):
            value = getattr(self, name)
            if not isinstance(value, int | float | np.floating) or isinstance(value, bool) or not 0 <= value < np.inf:
                raise AnalysisError(f"CrosscoderConfig {name}={value!r} must be a finite number ≥ 0.")
        if self.model_names is not None:
            object.__setattr__(self, "model_names", tuple(self.model_names))
            if len(self.model_names) != 2:
                raise AnalysisError(f"model_names={self.model_names!r}: name the two models, (A, B).")

    @property
    def aux_k(self) -> int:
        return min(self.d_sae, self.k_aux if self.k_aux is not None else max(1, self.d_in // 2))


def init_params(config: CrosscoderConfig, seed: int = 0) -> dict[str, jax.Array]:
    """Every latent starts shared: the same random direction in both decoders (each of norm 1/√2, so the pair has
    unit norm), the encoders their transposes, biases zero; BatchTopK's threshold unset (−1) until training sets
    it. Any difference between the two decoders is then learnt from the data."""
    rows = jax.random.normal(jax.random.key(seed), (config.d_sae, config.d_in), jnp.float32)
    rows = rows / jnp.linalg.norm(rows, axis=-1, keepdims=True) / np.sqrt(2)
    W_dec = jnp.stack([rows, rows])
    return {"W_enc": W_dec.transpose(0, 2, 1), "b_enc": jnp.zeros(config.d_sae), "W_dec": W_dec,
            "b_dec": jnp.zeros((2, config.d_in)), "threshold": jnp.float32(-1.0)}


def decoder_norms(params) -> jax.Array:
    """[M, S] ‖W_dec[M]_i‖ of each latent in each model."""
    return jnp.linalg.norm(params["W_dec"], axis=-1)


def pre_activations(params, x):
    """[N, S] of paired activations x [N, M, D], each model's decoder bias taken off first (as the SAE does)."""
    return jnp.einsum("NMD,MDS->NS", x - params["b_dec"], params["W_enc"]) + params["b_enc"]


def _batch_top_k(values, scores, kept: int):
    """values [N, S] where scores is among the `kept` largest of the whole batch (and positive), else 0; and the
    smallest score kept (NaN where none is: the threshold then stays). The kept-th largest score is found by a
    partition, not lax.top_k, whose XLA CPU kernel takes seconds for k in the tens of thousands."""
    flat = scores.reshape(-1)
    kth = -jnp.partition(-flat, kept - 1)[kept - 1]
    mask = (scores >= kth) & (scores > 0)  # ties at the cut (measure zero for real scores) are all kept
    smallest = jnp.min(jnp.where(mask, scores, jnp.inf))
    return jnp.where(mask, values, 0.0), jnp.where(jnp.isinf(smallest), jnp.nan, smallest)


def _scores(params, relu_pre):
    return relu_pre * jnp.sum(decoder_norms(params), axis=0)


def encode(config: CrosscoderConfig, params, x):
    """Latent activations [N, S] of paired activations x [N, M, D], as used after training: BatchTopK keeps each
    token's latents whose norm-weighted value exceeds the learnt threshold."""
    relu_pre = jax.nn.relu(pre_activations(params, x))
    if config.architecture == "l1":
        return relu_pre
    return jnp.where(_scores(params, relu_pre) > params["threshold"], relu_pre, 0.0)


def contributions(params, x):
    """[N, M, S] what each model's own vector adds to each latent's pre-activation, x_M · W_enc[M]_i, of paired
    activations x [N, M, D]: a latent the fine-tune added is driven from B's side."""
    return jnp.einsum("NMD,MDS->NMS", x, params["W_enc"])


def decode(params, latents):
    """[N, M, D] each model's reconstruction from latents [N, S]."""
    return jnp.einsum("NS,MSD->NMD", latents, params["W_dec"]) + params["b_dec"]


def losses(config: CrosscoderConfig, params, x, dead, step):
    """({"total", "mse", "aux" | "l1"}, latents [N, S], the smallest kept value or NaN) of a batch x [N, M, D]."""
    relu_pre = jax.nn.relu(pre := pre_activations(params, x))
    if config.architecture == "batchtopk":
        latents, smallest = _batch_top_k(relu_pre, _scores(params, relu_pre), config.k * x.shape[0])
    else:
        latents, smallest = relu_pre, jnp.float32(jnp.nan)
    error = x - decode(params, latents)
    mse = jnp.mean(jnp.sum(error**2, (-2, -1)))
    if config.architecture == "batchtopk":

        def aux_loss(pre, W_dec, error):
            kept, index = jax.lax.top_k(jnp.where(dead, pre, -jnp.inf), config.aux_k)
            aux = jax.nn.relu(jnp.put_along_axis(jnp.zeros_like(pre), index, kept, axis=-1, inplace=False))
            return jnp.mean(jnp.sum((error - jnp.einsum("NS,MSD->NMD", aux, W_dec)) ** 2, (-2, -1)))

        aux = jax.lax.cond(jnp.any(dead), aux_loss, lambda *_: jnp.zeros((), x.dtype), pre, params["W_dec"],
                           jax.lax.stop_gradient(error))
        return {"total": mse + config.aux_coefficient * aux, "mse": mse, "aux": aux}, latents, smallest
    ramp = jnp.minimum(1.0, (step + 1) / config.l1_warmup) if config.l1_warmup else 1.0
    l1 = jnp.mean(latents @ jnp.sum(decoder_norms(params), axis=0))
    return {"total": mse + config.l1_coefficient * ramp * l1, "mse": mse, "l1": l1}, latents, smallest


def updated_threshold(threshold, smallest):
    """The running mean of each batch's smallest kept value (the first batch sets it)."""
    if_set = THRESHOLD_DECAY * threshold + (1 - THRESHOLD_DECAY) * smallest
    return jnp.where(jnp.isnan(smallest), threshold, jnp.where(threshold < 0, smallest, if_set))


def checked_pairs(x, d_in: int, what: str = "this batch") -> np.ndarray:
    """x as float32 [N, 2, d_in], or an AnalysisError naming its shape or its first non-finite row."""
    x = np.asarray(x, np.float32)
    if x.ndim != 3 or x.shape[1:] != (2, d_in) or not x.shape[0]:
        raise AnalysisError(f"{what}: a crosscoder reads paired activations [N, 2, {d_in}] (the two models' vectors "
                            f"of each token, A then B); got shape {tuple(x.shape)}. Use diffing.paired_activations.")
    checked_finite(x.reshape(len(x), -1), what, "the crosscoder would turn NaN")
    return x
