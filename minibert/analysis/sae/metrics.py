"""How good an SAE is: sparsity (L0), fraction of variance unexplained, dead and dense latents, and spliced-in
fidelity — the model run with the SAE's reconstruction written in place of the hook's value.

- L0: mean number of non-zero latents per token.
- FVU: Σ‖x − x̂‖² / Σ‖x − mean(x)‖² over the tokens (0 perfect; 1 no better than the mean).
- dead: fraction of latents that never fire on the tokens given; dense: fraction firing on more than
  `dense_above` of them (SAELens' feature-density plots flag those above 10%).
- fidelity, checkpoints with a head (masked-LM or classifier): cross-entropy clean, spliced and ablated, loss
  recovered, KL and accuracy (spliced_fidelity).
- fidelity, sentence-transformers checkpoints: cosine between the sentence embeddings with and without, and
  with the hook ablated (pooled as the checkpoint's Pooling module says), and loss recovered with 1 − cosine as
  the loss.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from minibert.analysis.gradients import IGNORE, mask_tokens
from minibert.analysis.sae.model import SAEConfig, checked_finite, encode, reconstruct
from minibert.core.hooks import HookFn
from minibert.errors import AnalysisError
from minibert.runtime.pooling import pooled_tokens


def evaluate(config: SAEConfig, params, x, dense_above: float = 0.1) -> dict[str, float | np.ndarray]:
    """{"l0", "fvu", "dead", "dense", "frequency" [S]} on activations x [N, d_in]."""
    x = np.asarray(x, np.float32)
    if x.ndim != 2 or x.shape[1] != config.d_in or not x.shape[0]:
        raise AnalysisError(f"evaluate takes activations [N, d_in] = [N, {config.d_in}] with N ≥ 1; got shape "
                            f"{tuple(x.shape)}. Pass sae.token_activations of the hook the SAE was trained on.")
    checked_finite(x, "x", "every score would be NaN")
    x = jnp.asarray(x)
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


def _zeroed(value, ctx):
    return jnp.zeros_like(value)


def _replaced_by_mean(value, ctx, mean):
    return jnp.broadcast_to(mean, value.shape).astype(value.dtype)


ABLATIONS = ("zero", "mean")


def _ablation_hooks(model, batch, hook_name: str, ablation: str) -> dict:
    """{hook: writer} replacing the hook's value by 0, or by its mean over the batch's real tokens."""
    if ablation == "zero":
        return {hook_name: _zeroed}
    _, cache = model.run_with_cache(batch, names=[hook_name])
    value = np.asarray(cache[hook_name], np.float64)
    real = np.asarray(model.inputs(batch).attention_mask) > 0
    return {hook_name: HookFn(_replaced_by_mean, mean=jnp.asarray(value[real].mean(0), jnp.float32))}


def _head_scores(runs: dict, targets: np.ndarray) -> dict[str, float]:
    """Cross-entropy against targets [P], accuracy, and KL(clean ‖ spliced) of the logits [P, C] of each run
    ("clean", "spliced", "ablated"); loss recovered = (CE_ablated − CE_spliced) / (CE_ablated − CE_clean)."""
    log_probs = {name: jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), axis=-1) for name, logits in runs.items()}
    picked = jnp.asarray(targets)[:, None]
    ce = {name: float(-jnp.mean(jnp.take_along_axis(lp, picked, -1))) for name, lp in log_probs.items()}
    clean, spliced = log_probs["clean"], log_probs["spliced"]
    scores = {f"ce_{name}": value for name, value in ce.items()}
    scores |= {"ce_increase": ce["spliced"] - ce["clean"],
               "loss_recovered": (ce["ablated"] - ce["spliced"]) / (ce["ablated"] - ce["clean"]),
               "kl": float(jnp.mean(jnp.sum(jnp.exp(clean) * (clean - spliced), -1))),
               "accuracy_clean": float(jnp.mean(jnp.argmax(clean, -1) == picked[:, 0])),
               "accuracy_spliced": float(jnp.mean(jnp.argmax(spliced, -1) == picked[:, 0]))}
    return scores


def _checked_width(model, config: SAEConfig, hook_name: str) -> None:
    from minibert.analysis.sae.source import hook_width

    width = hook_width(model, hook_name)
    if width != config.d_in:
        raise AnalysisError(f"{hook_name!r} gives {width}-wide vectors but the SAE reads d_in={config.d_in}; pass "
                            f"the hook the SAE was trained on.")


def spliced_fidelity(model, config: SAEConfig, params, texts, hook_name: str | None = None, seed: int = 0, *,
                     pairs=None, labels=None, ablation: str = "zero") -> dict[str, float]:
    """How much of the model's behaviour survives the SAE's reconstruction written in place of the hook's value.

    texts, pairs: as sae.text_rows reads them (a text, a list, pairs, (text, pair) tuples or a corpus file).
    Models with a head score three runs — clean, spliced, and ablated (the hook's value replaced by 0, or by its
    mean over the batch's real tokens: ablation="zero" | "mean") — on the head's outputs:
    {"ce_clean", "ce_spliced", "ce_ablated", "ce_increase", "loss_recovered" = (CE_ablated − CE_spliced) /
    (CE_ablated − CE_clean) (1: the SAE loses nothing; 0: no better than ablating), "kl" (mean KL(clean ‖
    spliced) of the head's distributions), "accuracy_clean", "accuracy_spliced"}.
    - masked-LM heads: at 15% of words masked (seed), against the masked tokens.
    - classifier heads (sequence or token): against `labels` (class ids or id2label names, one per text) where
      given, else the clean run's predictions (accuracy_spliced is then the agreement with the clean model);
      token heads score every real token against the clean predictions.
    Models without a head: {"cosine", "cosine_ablated", "loss_recovered"}: the mean cosine of the sentence
    embeddings with the SAE, and with the hook ablated, to those without (pooled as the checkpoint's
    sentence-transformers Pooling says, the mean where it says nothing); with a run's loss 1 − its cosine (the
    clean run's 0), loss recovered = (cosine − cosine_ablated) / (1 − cosine_ablated).
    The clean run writes the hook's own value back, so it is the same program as the spliced one but for the SAE.
    """
    hook_name = hook_name or config.hook_name
    if hook_name is None:
        raise AnalysisError("the SAE's config names no hook_name; pass hook_name=.")
    _checked_width(model, config, hook_name)
    hooks = splice_hook(config, params, hook_name)
    return fidelity(model, hook_name, lambda batch: hooks, texts, seed, pairs=pairs, labels=labels, ablation=ablation)


def fidelity(model, hook_name: str, spliced, texts, seed: int = 0, *, pairs=None, labels=None,
             ablation: str = "zero") -> dict[str, float]:
    """spliced_fidelity's scores for any replacement at `hook_name`: spliced(batch) gives the {hook: writer} of
    the spliced run on that batch (the masked one for a masked-LM head); the clean run writes the hook's own
    value back, the ablated one 0 or the batch's mean (ablation)."""
    from minibert.analysis.sae.source import text_batch

    if ablation not in ABLATIONS:
        raise AnalysisError(f"ablation={ablation!r}: pick 'zero' or 'mean'.")
    unchanged = {hook_name: _unchanged}
    batch = text_batch(model, texts, pairs)
    heads = model.config.heads
    if heads.mlm:
        masked, targets = mask_tokens(model, batch, seed=seed)
        where = np.nonzero(targets != IGNORE)
        runs = {name: model.run_with_hooks(masked, hooks=run_hooks).logits[where] for name, run_hooks in
                (("clean", unchanged), ("spliced", spliced(masked)),
                 ("ablated", _ablation_hooks(model, masked, hook_name, ablation)))}
        return _head_scores(runs, targets[where])
    if heads.classifier is not None:
        given = None if labels is None else _class_ids(labels, len(batch), heads.classifier, model.config.id2label)
        logits = {name: model.run_with_hooks(batch, hooks=run_hooks).logits for name, run_hooks in
                  (("clean", unchanged), ("spliced", spliced(batch)),
                   ("ablated", _ablation_hooks(model, batch, hook_name, ablation)))}
        if heads.classifier == "token":
            where = np.nonzero(np.asarray(batch.attention_mask) > 0)
            logits = {name: value[where] for name, value in logits.items()}
        targets = np.argmax(np.asarray(logits["clean"]), -1) if given is None else given
        return _head_scores(logits, targets)
    mask = batch.attention_mask
    vectors = {name: sentence_vectors(model, model.run_with_hooks(batch, hooks=run_hooks), mask) for name, run_hooks in
               (("clean", unchanged), ("spliced", spliced(batch)),
                ("ablated", _ablation_hooks(model, batch, hook_name, ablation)))}
    return _sentence_scores(vectors)


def _sentence_scores(vectors: dict) -> dict[str, float]:
    """The mean cosine of each text's sentence vector [B, D'] to its clean one, spliced and ablated; the loss of a
    run is 1 − that cosine (0 for the clean run), so loss recovered = (loss_ablated − loss_spliced) /
    (loss_ablated − 0) = (cosine − cosine_ablated) / (1 − cosine_ablated)."""
    clean = vectors["clean"]

    def cosine(other):
        per_text = jnp.sum(clean * other, -1) / (jnp.linalg.norm(clean, axis=-1) * jnp.linalg.norm(other, axis=-1))
        return float(jax.device_get(per_text.mean()))

    spliced, ablated = cosine(vectors["spliced"]), cosine(vectors["ablated"])
    return {"cosine": spliced, "cosine_ablated": ablated, "loss_recovered": (spliced - ablated) / (1 - ablated)}


def _class_ids(labels, texts: int, classifier: str, names: tuple[str, ...]) -> np.ndarray:
    """labels (class ids, or the checkpoint's id2label names, one per text) as ids, each a class of the model: an
    id out of range gave NaN cross-entropies."""
    values = np.asarray(labels)
    named = values.dtype.kind == "U"
    if classifier != "sequence" or values.shape != (texts,) or not (named or np.issubdtype(values.dtype, np.integer)):
        raise AnalysisError(f"labels are class ids or names, one per text ({texts}), for a sequence classifier; got "
                            f"{values.dtype} {values.shape}. Leave labels out to score against the clean "
                            f"predictions.")
    index = {name: i for i, name in enumerate(names)}
    ids = np.array([index.get(value, -1) if named else value for value in values.tolist()])
    bad = np.flatnonzero((ids < 0) | (ids >= len(names)))
    if bad.size:
        shown = ", ".join(names[:10]) + (", …" if len(names) > 10 else "")
        raise AnalysisError(f"labels[{bad[0]}]={values.tolist()[bad[0]]!r} is not a class of the model "
                            f"(0 … {len(names) - 1}: {shown}); pass its class ids or id2label names.")
    return ids
