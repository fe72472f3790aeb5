"""ModernBERT (Warner et al., 2024): a pre-LN encoder with rotary positions, a GeGLU MLP, no biases where its
config says so, and global attention every `global_attn_every_n_layers`-th layer, a sliding window of
±local_attention/2 tokens in the others.

This module is the record and the checkpoint key table; the forward code (blocks, embeddings, heads) is
families/modernbert_model.py, named by path so that this module need not import model.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minibert.errors import ConfigError
from minibert.families.base import Family
from minibert.families.keys import HeadKeys, LayerKeys, Rule, identity, to_HKD, transpose

if TYPE_CHECKING:
    from minibert.config import Config

CODE = "minibert.families.modernbert_model"
GLOBAL, LOCAL = "full_attention", "sliding_attention"  # transformers' layer_types
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")  # of config.ACTIVATIONS (not imported: cycle)

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
        return float(cfg.setting(old_key))
    rope = dict(dict(parameters).get(kind) or ())
    if rope.get("rope_type", "default") != "default":
        raise ConfigError(f"{cfg.source}: rope_parameters.{kind}.rope_type {rope['rope_type']!r} is not implemented; "
                          f"minibert computes the 'default' rotary embedding only.")
    return float(rope.get("rope_theta", cfg.setting(old_key)))


def check(cfg: Config) -> None:
    """Refuse the settings minibert does not compute, naming the key."""
    for kind in set(layer_kinds(cfg)):
        rope_theta(cfg, kind)
    if cfg.head_dim % 2:
        raise ConfigError(f"{cfg.source}: head width {cfg.head_dim} (hidden_size / num_attention_heads) is odd; "
                          f"rotary embeddings rotate pairs of dimensions, so it must be even.")
    window = cfg.setting("local_attention")
    if isinstance(window, bool) or not isinstance(window, int) or window < 2:
        raise ConfigError(f"{cfg.source}: local_attention must be an integer ≥ 2 (the window's width), got {window!r}.")
    if cfg.setting("classifier_pooling") not in ("cls", "mean"):
        raise ConfigError(f"{cfg.source}: classifier_pooling must be 'cls' or 'mean', got "
                          f"{cfg.setting('classifier_pooling')!r}.")
    if cfg.setting("classifier_activation") not in ACTIVATIONS:
        raise ConfigError(f"{cfg.source}: classifier_activation {cfg.setting('classifier_activation')!r} is not one "
                          f"of {', '.join(ACTIVATIONS)}.")


def to_CDHK(w, cfg):  # fused Wqkv [3·H·K, D] → [3, D, H, K] (q, k, v)
    return w.reshape(3, cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size).transpose(0, 3, 1, 2)


def to_CHK(b, cfg):  # [3·H·K] → [3, H, K]
    return b.reshape(3, cfg.num_attention_heads, cfg.head_dim)


def to_DGF(w, cfg):  # GeGLU Wi [2F, D] → [D, 2, F]: [:, 0] goes through the activation, [:, 1] multiplies it
    return w.T.reshape(cfg.hidden_size, 2, cfg.intermediate_size)


def to_GF(b, cfg):  # [2F] → [2, F]
    return b.reshape(2, cfg.intermediate_size)


def dense(hf: str, w: str, b: str, shape: tuple[int, int], w_fn, b_fn, bias: bool) -> dict[str, Rule]:
    """A Linear's weight and, where the config gives it one, its bias."""
    table = {f"{hf}.weight": (w, shape, w_fn)}
    return table | ({f"{hf}.bias": (b, shape[:1], b_fn)} if bias else {})


def norm(hf: str, ours: str, D: int, bias: bool) -> dict[str, Rule]:
    table = {f"{hf}.weight": (f"{ours}.scale", (D,), identity)}
    return table | ({f"{hf}.bias": (f"{ours}.bias", (D,), identity)} if bias else {})


def key_table(cfg: Config) -> dict[str, Rule]:
    """Every key of a ModernBERT checkpoint → (minibert parameter of modernbert_model's modules, shape, converter)."""
    check(cfg)
    D, F, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    norm_bias, attention_bias, mlp_bias = (cfg.setting(k) for k in ("norm_bias", "attention_bias", "mlp_bias"))
    table: dict[str, Rule] = {"embeddings.tok_embeddings.weight": ("embed.word", (V, D), identity)}
    table |= norm("embeddings.norm", "embed.ln", D, norm_bias)
    for i in range(cfg.num_hidden_layers):
        hf, ours = f"layers.{i}", f"blocks.{i}"
        if i or cfg.family.first_ln1:  # layer 0's attention norm is the identity (the embeddings end with a norm)
            table |= norm(f"{hf}.attn_norm", f"{ours}.ln1", D, norm_bias)
        table |= dense(f"{hf}.attn.Wqkv", f"{ours}.attn.W_QKV", f"{ours}.attn.b_QKV", (3 * D, D), to_CDHK, to_CHK,
                       attention_bias)
        table |= dense(f"{hf}.attn.Wo", f"{ours}.attn.W_O", f"{ours}.attn.b_O", (D, D), to_HKD, identity,
                       attention_bias)
        table |= norm(f"{hf}.mlp_norm", f"{ours}.ln2", D, norm_bias)
        table |= dense(f"{hf}.mlp.Wi", f"{ours}.mlp.W_in", f"{ours}.mlp.b_in", (2 * F, D), to_DGF, to_GF, mlp_bias)
        table |= dense(f"{hf}.mlp.Wo", f"{ours}.mlp.W_out", f"{ours}.mlp.b_out", (D, F), transpose, identity,
                       mlp_bias)
    table |= norm("final_norm", "family_head.ln_final", D, norm_bias)
    heads = cfg.heads
    if heads.mlm or heads.classifier:  # dense → act → norm before the decoder or the classifier
        table |= dense("head.dense", "family_head.W", "family_head.b", (D, D), transpose, identity,
                       cfg.setting("classifier_bias"))
        table |= norm("head.norm", "family_head.ln", D, norm_bias)
    if heads.mlm and cfg.setting("decoder_bias"):
        table["decoder.bias"] = ("family_head.decoder_bias", (V,), identity)
    if heads.classifier:  # always with a bias (an nn.Linear with the default)
        table |= dense("classifier", "family_head.classifier.W", "family_head.classifier.b", (cfg.num_labels, D),
                       transpose, identity, True)
    return table


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
    block=f"{CODE}:ModernBlock", embeddings=f"{CODE}:ModernEmbeddings", head=f"{CODE}:ModernHead"),)
