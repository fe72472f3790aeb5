"""Two models side by side at one site: the checks that they can be compared, and their paired activations —
streamed, packed and cached as sae.activations does it, one pass of each model over the same packed rows.

    x = paired_activations(base, finetuned, texts, "blocks.3.hook_resid_post", batch_size=1024)   # [N, 2, D]
    x.source    # {"hook_name", "models": (name A, name B), "weights": (digest A, digest B)}
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import jax
import numpy as np

from minibert.analysis.compare import check_same_tokenizer
from minibert.analysis.corpus import packing
from minibert.analysis.corpus.result import weights_digest
from minibert.analysis.corpus.resume import TextsDigest
from minibert.analysis.sae.source import (
    ActivationCache,
    ActivationStream,
    check_counts,
    forward_batches,
    hook_width,
    shuffled,
    text_batch,
    text_rows,
)
from minibert.errors import AnalysisError


def model_name(model) -> str:
    """How a model is named in a stream's source and in messages: where it was loaded from."""
    return str(getattr(model, "source", None) or "an unnamed model")


def pair_names(model_a, model_b, names: tuple[str, str] | None = None) -> tuple[str, str]:
    """How a report names A and B: `names` (two different non-empty labels, e.g. ("base", "fine-tuned")), or
    where each was loaded from. A fine-tune made in this session keeps its base's source, so two models named
    alike are told apart by their weights' digests ("… (A, weights 1a2b…)")."""
    if names is not None:
        if isinstance(names, str) or len(names) != 2 or not all(isinstance(n, str) and n.strip() for n in names) \
                or names[0] == names[1]:
            raise AnalysisError(f"names={names!r}: pass two different labels, (A, B), e.g. ('base', 'fine-tuned').")
        return tuple(names)
    found = model_name(model_a), model_name(model_b)
    if found[0] != found[1]:
        return found
    return tuple(f"{name} ({which}, weights {weights_digest(model)[:8]})"
                 for name, which, model in zip(found, "AB", (model_a, model_b), strict=True))


def check_pair(model_a, model_b, hook_name: str | None = None) -> int:
    """Two distinct models sharing a tokenizer and, at `hook_name`, a width; the width, or an AnalysisError naming
    what differs."""
    if model_a is model_b:
        raise AnalysisError(f"the same model ({model_name(model_a)}) was passed as both A and B; pass the two "
                            f"models to compare (to diff a model against itself, load it twice).")
    check_same_tokenizer(model_a, model_b)
    if hook_name is None:
        widths = model_a.config.hidden_size, model_b.config.hidden_size
        what = "hidden sizes"
    else:
        widths = hook_width(model_a, hook_name), hook_width(model_b, hook_name)
        what = f"widths at {hook_name!r}"
    if widths[0] != widths[1]:
        raise AnalysisError(f"the models' {what} differ ({widths[0]} in {model_name(model_a)}, {widths[1]} in "
                            f"{model_name(model_b)}); a crosscoder and these diffs need two models of one width (a "
                            f"base and its fine-tune, two checkpoints of one run).")
    return widths[0]


def row_length(model_a, model_b, max_length: int | None) -> int:
    """Tokens per row: max_length, or 128 where the two models have as many positions, else the fewer they have."""
    positions = min(model_a.config.max_tokens, model_b.config.max_tokens)
    return min(128, positions) if max_length is None else max_length


def pair_source(model_a, model_b, hook_name: str) -> dict:
    """What a paired stream reads: the site, both models' names and weight digests (A first)."""
    return {"hook_name": hook_name, "models": [model_name(model_a), model_name(model_b)],
            "weights": [weights_digest(model_a), weights_digest(model_b)]}


def paired_activations(model_a, model_b, texts: Iterable[str] | str | Path, hook_name: str, *,
                       batch_size: int = 1024, batch_tokens: int | None = None, buffer_tokens: int = 32_768,
                       max_length: int | None = None, seed: int = 0, cache: str | Path | None = None
                       ) -> ActivationStream:
    """Batches [batch_size, 2, d] of shuffled paired token activations at `hook_name` (A's vector, then B's, of the
    same token; [CLS]/[SEP] left out): sae.activations' stream for two models at once. The texts are read,
    tokenized and packed once; each packed forward batch runs through A and through B. cache: a directory, as
    sae.activations takes it; its record names the site and both models' weights, so a cache of another pair (or
    of A and B swapped) is refused. The stream's `.source` is pair_source's record, which CrosscoderTrainer.train
    checks."""
    check_pair(model_a, model_b, hook_name)
    check_counts(batch_size, buffer_tokens, batch_tokens, seed)
    if batch_tokens is None:
        batch_tokens = packing.default_batch_tokens(jax.devices()[0].platform)
    max_length = row_length(model_a, model_b, max_length)
    rows, pairs = text_rows(texts)
    digest = TextsDigest()
    rows = digest.through(rows)
    source = pair_source(model_a, model_b, hook_name)
    store = None
    if cache is not None:
        store = ActivationCache(cache, {"weights": source["weights"], "models": source["models"],
                                        "hook_name": hook_name, "max_length": max_length})
        record = store.complete()
        if record is not None:
            for _ in rows:  # the texts' digest, without running the models
                pass
            return ActivationStream(shuffled(store.read(record, digest.hexdigest()), batch_size, buffer_tokens, seed),
                                    source, batch_size)
    forward = forward_batches((model_a, model_b), rows, pairs, (hook_name,), max_length, batch_tokens)
    return ActivationStream(shuffled(forward if store is None else store.write(forward, digest), batch_size,
                                     buffer_tokens, seed), source, batch_size)


def paired_token_activations(model_a, model_b, texts, hook_name: str, max_length: int | None = None, *, pairs=None
                             ) -> tuple[np.ndarray, list[tuple[int, int, str, str]]]:
    """(x [N, 2, d], where [N]) at every real, non-special token of `texts`, each text padded in one batch (no
    packing; truncated to max_length, by default row_length's): for latent statistics and the report's examples.
    where[n] = (text index, token position, token, the token in context)."""
    check_pair(model_a, model_b, hook_name)
    batch = text_batch(model_a, texts, pairs, row_length(model_a, model_b, max_length), cut=True)
    ids = np.asarray(batch.input_ids)
    keep = (np.asarray(batch.attention_mask) > 0) & ~np.isin(
        ids, [model_a.tokenizer.cls_token_id, model_a.tokenizer.sep_token_id])
    values = []
    for model in (model_a, model_b):
        _, cache = model.run_with_cache(batch, names=[hook_name])
        value = np.asarray(cache[hook_name], np.float32)
        values.append(value.reshape(*value.shape[:2], -1)[keep])
    lengths = np.asarray(batch.attention_mask).sum(1)
    where = [(int(b), int(t), batch.tokens[b][t], _context(batch.tokens[b][:lengths[b]], t))
             for b, t in zip(*np.nonzero(keep), strict=True)]
    return np.stack(values, axis=1), where


CONTEXT = 4  # tokens shown either side of an example


def _context(tokens: list[str], t: int) -> str:
    """The token at t in brackets, with CONTEXT real tokens either side: "the food was [cold] but the"."""
    shown = tokens[max(0, t - CONTEXT):t] + [f"[{tokens[t]}]"] + tokens[t + 1:t + 1 + CONTEXT]
    return " ".join(shown)
