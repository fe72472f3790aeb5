"""DeBERTa-v2 and -v3 (He et al., 2021; 2023): a post-LN encoder whose attention adds to the content scores
q·k two terms of relative position — content→position (c2p) and position→content (p2c) — read from one table of
relative-distance embeddings shared by every layer, with distances put in log-spaced buckets.

This module is the record, its config checks and the checkpoint key table; the forward code (embeddings,
blocks, the relative-position table) is families/deberta_v2_model.py, named by path so that this module need
not import model.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minibert.errors import ConfigError
from minibert.families.base import Family
from minibert.families.keys import LayerKeys, Rule, block_keys, identity, layer_norm, linear, to_DHK, to_HK

if TYPE_CHECKING:
    from minibert.config import Config

CODE = "minibert.families.deberta_v2_model"
TERMS = ("c2p", "p2c")  # the position terms pos_att_type may list

# config.json keys beyond Config's fields, with transformers' defaults (DebertaV2Config and the getattr defaults
# of modeling_deberta_v2.py).
SETTINGS = (
    ("relative_attention", False), ("max_relative_positions", -1), ("position_buckets", -1),
    ("position_biased_input", True), ("pos_att_type", None), ("share_att_key", False), ("norm_rel_ebd", "none"),
    ("pooler_hidden_act", "gelu"), ("legacy", True),
    # DeBERTa-v3 has no segment table (type_vocab_size 0), which Config's field cannot hold: read here instead.
    ("type_vocab_size", 0),
    ("conv_kernel_size", 0), ("conv_groups", 1), ("conv_act", "tanh"),  # refused unless conv_kernel_size is 0
    # The head width, which DeBERTa-v2 xlarge/xxlarge configs write out: accepted where it is hidden_size /
    # num_attention_heads (what minibert computes), so that those configs are refused for their convolution layer.
    ("attention_head_size", None),
)
# Training only (pooler_dropout), or checked by the checkpoint's shapes (pooler_hidden_size: the pooler's width,
# which transformers writes into every config). embedding_size, which released DeBERTa configs do not have, is
# refused by name as a key minibert does not implement.
IGNORED = frozenset({"pooler_dropout", "pooler_hidden_size"})


def position_terms(cfg: Config) -> tuple[str, ...]:
    """The position terms the attention adds, of "c2p" and "p2c": pos_att_type as a list or "p2c|c2p"."""
    listed = cfg.setting("pos_att_type") or ()
    if isinstance(listed, str):
        listed = listed.split("|")
    terms = tuple(str(term).strip().lower() for term in listed)
    if not set(terms) <= set(TERMS):
        raise ConfigError(f"{cfg.source}: pos_att_type {cfg.setting('pos_att_type')!r} lists a term minibert does not "
                          f"compute; DeBERTa-v2/v3 use {' and '.join(TERMS)} (\"p2c|c2p\").")
    return tuple(term for term in TERMS if term in terms)


def max_relative_positions(cfg: Config) -> int:
    """The largest distance the buckets tell apart: max_relative_positions, else max_position_embeddings."""
    largest = cfg.setting("max_relative_positions")
    return largest if largest >= 1 else cfg.max_position_embeddings


def attention_span(cfg: Config) -> int:
    """A: the relative-embedding table has 2A rows, distances −A…A−1 (position_buckets, else the largest distance)."""
    buckets = cfg.setting("position_buckets")
    return buckets if buckets > 0 else max_relative_positions(cfg)


def segment_rows(cfg: Config) -> int:
    """Rows of the segment table: type_vocab_size, 0 (none) in DeBERTa-v3."""
    return cfg.setting("type_vocab_size")


def check(cfg: Config) -> None:
    """Refuse a checkpoint's config that minibert does not compute, naming the key and what to do."""
    if cfg.setting("relative_attention") is not True:
        raise ConfigError(f"{cfg.source}: relative_attention is not true; minibert computes DeBERTa's disentangled "
                          f"attention (relative_attention = true, as every released DeBERTa-v2/v3 config sets it). "
                          f"Set it in config.json only if the weights were trained that way.")
    check_features(cfg)


def check_features(cfg: Config) -> None:
    """Refuse the features minibert does not compute (also for a model built from a Config written in code, whose
    relative_attention is left at transformers' default: such a model's relative table is minibert's to draw)."""
    where = f"{cfg.source}: "
    for key in ("max_relative_positions", "position_buckets", "type_vocab_size", "conv_kernel_size"):
        value = cfg.setting(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}{key} must be an integer, got {value!r}. Fix it in config.json.")
    position_terms(cfg)
    head_size = cfg.setting("attention_head_size")
    if head_size is not None and head_size != cfg.head_dim:
        raise ConfigError(f"{where}attention_head_size = {head_size!r} is not implemented; minibert's heads are "
                          f"hidden_size / num_attention_heads = {cfg.head_dim} wide (remove the key, or make it "
                          f"{cfg.head_dim}, if the weights were trained that way).")
    if cfg.setting("conv_kernel_size") > 0:
        raise ConfigError(f"{where}conv_kernel_size = {cfg.setting('conv_kernel_size')}: the convolution layer after "
                          f"the first block (DeBERTa-v2 xlarge/xxlarge) is not implemented in minibert; DeBERTa-v3 "
                          f"models have none.")
    if str(cfg.setting("norm_rel_ebd")).strip().lower() not in ("none", "layer_norm"):
        raise ConfigError(f"{where}norm_rel_ebd {cfg.setting('norm_rel_ebd')!r} is not implemented; minibert "
                          f"normalises the relative embeddings with 'layer_norm' or not at all ('none').")
    if segment_rows(cfg) not in (0, 1):
        raise ConfigError(f"{where}type_vocab_size = {segment_rows(cfg)}: minibert's DeBERTa reads a segment table of "
                          f"at most one row (its tokenizer gives every token segment 0); released DeBERTa-v2/v3 "
                          f"models have none (type_vocab_size = 0).")
    if cfg.setting("pooler_hidden_act") != "gelu":  # model.Pooler applies the family's one activation
        raise ConfigError(f"{where}pooler_hidden_act {cfg.setting('pooler_hidden_act')!r} is not implemented; "
                          f"minibert's DeBERTa pooler applies gelu (transformers' default, as released models use).")


LAYER_KEYS = LayerKeys("encoder.layer.{i}", "attention.self.query_proj", "attention.self.key_proj",
                       "attention.self.value_proj", "attention.output.dense", "attention.output.LayerNorm",
                       "intermediate.dense", "output.dense", "output.LayerNorm")


def key_table(cfg: Config) -> dict[str, Rule]:
    """Every key of a DeBERTa-v2 checkpoint → (minibert parameter, shape, converter): BERT's block layout under
    DeBERTa's names, the position projections where keys are not shared, the relative table at encoder level."""
    check(cfg)
    D, V = cfg.hidden_size, cfg.vocab_size
    table: dict[str, Rule] = {"embeddings.word_embeddings.weight": ("embed.word", (V, D), identity),
                              **layer_norm("embeddings.LayerNorm", "embed.ln", D)}
    if cfg.setting("position_biased_input"):
        table["embeddings.position_embeddings.weight"] = ("embed.position", (cfg.max_position_embeddings, D),
                                                          identity)
    if segment_rows(cfg):
        table["embeddings.token_type_embeddings.weight"] = ("embed.token_type", (segment_rows(cfg), D), identity)
    table["encoder.rel_embeddings.weight"] = ("shared.table", (2 * attention_span(cfg), D), identity)
    if cfg.setting("norm_rel_ebd").strip().lower() == "layer_norm":
        table |= layer_norm("encoder.LayerNorm", "shared.ln", D)
    for i in range(cfg.num_hidden_layers):
        table |= block_keys(cfg, LAYER_KEYS, i)
        if not cfg.setting("share_att_key"):  # the position projections of their own
            for term, hf, ours in (("c2p", "pos_key_proj", "K"), ("p2c", "pos_query_proj", "Q")):
                if term in position_terms(cfg):
                    table |= linear(f"encoder.layer.{i}.attention.self.{hf}", f"blocks.{i}.attn.W_pos_{ours}",
                                    f"blocks.{i}.attn.b_pos_{ours}", D, D, to_DHK, to_HK)
    return table | head_table(cfg)


def head_table(cfg: Config) -> dict[str, Rule]:
    """The keys of the heads: the context pooler and classifier, or the masked-LM head in its legacy layout
    (cls.predictions…, transformers' default) or its current one (lm_predictions.lm_head…)."""
    D, V, heads = cfg.hidden_size, cfg.vocab_size, cfg.heads
    table: dict[str, Rule] = {}
    if heads.pooler:
        table |= linear("pooler.dense", "pooler.W", "pooler.b", D, D)
    if heads.classifier:
        table |= linear("classifier", "classifier.W", "classifier.b", cfg.num_labels, D)
    if heads.mlm:
        legacy = cfg.setting("legacy")
        prefix = "cls.predictions" if legacy else "lm_predictions.lm_head"
        transform = f"{prefix}.transform" if legacy else prefix
        table |= linear(f"{transform}.dense", "mlm.W", "mlm.b", D, D)
        table |= layer_norm(f"{transform}.LayerNorm", "mlm.ln", D)
        table[f"{prefix}.bias"] = ("mlm.decoder_bias", (V,), identity)
    return table


FAMILIES = (Family(
    "deberta-v2", "DeBERTa-v2", "DebertaV2", "deberta",
    keys=IGNORED,
    fixed=(("type_vocab_size", 1),),  # Config's field; the segment table's rows are the setting above
    settings=SETTINGS,
    layer_keys=LAYER_KEYS,
    key_table=key_table,
    # microsoft/deberta-v3-* hold their pretraining heads and a position table the encoder does not read
    # (transformers' DeBERTa ignores them when it loads; deberta_v2_model.enhanced_mask_decoder takes the table as
    # an argument): DebertaV2Model and its task heads load from those files.
    unused_keys=(r"mask_predictions\.", r"lm_predictions\.", r"embeddings\.position_embeddings\."),
    tokenizer="unigram",
    token_types=False, base_pooler=False, pooler_activation="gelu",
    positions="relative", attention="disentangled",
    block=f"{CODE}:DebertaBlock", embeddings=f"{CODE}:DebertaEmbeddings", shared=f"{CODE}:RelativePositions"),)
