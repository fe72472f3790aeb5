"""Activations to train an SAE on, streamed: texts go through the model a chunk at a time (the model's
compiled forward), the real tokens' values at one hook go into a bounded buffer that is shuffled, and
batches come out of it. The corpus is never held whole: only `buffer_tokens` activations at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from minibert.errors import AnalysisError
from minibert.hooks import site_axes


def hook_width(model, hook_name: str) -> int:
    """The size of one token's vector at `hook_name` (heads × head dim for attn.hook_z: SAELens' hook_z)."""
    if hook_name not in model.hook_sites:
        raise AnalysisError(f"{hook_name!r} is not a hook of this model; e.g. 'blocks.3.hook_resid_post', "
                            f"'blocks.3.mlp.hook_post', 'blocks.3.attn.hook_z' (model.hook_names lists them).")
    axes = site_axes(hook_name)
    if axes[:2] != ["B", "T"] or "S" in axes:
        raise AnalysisError(f"{hook_name!r} has axes {axes}; an SAE reads one vector per token ([B, T, ...]).")
    shape = model.hook_sites[hook_name][0]
    return int(np.prod(shape[2:]))


def token_activations(model, texts, hook_name: str, max_length: int = 128, special: bool = False) -> np.ndarray:
    """[N, d] the hook's value at every real token of `texts` ([CLS]/[SEP] left out unless special)."""
    batch = model.tokenize(list(texts), max_length=max_length)
    _, cache = model.run_with_cache(batch, names=[hook_name])
    values = np.asarray(cache[hook_name], np.float32)
    values = values.reshape(*values.shape[:2], -1)
    keep = np.asarray(batch.attention_mask) > 0
    if not special:
        ids = np.asarray(batch.input_ids)
        keep &= ~np.isin(ids, [model.tokenizer.cls_token_id, model.tokenizer.sep_token_id])
    return values[keep]


def activations(model, texts: Iterable[str], hook_name: str, *, batch_size: int = 1024,
                texts_per_forward: int = 32, buffer_tokens: int = 32_768, max_length: int = 128,
                seed: int = 0) -> Iterator[np.ndarray]:
    """Batches [batch_size, d] of shuffled token activations at `hook_name`, from a stream of texts.

    The buffer fills to `buffer_tokens`, is shuffled, and gives out half of itself as batches before it refills,
    so tokens of one text spread over many batches. The last, partial batch is dropped.
    """
    hook_width(model, hook_name)
    if buffer_tokens < 2 * batch_size:
        raise AnalysisError(f"buffer_tokens={buffer_tokens} must hold at least two batches ({2 * batch_size}).")
    rng = np.random.default_rng(seed)
    buffer: list[np.ndarray] = []
    held = 0

    def drain(keep: int):
        nonlocal buffer, held
        pool = np.concatenate(buffer)
        pool = pool[rng.permutation(len(pool))]
        out = (len(pool) - keep) // batch_size * batch_size
        buffer, held = [pool[out:]], len(pool) - out
        return [pool[i:i + batch_size] for i in range(0, out, batch_size)]

    chunk: list[str] = []
    for text in texts:
        chunk.append(text)
        if len(chunk) == texts_per_forward:
            buffer.append(token_activations(model, chunk, hook_name, max_length))
            held += len(buffer[-1])
            chunk = []
            if held >= buffer_tokens:
                yield from drain(keep=buffer_tokens // 2)
    if chunk:
        buffer.append(token_activations(model, chunk, hook_name, max_length))
    if buffer:
        yield from drain(keep=0)
