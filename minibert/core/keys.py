"""Key tables: every Hugging Face checkpoint key a family reads, the minibert parameter it becomes, its shape.

A rule is (minibert parameter path, Hugging Face shape, converter). PyTorch Linear stores W as out×in;
minibert stores W_Q as D×H×K and W_O as H×K×D, so the converters reshape. `bert_layout` builds the table of
every family whose blocks are BERT's (BERT, RoBERTa, DistilBERT, ELECTRA, ALBERT) from two small tables of
names, LayerKeys and HeadKeys; a family with other blocks gives Family.key_table its own function, built
from the same `linear` and `layer_norm` pieces.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from minibert.core.config import Config
from minibert.core.family import LayerKeys

Rule = tuple[str, tuple[int, ...], Callable]  # minibert param path, HF shape, converter


def identity(w, cfg):
    return w


def transpose(w, cfg):  # PyTorch Linear [out, in] → [in, out]
    return w.T


def to_DHK(w, cfg):  # [H·K, D] → [D, H, K]
    return w.T.reshape(cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim)


def to_HK(b, cfg):  # [H·K] → [H, K]
    return b.reshape(cfg.num_attention_heads, cfg.head_dim)


def to_HKD(w, cfg):  # [D, H·K] → [H, K, D]
    return w.T.reshape(cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size)


def to_vector(w, cfg):  # [1, D] → [D] (a Linear with one output)
    return w[0]


def to_scalar(b, cfg):  # [1] → ()
    return b[0]


def layer_norm(hf: str, ours: str, D: int) -> dict[str, Rule]:
    return {f"{hf}.weight": (f"{ours}.scale", (D,), identity), f"{hf}.bias": (f"{ours}.bias", (D,), identity)}


def linear(hf: str, w: str, b: str, out_dim: int, in_dim: int, w_fn=transpose, b_fn=identity) -> dict[str, Rule]:
    return {f"{hf}.weight": (w, (out_dim, in_dim), w_fn), f"{hf}.bias": (b, (out_dim,), b_fn)}


def bert_layout(cfg: Config) -> dict[str, Rule]:
    """Every key of a BERT-layout architecture → (minibert param path, HF shape, converter), named by the
    family's LayerKeys and HeadKeys.

    Encoder keys are bare (`embeddings...`, `encoder...`, `pooler...`); head keys are as HF
    saves them (`cls...`, `classifier...`, `lm_head...`).
    """
    D, E, V = cfg.hidden_size, cfg.embed_dim, cfg.vocab_size
    family = cfg.family
    names = family.head_keys
    table: dict[str, Rule] = {
        "embeddings.word_embeddings.weight": ("embed.word", (V, E), identity),
        "embeddings.position_embeddings.weight": ("embed.position", (cfg.max_position_embeddings, E), identity),
        **layer_norm("embeddings.LayerNorm", "embed.ln", E),
    }
    if family.token_types:
        table["embeddings.token_type_embeddings.weight"] = ("embed.token_type", (cfg.type_vocab_size, E), identity)
    if cfg.has_projection:
        table |= linear(names.projection, "embed.W_proj", "embed.b_proj", D, E)
    # ALBERT's blocks share one set of weights: the key table names them once, as block 0's.
    for i in range(1 if family.shared_layers else cfg.num_hidden_layers):
        table |= block_keys(cfg, family.layer_keys, i)
    return table | head_table(cfg)


def head_table(cfg: Config) -> dict[str, Rule]:
    """The keys of the architecture's pooler and heads, named by the family's HeadKeys."""
    D, E, V = cfg.hidden_size, cfg.embed_dim, cfg.vocab_size
    names, heads = cfg.family.head_keys, cfg.heads
    table: dict[str, Rule] = {}
    if heads.pooler:
        pooler = names.sequence_pooler if heads.classifier == "sequence" else names.pooler
        table |= linear(pooler, "pooler.W", "pooler.b", D, D)
    if heads.mlm:
        table |= linear(names.mlm_dense, "mlm.W", "mlm.b", E, D)
        table |= layer_norm(names.mlm_ln, "mlm.ln", E)
        table[names.mlm_bias] = ("mlm.decoder_bias", (V,), identity)
    if heads.nsp:
        table |= linear("cls.seq_relationship", "nsp.W", "nsp.b", 2, D)
    if heads.classifier:
        classifier = names.classifier if heads.classifier == "sequence" else "classifier"
        table |= linear(classifier, "classifier.W", "classifier.b", cfg.num_labels, D)
    if heads.discriminator:
        table |= linear("discriminator_predictions.dense", "discriminator.W", "discriminator.b", D, D)
        table |= linear("discriminator_predictions.dense_prediction", "discriminator.w", "discriminator.c", 1, D,
                        to_vector, to_scalar)
    return table


def block_keys(cfg: Config, names: LayerKeys, i: int) -> dict[str, Rule]:
    """Layer i's keys under the family's module `names`, into minibert's Block `blocks.{i}`."""
    D, F = cfg.hidden_size, cfg.intermediate_size
    hf, ours = names.prefix.format(i=i), f"blocks.{i}"
    table: dict[str, Rule] = {}
    for name in ("query", "key", "value"):
        letter = name[0].upper()
        table |= linear(f"{hf}.{getattr(names, name)}", f"{ours}.attn.W_{letter}", f"{ours}.attn.b_{letter}",
                        D, D, to_DHK, to_HK)
    table |= linear(f"{hf}.{names.out}", f"{ours}.attn.W_O", f"{ours}.attn.b_O", D, D, to_HKD)
    table |= layer_norm(f"{hf}.{names.ln1}", f"{ours}.ln1", D)
    table |= linear(f"{hf}.{names.mlp_in}", f"{ours}.mlp.W_in", f"{ours}.mlp.b_in", F, D)
    table |= linear(f"{hf}.{names.mlp_out}", f"{ours}.mlp.W_out", f"{ours}.mlp.b_out", D, F)
    table |= layer_norm(f"{hf}.{names.ln2}", f"{ours}.ln2", D)
    return table


def as_dict(names: LayerKeys) -> tuple[str, Mapping[str, str]]:
    """(prefix, {part: module}): the shape of checkpoint.LAYER_KEYS' entries before families/ held them."""
    parts = dataclasses.asdict(names)
    return parts.pop("prefix"), parts
