"""ModernBERT (Warner et al., 2024): a pre-LN encoder with rotary positions, a GeGLU MLP, no biases where its
config says so, and global attention every `global_attn_every_n_layers`-th layer, a sliding window of
±local_attention/2 tokens in the others.

This module is the family: its record, config checks and checkpoint key table, then its forward code (embeddings
without a position table, pre-LN blocks with rotary attention, a final LayerNorm before its heads). Hook names are
TransformerLens' with their pre-LN meanings:

    resid_pre  = block input                           (hook_resid_pre)
    resid_mid  = resid_pre + Attn(ln1(resid_pre))      (ln1: identity in layer 0, as transformers has it)
    resid_post = resid_mid + MLP(ln2(resid_mid))       (hook_resid_post, the next block's resid_pre)
    last_hidden_state = ln_final(resid_post of the last block)

q and k are rotated after hook_q / hook_k (hook_rot_q, hook_rot_k: what the scores use); keys outside a local
layer's window are masked like padding, so attn.hook_attn_scores holds −inf there.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from flax import nnx

from minibert.core import config
from minibert.core import site_names as site
from minibert.core.config import Config
from minibert.core.dropout import NO_DROPOUT, Dropout
from minibert.core.encoder import (
    ACTIVATIONS,
    Classifier,
    Hooks,
    LayerNorm,
    Output,
    attend,
    attention_output,
)
from minibert.core.encoder import _weight as weight
from minibert.core.encoder import _zeros as zeros
from minibert.core.family import Family, HeadKeys, LayerKeys, Part, WeightRoles
from minibert.core.keys import Rule, identity, to_HKD, transpose
from minibert.core.shows import HEAD_ROW, KEYS_HEAD, QUERY, QUERY_HEAD, shared, step_table
from minibert.errors import ConfigError, InputError

GLOBAL, LOCAL = "full_attention", "sliding_attention"  # transformers' layer_types

# config.json keys beyond Config's fields, with transformers' defaults. Hub configs written before transformers 5
# say global_attn_every_n_layers and global/local_rope_theta; transformers 5 writes layer_types and rope_parameters.
SETTINGS = (
    ("norm_eps", 1e-5), ("norm_bias", False), ("attention_bias", False), ("mlp_bias", False),
    ("classifier_bias", False), ("decoder_bias", True), ("classifier_pooling", "cls"),
    ("classifier_activation", "gelu"), ("local_attention", 128), ("global_attn_every_n_layers", 3),
    ("layer_types", None), ("rope_parameters", None), ("global_rope_theta", 160_000.0), ("local_rope_theta", 10_000.0),
)
# Training-only and kernel settings: they change nothing minibert computes.
IGNORED = frozenset({"attention_dropout", "embedding_dropout", "mlp_dropout", "deterministic_flash_attn",
                     "sparse_prediction", "sparse_pred_ignore_index", "initializer_cutoff_factor", "reference_compile",
                     "repad_logits_with_grad"})


def layer_kinds(cfg: Config) -> tuple[str, ...]:
    """GLOBAL or LOCAL for each layer: config.json's layer_types, else every n-th layer (from layer 0) global."""
    kinds = cfg.setting("layer_types")
    if kinds is None:
        every = cfg.setting("global_attn_every_n_layers")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ConfigError(f"{cfg.source}: global_attn_every_n_layers must be a positive integer, got {every!r}.")
        return tuple(LOCAL if i % every else GLOBAL for i in range(cfg.num_hidden_layers))
    if not isinstance(kinds, tuple) or len(kinds) != cfg.num_hidden_layers or not set(kinds) <= {GLOBAL, LOCAL}:
        raise ConfigError(f"{cfg.source}: layer_types must list {cfg.num_hidden_layers} entries (num_hidden_layers), "
                          f"each {GLOBAL!r} or {LOCAL!r}; got {kinds!r}.")
    return kinds


def rope_theta(cfg: Config, kind: str) -> float:
    """The rotary base θ of GLOBAL or LOCAL layers: rope_parameters[kind].rope_theta, else global/local_rope_theta."""
    parameters = cfg.setting("rope_parameters")
    old_key = "global_rope_theta" if kind == GLOBAL else "local_rope_theta"
    if parameters is None:
        return positive_number(cfg, old_key, cfg.setting(old_key))
    rope = dict(dict(parameters).get(kind) or ())
    if rope.get("rope_type", "default") != "default":
        raise ConfigError(f"{cfg.source}: rope_parameters.{kind}.rope_type {rope['rope_type']!r} is not implemented; "
                          f"minibert computes the 'default' rotary embedding only.")
    return positive_number(cfg, f"rope_parameters.{kind}.rope_theta", rope.get("rope_theta", cfg.setting(old_key)))


def positive_number(cfg: Config, key: str, value) -> float:
    """value as a float, refused unless a finite number > 0 (θ = 0 or ε ≤ 0 gives NaN everywhere)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ConfigError(f"{cfg.source}: {key} must be a finite number > 0, got {value!r}. Fix it in config.json.")
    return float(value)


def check(cfg: Config) -> None:
    """Refuse the settings minibert does not compute, naming the key."""
    for kind in set(layer_kinds(cfg)):
        rope_theta(cfg, kind)
    positive_number(cfg, "norm_eps", cfg.setting("norm_eps"))
    for key in ("norm_bias", "attention_bias", "mlp_bias", "classifier_bias", "decoder_bias"):
        if not isinstance(cfg.setting(key), bool):  # the string "false" would read as true
            raise ConfigError(f"{cfg.source}: {key} must be true or false (a JSON boolean), got "
                              f"{cfg.setting(key)!r}. Fix it in config.json.")
    if cfg.head_dim % 2:
        raise ConfigError(f"{cfg.source}: head width {cfg.head_dim} (hidden_size / num_attention_heads) is odd; "
                          f"rotary embeddings rotate pairs of dimensions, so it must be even.")
    window = cfg.setting("local_attention")
    if isinstance(window, bool) or not isinstance(window, int) or window < 2:
        raise ConfigError(f"{cfg.source}: local_attention must be an integer ≥ 2 (the window's width), got {window!r}.")
    if cfg.setting("classifier_pooling") not in ("cls", "mean"):
        raise ConfigError(f"{cfg.source}: classifier_pooling must be 'cls' or 'mean', got "
                          f"{cfg.setting('classifier_pooling')!r}.")
    if cfg.setting("classifier_activation") not in config.ACTIVATIONS:
        raise ConfigError(f"{cfg.source}: classifier_activation {cfg.setting('classifier_activation')!r} is not one "
                          f"of {', '.join(config.ACTIVATIONS)}.")


def to_CDHK(w, cfg):  # fused Wqkv [3·H·K, D] → [3, D, H, K] (q, k, v)
    return w.reshape(3, cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size).transpose(0, 3, 1, 2)


def to_CHK(b, cfg):  # [3·H·K] → [3, H, K]
    return b.reshape(3, cfg.num_attention_heads, cfg.head_dim)


def to_DGF(w, cfg):  # GeGLU Wi [2F, D] → [D, 2, F]: [:, 0] goes through the activation, [:, 1] multiplies it
    return w.T.reshape(cfg.hidden_size, 2, cfg.intermediate_size)


def to_GF(b, cfg):  # [2F] → [2, F]
    return b.reshape(2, cfg.intermediate_size)


def linear_keys(hf: str, w: str, b: str, shape: tuple[int, int], w_fn, b_fn, bias: bool) -> dict[str, Rule]:
    """A Linear's weight and, where the config gives it one, its bias."""
    table = {f"{hf}.weight": (w, shape, w_fn)}
    return table | ({f"{hf}.bias": (b, shape[:1], b_fn)} if bias else {})


def norm_keys(hf: str, ours: str, D: int, bias: bool) -> dict[str, Rule]:
    table = {f"{hf}.weight": (f"{ours}.scale", (D,), identity)}
    return table | ({f"{hf}.bias": (f"{ours}.bias", (D,), identity)} if bias else {})


def key_table(cfg: Config) -> dict[str, Rule]:
    """Every key of a ModernBERT checkpoint → (minibert parameter of the modules below, shape, converter)."""
    check(cfg)
    D, F, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    norm_bias, attention_bias, mlp_bias = (cfg.setting(k) for k in ("norm_bias", "attention_bias", "mlp_bias"))
    table: dict[str, Rule] = {"embeddings.tok_embeddings.weight": ("embed.word", (V, D), identity)}
    table |= norm_keys("embeddings.norm", "embed.ln", D, norm_bias)
    for i in range(cfg.num_hidden_layers):
        hf, ours = f"layers.{i}", f"blocks.{i}"
        if i or cfg.family.first_ln1:  # layer 0's attention norm is the identity (the embeddings end with a norm)
            table |= norm_keys(f"{hf}.attn_norm", f"{ours}.ln1", D, norm_bias)
        table |= linear_keys(f"{hf}.attn.Wqkv", f"{ours}.attn.W_QKV", f"{ours}.attn.b_QKV", (3 * D, D), to_CDHK,
                             to_CHK, attention_bias)
        table |= linear_keys(f"{hf}.attn.Wo", f"{ours}.attn.W_O", f"{ours}.attn.b_O", (D, D), to_HKD, identity,
                             attention_bias)
        table |= norm_keys(f"{hf}.mlp_norm", f"{ours}.ln2", D, norm_bias)
        table |= linear_keys(f"{hf}.mlp.Wi", f"{ours}.mlp.W_in", f"{ours}.mlp.b_in", (2 * F, D), to_DGF, to_GF,
                             mlp_bias)
        table |= linear_keys(f"{hf}.mlp.Wo", f"{ours}.mlp.W_out", f"{ours}.mlp.b_out", (D, F), transpose, identity,
                             mlp_bias)
    table |= norm_keys("final_norm", "family_head.ln_final", D, norm_bias)
    heads = cfg.heads
    if heads.mlm or heads.classifier:  # dense → act → norm before the decoder or the classifier
        table |= linear_keys("head.dense", "family_head.W", "family_head.b", (D, D), transpose, identity,
                             cfg.setting("classifier_bias"))
        table |= norm_keys("head.norm", "family_head.ln", D, norm_bias)
    if heads.mlm and cfg.setting("decoder_bias"):
        table["decoder.bias"] = ("family_head.decoder_bias", (V,), identity)
    if heads.classifier:  # always with a bias (an nn.Linear with the default)
        table |= linear_keys("classifier", "family_head.classifier.W", "family_head.classifier.b",
                             (cfg.num_labels, D), transpose, identity, True)
    return table



# ---- forward code ------------------------------------------------------------------------------------------

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
        embed = hooks(site.EMBED, self.word[...][input_ids])  # [B, T, D]
        return dropout.hidden("embed", self.ln(embed, hooks, "embed.ln"))


class ModernAttention(nnx.Module):
    """Fused q, k, v projection W_QKV [3, D, H, K], rotary q and k, attention over every key (global layers) or
    within ±local_attention/2 of the query (local layers)."""

    def __init__(self, cfg: Config, dtype, rngs):
        D, H, K = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
        with_bias = cfg.setting("attention_bias")
        self.W_QKV = weight(rngs, (3, D, H, K), dtype)
        self.b_QKV = bias((3, H, K), dtype, with_bias)
        self.W_O = weight(rngs, (H, K, D), dtype)
        self.b_O = bias((D,), dtype, with_bias)
        # Every layer's rotary base and window, the same tables in every block (so that blocks are alike and
        # encoder.Encoder.stack scans them); a layer reads its own entries.
        kinds = layer_kinds(cfg)
        self.thetas = tuple(rope_theta(cfg, kind) for kind in kinds)
        self.half_widths = tuple(None if kind == GLOBAL else cfg.setting("local_attention") // 2 for kind in kinds)
        self.max_positions = cfg.max_position_embeddings

    def settings(self, layer) -> tuple:
        """(θ, ± half width of the keys a query reads, None: every key) of layer `layer`. A traced layer (a scanned
        stack) reads them from arrays, a global layer's half width being every position."""
        if isinstance(layer, int):
            return self.thetas[layer], self.half_widths[layer]
        widths = [self.max_positions if width is None else width for width in self.half_widths]
        return jnp.asarray(self.thetas, jnp.float32)[layer], jnp.asarray(widths)[layer]

    def __call__(self, x, key_mask, hooks: Hooks, name: str, dropout: Dropout = NO_DROPOUT, *, layer):
        """layer: this block's index (traced in a scanned stack): global or local attention, and its rotary base."""
        theta, half_width = self.settings(layer)
        qkv = jnp.einsum("BTD,CDHK->CBTHK", x, self.W_QKV[...])
        if self.b_QKV is not None:
            qkv = qkv + self.b_QKV[...][:, None, None]
        q, k, v = (hooks(site.under(name, part), qkv[i]) for i, part in enumerate((site.Q, site.K, site.V)))
        q = hooks(site.under(name, site.ROT_Q), rotate(q, theta))
        k = hooks(site.under(name, site.ROT_K), rotate(k, theta))
        if half_width is not None:
            key_mask = key_mask & window_mask(x.shape[1], half_width)  # [B, 1, T, S]
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
        pre = hooks(site.under(name, site.MLP_PRE), both[..., 0, :])  # [B, T, F]
        linear = hooks(site.under(name, site.MLP_PRE_LINEAR), both[..., 1, :])
        post = hooks(site.under(name, site.MLP_POST), ACTIVATIONS[self.activation](pre) * linear)
        out = post @ self.W_out[...]
        return out if self.b_out is None else out + self.b_out[...]


# Its blocks' layout by role: q, k, v fused in that order along W_QKV's first axis (ModernAttention), the GeGLU's
# activated half W_in[:, 0] (the gate), its linear half W_in[:, 1].
WEIGHT_ROLES = WeightRoles(
    q=Part("attn.W_QKV", 0), k=Part("attn.W_QKV", 1), v=Part("attn.W_QKV", 2),
    b_q=Part("attn.b_QKV", 0), b_k=Part("attn.b_QKV", 1), b_v=Part("attn.b_QKV", 2),
    w_gate=Part("mlp.W_in", 0, axis=1), w_in=Part("mlp.W_in", 1, axis=1),
    b_gate=Part("mlp.b_in", 0), b_in=Part("mlp.b_in", 1))


class ModernBlock(nnx.Module):
    """x + Attn(ln1(x)), then + MLP(ln2(·)); layer 0 has no ln1 (Family.first_ln1)."""

    takes_layer = True  # its attention differs by layer: encoder.Encoder passes the layer's index (traced when scanned)

    def __init__(self, cfg: Config, dtype, rngs, layer: int):
        self.ln1 = norm(cfg, dtype) if layer or cfg.family.first_ln1 else None
        self.attn = ModernAttention(cfg, dtype, rngs)
        self.ln2 = norm(cfg, dtype)
        self.mlp = GeGLU(cfg, dtype, rngs)

    def __call__(self, resid_pre, key_mask, hooks: Hooks, name: str, dropout: Dropout = NO_DROPOUT, *, layer):
        resid_pre = hooks(site.under(name, site.RESID_PRE), resid_pre)
        attn_in = resid_pre if self.ln1 is None else self.ln1(resid_pre, hooks, f"{name}.{site.LN1}")
        attended = self.attn(attn_in, key_mask, hooks, f"{name}.{site.ATTN}", dropout, layer=layer)
        attn_out = hooks(site.under(name, site.ATTN_OUT), attended)
        resid_mid = hooks(site.under(name, site.RESID_MID), resid_pre + dropout.hidden(f"{name}.attn_out", attn_out))
        mlp_out = hooks(site.under(name, site.MLP_OUT), self.mlp(self.ln2(resid_mid, hooks, f"{name}.{site.LN2}"),
                                                                  hooks, f"{name}.{site.MLP}"))
        return hooks(site.under(name, site.RESID_POST), resid_mid + dropout.hidden(f"{name}.mlp_out", mlp_out))


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
        self.classifier = (Classifier(D, cfg.num_labels, dtype, rngs, site.CLASSIFIER_LOGITS)
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
        hidden = self.ln_final(hidden, hooks, site.LN_FINAL)  # [B, T, D], the last hidden state
        if self.mlm:
            transformed = self.transform(hidden, hooks, "mlm_head", out=site.UNEMBED_IN)
            logits = jnp.einsum("BTD,VD->BTV", transformed, word_embeddings)
            if self.decoder_bias is not None:
                logits = logits + self.decoder_bias[...]
            return Output(hidden, logits=hooks(site.UNEMBED_OUT, logits))
        if self.classifier is None:
            return Output(hidden)
        if self.per_token:
            transformed = self.transform(hidden, hooks, "classifier")
            return Output(hidden, logits=self.classifier(dropout.classifier("classifier", transformed), hooks))
        pooled = hooks(site.POOLER_OUT, self.transform(self.pool(hidden, key_mask), hooks, "pooler"))
        return Output(hidden, pooled, self.classifier(dropout.classifier("classifier", pooled), hooks))


# ---- what it shows ------------------------------------------------------------------------------------------

# Pre-LN (TransformerLens' meanings): ln1 before attention, ln2 before the MLP, no LayerNorm on the block's output.
PRE_LN_ORDER = (site.RESID_PRE, site.LN1, site.ATTN, site.ATTN_OUT, site.RESID_MID, site.LN2, site.MLP, site.MLP_OUT,
                site.RESID_POST)
# The step-through: LayerNorm before each sublayer, rotary q and k, a gated FFN (GeGLU), no LayerNorm after the
# residual adds but one after the last block; biases only where the checkpoint has them ("(+ b)").
PRE_LN_STEPS = step_table(
    ("word", "token embedding", "e_word = W_E[id_t] (no position table: positions enter as rotations of q, k)",
     site.EMBED, QUERY, ()),
    ("embed_ln", "embedding LayerNorm", "h⁰ = LN(e_word)", site.FULL_EMBED, QUERY, ("word",)),
    *shared("x"),
    ("ln1", "LayerNorm 1 (before attention)", "x̂ = LN₁(x)  (block 0 has none: x̂ = x)",
     site.layernorm(site.LN1, site.LN_OUT), QUERY, ("x",)),
    ("q", "query", "q = x̂ W_Q[h] (+ b_Q[h])", site.Q, QUERY_HEAD, ("ln1|x",)),
    ("k", "keys (every token s)", "k_s = x̂_s W_K[h] (+ b_K[h])", site.K, KEYS_HEAD, ("ln1|x",)),
    ("v", "values (every token s)", "v_s = x̂_s W_V[h] (+ b_V[h])", site.V, KEYS_HEAD, ("ln1|x",)),
    ("rot_q", "rotary query", "q̃ = R(t) q (each pair of coordinates i turned by the angle t·θ_i)",
     site.ROT_Q, QUERY_HEAD, ("q",)),
    ("rot_k", "rotary keys", "k̃_s = R(s) k_s", site.ROT_K, KEYS_HEAD, ("k",)),
    ("qk", "dot products", "q̃·k̃_s (through the rotations: depends on s − t)", site.QK, HEAD_ROW,
     ("rot_q", "rot_k")),
    ("scaled", "scaled and masked", "(q̃·k̃_s)/√{d_head} + mask_s (mask: 0 on keys in reach, −∞ on padding and, "
     "in a local layer, on keys beyond its window)", site.ATTN_SCORES, HEAD_ROW, ("qk",)),
    *shared("pattern", "z", "concat", "head_out"),
    ("attn_out", "attention output", "a = Σ_h z_h W_O[h] (+ b_O)", site.ATTN_OUT, QUERY, ("concat", "head_out")),
    *shared("resid_mid"),
    ("ln2", "LayerNorm 2 (before the FFN)", "y = LN₂(r) = (r − μ)/σ · γ₂ + β₂  (μ, σ over r's {d_model} numbers)",
     site.layernorm(site.LN2, site.LN_OUT), QUERY, ("resid_mid",)),
    ("ffn_pre", "FFN gate", "g = y W_in[:, 0] (+ b)", site.MLP_PRE, QUERY, ("ln2",)),
    ("ffn_linear", "FFN linear half", "u = y W_in[:, 1] (+ b)", site.MLP_PRE_LINEAR, QUERY, ("ln2",)),
    ("ffn_post", "gated activation", "act(g) ⊙ u", site.MLP_POST, QUERY, ("ffn_pre", "ffn_linear")),
    ("ffn_out", "FFN out", "m = (act(g) ⊙ u) W_out (+ b_out)", site.MLP_OUT, QUERY, ("ffn_post",)),
    ("resid_post", "residual (the block's output)", "h{next_sup} = r + m", site.RESID_POST, QUERY,
     ("resid_mid", "ffn_out")),
    ("ln_final", "final LayerNorm (after the last block)", "LN_final(h{next_sup}): the last hidden state",
     site.layernorm(site.LN_FINAL, site.LN_OUT), QUERY, ("resid_post",)),
)


FAMILIES = (Family(
    "modernbert", "ModernBERT", "ModernBert", "model",
    renames=(("hidden_activation", "hidden_act"),),
    keys=IGNORED,
    fixed=(("type_vocab_size", 1),),
    settings=SETTINGS,
    layer_keys=LayerKeys("layers.{i}", "attn.Wqkv", "attn.Wqkv", "attn.Wqkv", "attn.Wo", "attn_norm", "mlp.Wi",
                         "mlp.Wo", "mlp_norm"),
    head_keys=HeadKeys(pooler=None, tied=(("decoder.weight", "embed.word"),)),
    key_table=key_table,
    tokenizer="bpe",
    token_types=False, base_pooler=False,
    norm="pre", first_ln1=False, positions="rotary", mlp="glu", attention="local_global",
    block=ModernBlock, embeddings=ModernEmbeddings, head=ModernHead, weight_roles=WEIGHT_ROLES,
    block_order=PRE_LN_ORDER, block_output=site.RESID_POST, final_norm=True, stream_norms=(),
    query_key=(site.ROT_Q, site.ROT_K), steps=PRE_LN_STEPS),)
