"""Sentence vectors from hidden states: the pooling modes of sentence-transformers' Pooling module."""

from __future__ import annotations

import jax.numpy as jnp

from minibert import checkpoint

# sentence_embeddings' modes: sentence-transformers' (checkpoint.POOLING_MODES maps its old names to them)
POOLINGS = tuple(checkpoint.POOLING_MODES.values())


def pooled_tokens(hidden, mask, mode: str, skip: int = 0):
    """[B, D] sentence vectors of hidden states [B, T, D] over the real tokens of `mask` [B, T], as
    sentence-transformers' Pooling computes `mode` (one of POOLINGS), leaving out the first `skip` real tokens
    of each row ([CLS] and a prompt, for a Pooling with include_prompt false).

    cls: the first token kept; max: the per-feature maximum; mean: the mean; mean_sqrt_len_tokens: the sum over
    √(count); weightedmean: the mean weighted by position 1, 2, … from the row's first real token;
    lasttoken: the last real token.
    """
    positions = jnp.arange(hidden.shape[1])[None]
    first = jnp.argmax(mask, axis=1)[:, None]  # the first real token: 0 unless the rows are padded on the left
    kept = (mask * (positions >= first + skip))[..., None].astype(hidden.dtype)
    count = jnp.maximum(kept.sum(1), 1e-9)
    if mode == "cls":
        return jnp.take_along_axis(hidden, jnp.argmax(kept[..., 0], axis=1)[:, None, None], axis=1)[:, 0]
    if mode == "max":
        return jnp.where(kept > 0, hidden, -jnp.inf).max(1)
    if mode == "mean":
        return (hidden * kept).sum(1) / count
    if mode == "mean_sqrt_len_tokens":
        return (hidden * kept).sum(1) / jnp.sqrt(count)
    if mode == "weightedmean":
        weights = kept * (positions + 1 - first)[..., None]
        return (hidden * weights).sum(1) / jnp.maximum(weights.sum(1), 1e-9)
    last = hidden.shape[1] - 1 - jnp.argmax(mask[:, ::-1], axis=1)
    return jnp.take_along_axis(hidden * kept, last[:, None, None], axis=1)[:, 0]
