"""Training a crosscoder: the SAE trainer's pieces (Adam with warm-up, dead-latent tracking, the checkpoint file,
the progress bar) around the crosscoder's losses, in one compiled step.

    trainer = CrosscoderTrainer(CrosscoderConfig(d_in=384, d_sae=4096, k=32), learning_rate=2e-4)
    trainer.train(paired_activations(base, finetuned, texts, "blocks.3.hook_resid_post"), progress=True)
    trainer.save("run.npz"); trainer = CrosscoderTrainer.resume("run.npz")

train() on paired_activations' stream records the site, the two models' names and weights it reads
(CrosscoderTrainer.source) and refuses a stream of another site or pair, even of the same width.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax

from minibert.analysis.diffing.crosscoder import CrosscoderConfig, checked_pairs, init_params, losses, updated_threshold
from minibert.analysis.sae.training import Trainer, _adam, _check_settings
from minibert.errors import AnalysisError

_NOT_TRAINED = ("threshold",)  # set from the batches, not by gradients


@functools.partial(jax.jit, static_argnames=("config", "optimizer"))
def _train_step(params, opt_state, since_fired, x, step, dead_tokens, *, config, optimizer):
    """One update: (params, opt_state, tokens since each latent fired [S], losses)."""
    dead = since_fired >= dead_tokens
    trained = {name: value for name, value in params.items() if name not in _NOT_TRAINED}

    def objective(trained):
        parts, latents, smallest = losses(config, trained | {"threshold": params["threshold"]}, x, dead, step)
        return parts["total"], (parts, latents, smallest)

    (_, (parts, latents, smallest)), grads = jax.value_and_grad(objective, has_aux=True)(trained)
    updates, opt_state = optimizer.update(grads, opt_state, trained)
    params = optax.apply_updates(trained, updates) | {"threshold": updated_threshold(params["threshold"], smallest)}
    fired = jnp.any(latents > 0, axis=0)
    since_fired = jnp.where(fired, 0, since_fired + x.shape[0])
    return params, opt_state, since_fired, parts


class CrosscoderTrainer(Trainer):
    """Holds a crosscoder's parameters and optimiser state; `step(x)` trains on one batch x [N, 2, d_in]. The SAE
    trainer's train, save and resume, around the crosscoder's own step."""

    config_class = CrosscoderConfig
    what = "crosscoder"

    def __init__(self, config: CrosscoderConfig, *, learning_rate: float = 2e-4, warmup: int = 0,
                 dead_tokens: int = 1_000_000, seed: int = 0, params=None, source: dict | None = None):
        _check_settings(learning_rate, warmup, dead_tokens)
        self.config, self.learning_rate, self.warmup, self.dead_tokens = config, learning_rate, warmup, dead_tokens
        self.source, self.seed = source, seed
        self.optimizer = _adam(learning_rate, warmup)
        self.params = init_params(config, seed) if params is None else {k: jnp.asarray(v) for k, v in params.items()}
        self.opt_state = self.optimizer.init({k: v for k, v in self.params.items() if k not in _NOT_TRAINED})
        self.since_fired = jnp.zeros(config.d_sae, jnp.int32)
        self.steps = 0

    def center(self, x) -> None:
        """Set each model's b_dec to its mean over sample paired activations x [N, 2, d_in] before training."""
        x = checked_pairs(x, self.config.d_in, "the centring sample")
        self.params = self.params | {"b_dec": jnp.mean(jnp.asarray(x), axis=0)}

    def step(self, x) -> dict[str, float]:
        x = checked_pairs(x, self.config.d_in)
        return self._applied(*_train_step(
            self.params, self.opt_state, self.since_fired, x, jnp.int32(self.steps), jnp.int32(self.dead_tokens),
            config=self.config, optimizer=self.optimizer))

    def compiled_step(self, x):
        """The compiled training step for batches shaped as x (jax.stages.Compiled): its memory_analysis() and
        cost_analysis() are XLA's own account of one step (benchmarks/ read them)."""
        x = checked_pairs(x, self.config.d_in)
        return _train_step.lower(self.params, self.opt_state, self.since_fired, x, jnp.int32(self.steps),
                                 jnp.int32(self.dead_tokens), config=self.config, optimizer=self.optimizer).compile()

    def _check_source(self, source: dict | None) -> None:
        """Refuse a stream of another site than the config's, of other models than the config names, or other than
        the one this trainer (or the run it resumes) trained on; then remember it, and its site in the config."""
        if source is None:
            return
        if self.config.hook_name is not None and source["hook_name"] != self.config.hook_name:
            raise AnalysisError(f"these activations are {source['hook_name']!r}'s but the crosscoder reads "
                                f"{self.config.hook_name!r}; stream the site it was configured for.")
        if self.config.model_names is not None and tuple(source["models"]) != self.config.model_names:
            raise AnalysisError(f"these activations are of the models {tuple(source['models'])} but the crosscoder "
                                f"is between {self.config.model_names}; stream the pair it was configured for.")
        if self.source is not None and source != self.source:
            raise AnalysisError(f"this crosscoder was trained on {self.source} and these activations come from "
                                f"{source}; resume on the same site and pair of models, or start a new trainer.")
        self.source = source
        if self.config.hook_name is None:  # the site it trained on, which what_changed and save then know
            self.config = dataclasses.replace(self.config, hook_name=source["hook_name"])
