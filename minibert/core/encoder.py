"""The BERT encoder, top to bottom, with every hook site inline.

Axis letters, used in every einsum and docstring of minibert:
    B batch      T query positions   S key positions   H heads
    K head dim   D model dim         F ffn dim         L layers
    V vocabulary C classes           E embedding width (= D unless ELECTRA/ALBERT narrow it)

Each intermediate passes through `hooks(name, value)` where it is computed. With no
hooks the call is the identity and costs nothing; `minibert.core.hooks.HookPoints` reads,
replaces or differentiates the value (see hooks.py). Weights are stored in the shape
the maths uses (W_Q as D×H×K, W_O as H×K×D); checkpoint.py does the reshaping.

One post-LN encoder block, as Vaswani et al. and Hugging Face's BertLayer compute it
(hook names follow TransformerLens' HookedEncoder):
    resid_mid  = resid_pre + Attention(resid_pre)
    ln1        = LayerNorm(resid_mid)
    resid_post = ln1 + MLP(ln1)
    block out  = LayerNorm(resid_post)      (= next block's resid_pre)

The encoder applies L such blocks, one after the other (Encoder.stack): block i on block i − 1's output. The block is
written once; the stack runs it as a jax.lax.scan over the layers, each step reading its layer's weights, so a program
holds one traced copy of it whatever the depth, and every hook keeps its per-layer name (blocks.3.attn.hook_pattern).
In training, values pass through dropout (minibert/core/dropout.py) where Hugging Face's BERT drops them, after
their hooks.

The other families (minibert.families) are this encoder with small, explicit variations: RoBERTa
numbers positions from pad_token_id + 1; DistilBERT has no segment embeddings; ELECTRA and ALBERT
project E-wide embeddings up to D; ALBERT applies one block's weights in every layer. A family whose blocks,
embeddings or heads differ more (ModernBERT: pre-LN, rotary, GeGLU; families/modernbert.py) brings its
own and reuses the pieces here (LayerNorm, attend, attention_output).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from minibert.core import attention
from minibert.core import site_names as site
from minibert.core.config import Config
from minibert.core.dropout import NO_DROPOUT, Dropout, LayerDropout
from minibert.core.family import Heads


class Hooks(Protocol):
    def __call__(self, name: str, value: jax.Array) -> jax.Array: ...
    def active(self, name: str) -> bool: ...


class NoHooks:
    """The hooks a plain forward uses: every value passes through unchanged."""

    def __call__(self, name, value):
        return value

    def active(self, name):
        return False

    def over_layers(self, layers):
        """In a scanned stack (Encoder.stack) too: nothing to capture or write in any layer."""
        return self

    captures = False  # the scanned stack's side of hooks.LayerHooks, where nothing is ever captured
    buffers: dict = {}

    def at(self, layer, buffers):
        return self

    def store(self, buffers):
        pass


NO_HOOKS = NoHooks()


def gelu(x):
    """x·Φ(x), Φ the normal CDF (1 + erf(x/√2))/2: Hugging Face's "gelu", the exact erf form.

    Written with erf as Hugging Face writes it: XLA:CPU evaluates erf as one polynomial, while
    jax.nn.gelu(approximate=False) goes through erfc (exp, division, branches), several times the cost
    (benchmarks/RESULTS.md).
    """
    return x * (0.5 + 0.5 * jax.lax.erf(x * (1 / math.sqrt(2))))


ACTIVATIONS = {
    "gelu": gelu,
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "tanh": jnp.tanh,  # BERT's pooler
}


def _weight(rngs: nnx.Rngs | None, shape, dtype, std=0.02) -> nnx.Param:
    """A weight, N(0, std) when rngs are given (random models), else zeros to be loaded over."""
    if rngs is None:
        return nnx.Param(jnp.zeros(shape, dtype))
    return nnx.Param(std * jax.random.normal(rngs.params(), shape, dtype))


def _zeros(shape, dtype) -> nnx.Param:
    return nnx.Param(jnp.zeros(shape, dtype))


@struct.dataclass
class Output:
    """What a forward pass returns. Fields a model does not have are None."""

    last_hidden_state: jax.Array  # [B, T, D]
    pooler_output: jax.Array | None = None  # [B, D]
    logits: jax.Array | None = None  # MLM [B, T, V], sequence [B, C], token [B, T, C] or discriminator [B, T]
    nsp_logits: jax.Array | None = None  # [B, 2], BertForPreTraining only


class LayerNorm(nnx.Module):
    """y = (x − mean) / sqrt(var + eps) · scale + bias, over D; computed in float32.

    Hooks: hook_scale = sqrt(var + eps), hook_normalized = (x − mean)/hook_scale (TransformerLens' meaning:
    before the gain and bias), hook_out = y (or the name `out`, where TransformerLens names y otherwise).
    """

    def __init__(self, dim: int, eps: float, dtype, bias: bool = True):
        self.scale = nnx.Param(jnp.ones((dim,), dtype))
        self.bias = _zeros((dim,), dtype) if bias else None  # ModernBERT's norms have none (norm_bias = false)
        self.eps = eps

    def __call__(self, x, hooks: Hooks, name: str, out: str | None = None):
        x32 = x.astype(jnp.float32)
        centered = x32 - x32.mean(-1, keepdims=True)
        scale = hooks(site.under(name, site.LN_SCALE),
                      jnp.sqrt((centered**2).mean(-1, keepdims=True) + self.eps))  # [B, T, 1]
        # before gain and bias, as in TransformerLens
        normalized = hooks(site.under(name, site.LN_NORMALIZED), centered / scale)
        y = normalized * self.scale[...] if self.bias is None else normalized * self.scale[...] + self.bias[...]
        return hooks(out or site.under(name, site.LN_OUT), y.astype(x.dtype))


def parameter_names(state) -> list[str]:
    """The dotted names of a model's parameters (`model.state`), in the state's leaf order."""
    paths = jax.tree_util.tree_flatten_with_path(state)[0]
    return [jax.tree_util.keystr(path, simple=True, separator=".").removesuffix(".value") for path, _ in paths]


def position_rows(input_ids, pad_token_id: int, offset: bool):
    """The position-table row of every token of input_ids [B, T]: [1, T] rows 0…T−1, or with `offset`
    (RoBERTa, config.Family.position_offset) [B, T] counting real tokens from pad_token_id + 1, with
    padding tokens on the pad row (fairseq's numbering). NumPy in, NumPy out (the corpus survey numbers
    its documents with it on the host); JAX in, JAX out."""
    xp = np if isinstance(input_ids, np.ndarray) else jnp
    if not offset:
        return xp.arange(input_ids.shape[1])[None]
    real = input_ids != pad_token_id
    return xp.where(real, xp.cumsum(real, axis=1) + pad_token_id, pad_token_id)


GATHERED = ("embed.word", "embed.position", "embed.token_type")  # parameters read by row (a gather), not multiplied


class Embeddings(nnx.Module):
    """LayerNorm(W_E[ids] + W_pos[positions] + W_type[segments]), then (ELECTRA, ALBERT) · W_proj + b_proj.

    Tables are E wide; the projection, where the family has one, maps E to the D of the blocks.
    DistilBERT has no segment table; RoBERTa's positions start at pad_token_id + 1.
    """

    def __init__(self, cfg: Config, dtype, rngs):
        E = cfg.embed_dim
        self.word = _weight(rngs, (cfg.vocab_size, E), dtype)  # [V, E]
        self.position = _weight(rngs, (cfg.max_position_embeddings, E), dtype)
        self.token_type = _weight(rngs, (cfg.type_vocab_size, E), dtype) if cfg.family.token_types else None
        self.ln = LayerNorm(E, cfg.layer_norm_eps, dtype)
        self.W_proj = _weight(rngs, (E, cfg.hidden_size), dtype) if cfg.has_projection else None  # [E, D]
        self.b_proj = _zeros((cfg.hidden_size,), dtype) if cfg.has_projection else None
        self.offset_positions = cfg.family.position_offset
        self.pad_token_id = cfg.pad_token_id

    def positions(self, input_ids) -> jax.Array:
        """The position-table row of every token (position_rows)."""
        return position_rows(input_ids, self.pad_token_id, self.offset_positions)

    def __call__(self, input_ids, token_type_ids, hooks: Hooks, position_ids=None, dropout: Dropout = NO_DROPOUT):
        """position_ids [B, T] or [1, T]: the position-table rows to read; None numbers them by the family's rule."""
        embed = hooks(site.EMBED, self.word[...][input_ids])  # [B, T, E]
        rows = self.positions(input_ids) if position_ids is None else position_ids
        summed = embed + hooks(site.POS_EMBED, jnp.broadcast_to(self.position[...][rows], embed.shape))
        if self.token_type is not None:
            summed = summed + hooks(site.TOKEN_TYPE_EMBED, self.token_type[...][token_type_ids])
        normalized = dropout.hidden("embed", self.ln(summed, hooks, site.EMBED_LN))
        if self.W_proj is None:
            return normalized
        return hooks(site.PROJECT, normalized @ self.W_proj[...] + self.b_proj[...])  # [B, T, D]


def explicit_attention(q, k, v, key_mask, hooks: Hooks, name: str, dropout: Dropout = NO_DROPOUT):
    """softmax(q·k/√K + mask) · v, every step a hook site. q, k, v [B, T|S, H, K] → z [B, T, H, K].

    Heads become a batch axis first ([B, H, T, K]): the two products are then plain batched matmuls, and
    XLA neither transposes the [T, S] scores nor keeps the pattern in memory when nobody captures it.
    """
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))  # [B, H, T|S, K]
    qk = hooks(site.under(name, site.QK), jnp.einsum("BHTK,BHSK->BHTS", q, k))  # raw q·k
    scaled = qk / math.sqrt(q.shape[-1])
    # −inf at masked keys, as in TL
    scores = hooks(site.under(name, site.ATTN_SCORES), jnp.where(key_mask, scaled, -jnp.inf))
    pattern = hooks(site.under(name, site.PATTERN), attention_softmax(scores.astype(jnp.float32)).astype(v.dtype))
    weights = dropout.attention(f"{name}.pattern", pattern)  # training only; the hook saw the pattern itself
    return jnp.einsum("BHTS,BHSK->BHTK", weights, v).transpose(0, 2, 1, 3)


def attention_softmax(scores):
    """softmax over S of scores [..., S] holding −inf at masked keys. A row whose keys are all masked (a batch
    row of padding only, or a hook that blocked every key) is uniform, 1/S on every key: what Hugging Face's
    finite mask (the most negative float) gives there, and what the unwatched and fused paths compute, where
    the plain softmax of −inf everywhere would be NaN."""
    blocked = jnp.isneginf(scores).all(axis=-1, keepdims=True)
    return jax.nn.softmax(jnp.where(blocked, 0.0, scores), axis=-1)


def fused_attention(q, k, v, key_mask):
    """explicit_attention's z through XLA's `jax.nn.dot_product_attention` (the "xla" backend of attention.py;
    cuDNN's kernel is attention.cudnn_attention). q, k, v [B, T|S, H, K], key_mask [B, 1, 1|T, S] → z [B, T, H, K]."""
    return jax.nn.dot_product_attention(q, k, v, mask=key_mask, implementation="xla")


def unwatched_attention(q, k, v, key_mask):
    """explicit_attention's z when nobody watches a step: softmax's division moves after the product with v.

    softmax(s)·v = (exp(s − max s)·v) / Σ exp(s − max s), so it divides [T, K] values rather than the [T, S]
    pattern (as flash attention does) and the pattern is never formed. Equal to explicit_attention up to fp32
    rounding; on CPU it is faster than both explicit_attention and XLA's dot_product_attention.
    """
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))  # [B, H, T|S, K]
    scores = jnp.einsum("BHTK,BHSK->BHTS", q, k) / math.sqrt(q.shape[-1])
    scores = jnp.where(key_mask, scores, jnp.finfo(scores.dtype).min).astype(jnp.float32)
    # Subtracting the row max keeps exp finite; it cancels in the ratio, so no gradient flows through it.
    weights = jnp.exp(scores - jax.lax.stop_gradient(scores.max(axis=-1, keepdims=True)))  # unnormalised pattern
    z = jnp.einsum("BHTS,BHSK->BHTK", weights.astype(v.dtype), v) / weights.sum(axis=-1, keepdims=True)
    return z.astype(v.dtype).transpose(0, 2, 1, 3)


class Attention(nnx.Module):
    def __init__(self, cfg: Config, dtype, rngs):
        D, H, K = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
        self.W_Q, self.W_K, self.W_V = (_weight(rngs, (D, H, K), dtype) for _ in range(3))
        self.b_Q, self.b_K, self.b_V = (_zeros((H, K), dtype) for _ in range(3))
        self.W_O = _weight(rngs, (H, K, D), dtype)
        self.b_O = _zeros((D,), dtype)

    def __call__(self, x, key_mask, hooks: Hooks, name: str, dropout: Dropout = NO_DROPOUT,
                 first_token_only: bool = False):
        """x [B, T, D], key_mask [B, 1, 1, S] (True = real token) → attention output [B, T, D]; with
        first_token_only, the output of the first query alone, [B, 1, D] (keys and values from every token)."""
        queries = x[:, :1] if first_token_only else x
        q = hooks(site.under(name, site.Q), jnp.einsum("BTD,DHK->BTHK", queries, self.W_Q[...]) + self.b_Q[...])
        k = hooks(site.under(name, site.K), jnp.einsum("BSD,DHK->BSHK", x, self.W_K[...]) + self.b_K[...])
        v = hooks(site.under(name, site.V), jnp.einsum("BSD,DHK->BSHK", x, self.W_V[...]) + self.b_V[...])
        z = attend(q, k, v, key_mask, hooks, name, dropout)
        return attention_output(z, self.W_O[...], self.b_O[...], hooks, name)


def attend(q, k, v, key_mask, hooks: Hooks, name: str, dropout: Dropout = NO_DROPOUT):
    """z [B, T, H, K] = softmax(q·k/√K + mask)·v, by the cheapest kernel that still shows what is watched
    (attention.choose, per platform). key_mask: bool, broadcast to [B, H, T, S] ([B, 1, 1, S] for padding;
    [B, 1, T, S] for a local window)."""
    watched = any(hooks.active(site.under(name, h)) for h in (site.QK, site.ATTN_SCORES, site.PATTERN))

    def choice(platform):
        return attention.choose(platform, q.dtype, q.shape, k.shape, key_mask.shape, watched=watched,
                                dropout=bool(dropout.attention_rate), cudnn=attention.cudnn_present())

    backends = {platform: choice(platform) for platform in ("cpu", "cuda", "tpu")}  # tpu: every other platform
    attention.log_once(choice(attention.platform()))
    kernels = {platform: _kernel(backend.name, hooks, name, dropout) for platform, backend in backends.items()}
    if len({backend.name for backend in backends.values()}) == 1:  # one kernel: no branch (hooks traced once)
        z = kernels["cpu"](q, k, v, key_mask)
    else:  # the program picks its platform's kernel when lowered (another lowers for CUDA than for the CPU)
        z = jax.lax.platform_dependent(q, k, v, key_mask, cpu=kernels["cpu"], cuda=kernels["cuda"],
                                       default=kernels["tpu"])
    return hooks(site.under(name, site.Z), z)  # [B, T, H, K]


def _kernel(backend: str, hooks: Hooks, name: str, dropout: Dropout):
    """(q, k, v, key_mask) → z for an attention.Backend's name."""
    def explicit(q, k, v, key_mask):
        return explicit_attention(q, k, v, key_mask, hooks, name, dropout)

    def cudnn_where_lengths_describe_the_mask(q, k, v, key_mask):
        lengths, described = attention.key_lengths(jnp.broadcast_to(key_mask, (q.shape[0], 1, 1, k.shape[1])))
        otherwise = explicit if dropout.attention_rate else fused_attention
        return jax.lax.cond(
            described.all(),
            lambda: attention.cudnn_attention(q, k, v, lengths, dropout.attention_rate, f"{name}.pattern"),
            lambda: otherwise(q, k, v, key_mask))

    # fused_attention is read when the kernel is built, so a script that swaps the module attribute is heard
    return {"explicit": explicit, "unwatched": unwatched_attention, "xla": fused_attention,
            "cudnn": cudnn_where_lengths_describe_the_mask}[backend]


def attention_output(z, W_O, b_O, hooks: Hooks, name: str):
    """z [B, T, H, K] · W_O [H, K, D] (+ b_O [D], None where the model has no bias) → [B, T, D]; each head's
    share is hook_result [B, T, H, D] when watched."""
    if hooks.active(site.under(name, site.RESULT)):
        out = hooks(site.under(name, site.RESULT), jnp.einsum("BTHK,HKD->BTHD", z, W_O)).sum(axis=2)
    else:
        out = jnp.einsum("BTHK,HKD->BTD", z, W_O)
    return out if b_O is None else out + b_O


class MLP(nnx.Module):
    def __init__(self, cfg: Config, dtype, rngs):
        self.W_in = _weight(rngs, (cfg.hidden_size, cfg.intermediate_size), dtype)  # [D, F]
        self.b_in = _zeros((cfg.intermediate_size,), dtype)
        self.W_out = _weight(rngs, (cfg.intermediate_size, cfg.hidden_size), dtype)  # [F, D]
        self.b_out = _zeros((cfg.hidden_size,), dtype)
        self.activation = cfg.hidden_act

    def __call__(self, x, hooks: Hooks, name: str):
        pre = hooks(site.under(name, site.MLP_PRE), x @ self.W_in[...] + self.b_in[...])  # [B, T, F]
        post = hooks(site.under(name, site.MLP_POST), ACTIVATIONS[self.activation](pre))
        return post @ self.W_out[...] + self.b_out[...]


class Block(nnx.Module):
    attention = Attention  # a family whose blocks differ from BERT's in attention only swaps this (DeBERTa)

    def __init__(self, cfg: Config, dtype, rngs, layer: int = 0):
        """layer: this block's index; BERT's blocks are alike, a family's own Block may differ by layer."""
        self.attn = self.attention(cfg, dtype, rngs)
        self.ln1 = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps, dtype)
        self.mlp = MLP(cfg, dtype, rngs)
        self.ln2 = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps, dtype)

    def __call__(self, resid_pre, key_mask, hooks: Hooks, name: str, dropout: Dropout = NO_DROPOUT,
                 first_token_only: bool = False, **shared):
        """shared: the encoder-level state of a family that has some (Family.shared), for its attention.
        first_token_only (BERT's Attention): the block's output at the first position alone, [B, 1, D], for a head
        that reads nothing else (Encoder.first_token_suffices); keys and values still come from every token."""
        resid_pre = hooks(site.under(name, site.RESID_PRE), resid_pre)
        if first_token_only:
            shared["first_token_only"] = True
        attn_out = hooks(site.under(name, site.ATTN_OUT),
                         self.attn(resid_pre, key_mask, hooks, f"{name}.{site.ATTN}", dropout, **shared))
        if first_token_only:  # every later step is per position: the first one is all that is left
            resid_pre = resid_pre[:, :1]
        resid_mid = hooks(site.under(name, site.RESID_MID), resid_pre + dropout.hidden(f"{name}.attn_out", attn_out))
        normalized_mid = self.ln1(resid_mid, hooks, f"{name}.{site.LN1}")
        mlp_out = hooks(site.under(name, site.MLP_OUT), self.mlp(normalized_mid, hooks, f"{name}.{site.MLP}"))
        resid_post = hooks(site.under(name, site.RESID_POST),
                           normalized_mid + dropout.hidden(f"{name}.mlp_out", mlp_out))
        return hooks(site.under(name, site.NORMALIZED_RESID_POST),
                     self.ln2(resid_post, hooks, f"{name}.{site.LN2}"))


class Pooler(nnx.Module):
    """pooled = act(first token's hidden state · W + b); act is tanh, except in the sequence classifiers of
    ELECTRA (gelu) and DistilBERT (relu), whose dense layer on the first token minibert calls the pooler."""

    def __init__(self, cfg: Config, dtype, rngs):
        self.W = _weight(rngs, (cfg.hidden_size, cfg.hidden_size), dtype)
        self.b = _zeros((cfg.hidden_size,), dtype)
        self.activation = cfg.family.pooler_activation

    def __call__(self, hidden, hooks: Hooks):
        pooled = ACTIVATIONS[self.activation](hidden[:, 0] @ self.W[...] + self.b[...])
        return hooks(site.POOLER_OUT, pooled)  # [B, D]


class MaskedLMHead(nnx.Module):
    """logits = LayerNorm(act(h · W + b)) · W_Eᵀ + bias, with W_E the (tied) word embeddings [V, E].

    W is [D, E]: ELECTRA's generator and ALBERT map back down to the embedding width. act is the config's
    hidden_act, or gelu where the family fixes it (RoBERTa, ELECTRA).
    """

    def __init__(self, cfg: Config, dtype, rngs):
        self.W = _weight(rngs, (cfg.hidden_size, cfg.embed_dim), dtype)
        self.b = _zeros((cfg.embed_dim,), dtype)
        self.activation = cfg.family.mlm_activation or cfg.hidden_act
        self.ln = LayerNorm(cfg.embed_dim, cfg.layer_norm_eps, dtype)
        self.decoder_bias = _zeros((cfg.vocab_size,), dtype)

    def __call__(self, hidden, word_embeddings, hooks: Hooks):
        transformed = ACTIVATIONS[self.activation](hidden @ self.W[...] + self.b[...])
        # TransformerLens' names: its mlm_head ends with the layernorm, whose output enters its unembed
        transformed = self.ln(transformed, hooks, site.MLM_LN, out=site.UNEMBED_IN)
        # the tied table may be float32 while the head computes in bf16 (Encoder.compute_dtype): the product runs in
        # the head's dtype, as an untied decoder would
        decoder = word_embeddings.astype(transformed.dtype)
        logits = jnp.einsum("BTE,VE->BTV", transformed, decoder) + self.decoder_bias[...]
        return hooks(site.UNEMBED_OUT, logits)


class Discriminator(nnx.Module):
    """ELECTRA's replaced-token detector: logit = act(h · W + b) · w + c, one per position, [B, T]."""

    def __init__(self, cfg: Config, dtype, rngs):
        self.W = _weight(rngs, (cfg.hidden_size, cfg.hidden_size), dtype)
        self.b = _zeros((cfg.hidden_size,), dtype)
        self.activation = cfg.hidden_act
        self.w = _weight(rngs, (cfg.hidden_size,), dtype)
        self.c = _zeros((), dtype)

    def __call__(self, hidden, hooks: Hooks):
        transformed = ACTIVATIONS[self.activation](hidden @ self.W[...] + self.b[...])
        return hooks(site.DISCRIMINATOR_LOGITS, transformed @ self.w[...] + self.c[...])


class Classifier(nnx.Module):
    """logits = x · W + b, on the pooled output (sequence) or every token (token classification)."""

    def __init__(self, in_dim: int, classes: int, dtype, rngs, hook: str):
        self.W = _weight(rngs, (in_dim, classes), dtype)
        self.b = _zeros((classes,), dtype)
        self.hook = hook  # the logits' hook name

    def __call__(self, x, hooks: Hooks):
        return hooks(self.hook, x @ self.W[...] + self.b[...])


# Whether the stack being traced is differentiated (unrolled_stack): read by Encoder.stack when a program is traced.
_DIFFERENTIATED = contextvars.ContextVar("minibert_differentiated", default=False)


@contextlib.contextmanager
def unrolled_stack():
    """Within it, Encoder.stack traces its blocks unrolled, one copy per layer, however the model was built: for the
    programs that differentiate through the stack (Model.grad, the gradient analyses, fine-tuning's step). The
    scan's backward costs about twice the unrolled one's and compiles no faster (benchmarks/RESULTS.md, issue 43);
    a program that only runs forward keeps the scan, whose compile does not grow with depth. It decides how a
    program is traced, not what it computes: both stacks give the same values up to float32 rounding."""
    token = _DIFFERENTIATED.set(True)
    try:
        yield
    finally:
        _DIFFERENTIATED.reset(token)


class Encoder(nnx.Module):
    """The encoder and the head its architecture names (Config.architecture), for every family."""

    def __init__(self, cfg: Config, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None, scan: bool = True):
        """scan: run blocks alike in shape as one jax.lax.scan (Encoder.stack); False unrolls them, one copy of the
        block per layer in the program (the tests' reference)."""
        self.config, self.scan = cfg, scan
        # A family whose embeddings or blocks are not BERT's names its own (Family.embeddings, Family.block).
        block = cfg.family.block or Block
        self.embed = (cfg.family.embeddings or Embeddings)(cfg, dtype, rngs)
        if cfg.family.shared_layers:  # ALBERT: every entry is the same Block, so its weights are stored once
            self.blocks = nnx.List([block(cfg, dtype, rngs, 0)] * cfg.num_hidden_layers)
        else:
            self.blocks = nnx.List([block(cfg, dtype, rngs, i) for i in range(cfg.num_hidden_layers)])
        shared = cfg.family.shared  # state every block reads (Family.shared), stored once
        self.shared = shared(cfg, dtype, rngs) if shared is not None else None
        # A family whose heads are not BERT's (ModernBERT: a final LayerNorm, then its own heads) names its own
        # head stage (Family.head); it replaces every part below.
        family_head = cfg.family.head
        self.family_head = family_head(cfg, dtype, rngs) if family_head is not None else None
        heads = cfg.heads if self.family_head is None else Heads(pooler=False)
        self.pooler = Pooler(cfg, dtype, rngs) if heads.pooler else None
        self.mlm = MaskedLMHead(cfg, dtype, rngs) if heads.mlm else None
        self.nsp = Classifier(cfg.hidden_size, 2, dtype, rngs, site.NSP_OUT) if heads.nsp else None
        self.classifier = (Classifier(cfg.hidden_size, cfg.num_labels, dtype, rngs, site.CLASSIFIER_LOGITS)
                           if heads.classifier else None)
        self.discriminator = Discriminator(cfg, dtype, rngs) if heads.discriminator else None

    # The stages below are the only code that runs the model: the plain forward, the offloaded forward
    # (api.Model.run(offload=True)) and the sweeps of analysis/ compose them.

    def __call__(self, input_ids, token_type_ids, attention_mask, hooks: Hooks = NO_HOOKS,
                 position_ids=None, dropout: Dropout = NO_DROPOUT, first_token_only: bool = False) -> Output:
        """input_ids, token_type_ids, attention_mask: int [B, T] (position_ids: Embeddings; dropout: training)
        → Output. first_token_only (where first_token_suffices): the last block computes position 0 alone, so
        last_hidden_state is [B, 1, D]."""
        key_mask = self.key_mask(attention_mask)
        resid = self.embedding(input_ids, token_type_ids, hooks, position_ids, dropout)
        resid = self.stack(resid, key_mask, hooks, dropout, first_token_only=first_token_only)
        return self.head(resid, hooks, dropout, key_mask)

    @property
    def first_token_suffices(self) -> bool:
        """Whether the head reads the last block at the first position ([CLS]) only: a sequence classifier (or
        BertModel's pooler alone) on BERT's own blocks and heads, where Encoder(first_token_only=True) computes the
        last block's first position alone and gives the same logits and pooled output."""
        heads = self.config.heads
        return (self.family_head is None and self.pooler is not None and self.mlm is None and self.nsp is None
                and self.discriminator is None and heads.classifier in (None, "sequence")
                and type(self.blocks[-1]) is Block)

    @staticmethod
    def key_mask(attention_mask) -> jax.Array:
        """attention_mask int [B, S] (1 = real token) → bool [B, 1, 1, S], broadcast over heads and queries."""
        return attention_mask.astype(bool)[:, None, None, :]

    def embedding(self, input_ids, token_type_ids, hooks: Hooks = NO_HOOKS, position_ids=None,
                  dropout: Dropout = NO_DROPOUT) -> jax.Array:
        """Stage 0: the residual stream entering block 0, [B, T, D], in the blocks' dtype (compute_dtype)."""
        embedded = self.embed(input_ids, token_type_ids, hooks, position_ids, dropout)
        return hooks(site.FULL_EMBED, embedded.astype(self.compute_dtype()))

    def compute_dtype(self):
        """The dtype the blocks compute in: that of their weights. It can differ from the embeddings': training in
        bf16 gathers rows from float32 tables (their gradients, scatter-adds over every token, sum in float32) and
        casts the embedded stream once, here (training.finetune.compute_parameters)."""
        return next(w.dtype for w in jax.tree.leaves(nnx.state(self.blocks[0], nnx.Param)) if w.ndim >= 2)

    def block(self, i: int, resid, key_mask, hooks: Hooks = NO_HOOKS, dropout: Dropout = NO_DROPOUT,
              first_token_only: bool = False) -> jax.Array:
        """Stage 1 + i: block i on the residual stream [B, T, D] → its output [B, T, D] ([B, 1, D]: Block)."""
        return self.blocks[i](resid, key_mask, hooks, f"blocks.{i}", dropout, **self.context(i, first_token_only))

    def context(self, layer, first_token_only: bool = False) -> dict:
        """A block call's keywords beyond its input: the encoder-level state (Family.shared), the layer's index for
        blocks that differ by layer (a block class with takes_layer, ModernBERT's; traced in a scanned stack) and
        first_token_only where it is asked."""
        context = {} if self.shared is None else {"shared": self.shared}
        if getattr(self.blocks[0], "takes_layer", False):
            context["layer"] = layer
        if first_token_only:
            context["first_token_only"] = True
        return context

    def stack(self, resid, key_mask, hooks: Hooks = NO_HOOKS, dropout: Dropout = NO_DROPOUT, start=0,
              first_token_only: bool = False) -> jax.Array:
        """Stages 1 + start … L: blocks start…L−1 on the residual stream entering block `start` → the last block's
        output [B, T, D] ([B, 1, D] with first_token_only, Encoder.__call__: the last block then runs apart).
        `start` may be traced (int32): blocks before it are then skipped at run time, so one program serves every
        start.

        The block is written once; the stack repeats it. Each run of consecutive blocks alike in shape (runs) is
        one jax.lax.scan of the block over the run's layers, each step reading its layer's weights (ALBERT: its
        one shared block's), so a program holds one traced copy of the block whatever the depth. Hooks keep
        their per-layer names and meanings (hooks.LayerHooks). Unrolled, one copy per layer, when built with
        scan=False, when `hooks` cannot follow a traced layer (they have no over_layers), and within unrolled_stack
        (a program that differentiates)."""
        last = len(self.blocks) - 1
        scan = self.scan and not _DIFFERENTIATED.get()
        for layers in self.runs(range(last if first_token_only else last + 1)):
            if isinstance(start, int):
                layers = range(max(start, layers.start), layers.stop)
            if scan and len(layers) > 1 and hasattr(hooks, "over_layers"):
                resid = self.scanned(layers, resid, key_mask, hooks, dropout, start)
                continue
            for i in layers:
                if isinstance(start, int):
                    resid = self.block(i, resid, key_mask, hooks, dropout)
                else:
                    resid = jax.lax.cond(i >= start, lambda x, i=i: self.block(i, x, key_mask, hooks, dropout),
                                         lambda x: x, resid)
        if first_token_only:
            resid = self.block(last, resid, key_mask, hooks, dropout, first_token_only)
        return resid

    def runs(self, layers: range) -> list[range]:
        """`layers` as runs of consecutive blocks alike in shape (the same parameter shapes and settings): one run
        for most families; ModernBERT's block 0, which has no ln1, stands apart."""
        runs = []
        for i in layers:
            if runs and nnx.graphdef(self.blocks[i]) == nnx.graphdef(self.blocks[runs[-1].start]):
                runs[-1] = range(runs[-1].start, i + 1)
            else:
                runs.append(range(i, i + 1))
        return runs

    def scanned(self, layers: range, resid, key_mask, hooks, dropout: Dropout, start=0) -> jax.Array:
        """Blocks `layers` (alike in shape) as one jax.lax.scan: the block is traced once, with the layer index a
        traced int32, its weights that layer's, its hooks those of that layer (their captures carried through the
        scan in buffers, hooks.LayerHooks)."""
        graphdef = nnx.graphdef(self.blocks[layers.start])
        shared_block = all(self.blocks[i] is self.blocks[layers.start] for i in layers)  # ALBERT
        weights = [nnx.state(self.blocks[i]) for i in layers]
        layer_hooks = hooks.over_layers(layers)

        def block_at(layer):
            """Block `layer` (traced): its weights picked by a switch over the layers' own arrays, which XLA reads
            in place (stacking them [n, ...] copied every weight at each call and made the forward ~1.5x slower;
            benchmarks/RESULTS.md)."""
            if shared_block:
                return self.blocks[layers.start]
            return nnx.merge(graphdef, jax.lax.switch(layer - layers.start, [lambda w=w: w for w in weights]))

        def run(layer, resid, buffers):
            """Block `layer` (traced) on resid, its captures written into buffers (None: returned as they are)."""
            block = block_at(layer)
            hooks_here = layer_hooks.at(layer, buffers)
            resid = block(resid, key_mask, hooks_here, "blocks.*", LayerDropout(dropout, layer, layers),
                          **self.context(layer))
            return resid, hooks_here.buffers

        def body(carry, layer):
            step = functools.partial(run, layer)
            if isinstance(start, int):
                return step(*carry), None
            return jax.lax.cond(layer >= start, step, lambda *carry: carry, *carry), None

        buffers = {}
        if layer_hooks.captures:  # the shapes of the values captured, from a trace of the block alone
            found = jax.eval_shape(lambda: run(jnp.int32(layers.start), resid, None)[1])
            buffers = layer_hooks.empty(found)
        (resid, buffers), _ = jax.lax.scan(body, (resid, buffers), jnp.arange(layers.start, layers.stop,
                                                                                dtype=jnp.int32))
        layer_hooks.store(buffers)
        return resid

    def head(self, hidden, hooks: Hooks = NO_HOOKS, dropout: Dropout = NO_DROPOUT, key_mask=None) -> Output:
        """Last stage: the pooler and task head on the last hidden state [B, T, D]. key_mask (Encoder.key_mask):
        which tokens are real, for heads that pool over them (ModernBERT's mean pooling)."""
        if self.family_head is not None:
            return self.family_head(hidden, self.embed.word[...], hooks, dropout, key_mask)
        pooled = self.pooler(hidden, hooks) if self.pooler is not None else None
        logits = nsp_logits = None
        if self.mlm is not None:
            logits = self.mlm(hidden, self.embed.word[...], hooks)
        if self.nsp is not None:
            nsp_logits = self.nsp(pooled, hooks)
        if self.classifier is not None:
            per_token = self.config.heads.classifier == "token"
            logits = self.classifier(dropout.classifier("classifier", hidden if per_token else pooled), hooks)
        if self.discriminator is not None:
            logits = self.discriminator(hidden, hooks)
        return Output(hidden, pooled, logits, nsp_logits)
