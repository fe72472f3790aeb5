"""How good a transcoder is: sparsity, the fraction of the MLP output's variance it leaves unexplained, dead and
dense latents, and the spliced model — ŷ written in place of the MLP's output at its block.

- L0: mean number of non-zero latents per token.
- FVU: Σ‖y − ŷ‖² / Σ‖y − ȳ‖² over the tokens, y the MLP's output (0 perfect; 1 no better than its mean).
- dead / dense: fractions of latents firing on no token / on more than `dense_above` of them.
- spliced_fidelity: sae.fidelity's scores (masked-LM or classifier cross-entropy clean / spliced / ablated, loss
  recovered, KL, accuracy; or the sentence-embedding cosine for a model without a head) with
  hook_mlp_out ← ŷ(x), x the block's MLP input in the same run.
"""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np

from minibert.analysis._finite import check_finite_params
from minibert.analysis.corpus.result import weights_digest
from minibert.analysis.sae.metrics import fidelity
from minibert.analysis.sae.model import checked_finite
from minibert.analysis.sae.source import hook_width
from minibert.analysis.transcoders.model import TranscoderConfig, encode, forward
from minibert.analysis.transcoders.source import check_source, sites
from minibert.core.hooks import HookFn
from minibert.errors import AnalysisError, AnalysisWarning, outside_minibert


def evaluate(config: TranscoderConfig, params, x, y=None, dense_above: float = 0.1, *,
             other_weights: bool = False) -> dict[str, float | np.ndarray]:
    """{"l0", "fvu", "dead", "dense", "frequency" [S]} on the Pairs token_pairs gives (or a batch of
    activations' stream), or on bare arrays x [N, d_in], y [N, d_out]. Pairs carry the block, hooks and weights
    they were read from: pairs of another block or site than the transcoder's, or (unless other_weights) of other
    weights, are refused; bare arrays cannot be checked."""
    if y is None:
        if not (isinstance(x, tuple) and len(x) == 2):
            raise AnalysisError(f"evaluate takes the pairs transcoders.token_pairs gives, or x and y; got one "
                                f"{type(x).__name__}.")
        source = getattr(x, "source", None)
        if source is not None:
            check_source(config, source, f"pass transcoders.token_pairs(model, texts, {config.layer}) of the model "
                                         f"it was trained on.", other_weights=other_weights,
                         weights_fix=", or other_weights=True to score it on these weights (other_weights is for "
                                     "other weights only: it never lets pairs of another layer or site through).")
        x, y = x
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    if x.ndim != 2 or x.shape[1] != config.d_in or y.shape != (x.shape[0], config.d_out) or not x.shape[0]:
        raise AnalysisError(f"evaluate takes pairs x [N, {config.d_in}], y [N, {config.d_out}] with N ≥ 1; got "
                            f"{tuple(x.shape)} and {tuple(y.shape)}. Pass transcoders.token_pairs of its layer.")
    for name, values in (("x", x), ("y", y)):
        checked_finite(values, name, "every score would be NaN")
    check_finite_params(params, "evaluate: the transcoder")
    x, y = jnp.asarray(x), jnp.asarray(y)
    latents = encode(config, params, x)
    error = y - forward(config, params, x)
    frequency = np.asarray(jnp.mean(latents > 0, axis=0))
    l0 = float(jnp.mean(jnp.sum(latents > 0, -1)))
    warn_if_uncalibrated(config, l0)
    return {"l0": l0,
            "fvu": float(jnp.sum(error**2) / jnp.sum((y - y.mean(0)) ** 2)),
            "dead": float(np.mean(frequency == 0)), "dense": float(np.mean(frequency > dense_above)),
            "frequency": frequency}


BATCHTOPK_L0_MULTIPLE = 2  # a BatchTopK transcoder whose inference L0 passes this multiple of k: θ not yet set
JUMPRELU_L0_SHARE = 0.25  # a JumpReLU transcoder firing more than this share of its latents per token: θ untrained
_warned: set[TranscoderConfig] = set()


def warn_if_uncalibrated(config: TranscoderConfig, l0: float) -> None:
    """Warn (once per config) where a threshold architecture's inference L0 says its threshold is not calibrated
    yet: BatchTopK above BATCHTOPK_L0_MULTIPLE·k (θ starts at 0 and follows the smallest kept activation slowly),
    JumpReLU above JUMPRELU_L0_SHARE of d_sae (θ starts at threshold_init)."""
    if config.architecture == "batchtopk" and l0 > BATCHTOPK_L0_MULTIPLE * config.k:
        why = (f"{l0:.1f} latents per token fire at inference, more than {BATCHTOPK_L0_MULTIPLE}·k = "
               f"{BATCHTOPK_L0_MULTIPLE * config.k}: the inference threshold θ is a moving average of the smallest "
               f"activation each training batch kept (starting at 0, rate threshold_rate={config.threshold_rate}) "
               f"and is not calibrated yet")
    elif config.architecture == "jumprelu" and l0 > JUMPRELU_L0_SHARE * config.d_sae:
        why = (f"{l0:.1f} of its {config.d_sae} latents per token fire, more than {JUMPRELU_L0_SHARE:.0%}: the "
               f"thresholds are not trained yet (they start at threshold_init={config.threshold_init})")
    else:
        return
    if config in _warned:
        return
    _warned.add(config)
    warnings.warn(f"this {config.architecture} transcoder is not sparse yet — {why}. Train it longer (or, for "
                  f"BatchTopK, with a larger threshold_rate) before reading its latents; this warning is given once "
                  f"per transcoder config.", AnalysisWarning, stacklevel=outside_minibert())


def checked_site(model, config: TranscoderConfig, *, other_weights: bool = False) -> tuple[str, str]:
    """(hook_in, hook_out) of the config's layer in `model`, refusing a transcoder made for another site, other
    widths or (unless other_weights) other model weights."""
    hook_in, hook_out = sites(model, config.layer)
    for mine, here in ((config.hook_in, hook_in), (config.hook_out, hook_out)):
        if mine is not None and mine != here:
            raise AnalysisError(f"this transcoder reads {config.hook_in!r} → {config.hook_out!r}, but block "
                                f"{config.layer}'s MLP here is {hook_in!r} → {hook_out!r} (another family?); use a "
                                f"transcoder trained on this model.")
    widths = (hook_width(model, hook_in), hook_width(model, hook_out))
    if widths != (config.d_in, config.d_out):
        raise AnalysisError(f"block {config.layer}'s MLP here maps {widths[0]} → {widths[1]} wide vectors, the "
                            f"transcoder {config.d_in} → {config.d_out}; use a transcoder trained on this model.")
    if config.weights is not None and not other_weights and weights_digest(model) != config.weights:
        raise AnalysisError(f"this transcoder was trained on the model weights {config.weights}, and this model's "
                            f"are {weights_digest(model)}; pass the model it was trained on, or other_weights=True "
                            f"to splice it into these weights on purpose.")
    return hook_in, hook_out


def _written(value, ctx, y_hat):
    return y_hat.astype(value.dtype)


def splice_hooks(model, config: TranscoderConfig, params, batch, *, other_weights: bool = False) -> dict:
    """{hook_mlp_out: writer} giving the run on `batch` ŷ(x) in place of the block's MLP output, x the MLP's
    input. x is read from the clean run: nothing before hook_mlp_out changes when it is written, so the spliced
    run's x is the same."""
    hook_in, hook_out = checked_site(model, config, other_weights=other_weights)
    _, cache = model.run_with_cache(batch, names=[hook_in])
    y_hat = forward(config, {k: jnp.asarray(v) for k, v in params.items()}, jnp.asarray(cache[hook_in], jnp.float32))
    return {hook_out: HookFn(_written, y_hat=y_hat)}


def spliced_fidelity(model, config: TranscoderConfig, params, texts, seed: int = 0, *, pairs=None, labels=None,
                     ablation: str = "zero", other_weights: bool = False) -> dict[str, float]:
    """The model with the transcoder's ŷ in place of its block's MLP output, against the clean model and the MLP
    output ablated (0, or its mean over the batch's real tokens): as sae.spliced_fidelity scores an SAE —
    masked-LM heads at 15% of words masked (seed) against the masked tokens; classifier heads against `labels`
    or the clean predictions; models without a head by the sentence embeddings' cosine. texts, pairs: as
    sae.text_rows reads them."""
    hook_in, hook_out = checked_site(model, config, other_weights=other_weights)
    return fidelity(model, hook_out, lambda batch: splice_hooks(model, config, params, batch,
                                                                other_weights=other_weights),
                    texts, seed, pairs=pairs, labels=labels, ablation=ablation)
