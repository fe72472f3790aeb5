"""Logit lens for masked-LM checkpoints: what the MLM head would predict from each layer's residual stream.

    logits = logit_lens(model, batch)                    # [L + 1, B, T, V]: embedding, then each block's output
    ids, values = logit_lens(model, batch, top_k=5)      # [L + 1, B, T, 5] each, without the full logits
    steps = logit_contributions(model, batch, targets)   # [L + 1, B, T]: start, then each block's change

Stream 0 is `hook_full_embed` (the embedding LayerNorm's output), stream l + 1 is block l's output, the site its
family declares (Family.block_output: `blocks.{l}.hook_normalized_resid_post` in BERT); each is read by the model's
own head stage (`Encoder.head`: dense, activation, LayerNorm, tied unembedding, bias). Blocks are 0-indexed. In a
pre-LN family (ModernBERT) a block's output is `blocks.{l}.hook_resid_post`, and its head stage begins with the
final LayerNorm (`ln_final`), so each stream is read as TransformerLens' logit lens reads a pre-LN model's:
ln_final, then the head.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from minibert.analysis.gradients import require_mlm_head
from minibert.core.site_names import FULL_EMBED
from minibert.errors import AnalysisError


def _streams(model, batch) -> jax.Array:
    """[L + 1, B, T, D]: the embedding output, then every block's output (the streams the lens reads; not
    sweeps.residual_streams, which holds each block's input, [L, B, T, D])."""
    output = model.config.family.block_output
    _, cache = model.run_with_cache(batch, names=[FULL_EMBED, f"blocks.*.{output}"])
    return jnp.concatenate([cache[FULL_EMBED][None], cache.stack(output)])


def _read(model, state, hidden) -> jax.Array:
    """The MLM head's logits [B, T, V] for hidden states [B, T, D], through the model's head stage."""
    return model.head(state, hidden).logits


def _lens(model, state, streams, *, top_k: int | None):
    """Each stream [L + 1, B, T, D] through the head, one stream at a time (one [B, T, V] block live)."""
    if top_k is None:
        return jax.lax.map(lambda h: _read(model, state, h), streams)
    return jax.lax.map(lambda h: jax.lax.top_k(_read(model, state, h), top_k), streams)


def _lens_at(model, state, streams, targets) -> jax.Array:
    """The lens logit of token targets[b, t] at every stream: [L + 1, B, T]."""
    pick = lambda h: jnp.take_along_axis(_read(model, state, h), targets[..., None], axis=-1)[..., 0]
    return jax.lax.map(pick, streams)


def logit_lens(model, batch, top_k: int | None = None):
    """The logit lens (nostalgebraist 2020) on a masked-LM model: every layer's residual stream read by the head.

    top_k=None: logits [L + 1, B, T, V] (NumPy float32; row 0 the embedding, row l + 1 block l's output,
    whose last row equals the model's own logits). top_k=k: (token ids [L + 1, B, T, k], logits [L + 1,
    B, T, k]) of the k highest, computed on the device so the full logits never reach the host; turn ids
    into tokens with model.tokenizer.convert_ids_to_tokens.
    """
    require_mlm_head(model, "the logit lens (it reads the residual stream through that head)")
    if top_k is not None and (not isinstance(top_k, int) or not 1 <= top_k <= model.config.vocab_size):
        raise AnalysisError(f"top_k must be an int in [1, {model.config.vocab_size}] (the vocabulary) or None; "
                            f"got {top_k!r}.")
    result = model.jit(_lens, static_argnames=("top_k",))(model.state, _streams(model, batch), top_k=top_k)
    if top_k is None:
        return np.asarray(result)
    values, ids = result
    return np.asarray(ids), np.asarray(values)


def logit_contributions(model, batch, targets) -> np.ndarray:
    """Per-block change of a chosen token's lens logit: [L + 1, B, T], NumPy float32.

    targets: the token id to follow at each position, int [B, T] (e.g. the original ids at masked
    positions), or one id / token string for every position. Row 0 is the lens logit at the embedding;
    row l + 1 is block l's change, lens_{l+1} − lens_l; the rows sum to the model's final logit.

    Why changes and not a decomposition: in a pre-LN model (GPT-2) the final residual stream is the sum
    of every block's output, and the unembedding after one last LayerNorm is nearly linear in it, so each
    block's output has a "direct" logit. BERT's blocks are post-LN: each block ends with LayerNorm(x + f(x)),
    which rescales and recentres the whole stream, so the output is no sum of per-block terms; and the
    MLM head adds a dense layer, an activation and a LayerNorm before the unembedding. No additive
    direct-logit split exists. The change of the lens logit across a block is what it does measure:
    how much closer reading the stream after that block (rather than before) brings the head to the token.
    """
    require_mlm_head(model, "the logit lens (it reads the residual stream through that head)")
    inputs = model.inputs(batch)
    ids = np.asarray(inputs.input_ids)
    if isinstance(targets, str):
        if model.tokenizer is None or targets not in model.tokenizer.vocab:
            raise AnalysisError(f"targets {targets!r} is not a token of this model's vocabulary; pass a token id or a "
                                f"wordpiece as model.tokenize writes it (e.g. 'paris', '##ing').")
        targets = model.tokenizer.vocab[targets]
    targets = np.broadcast_to(np.asarray(targets), ids.shape) if np.ndim(targets) == 0 else np.asarray(targets)
    if targets.shape != ids.shape or not np.issubdtype(targets.dtype, np.integer):
        raise AnalysisError(f"targets must be one token id or int token ids [B, T] = {ids.shape}; got "
                            f"{targets.dtype} {targets.shape}.")
    if targets.min() < 0 or targets.max() >= model.config.vocab_size:
        raise AnalysisError(f"targets must lie in [0, {model.config.vocab_size}); "
                            f"found {targets.min()}…{targets.max()}.")
    lens = model.jit(_lens_at)(model.state, _streams(model, inputs), jnp.asarray(targets, jnp.int32))
    return np.asarray(jnp.concatenate([lens[:1], jnp.diff(lens, axis=0)]))
