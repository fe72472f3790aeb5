"""Where a transcoder reads and writes (`sites`), and the (x, y) pairs it trains on, streamed.

A block's MLP reads the LayerNorm that runs just before it in the family's block (Family.block_order: post-LN
families run ln1 after the attention add, pre-LN ModernBERT runs ln2 before its MLP) and writes hook_mlp_out,
the MLP's output before the residual sum:

    hook_in  = blocks.{l}.ln1.hook_out  (post-LN: BERT, RoBERTa, ALBERT, DistilBERT, ELECTRA, DeBERTa-v2)
             = blocks.{l}.ln2.hook_out  (pre-LN: ModernBERT)
    hook_out = blocks.{l}.hook_mlp_out

The stream is sae.activations' machinery with both hooks captured in one forward per batch: each token's x and
y travel side by side through the shuffle buffer (and the cache), so a batch's pairs are always one token's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from minibert.analysis.corpus.result import weights_digest
from minibert.analysis.sae.source import ActivationStream, hook_width, shuffled_batches
from minibert.core.site_names import LN_OUT, MLP, MLP_OUT, in_block, layernorm
from minibert.errors import AnalysisError


def sites(model, layer: int) -> tuple[str, str]:
    """(hook_in, hook_out) of block `layer`'s MLP: the LayerNorm output the MLP reads and hook_mlp_out."""
    layers = model.config.num_hidden_layers
    if isinstance(layer, bool) or not isinstance(layer, int | np.integer) or not 0 <= layer < layers:
        raise AnalysisError(f"layer={layer!r}: this model's blocks are 0 … {layers - 1}; pass one of them.")
    order = model.config.family.block_order
    before = order[order.index(MLP) - 1] if MLP in order else None
    if before is None or not before.startswith("ln"):
        raise AnalysisError(f"the {model.config.family.model_type} family's block runs no LayerNorm just before its "
                            f"MLP ({' → '.join(order)}); a transcoder here has no MLP input site.")
    hook_in, hook_out = in_block(layer, layernorm(before, LN_OUT)), in_block(layer, MLP_OUT)
    missing = [name for name in (hook_in, hook_out) if name not in model.hook_sites]
    if missing:
        raise AnalysisError(f"block {layer} of this {model.config.family.model_type} model has no {missing[0]!r} "
                            f"(model.hook_names lists its hooks); pick another layer.")
    return hook_in, hook_out


IDENTITY = ("weights", "layer", "hook_in", "hook_out")  # what a trainer compares; "model" only names it


class Pairs(tuple):
    """(x [N, d_in], y [N, d_out]) MLP pairs and the `source` they were read from (source_of): token_pairs gives
    them, and each batch of activations' stream. They unpack as `x, y = pairs`; passed whole, evaluate and
    Trainer.step check the source against the transcoder (the unpacked arrays carry nothing)."""

    source: dict

    def __new__(cls, x: np.ndarray, y: np.ndarray, source: dict) -> Pairs:
        pairs = super().__new__(cls, (x, y))
        pairs.source = source
        return pairs

    def __repr__(self) -> str:
        return (f"Pairs(x {tuple(self[0].shape)}, y {tuple(self[1].shape)} of layer {self.source['layer']}: "
                f"{self.source['hook_in']} → {self.source['hook_out']})")


def check_source(config, source: dict, fix: str, *, other_weights: bool = False, weights_fix: str = "") -> None:
    """Refuse pairs read at another block or site than the transcoder's `config` (its layer, and its hooks and
    weights digest once training recorded them; other weights pass with other_weights=True); `fix` says what to
    do instead, and `weights_fix` (appended to it) what else to do about pairs of other weights only."""
    if source["layer"] != config.layer:
        raise AnalysisError(f"these pairs are of layer {source['layer']} but the transcoder is for layer "
                            f"{config.layer}; {fix}")
    for key, mine in (("hook_in", config.hook_in), ("hook_out", config.hook_out),
                      ("weights", None if other_weights else config.weights)):
        if mine is not None and source[key] != mine:
            advice = fix[:-1] + weights_fix if key == "weights" and weights_fix and fix.endswith(".") else fix
            raise AnalysisError(f"these pairs are {key} {source[key]!r} but the transcoder is for {key} {mine!r} "
                                f"(layer {config.layer}); {advice}")


def source_of(model, layer: int) -> dict:
    """What a stream of block `layer`'s MLP pairs reads: {"weights" (digest), "layer", "hook_in", "hook_out",
    "model" (where the model was loaded from: model.source, "<memory>" for one built in memory)}."""
    hook_in, hook_out = sites(model, layer)
    return {"weights": weights_digest(model), "layer": int(layer), "hook_in": hook_in, "hook_out": hook_out,
            "model": model.source}


def activations(model, texts, layer: int, *, batch_size: int = 1024, batch_tokens: int | None = None,
                buffer_tokens: int = 32_768, max_length: int | None = None, seed: int = 0,
                cache: str | Path | None = None) -> PairStream:
    """Batches (x [batch_size, d_in], y [batch_size, d_out]) of shuffled token pairs at block `layer`'s MLP:
    x its input, y its output ([CLS]/[SEP] and padding left out), as sae.activations streams one hook (texts,
    packing, buffer, cache and the dropped last partial batch are its). The stream's `.source` (source_of)
    names the weights, layer and hooks it reads; Trainer.train checks it."""
    source = source_of(model, layer)
    d_in = hook_width(model, source["hook_in"])
    key = {"weights": source["weights"], "hook_names": [source["hook_in"], source["hook_out"]]}
    batches = shuffled_batches(model, texts, (source["hook_in"], source["hook_out"]), key, batch_size=batch_size,
                               batch_tokens=batch_tokens, buffer_tokens=buffer_tokens, max_length=max_length,
                               seed=seed, cache=cache)
    return PairStream(batches, source, batch_size, d_in)


class PairStream(ActivationStream):
    """activations' (x, y) batches and what they read (`source`, see source_of)."""

    what = "MLP pairs"

    def __init__(self, batches: Iterator[np.ndarray], source: dict, batch_size: int, d_in: int):
        super().__init__(batches, source, batch_size)
        self.d_in = d_in

    def batch_of(self, values: np.ndarray) -> Pairs:
        return Pairs(values[:, :self.d_in], values[:, self.d_in:], self.source)


def token_pairs(model, texts, layer: int, max_length: int | None = None, *, pairs=None) -> Pairs:
    """Pairs (x [N, d_in], y [N, d_out]) at every real, non-special token of `texts`, each text whole (padded in
    one batch, no packing; one longer than max_length, None: the model's positions, is refused): held-out sets
    for evaluate, which checks their source. texts and pairs as sae.text_rows reads them."""
    from minibert.analysis.sae.source import text_batch

    source = source_of(model, layer)
    hook_in, hook_out = source["hook_in"], source["hook_out"]
    batch = text_batch(model, texts, pairs, max_length)
    _, cache = model.run_with_cache(batch, names=[hook_in, hook_out])
    keep = np.asarray(batch.attention_mask) > 0
    ids = np.asarray(batch.input_ids)
    keep &= ~np.isin(ids, [model.tokenizer.cls_token_id, model.tokenizer.sep_token_id])
    return Pairs(np.asarray(cache[hook_in], np.float32)[keep], np.asarray(cache[hook_out], np.float32)[keep], source)
