"""DeBERTa-v2/v3's forward pass: BERT's post-LN block around a disentangled attention, embeddings with an optional
position table, and one table of relative-distance embeddings that every block reads (Family.shared).

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

from minibert.config import Config
from minibert.errors import InputError
from minibert.families.deberta_v2 import (
    attention_span,
    check_features,
    max_relative_positions,
    position_terms,
    segment_rows,
)
from minibert.model import (
    NO_DROPOUT,
    NO_HOOKS,
    Attention,
    Block,
    Dropout,
    Hooks,
    LayerNorm,
    attention_output,
    attention_softmax,
)
from minibert.model import _weight as weight
from minibert.model import _zeros as zeros


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
    norm_rel_ebd is "layer_norm"): built once (model.Bert.shared), read by every block."""

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
        """x [B, T, D], key_mask [B, 1, 1, S], shared: the relative table (model.Bert.shared) → output [B, T, D]."""
        q = hooks(f"{name}.hook_q", jnp.einsum("BTD,DHK->BTHK", x, self.W_Q[...]) + self.b_Q[...])
        k = hooks(f"{name}.hook_k", jnp.einsum("BSD,DHK->BSHK", x, self.W_K[...]) + self.b_K[...])
        v = hooks(f"{name}.hook_v", jnp.einsum("BSD,DHK->BSHK", x, self.W_V[...]) + self.b_V[...])
        qk = hooks(f"{name}.hook_qk", jnp.einsum("BTHK,BSHK->BHTS", q, k))
        c2c = hooks(f"{name}.hook_c2c", qk / self.scale)
        r, rows = shared.embeddings(), shared.rows(x.shape[1])  # [2A, D], [T, S]
        c2p = p2c = jnp.zeros_like(c2c)
        if "c2p" in self.terms:  # q_t · (r W_K')[δ(t, s)]: every row's product, then each (t, s) picks its row
            by_row = jnp.einsum("BTHK,RHK->BHTR", q, self.project_positions(r, "K"))
            c2p = jnp.take_along_axis(by_row, rows[None, None], axis=-1) / self.scale
        if "p2c" in self.terms:  # k_s · (r W_Q')[δ(t, s)], picked per key s and then laid out [T, S]
            by_row = jnp.einsum("BSHK,RHK->BHSR", k, self.project_positions(r, "Q"))
            p2c = jnp.take_along_axis(by_row, rows.T[None, None], axis=-1).swapaxes(-1, -2) / self.scale
        c2p, p2c = hooks(f"{name}.hook_c2p", c2p), hooks(f"{name}.hook_p2c", p2c)
        scores = hooks(f"{name}.hook_attn_scores", jnp.where(key_mask, c2c + c2p + p2c, -jnp.inf))
        pattern = hooks(f"{name}.hook_pattern", attention_softmax(scores.astype(jnp.float32)).astype(v.dtype))
        weights = dropout.attention(f"{name}.pattern", pattern)
        z = hooks(f"{name}.hook_z", jnp.einsum("BHTS,BSHK->BTHK", weights, v))
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
        embed = hooks("embed.hook_embed", self.word[...][input_ids])  # [B, T, D]
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
                         f"least {T} rows (got {shape}), e.g. minibert.checkpoint.read_safetensors(path)"
                         f"[\"deberta.embeddings.position_embeddings.weight\"].")
    name = f"blocks.{last}"
    _, cache = model.run_with_cache(inputs, names=[f"{name}.hook_resid_pre"])
    hidden = cache[f"{name}.hook_resid_pre"]  # H [B, T, D]
    W_Q, b_Q = model.layer_weights("attn.W_Q")[last], model.layer_weights("attn.b_Q")[last]  # [D, H, K], [H, K]
    query = hidden + table[rows]
    for _ in range(2):
        q = jnp.einsum("BTD,DHK->BTHK", query, W_Q) + b_Q
        query = model.block(model.state, last, hidden, inputs, hooks=_query_input_hooks(name, q, query))
    return model.head(model.state, query).logits


def _query_input_hooks(name: str, q, query) -> dict:
    """Hooks that make block `name` read its queries q [B, T, H, K] from another input `query` [B, T, D] than its
    keys and values, and add its attention output to that input (the authors' query_states)."""
    attn_out = {}

    def keep(value, ctx):
        attn_out["value"] = value
        return value

    return {f"{name}.attn.hook_q": lambda value, ctx: q, f"{name}.hook_attn_out": keep,
            f"{name}.hook_resid_mid": lambda value, ctx: query + attn_out["value"]}
