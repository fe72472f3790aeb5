"""DeBERTa-v2 and -v3 (He et al., 2021; 2023): a post-LN encoder whose attention adds to the content scores
q·k two terms of relative position — content→position (c2p) and position→content (p2c) — read from one table of
relative-distance embeddings shared by every layer, with distances put in log-spaced buckets.

This module is the family: its record, config checks and checkpoint key table, then its forward code: BERT's
post-LN block around a disentangled attention, embeddings with an optional position table, and one table of
relative-distance embeddings that every block reads (Family.shared).

Block i's attention scores, per head, at query t and key s (A the span, δ(t, s) = clamp(bucket(t − s) + A,
0, 2A − 1) the row of the relative table r [2A, D], LayerNorm-ed when norm_rel_ebd says so):

    c2c[t, s] = q_t · k_s / √(K·m)                      (attn.hook_c2c)
    c2p[t, s] = q_t · (r W_K')[δ(t, s)] / √(K·m)        (attn.hook_c2p; 0 where pos_att_type omits c2p)
    p2c[t, s] = k_s · (r W_Q')[δ(t, s)] / √(K·m)        (attn.hook_p2c; 0 where pos_att_type omits p2c)
    scores    = c2c + c2p + p2c, −inf at padding keys   (attn.hook_attn_scores)

m = 1 + the number of position terms; W_K', W_Q' are the block's own W_K, W_Q (+ biases) when share_att_key is
set, else its position projections W_pos_K, W_pos_Q. bucket is the identity within ±position_buckets/2 and grows
with log(distance) beyond, up to max_relative_positions (transformers' make_log_bucket_position).

transformers multiplies padding positions' embeddings by 0; minibert leaves them: no real token reads a padding
position (padding keys are masked, every other step is per token), so real tokens' states are the same.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from flax import nnx

from minibert.core import site_names as site
from minibert.core.config import Config
from minibert.core.dropout import NO_DROPOUT, Dropout
from minibert.core.encoder import (
    NO_HOOKS,
    Attention,
    Block,
    Hooks,
    LayerNorm,
    attention_output,
    attention_softmax,
)
from minibert.core.encoder import _weight as weight
from minibert.core.encoder import _zeros as zeros
from minibert.core.family import Family, LayerKeys
from minibert.core.keys import Rule, block_keys, identity, layer_norm, linear, to_DHK, to_HK
from minibert.core.shows import HEAD_ROW, POST_LN_STEPS, replacing, step_table
from minibert.errors import ConfigError, InputError

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
IGNORED = frozenset({"pooler_dropout", "pooler_hidden_size", "cls_dropout"})  # cls_dropout: fine-tuned heads


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
    for key in ("share_att_key", "position_biased_input"):  # the string "false" would read as true
        if not isinstance(cfg.setting(key), bool):
            raise ConfigError(f"{where}{key} must be true or false (a JSON boolean), got {cfg.setting(key)!r}. Fix "
                              f"it in config.json.")
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
    if segment_rows(cfg) not in (0, 1, 2):
        raise ConfigError(f"{where}type_vocab_size = {segment_rows(cfg)}: minibert's DeBERTa reads a segment table of "
                          f"at most two rows (its tokenizer gives sentence A segment 0, sentence B segment 1, as "
                          f"transformers' does); released DeBERTa-v2/v3 models have none (type_vocab_size = 0).")
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



# ---- forward code ------------------------------------------------------------------------------------------

def log_buckets(relative: np.ndarray, buckets: int, largest: int) -> np.ndarray:
    """transformers' make_log_bucket_position in float32 as it computes it: distances within ±buckets/2 kept,
    larger ones mid + ⌈log(|d|/mid) / log((largest − 1)/mid) · (mid − 1)⌉ with d's sign (mid = buckets/2)."""
    mid = buckets // 2
    sign = np.sign(relative)
    distance = np.where((relative < mid) & (relative > -mid), mid - 1, np.abs(relative))
    ratio = np.log(distance.astype(np.float32) / np.float32(mid)) / np.log(np.float32((largest - 1) / mid))
    logged = np.ceil(ratio * np.float32(mid - 1)) + mid
    return np.where(distance <= mid, relative, logged * sign).astype(np.int64)


class RelativePositions(nnx.Module):
    """The relative-distance table r [2A, D] (encoder.rel_embeddings) and its LayerNorm (encoder.LayerNorm, where
    norm_rel_ebd is "layer_norm"): built once (encoder.Encoder.shared), read by every block."""

    def __init__(self, cfg: Config, dtype, rngs):
        self.span = attention_span(cfg)
        self.table = weight(rngs, (2 * self.span, cfg.hidden_size), dtype)
        normed = cfg.setting("norm_rel_ebd").strip().lower() == "layer_norm"
        self.ln = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps, dtype) if normed else None
        self.buckets, self.largest = cfg.setting("position_buckets"), max_relative_positions(cfg)

    def embeddings(self):
        """r [2A, D], normalised where the config says so."""
        return self.table[...] if self.ln is None else self.ln(self.table[...], NO_HOOKS, "rel")

    def rows(self, T: int) -> np.ndarray:
        """δ [T, T]: the row of r that query t reads for key s, clamp(bucket(t − s) + A, 0, 2A − 1)."""
        relative = np.arange(T)[:, None] - np.arange(T)[None, :]
        if self.buckets > 0 and self.largest > 0:
            relative = log_buckets(relative, self.buckets, self.largest)
        return np.clip(relative + self.span, 0, 2 * self.span - 1)


class DisentangledAttention(Attention):
    """BERT's q, k, v and output projections, with scores c2c + c2p + p2c (the module docstring's equations)."""

    def __init__(self, cfg: Config, dtype, rngs):
        super().__init__(cfg, dtype, rngs)
        D, H, K = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
        self.terms = position_terms(cfg)
        self.shared_keys = bool(cfg.setting("share_att_key"))
        own = {"c2p": "K", "p2c": "Q"}  # each term's own projection of r, unless the keys are shared
        for term, letter in own.items():
            present = term in self.terms and not self.shared_keys
            setattr(self, f"W_pos_{letter}", weight(rngs, (D, H, K), dtype) if present else None)
            setattr(self, f"b_pos_{letter}", zeros((H, K), dtype) if present else None)
        self.scale = math.sqrt(K * (1 + len(self.terms)))

    def project_positions(self, r, letter: str):
        """r W' + b' [2A, H, K]: r through the block's W_Q or W_K (share_att_key), else its W_pos_Q or W_pos_K."""
        prefix = "" if self.shared_keys else "pos_"
        W, b = getattr(self, f"W_{prefix}{letter}"), getattr(self, f"b_{prefix}{letter}")
        return jnp.einsum("RD,DHK->RHK", r, W[...]) + b[...]

    def __call__(self, x, key_mask, hooks: Hooks, name: str, dropout: Dropout = NO_DROPOUT,
                 shared: RelativePositions | None = None):
        """x [B, T, D], key_mask [B, 1, 1, S], shared: the relative table (Encoder.shared) → output [B, T, D]."""
        q = hooks(site.under(name, site.Q), jnp.einsum("BTD,DHK->BTHK", x, self.W_Q[...]) + self.b_Q[...])
        k = hooks(site.under(name, site.K), jnp.einsum("BSD,DHK->BSHK", x, self.W_K[...]) + self.b_K[...])
        v = hooks(site.under(name, site.V), jnp.einsum("BSD,DHK->BSHK", x, self.W_V[...]) + self.b_V[...])
        qk = hooks(site.under(name, site.QK), jnp.einsum("BTHK,BSHK->BHTS", q, k))
        c2c = hooks(site.under(name, site.C2C), qk / self.scale)
        r, rows = shared.embeddings(), shared.rows(x.shape[1])  # [2A, D], [T, S]
        c2p = p2c = jnp.zeros_like(c2c)
        if "c2p" in self.terms:  # q_t · (r W_K')[δ(t, s)]: every row's product, then each (t, s) picks its row
            by_row = jnp.einsum("BTHK,RHK->BHTR", q, self.project_positions(r, "K"))
            c2p = jnp.take_along_axis(by_row, rows[None, None], axis=-1) / self.scale
        if "p2c" in self.terms:  # k_s · (r W_Q')[δ(t, s)], picked per key s and then laid out [T, S]
            by_row = jnp.einsum("BSHK,RHK->BHSR", k, self.project_positions(r, "Q"))
            p2c = jnp.take_along_axis(by_row, rows.T[None, None], axis=-1).swapaxes(-1, -2) / self.scale
        c2p, p2c = hooks(site.under(name, site.C2P), c2p), hooks(site.under(name, site.P2C), p2c)
        scores = hooks(site.under(name, site.ATTN_SCORES), jnp.where(key_mask, c2c + c2p + p2c, -jnp.inf))
        pattern = hooks(site.under(name, site.PATTERN), attention_softmax(scores.astype(jnp.float32)).astype(v.dtype))
        weights = dropout.attention(f"{name}.pattern", pattern)
        z = hooks(site.under(name, site.Z), jnp.einsum("BHTS,BSHK->BTHK", weights, v))
        return attention_output(z, self.W_O[...], self.b_O[...], hooks, name)


class DebertaBlock(Block):
    """BERT's post-LN block (resid_mid = x + Attn(x), ln1, MLP, ln2) around the disentangled attention."""

    attention = DisentangledAttention


class DebertaEmbeddings(nnx.Module):
    """LayerNorm(W_E[ids] + W_pos[positions] (position_biased_input) + W_type[segments] (type_vocab_size > 0))."""

    def __init__(self, cfg: Config, dtype, rngs):
        check_features(cfg)  # a model built from a config alone, without a checkpoint's key table, is refused alike
        D = cfg.hidden_size
        self.word = weight(rngs, (cfg.vocab_size, D), dtype)
        biased = cfg.setting("position_biased_input")
        self.position = weight(rngs, (cfg.max_position_embeddings, D), dtype) if biased else None
        self.token_type = weight(rngs, (segment_rows(cfg), D), dtype) if segment_rows(cfg) else None
        self.ln = LayerNorm(D, cfg.layer_norm_eps, dtype)

    def __call__(self, input_ids, token_type_ids, hooks: Hooks, position_ids=None, dropout: Dropout = NO_DROPOUT):
        """position_ids [B, T] or [1, T]: rows of the position table (None: 0…T−1). The position and segment rows
        are added without a hook of their own (the hook table's embed.hook_pos_embed is BERT's absolute table)."""
        embed = hooks(site.EMBED, self.word[...][input_ids])  # [B, T, D]
        if self.position is not None:
            rows = jnp.arange(input_ids.shape[1])[None] if position_ids is None else position_ids
            embed = embed + self.position[...][rows]
        if self.token_type is not None:
            embed = embed + self.token_type[...][token_type_ids]
        return dropout.hidden("embed", self.ln(embed, hooks, "embed.ln"))


def enhanced_mask_decoder(model, batch, position_table=None):
    """Masked-LM logits [B, T, V] through DeBERTa's enhanced mask decoder (He et al., 2021, §3.2), as the authors'
    code computes it (DeBERTa's EnhancedMaskDecoder.emd_context_layer): the last block runs twice more on the
    input H of the last block, its queries read from Q = H + P[0…T−1] (absolute positions, added only here; the
    rows of the batch's position_ids where it has them, as the authors' code takes them) and then from its own
    output, its keys and values from H; the masked-LM head reads the second output.

        Q₁ = block_{L−1}(keys, values: H; queries and residual: H + P)
        Q₂ = block_{L−1}(keys, values: H; queries and residual: Q₁)        logits = head(Q₂)

    transformers' DebertaV2ForMaskedLM (which model(batch) equals) has no such decoder; this is the authors'
    prediction of a checkpoint pretrained with it. P is the checkpoint's embeddings.position_embeddings table
    [max_position_embeddings, D], which DeBERTa-v3 files carry and the encoder leaves unused (position_biased_input
    false). Where position_biased_input is true the authors' decoder is the model's own prediction (their code
    skips the two runs), so model(batch).logits is returned.

    model: a DeBERTa-v2/v3 Model with a masked-LM head (DebertaV2ForMaskedLM); batch: anything model.inputs takes.
    The block runs through the model's stage and hooks (a query input differs from the key input only in the
    block's q and its residual): blocks.{L−1}.attn.hook_q and hook_resid_mid are rewritten.
    """
    cfg = model.config
    if cfg.model_type != "deberta-v2" or not cfg.heads.mlm:
        raise InputError(f"the enhanced mask decoder is DeBERTa's masked-LM head; this model is a "
                         f"{cfg.architecture}. Load a DebertaV2ForMaskedLM (architecture=\"DebertaV2ForMaskedLM\").")
    inputs = model.inputs(batch)
    if cfg.setting("position_biased_input"):
        return model.run(inputs)[0].logits
    last = cfg.num_hidden_layers - 1
    given = inputs.position_ids
    rows = np.arange(inputs.input_ids.shape[1])[None] if given is None else np.asarray(given)  # [1 or B, T]
    T = int(rows.max()) + 1  # the rows of P read: 0…T−1, or the position_ids given
    table = None if position_table is None else jnp.asarray(position_table, model.dtype)
    if table is None or table.ndim != 2 or table.shape[1] != cfg.hidden_size or table.shape[0] < T:
        shape = None if table is None else tuple(table.shape)
        raise InputError(f"the enhanced mask decoder adds absolute positions: pass position_table, the checkpoint's "
                         f"[max_position_embeddings, {cfg.hidden_size}] embeddings.position_embeddings.weight with at "
                         f"least {T} rows (got {shape}), e.g. minibert.io.checkpoint.read_safetensors(path)"
                         f"[\"deberta.embeddings.position_embeddings.weight\"].")
    _, cache = model.run_with_cache(inputs, names=[site.in_block(last, site.RESID_PRE)])
    hidden = cache[site.in_block(last, site.RESID_PRE)]  # H [B, T, D]
    W_Q, b_Q = model.layer_weights("attn.W_Q")[last], model.layer_weights("attn.b_Q")[last]  # [D, H, K], [H, K]
    query = hidden + table[rows]
    for _ in range(2):
        q = jnp.einsum("BTD,DHK->BTHK", query, W_Q) + b_Q
        query = model.block(model.state, last, hidden, inputs, hooks=_query_input_hooks(last, q, query))
    return model.head(model.state, query).logits


def _query_input_hooks(layer: int, q, query) -> dict:
    """Hooks that make block `layer` read its queries q [B, T, H, K] from another input `query` [B, T, D] than its
    keys and values, and add its attention output to that input (the authors' query_states)."""
    attn_out = {}

    def keep(value, ctx):
        attn_out["value"] = value
        return value

    return {site.in_block(layer, site.Q): lambda value, ctx: q, site.in_block(layer, site.ATTN_OUT): keep,
            site.in_block(layer, site.RESID_MID): lambda value, ctx: query + attn_out["value"]}


# ---- what it shows ------------------------------------------------------------------------------------------

SCORE_TERMS = (site.C2C, site.C2P, site.P2C)  # in the order of ("c2c", *TERMS)


def score_scale(cfg: Config) -> int:
    """m of √(K·m), what each score term is divided by: 1 + the number of position terms."""
    return 1 + len(position_terms(cfg))


# The step-through: BERT's post-LN block whose scores are three terms, each already divided by √(K·m). r is the
# relative table, δ(t, s) the row for the distance t − s, W_K', W_Q' the block's W_K, W_Q (shared keys) or its own
# position projections.
DISENTANGLED_SCORES = step_table(
    ("c2c", "content → content", "q·k_s / √({d_head}·m)  (m = 1 + the number of position terms)", site.C2C,
     HEAD_ROW, ("qk",)),
    ("c2p", "content → position", "q·(r W_K')[δ(t, s)] / √({d_head}·m): the query against the relative table's row "
     "for the distance t − s (0 where pos_att_type leaves c2p out)", site.C2P, HEAD_ROW, ("q",)),
    ("p2c", "position → content", "k_s·(r W_Q')[δ(t, s)] / √({d_head}·m): each key against the table's row for "
     "t − s (0 where pos_att_type leaves p2c out)", site.P2C, HEAD_ROW, ("k",)),
    ("scaled", "summed and masked", "c2c_s + c2p_s + p2c_s + mask_s (mask: 0 on real keys, −∞ on padding)",
     site.ATTN_SCORES, HEAD_ROW, ("c2c", "c2p", "p2c")),
)
DISENTANGLED_STEPS = replacing(POST_LN_STEPS, "scaled", DISENTANGLED_SCORES)


FAMILIES = (Family(
    "deberta-v2", "DeBERTa-v2", "DebertaV2", "deberta",
    keys=IGNORED,
    fixed=(("type_vocab_size", 1),),  # Config's field; the segment table's rows are the setting above
    settings=SETTINGS,
    layer_keys=LAYER_KEYS,
    key_table=key_table,
    # microsoft/deberta-v3-* hold their pretraining heads and a position table the encoder does not read
    # (transformers' DeBERTa ignores them when it loads; enhanced_mask_decoder takes the table as
    # an argument): DebertaV2Model and its task heads load from those files.
    unused_keys=(r"mask_predictions\.", r"lm_predictions\.", r"embeddings\.position_embeddings\."),
    tokenizer="unigram",
    token_types=False, base_pooler=False, pooler_activation="gelu",
    positions="relative", attention="disentangled",
    block=DebertaBlock, embeddings=DebertaEmbeddings, shared=RelativePositions,
    score_terms=SCORE_TERMS, score_scale=score_scale, steps=DISENTANGLED_STEPS),)
