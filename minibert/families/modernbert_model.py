"""ModernBERT's forward pass: embeddings without a position table, pre-LN blocks with rotary attention (global or
within a window) and a GeGLU MLP, and a final LayerNorm before its heads. Hook names are TransformerLens' with
their pre-LN meanings:

    resid_pre  = block input                           (hook_resid_pre)
    resid_mid  = resid_pre + Attn(ln1(resid_pre))      (ln1: identity in layer 0, as transformers has it)
    resid_post = resid_mid + MLP(ln2(resid_mid))       (hook_resid_post, the next block's resid_pre)
    last_hidden_state = ln_final(resid_post of the last block)

q and k are rotated after hook_q / hook_k (hook_rot_q, hook_rot_k: what the scores use); keys outside a local
layer's window are masked like padding, so attn.hook_attn_scores holds −inf there.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from minibert.config import Config
from minibert.errors import InputError
from minibert.families.modernbert import GLOBAL, check, layer_kinds, rope_theta
from minibert.model import (
    ACTIVATIONS,
    NO_DROPOUT,
    Classifier,
    Dropout,
    Hooks,
    LayerNorm,
    Output,
    attend,
    attention_output,
)
from minibert.model import _weight as weight
from minibert.model import _zeros as zeros


def norm(cfg: Config, dtype) -> LayerNorm:
    return LayerNorm(cfg.hidden_size, cfg.setting("norm_eps"), dtype, bias=cfg.setting("norm_bias"))


def bias(shape, dtype, present: bool):
    return zeros(shape, dtype) if present else None


def rotate(x, theta: float):
    """Rotary embedding of x [B, T, H, K] at positions 0…T−1 (transformers' convention: dimension j pairs with
    j + K/2, angle position · θ^(−2j/K)), computed in float32 as transformers computes it."""
    T, K = x.shape[1], x.shape[-1]
    inverse_frequency = 1.0 / theta ** (jnp.arange(0, K, 2, dtype=jnp.float32) / K)  # [K/2]
    angles = jnp.arange(T, dtype=jnp.float32)[:, None] * inverse_frequency  # [T, K/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[None, :, None, :]  # [1, T, 1, K]
    x32 = x.astype(jnp.float32)
    half_turned = jnp.concatenate([-x32[..., K // 2:], x32[..., :K // 2]], axis=-1)
    return (x32 * jnp.cos(angles) + half_turned * jnp.sin(angles)).astype(x.dtype)


def window_mask(T: int, half_width: int):
    """[1, 1, T, T] True where |query − key| ≤ half_width: the keys a local layer's query reads."""
    positions = jnp.arange(T)
    return (jnp.abs(positions[:, None] - positions[None, :]) <= half_width)[None, None]


class ModernEmbeddings(nnx.Module):
    """LayerNorm(W_E[ids]): no position table (positions enter as rotations in attention), no segment table."""

    def __init__(self, cfg: Config, dtype, rngs):
        check(cfg)  # a model built from a config alone, without the checkpoint's key table, is refused alike
        self.word = weight(rngs, (cfg.vocab_size, cfg.hidden_size), dtype)  # [V, D]
        self.ln = norm(cfg, dtype)

    def __call__(self, input_ids, token_type_ids, hooks: Hooks, position_ids=None, dropout: Dropout = NO_DROPOUT):
        """token_type_ids and position_ids are unused: ModernBERT has no segment table and numbers positions 0…T−1
        in every row (rotary, in attention)."""
        embed = hooks("embed.hook_embed", self.word[...][input_ids])  # [B, T, D]
        return dropout.hidden("embed", self.ln(embed, hooks, "embed.ln"))


class ModernAttention(nnx.Module):
    """Fused q, k, v projection W_QKV [3, D, H, K], rotary q and k, attention over every key (global layers) or
    within ±local_attention/2 of the query (local layers)."""

    def __init__(self, cfg: Config, dtype, rngs, layer: int):
        D, H, K = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
        with_bias = cfg.setting("attention_bias")
        self.W_QKV = weight(rngs, (3, D, H, K), dtype)
        self.b_QKV = bias((3, H, K), dtype, with_bias)
        self.W_O = weight(rngs, (H, K, D), dtype)
        self.b_O = bias((D,), dtype, with_bias)
        kind = layer_kinds(cfg)[layer]
        self.theta = rope_theta(cfg, kind)
        self.half_width = None if kind == GLOBAL else cfg.setting("local_attention") // 2

    def __call__(self, x, key_mask, hooks: Hooks, name: str, dropout: Dropout = NO_DROPOUT):
        qkv = jnp.einsum("BTD,CDHK->CBTHK", x, self.W_QKV[...])
        if self.b_QKV is not None:
            qkv = qkv + self.b_QKV[...][:, None, None]
        q, k, v = (hooks(f"{name}.hook_{part}", qkv[i]) for i, part in enumerate("qkv"))
        q = hooks(f"{name}.hook_rot_q", rotate(q, self.theta))
        k = hooks(f"{name}.hook_rot_k", rotate(k, self.theta))
        if self.half_width is not None:
            key_mask = key_mask & window_mask(x.shape[1], self.half_width)  # [B, 1, T, S]
        z = attend(q, k, v, key_mask, hooks, name, dropout)
        return attention_output(z, self.W_O[...], None if self.b_O is None else self.b_O[...], hooks, name)


class GeGLU(nnx.Module):
    """(act(x·W_in[:, 0]) ⊙ x·W_in[:, 1]) · W_out: one input projection [D, 2, F] split into the activated half
    (hook_pre, TransformerLens' gate) and the linear half (hook_pre_linear)."""

    def __init__(self, cfg: Config, dtype, rngs):
        D, F = cfg.hidden_size, cfg.intermediate_size
        with_bias = cfg.setting("mlp_bias")
        self.W_in = weight(rngs, (D, 2, F), dtype)
        self.b_in = bias((2, F), dtype, with_bias)
        self.W_out = weight(rngs, (F, D), dtype)
        self.b_out = bias((D,), dtype, with_bias)
        self.activation = cfg.hidden_act

    def __call__(self, x, hooks: Hooks, name: str):
        both = jnp.einsum("BTD,DGF->BTGF", x, self.W_in[...])
        if self.b_in is not None:
            both = both + self.b_in[...]
        pre = hooks(f"{name}.hook_pre", both[..., 0, :])  # [B, T, F]
        linear = hooks(f"{name}.hook_pre_linear", both[..., 1, :])
        post = hooks(f"{name}.hook_post", ACTIVATIONS[self.activation](pre) * linear)
        out = post @ self.W_out[...]
        return out if self.b_out is None else out + self.b_out[...]


class ModernBlock(nnx.Module):
    """x + Attn(ln1(x)), then + MLP(ln2(·)); layer 0 has no ln1 (Family.first_ln1)."""

    def __init__(self, cfg: Config, dtype, rngs, layer: int):
        self.ln1 = norm(cfg, dtype) if layer or cfg.family.first_ln1 else None
        self.attn = ModernAttention(cfg, dtype, rngs, layer)
        self.ln2 = norm(cfg, dtype)
        self.mlp = GeGLU(cfg, dtype, rngs)

    def __call__(self, resid_pre, key_mask, hooks: Hooks, name: str, dropout: Dropout = NO_DROPOUT):
        resid_pre = hooks(f"{name}.hook_resid_pre", resid_pre)
        attn_in = resid_pre if self.ln1 is None else self.ln1(resid_pre, hooks, f"{name}.ln1")
        attn_out = hooks(f"{name}.hook_attn_out", self.attn(attn_in, key_mask, hooks, f"{name}.attn", dropout))
        resid_mid = hooks(f"{name}.hook_resid_mid", resid_pre + dropout.hidden(f"{name}.attn_out", attn_out))
        mlp_out = hooks(f"{name}.hook_mlp_out", self.mlp(self.ln2(resid_mid, hooks, f"{name}.ln2"), hooks,
                                                         f"{name}.mlp"))
        return hooks(f"{name}.hook_resid_post", resid_mid + dropout.hidden(f"{name}.mlp_out", mlp_out))


class ModernHead(nnx.Module):
    """ln_final, then the architecture's head: masked-LM logits norm(act(h·W + b))·W_Eᵀ + bias; a sequence
    classifier on the same transform of the [CLS] state or of the mean over real tokens (classifier_pooling);
    a token classifier on the transform of every token."""

    def __init__(self, cfg: Config, dtype, rngs):
        D, heads = cfg.hidden_size, cfg.heads
        self.ln_final = norm(cfg, dtype)
        transform = heads.mlm or heads.classifier is not None
        self.W = weight(rngs, (D, D), dtype) if transform else None
        self.b = bias((D,), dtype, transform and cfg.setting("classifier_bias"))
        self.ln = norm(cfg, dtype) if transform else None
        self.activation = cfg.setting("classifier_activation")
        self.decoder_bias = bias((cfg.vocab_size,), dtype, heads.mlm and cfg.setting("decoder_bias"))
        self.classifier = (Classifier(D, cfg.num_labels, dtype, rngs, "classifier.hook_logits")
                           if heads.classifier else None)
        self.mlm, self.per_token = heads.mlm, heads.classifier == "token"
        self.pooling = cfg.setting("classifier_pooling")

    def transform(self, x, hooks: Hooks, name: str, out: str | None = None):
        dense = x @ self.W[...] if self.b is None else x @ self.W[...] + self.b[...]
        return self.ln(ACTIVATIONS[self.activation](dense), hooks, f"{name}.ln", out)

    def pool(self, hidden, key_mask):
        if self.pooling == "cls":
            return hidden[:, 0]
        if key_mask is None:
            raise InputError("this ModernBERT classifier pools the mean of the real tokens (classifier_pooling = "
                             "'mean'), so its head needs the attention mask: run the whole forward (model.run) "
                             "rather than the head stage alone.")
        real = key_mask[:, 0, 0, :, None].astype(hidden.dtype)  # [B, S, 1]
        return (hidden * real).sum(axis=1) / real.sum(axis=1)

    def __call__(self, hidden, word_embeddings, hooks: Hooks, dropout: Dropout = NO_DROPOUT, key_mask=None):
        hidden = self.ln_final(hidden, hooks, "ln_final")  # [B, T, D], the last hidden state
        if self.mlm:
            transformed = self.transform(hidden, hooks, "mlm_head", out="unembed.hook_in")
            logits = jnp.einsum("BTD,VD->BTV", transformed, word_embeddings)
            if self.decoder_bias is not None:
                logits = logits + self.decoder_bias[...]
            return Output(hidden, logits=hooks("unembed.hook_out", logits))
        if self.classifier is None:
            return Output(hidden)
        if self.per_token:
            transformed = self.transform(hidden, hooks, "classifier")
            return Output(hidden, logits=self.classifier(dropout.classifier("classifier", transformed), hooks))
        pooled = hooks("pooler.hook_pooler_out", self.transform(self.pool(hidden, key_mask), hooks, "pooler"))
        return Output(hidden, pooled, self.classifier(dropout.classifier("classifier", pooled), hooks))
