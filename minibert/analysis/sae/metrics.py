"""How good an SAE is: sparsity (L0), fraction of variance unexplained, dead and dense latents, and spliced-in
fidelity — the model run with the SAE's reconstruction written in place of the hook's value.

- L0: mean number of non-zero latents per token.
- FVU: Σ‖x − x̂‖² / Σ‖x − mean(x)‖² over the tokens (0 perfect; 1 no better than the mean).
- dead: fraction of latents that never fire on the tokens given; dense: fraction firing on more than
  `dense_above` of them (SAELens' feature-density plots flag those above 10%).
- fidelity, masked-LM checkpoints: masked-LM cross-entropy with the reconstruction spliced in, minus without.
- fidelity, sentence-transformers checkpoints: cosine between the sentence embeddings with and without (pooled
  as the checkpoint's Pooling module says).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from minibert.analysis.gradients import mask_tokens, mlm_loss_fn
from minibert.analysis.sae.model import SAEConfig, encode, reconstruct
from minibert.hooks import HookFn
from minibert.pooling import pooled_tokens


def evaluate(config: SAEConfig, params, x, dense_above: float = 0.1) -> dict[str, float | np.ndarray]:
    """{"l0", "fvu", "dead", "dense", "frequency" [S]} on activations x [N, d_in]."""
    x = jnp.asarray(x, jnp.float32)
    latents = encode(config, params, x)
    error = x - reconstruct(config, params, x)
    frequency = np.asarray(jnp.mean(latents > 0, axis=0))
    return {"l0": float(jnp.mean(jnp.sum(latents > 0, -1))),
            "fvu": float(jnp.sum(error**2) / jnp.sum((x - x.mean(0)) ** 2)),
            "dead": float(np.mean(frequency == 0)), "dense": float(np.mean(frequency > dense_above)),
            "frequency": frequency}


def _splice(value, ctx, config, W_enc, b_enc, W_dec, b_dec):
    """The hook's value [B, T, ...] replaced by its SAE reconstruction (flattened per token and back)."""
    params = {"W_enc": W_enc, "b_enc": b_enc, "W_dec": W_dec, "b_dec": b_dec}
    flat = value.reshape(*value.shape[:2], -1)
    return reconstruct(config, params, flat.astype(jnp.float32)).reshape(value.shape).astype(value.dtype)


def splice_hook(config: SAEConfig, params, hook_name: str | None = None) -> dict:
    """{hook name: writer} that substitutes the SAE's reconstruction, for model.run_with_hooks."""
    name = hook_name or config.hook_name
    return {name: HookFn(functools.partial(_splice, config=config), **{k: jnp.asarray(v) for k, v in params.items()})}


def sentence_vectors(model, out, mask):
    """[B, D] sentence vectors of a run's last hidden states pooled as the checkpoint's sentence-transformers
    Pooling says (several modes concatenated), else by the mean; no Normalize: the cosine does not need it."""
    mode = (model.pooling or {}).get("mode") or "mean"
    modes = (mode,) if isinstance(mode, str) else tuple(mode)
    return jnp.concatenate([pooled_tokens(out.last_hidden_state, jnp.asarray(mask), m) for m in modes], axis=-1)


def _unchanged(value, ctx):
    return value


def spliced_fidelity(model, config: SAEConfig, params, texts, hook_name: str | None = None,
                     seed: int = 0) -> dict[str, float]:
    """Masked-LM models: {"ce_clean", "ce_spliced", "ce_increase"} on texts with 15% of words masked (seed).
    Other models: {"cosine"}, the mean cosine between sentence embeddings with and without the SAE, pooled as
    the checkpoint's sentence-transformers Pooling says (sentence_vectors; the mean where it says nothing).
    The clean run writes the hook's own value back, so both runs are the same program but for the SAE."""
    hooks = splice_hook(config, params, hook_name)
    unchanged = {name: _unchanged for name in hooks}
    batch = model.tokenize(list(texts))
    if model.config.heads.mlm:
        masked, labels = mask_tokens(model, batch, seed=seed)
        loss = mlm_loss_fn(labels)
        clean = float(loss(model.run_with_hooks(masked, hooks=unchanged)))
        spliced = float(loss(model.run_with_hooks(masked, hooks=hooks)))
        return {"ce_clean": clean, "ce_spliced": spliced, "ce_increase": spliced - clean}
    mask = batch.attention_mask
    a = sentence_vectors(model, model.run_with_hooks(batch, hooks=unchanged), mask)
    b = sentence_vectors(model, model.run_with_hooks(batch, hooks=hooks), mask)
    cosine = jnp.sum(a * b, -1) / (jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1))
    return {"cosine": float(jax.device_get(cosine.mean()))}
