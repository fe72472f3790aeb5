"""Training a transcoder: the losses of each architecture, one compiled step, and the Trainer (sae.Trainer's
optimiser, warm-up, dead-latent counters, progress bar, save and resume; the step and the stream check are the
transcoder's own).

Losses, averaged over the N tokens of a batch (docs/transcoders.md):
- reconstruction ‖y − ŷ‖² (summed over D), y the MLP's output;
- "topk", "batchtopk": + α ‖e − TopK_kaux(pre over dead latents) W_dec‖² (AuxK, Gao et al. 2024; e = y − ŷ with
  no gradient; "dead": no firing over the last dead_tokens tokens);
- "relu": + λ₁ Σ_i f_i ‖W_dec,i‖ (L1);
- "jumprelu": + λ₀ Σ_i H(pre_i − θ_i) (L0), with Rajamanoharan et al. (2024)'s pseudo-derivatives for θ:
  ∂JumpReLU/∂θ = −(θ/ε) K((pre − θ)/ε), ∂H/∂θ = −(1/ε) K((pre − θ)/ε), K the rectangle kernel 1[|u| ≤ ½];
  the gradient to pre is the straight-through H(pre − θ) (no pseudo-derivative to the pre-activation).
λ₁, λ₀ ramp up linearly over sparsity_warmup steps. After each update decoder rows are renormalised to unit norm
and JumpReLU thresholds clipped at 0 (θ ≥ 0, so relu(pre)·H(pre − θ) = pre·H(pre − θ): SAELens' form).

BatchTopK trains on the k·N largest activations of the batch (Bussmann et al. 2024) and keeps, outside the
optimiser, θ ← (1 − r) θ + r · (the smallest activation kept in the batch), r = threshold_rate (SAELens'
moving average); inference is the JumpReLU with that one θ.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from minibert.analysis.sae import training as sae_training
from minibert.analysis.sae.model import checked_finite, unit_decoder
from minibert.analysis.transcoders.model import (
    TranscoderConfig,
    _top_k,
    activate,
    decode,
    init_params,
    pre_activations,
)
from minibert.analysis.transcoders.source import IDENTITY, check_source
from minibert.errors import AnalysisError


def _rectangle(u):
    return (jnp.abs(u) <= 0.5).astype(u.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def jumprelu(pre, threshold, bandwidth: float):
    """pre · H(pre − θ), with the straight-through gradient to pre and the pseudo-derivative to θ."""
    return jnp.where(pre > threshold, pre, 0.0)


def _jumprelu_fwd(pre, threshold, bandwidth):
    return jumprelu(pre, threshold, bandwidth), (pre, threshold)


def _jumprelu_bwd(bandwidth, residuals, g):
    pre, threshold = residuals
    d_threshold = -(threshold / bandwidth) * _rectangle((pre - threshold) / bandwidth) * g
    return jnp.where(pre > threshold, g, 0.0), _summed_to(d_threshold, threshold)


jumprelu.defvjp(_jumprelu_fwd, _jumprelu_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def heaviside(pre, threshold, bandwidth: float):
    """H(pre − θ): no gradient to pre, the pseudo-derivative −(1/ε) K((pre − θ)/ε) to θ."""
    return (pre > threshold).astype(pre.dtype)


def _heaviside_fwd(pre, threshold, bandwidth):
    return heaviside(pre, threshold, bandwidth), (pre, threshold)


def _heaviside_bwd(bandwidth, residuals, g):
    pre, threshold = residuals
    d_threshold = -(1.0 / bandwidth) * _rectangle((pre - threshold) / bandwidth) * g
    return jnp.zeros_like(pre), _summed_to(d_threshold, threshold)


heaviside.defvjp(_heaviside_fwd, _heaviside_bwd)


def _summed_to(gradient, like):
    """gradient [N, S] summed over the batch axes to θ's shape [S]."""
    return jnp.sum(gradient, axis=tuple(range(gradient.ndim - like.ndim))).reshape(like.shape)


def batch_top_k(pre, k: int):
    """ReLU(pre) [N, S] with all but the k·N largest entries of the whole batch set to 0."""
    flat = jax.nn.relu(pre).reshape(-1)
    kept, index = jax.lax.top_k(flat, k * pre.shape[0])
    return jnp.zeros_like(flat).at[index].set(kept).reshape(pre.shape)


def training_activations(config: TranscoderConfig, params, pre):
    """f [N, S] as training computes it (batchtopk: over the batch; jumprelu: with its pseudo-derivatives)."""
    if config.architecture == "batchtopk":
        return batch_top_k(pre, config.k)
    if config.architecture == "jumprelu":
        return jumprelu(pre, params["threshold"], config.bandwidth)
    return activate(config, params, pre)


def losses(config: TranscoderConfig, params, x, y, dead, step):
    """({"total", "mse", and "aux" | "l1" | "l0"}, latents [N, S]) for pairs x [N, d_in], y [N, d_out]; dead [S]
    bool (AuxK), step (the sparsity warm-up)."""
    pre = pre_activations(params, x)
    latents = training_activations(config, params, pre)
    error = y - decode(config, params, latents, x)
    mse = jnp.mean(jnp.sum(error**2, -1))
    ramp = jnp.minimum(1.0, (step + 1) / config.sparsity_warmup) if config.sparsity_warmup else 1.0
    if config.architecture in ("topk", "batchtopk"):

        def aux_loss(pre, W_dec, error):
            aux_latents = _top_k(jnp.where(dead, pre, -jnp.inf), config.aux_k)  # live latents: −inf, ReLU'd to 0
            return jnp.mean(jnp.sum((error - aux_latents @ W_dec) ** 2, -1))

        # no dead latent, no AuxK loss: the branch (a top-k over every latent) is skipped, not multiplied by 0
        aux = jax.lax.cond(jnp.any(dead), aux_loss, lambda *_: jnp.zeros((), x.dtype), pre, params["W_dec"],
                           jax.lax.stop_gradient(error))
        return {"total": mse + config.aux_coefficient * aux, "mse": mse, "aux": aux}, latents
    if config.architecture == "relu":
        l1 = jnp.mean(jnp.sum(latents * jnp.linalg.norm(params["W_dec"], axis=-1), -1))
        return {"total": mse + config.l1_coefficient * ramp * l1, "mse": mse, "l1": l1}, latents
    l0 = jnp.mean(jnp.sum(heaviside(pre, params["threshold"], config.bandwidth), -1))
    return {"total": mse + config.l0_coefficient * ramp * l0, "mse": mse, "l0": l0}, latents


def _optimised(config: TranscoderConfig, params) -> tuple[dict, dict]:
    """(what Adam updates, what it does not): batchtopk's threshold is a moving average, not a parameter."""
    if config.architecture != "batchtopk":
        return params, {}
    return {k: v for k, v in params.items() if k != "threshold"}, {"threshold": params["threshold"]}


@functools.partial(jax.jit, static_argnames=("config", "optimizer"))
def _train_step(params, opt_state, since_fired, x, y, step, dead_tokens, *, config, optimizer):
    """One update: (params, opt_state, tokens since each latent fired [S], losses)."""
    dead = since_fired >= dead_tokens
    trained, fixed = _optimised(config, params)

    def objective(trained):
        parts, latents = losses(config, trained | fixed, x, y, dead, step)
        return parts["total"], (parts, latents)

    (_, (parts, latents)), grads = jax.value_and_grad(objective, has_aux=True)(trained)
    updates, opt_state = optimizer.update(grads, opt_state, trained)
    params = unit_decoder(optax.apply_updates(trained, updates)) | fixed
    if config.architecture == "jumprelu":
        params["threshold"] = jnp.maximum(params["threshold"], 0.0)
    if config.architecture == "batchtopk":
        smallest = jnp.min(jnp.where(latents > 0, latents, jnp.inf))
        moved = (1 - config.threshold_rate) * params["threshold"] + config.threshold_rate * smallest
        params["threshold"] = jnp.where(jnp.isfinite(smallest), moved, params["threshold"])
    fired = jnp.any(latents > 0, axis=0)
    since_fired = jnp.where(fired, 0, since_fired + x.shape[0])
    return params, opt_state, since_fired, parts


def _maths_only(config: TranscoderConfig) -> TranscoderConfig:
    """The config with what does not change the step (where it reads and writes) blanked: the compiled step, keyed
    on the config, is one program for every layer and model of the same widths and settings."""
    return dataclasses.replace(config, layer=0, hook_in=None, hook_out=None, model_name=None, weights=None)


class Trainer(sae_training.Trainer):
    """A transcoder's parameters and optimiser state; `step(x, y)` trains on one batch of MLP pairs.

        trainer = Trainer(TranscoderConfig(d_in=384, d_sae=4096, d_out=384, layer=3, k=32), learning_rate=2e-4)
        trainer.train(transcoders.activations(model, texts, layer=3), steps=1000, progress=True)
        trainer.save("run.npz"); trainer = Trainer.resume("run.npz")     # continues exactly

    train() records the stream's source (weights digest, layer, hooks) and refuses a stream of another site or
    model, on this run and on one resumed from it; the config takes the hooks and weights digest it trained on.
    """

    config_class = TranscoderConfig
    what = "transcoder"

    def __init__(self, config: TranscoderConfig, *, learning_rate: float = 2e-4, warmup: int = 0,
                 dead_tokens: int = 1_000_000, seed: int = 0, params=None, source: dict | None = None):
        sae_training._check_settings(learning_rate, warmup, dead_tokens)
        self.config, self.learning_rate, self.warmup, self.dead_tokens = config, learning_rate, warmup, dead_tokens
        self.source, self.seed = source, seed
        self.optimizer = sae_training._adam(learning_rate, warmup)
        if params is None:
            params = init_params(config, seed)
            if config.architecture == "jumprelu":
                params["threshold"] = jnp.full(config.d_sae, config.threshold_init, jnp.float32)
        self.params = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}
        self.opt_state = self.optimizer.init(_optimised(config, self.params)[0])
        self.since_fired = jnp.zeros(config.d_sae, jnp.int32)
        self.steps = 0

    def center(self, y) -> None:
        """Set b_dec to the mean of sample MLP outputs y [N, d_out] before training: ŷ starts at their centre."""
        self.params = self.params | {"b_dec": jnp.mean(jnp.asarray(y, jnp.float32), axis=0)}

    def step(self, x, y=None) -> dict[str, float]:
        """Train on one batch: x [N, d_in] the MLP's inputs, y [N, d_out] its outputs (or one (x, y) tuple; a
        stream's Pairs batch has its source checked and recorded, as train() does the stream's)."""
        if y is None and isinstance(x, tuple) and len(x) == 2:
            self._check_source(getattr(x, "source", None))  # a batch kept from a stream (a list of them, a cache)
            x, y = x
        x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
        config = self.config
        if x.ndim != 2 or x.shape[1] != config.d_in or y.shape != (x.shape[0], config.d_out):
            raise AnalysisError(f"a training batch is x [N, {config.d_in}] and y [N, {config.d_out}] (the MLP's input "
                                f"and output); got {x.shape} and {y.shape}.")
        # one NaN would reach every parameter through Adam's moments
        for name, values in (("x", x), ("y", y)):
            checked_finite(values, f"this batch's {name}", "the step would put NaN into the transcoder's parameters")
        return self._applied(*_train_step(
            self.params, self.opt_state, self.since_fired, x, y, jnp.int32(self.steps), jnp.int32(self.dead_tokens),
            config=_maths_only(config), optimizer=self.optimizer))

    @staticmethod
    def rows(batch) -> int:
        return len(batch[0])  # an (x, y) pair of [N, d] arrays

    def _check_source(self, source: dict | None) -> None:
        """A stream from transcoders.activations names its weights, layer and hooks: refuse one of another site
        than the config's, or other than the one this trainer (or the run it resumes) trained on; then record
        it, and its hooks and weights in the config (which save and the splicing checks read)."""
        if source is None or source == self.source:  # nothing new: step() sees each batch's source
            return
        config = self.config
        check_source(config, source, f"stream transcoders.activations(model, texts, layer={config.layer}) of the "
                                     f"model it was configured for, or start a new Trainer.")
        if self.source is not None and any(source[key] != self.source[key] for key in IDENTITY):
            raise AnalysisError(f"this transcoder was trained on {self.source} and these pairs come from {source}; "
                                f"resume on the same layer and model weights, or start a new Trainer.")
        self.source = source
        self.config = dataclasses.replace(config, hook_in=source["hook_in"], hook_out=source["hook_out"],
                                          weights=source["weights"], model_name=config.model_name or source["model"])
