"""Sentence vectors as sentence-transformers computes them: texts prepared by a checkpoint's settings (prompt,
lower case, truncation), run, and their hidden states pooled by the modes of its Pooling module."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp

from minibert.errors import ConfigError, InputError
from minibert.io import checkpoint
from minibert.io.tokenizer import is_text

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


def sentence_embeddings(model, batch, mode: str | Sequence[str] | None, normalize: bool | None, pairs,
                        prompt: str | None, prompt_name: str | None) -> jax.Array:
    """Model.sentence_embeddings(batch, …) of a Model (its docstring says what each argument does)."""
    settings = model.pooling or {"mode": "mean", "normalize": False}
    if mode is None and settings.get("unsupported"):
        raise ConfigError(f"{model.source}: sentence-transformers computes this model's embeddings with "
                          f"{', '.join(settings['unsupported'])}, which minibert does not compute, so its "
                          f"sentence vectors would be wrong; use sentence-transformers for them, or pass "
                          f"mode= to pool the encoder's own hidden states.")
    mode = mode or settings["mode"]
    if mode is None:
        raise InputError(f"{model.source}: this checkpoint's modules.json has no Pooling module; pass a mode, "
                         f"one of {', '.join(map(repr, POOLINGS))}.")
    modes = (mode,) if isinstance(mode, str) else tuple(mode)
    if not modes or any(m not in POOLINGS for m in modes):  # before the run: a typo costs no forward pass
        raise InputError(f"pooling mode {mode!r} is not one of {', '.join(map(repr, POOLINGS))} (or a list "
                         f"of them).")
    normalize = settings["normalize"] if normalize is None else normalize
    inputs, skip = _sentence_inputs(model, batch, pairs, settings, prompt, prompt_name)
    hidden = model.run(inputs)[0].last_hidden_state
    pooled = jnp.concatenate([pooled_tokens(hidden, inputs.attention_mask, m, skip) for m in modes], axis=-1)
    if normalize:
        pooled = pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
    return pooled


def _sentence_inputs(model, batch, pairs, settings: Mapping, prompt: str | None, prompt_name: str | None):
    """(Inputs, tokens each row's pooling leaves out) of sentence_embeddings: texts with the prompt
    prepended, lower-cased and truncated as the checkpoint's sentence-transformers settings say."""
    if not is_text(batch):  # tokenized by the caller: run as given, without the default prompt
        if (prompt, prompt_name, pairs) != (None, None, None):
            raise InputError("a prompt or pairs go with texts; pass texts, or tokenize the prompted texts and "
                             "their pairs yourself and pass neither.")
        return model.inputs(batch), 0
    prompts = settings.get("prompts", {})
    if prompt is None and prompt_name is not None and prompt_name not in prompts:
        raise InputError(f"prompt_name {prompt_name!r} is not one of this checkpoint's prompts "
                         f"{list(prompts)} (config_sentence_transformers.json); pass prompt='text: ' instead.")
    if prompt is None:
        prompt = prompts.get(prompt_name or settings.get("default_prompt"), "")
    if not isinstance(prompt, str):
        raise InputError(f"prompt must be a text such as 'query: '; got {type(prompt).__name__}.")

    def prepared(text):  # sentence-transformers' Lowercase normaliser, before anything else
        return text.lower() if settings.get("lower_case") and isinstance(text, str) else text

    texts = [prepared(prompt + text) for text in ([batch] if isinstance(batch, str) else batch)]
    if isinstance(pairs, (str, list, tuple)):  # anything else goes to tokenize, which names the problem
        pairs = [prepared(pair) for pair in ([pairs] if isinstance(pairs, str) else pairs)]
    limit = None if model.pooling is None else _sentence_length(model, settings)
    # sentence-transformers counts the prompt's tokens with its [CLS] and without its closing [SEP]
    counted = prompt and not settings.get("include_prompt", True)
    skip = model.tokenize(prepared(prompt)).input_ids.shape[1] - 1 if counted else 0
    return model.inputs(model.tokenize(texts, pairs, max_length=limit)), skip


def _sentence_length(model, settings: Mapping) -> int:
    """The length sentence-transformers truncates texts to: max_seq_length, else the tokenizer's limit."""
    length = settings.get("max_seq_length")
    if length is None:
        return min(model.tokenizer.model_max_length, model.config.max_tokens)
    if length > model.config.max_tokens:
        raise ConfigError(f"{model.source}: sentence_bert_config.json's max_seq_length is {length}, but the model "
                          f"has {model.config.max_tokens} positions; set it to {model.config.max_tokens} or less.")
    return length
