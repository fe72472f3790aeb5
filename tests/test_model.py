"""minibert/core/encoder.py, one module at a time, against arrays worked out by hand (gemma's _modules_test style).

Tiny sizes (D = 4, H = 2, K = 2, F = 3), weights written out in the test, and expected values either
written down by hand or computed by the float64 NumPy references below, which are themselves checked
against the hand-worked numbers first. The last tests check that the stages `key_mask`, `embedding`,
`block(i)` and `head` compose to the full forward and agree with the references on a random model.

Tolerances: the modules compute in float32, the references in float64, so each comparison allows
`steps` float32 roundings (unit roundoff u = 2⁻²⁴ ≈ 6e-8) of the largest value involved; `steps`
counts the rounded operations on the longest path to one output, with a few ulp for exp and erf
(XLA's are accurate to ≤ 4 ulp), and is given next to each call.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from minibert.core.config import BertConfig
from minibert.core.encoder import MLP, Attention, Block, Encoder, LayerNorm, gelu

U = 2.0**-24  # float32 unit roundoff
EPS = 1e-12  # BERT's layer_norm_eps: far below float32's resolution of the variances used here


def assert_fp32_close(got, want, steps: int) -> None:
    """|got − want| ≤ steps · u · (largest |want|, at least 1): `steps` float32 roundings of values of that size."""
    want = np.asarray(want, np.float64)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=0,
                               atol=steps * U * max(1.0, float(np.abs(want).max())))


class Recorder:
    """Hooks that keep every value passing through; `watch` names the sites reported active, so the
    modules take the path that computes them (attention: the explicit softmax)."""

    def __init__(self, watch=()):
        self.values: dict[str, np.ndarray] = {}
        self.watch = set(watch)

    def __call__(self, name, value):
        self.values[name] = np.asarray(value)
        return value

    def active(self, name):
        return name in self.watch


def set_weights(module: nnx.Module, **weights) -> None:
    for name, value in weights.items():
        setattr(module, name, nnx.Param(jnp.asarray(value, jnp.float32)))


def tiny_config(**changes) -> BertConfig:
    settings = dict(vocab_size=7, hidden_size=4, num_hidden_layers=2, num_attention_heads=2, intermediate_size=3,
                    max_position_embeddings=5, type_vocab_size=2)
    return BertConfig(**settings | changes)


# ---- float64 references, written with loops where the modules use einsums ------------------------------

def layer_norm_ref(x, gain, bias, eps=EPS):
    x = np.asarray(x, np.float64)
    centered = x - x.mean(-1, keepdims=True)
    scale = np.sqrt((centered**2).mean(-1, keepdims=True) + eps)
    return centered / scale * gain + bias


def attention_ref(x, mask, W_Q, b_Q, W_K, b_K, W_V, b_V, W_O, b_O):
    """x [T, D], mask [S] (1 real) → (pattern [H, T, S], output [T, D]) by loops over heads, queries and keys."""
    x = np.asarray(x, np.float64)
    T, H, K = len(x), W_Q.shape[1], W_Q.shape[2]
    pattern = np.zeros((H, T, T))
    out = np.tile(np.asarray(b_O, np.float64), (T, 1))
    for h in range(H):
        q, k, v = (x @ W[:, h] + b[h] for W, b in ((W_Q, b_Q), (W_K, b_K), (W_V, b_V)))
        for t in range(T):
            scores = [q[t] @ k[s] / math.sqrt(K) for s in range(T) if mask[s]]
            weights = np.exp(np.array(scores) - max(scores))
            pattern[h, t, np.flatnonzero(mask)] = weights / weights.sum()
            out[t] += sum(pattern[h, t, s] * v[s] for s in range(T)) @ W_O[h]
    return pattern, out


def gelu_ref(x):
    return np.vectorize(lambda v: v * 0.5 * (1 + math.erf(v / math.sqrt(2))))(np.asarray(x, np.float64))


def mlp_ref(x, W_in, b_in, W_out, b_out):
    return gelu_ref(np.asarray(x, np.float64) @ W_in + b_in) @ W_out + b_out


def block_ref(x, mask, p):
    """One post-LN block from `p`, a block's weights as NumPy arrays (module attribute names)."""
    _, attn = attention_ref(x, mask, *(p[f"attn.{n}"] for n in ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V", "W_O",
                                                                 "b_O")))
    mid = layer_norm_ref(x + attn, p["ln1.scale"], p["ln1.bias"])
    post = mid + mlp_ref(mid, p["mlp.W_in"], p["mlp.b_in"], p["mlp.W_out"], p["mlp.b_out"])
    return layer_norm_ref(post, p["ln2.scale"], p["ln2.bias"])


def block_weights(block: Block) -> dict[str, np.ndarray]:
    names = {"attn": ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V", "W_O", "b_O"), "ln1": ("scale", "bias"),
             "mlp": ("W_in", "b_in", "W_out", "b_out"), "ln2": ("scale", "bias")}
    return {f"{part}.{name}": np.asarray(getattr(getattr(block, part), name)[...], np.float64)
            for part, fields in names.items() for name in fields}


# ---- LayerNorm --------------------------------------------------------------------------------------------

def test_layer_norm_by_hand():
    # x = [1, 2, 3, 4]: mean 2.5, centred [−1.5, −0.5, 0.5, 1.5], variance 5/4, σ = √5/2 = 1.118033988749895,
    # normalised = centred/σ = [−3, −1, 1, 3]/√5; gain [1, 2, 1, 2], bias [0, 0, 1, 1].
    ln = LayerNorm(4, EPS, jnp.float32)
    set_weights(ln, scale=[1, 2, 1, 2], bias=[0, 0, 1, 1])
    hooks = Recorder()
    out = ln(jnp.array([[[1.0, 2, 3, 4]]]), hooks, "ln")
    r5 = 1 / math.sqrt(5)
    # mean, centring, square, mean, sqrt, divide, gain, bias: 4 + 1 + 1 + 4 + 1 + 1 + 1 + 1 roundings
    assert_fp32_close(hooks.values["ln.hook_scale"], [[[math.sqrt(5) / 2]]], steps=14)
    assert_fp32_close(hooks.values["ln.hook_normalized"], [[[-3 * r5, -r5, r5, 3 * r5]]], steps=14)
    assert_fp32_close(out, [[[-3 * r5, -2 * r5, 1 + r5, 1 + 6 * r5]]], steps=14)
    np.testing.assert_array_equal(hooks.values["ln.hook_out"], out)
    assert_fp32_close(layer_norm_ref([1, 2, 3, 4], [1, 2, 1, 2], [0, 0, 1, 1]),
                      [-3 * r5, -2 * r5, 1 + r5, 1 + 6 * r5], steps=1)


def test_layer_norm_is_per_position_and_ignores_a_shift():
    ln = LayerNorm(4, EPS, jnp.float32)
    x = np.array([[[1.0, 2, 3, 4], [10, 0, 10, 0]]])
    out = np.asarray(ln(jnp.asarray(x), Recorder(), "ln"))
    # [10, 0, 10, 0]: mean 5, σ 5 → [1, −1, 1, −1] exactly representable; adding 100 changes nothing.
    assert_fp32_close(out[0, 1], [1, -1, 1, -1], steps=14)
    # Near 104 the mean and the centring each round at 104·u (8 such roundings on the path), and dividing
    # by σ (the smaller is √5/2) scales that error up: 14 + 8 · 104 / (√5/2) roundings of O(1) values.
    assert_fp32_close(ln(jnp.asarray(x + 100), Recorder(), "ln"), out, steps=14 + math.ceil(8 * 104 / 1.118))


# ---- attention ----------------------------------------------------------------------------------------------

# Head 0 reads dimensions 0, 1 of x and head 1 dimensions 2, 3 (q = k = v = that slice); W_O writes each
# head's z back where it came from, so the output is z of both heads side by side.
SLICES = np.zeros((4, 2, 2))
SLICES[0, 0, 0] = SLICES[1, 0, 1] = SLICES[2, 1, 0] = SLICES[3, 1, 1] = 1.0
X = np.array([[2.0, 0, 0, 1], [0, 2, 1, 0], [3, 3, 5, 5]])  # token 2 is padding
MASK = np.array([1, 1, 0])


def attention_module() -> Attention:
    attention = Attention(tiny_config(), jnp.float32, None)
    set_weights(attention, W_Q=SLICES, W_K=SLICES, W_V=SLICES, W_O=SLICES.transpose(1, 2, 0),
                b_Q=np.zeros((2, 2)), b_K=np.zeros((2, 2)), b_V=np.zeros((2, 2)), b_O=np.zeros(4))
    return attention


def hand_attention():
    """Scores q·k/√2 over the two real keys. Head 0: q0 = [2, 0], q1 = [0, 2]: token 0 scores 4/√2 on itself
    and 0 on token 1, so it keeps p = σ(2√2) of its attention (σ the logistic); token 1 the same, mirrored.
    Head 1: q0 = [0, 1], q1 = [1, 0]: 1/√2 on itself, 0 on the other: p' = σ(1/√2). Token 2 (padding) is a
    key nobody sees; as a query it reads tokens 0 and 1 like the others (its row is not used)."""
    p, p1 = 1 / (1 + math.exp(-2 * math.sqrt(2))), 1 / (1 + math.exp(-1 / math.sqrt(2)))
    pattern = np.zeros((2, 3, 3))
    pattern[0, :2, :2] = [[p, 1 - p], [1 - p, p]]
    pattern[1, :2, :2] = [[p1, 1 - p1], [1 - p1, p1]]
    pattern[:, 2, :2] = 0.5  # token 2: [3, 3]·[2, 0] = [3, 3]·[0, 2] and [5, 5]·[0, 1] = [5, 5]·[1, 0]: equal scores
    z = np.einsum("HTS,SHK->THK", pattern, X[:, [[0, 1], [2, 3]]])  # v = x's slice, per head
    return pattern, z.reshape(3, 4)


def test_attention_by_hand_with_a_padding_key():
    pattern, out = hand_attention()
    hooks = Recorder(watch={"a.hook_pattern"})
    got = attention_module()(jnp.asarray(X[None], jnp.float32), jnp.asarray(MASK, bool)[None, None, None], hooks, "a")
    # q·k (2 products, 1 sum), /√2, exp (≤ 4 ulp), sum of 2, divide: 10 roundings in the pattern; z adds a
    # product and a sum over 3 keys, W_O another product and sum over 4 terms: 20 in all, values ≤ 5.
    assert_fp32_close(hooks.values["a.hook_pattern"][0], pattern, steps=10)
    assert np.all(hooks.values["a.hook_pattern"][0, :, :, 2] == 0)  # the padding key gets exactly nothing
    assert_fp32_close(got[0], out, steps=20)
    assert_fp32_close(hooks.values["a.hook_q"][0], X[:, [[0, 1], [2, 3]]], steps=4)
    ref_pattern, ref_out = attention_ref(X, MASK, SLICES, np.zeros((2, 2)), SLICES, np.zeros((2, 2)), SLICES,
                                         np.zeros((2, 2)), SLICES.transpose(1, 2, 0), np.zeros(4))
    assert_fp32_close(ref_pattern, pattern, steps=4)
    assert_fp32_close(ref_out, out, steps=8)


def test_unwatched_attention_gives_the_same_output():
    """With no score hook active the module skips forming the pattern (model.unwatched_attention)."""
    _, out = hand_attention()
    hooks = Recorder()
    got = attention_module()(jnp.asarray(X[None], jnp.float32), jnp.asarray(MASK, bool)[None, None, None], hooks, "a")
    assert "a.hook_pattern" not in hooks.values
    assert_fp32_close(got[0], out, steps=20)  # the same roundings, the division moved after the product with v


def test_attention_biases_and_per_head_results():
    attention = attention_module()
    b_V, b_O = np.array([[1.0, 0], [0, -1]]), np.array([0.5, 0, 0, 0])
    set_weights(attention, b_V=b_V, b_O=b_O)
    pattern, out = hand_attention()
    hooks = Recorder(watch={"a.hook_result"})
    got = attention(jnp.asarray(X[None], jnp.float32), jnp.asarray(MASK, bool)[None, None, None], hooks, "a")
    # Each row of the pattern sums to 1, so b_V adds itself once to z; b_O adds itself to the output.
    assert_fp32_close(got[0], out + b_V.reshape(4) + b_O, steps=24)
    result = hooks.values["a.hook_result"][0]  # [T, H, D]: head h writes only its own two dimensions
    assert_fp32_close(result[:, 0, 2:], np.zeros((3, 2)), steps=1)
    assert_fp32_close(result.sum(1) + b_O, got[0], steps=4)


# ---- MLP ----------------------------------------------------------------------------------------------------

def test_gelu_by_hand():
    # gelu(x) = x Φ(x): Φ(0) = 1/2, Φ(±1) = 0.8413447460685429 / 0.15865525393145707, Φ(2) = 0.9772498680518208.
    x = jnp.array([-1.0, 0.0, 1.0, 2.0])
    want = [-0.15865525393145707, 0.0, 0.8413447460685429, 2 * 0.9772498680518208]
    assert_fp32_close(gelu(x), want, steps=8)  # erf (≤ 4 ulp), scale, add, half, product
    assert_fp32_close(gelu_ref(x), want, steps=1)


def test_mlp_with_gelu_by_hand():
    mlp = MLP(tiny_config(hidden_size=2, num_attention_heads=1), jnp.float32, None)
    # pre = x W_in + b_in = [−1, 0, 2] for x = [1, −1]; post = gelu(pre); out = post W_out + b_out.
    W_in, b_in = np.array([[1.0, 0, 1], [2, 0, -1]]), np.array([0.0, 0, 0])
    W_out, b_out = np.array([[1.0, 0], [5, 5], [0, 1]]), np.array([0.0, 0.25])
    set_weights(mlp, W_in=W_in, b_in=b_in, W_out=W_out, b_out=b_out)
    hooks = Recorder()
    got = mlp(jnp.array([[[1.0, -1.0]]]), hooks, "mlp")
    post = [-0.15865525393145707, 0.0, 2 * 0.9772498680518208]
    assert_fp32_close(hooks.values["mlp.hook_pre"], [[[-1, 0, 2]]], steps=3)
    assert_fp32_close(hooks.values["mlp.hook_post"], [[post]], steps=12)
    assert_fp32_close(got, [[[post[0], post[2] + 0.25]]], steps=16)  # + product and sum over F = 3
    assert_fp32_close(mlp_ref([1.0, -1.0], W_in, b_in, W_out, b_out), [post[0], post[2] + 0.25], steps=2)


# ---- one block ----------------------------------------------------------------------------------------------

def test_block_by_hand_weights_against_the_reference():
    block = Block(tiny_config(), jnp.float32, None)
    block.attn = attention_module()
    set_weights(block.ln1, scale=[1, 0.5, 2, 1], bias=[0, 0.1, 0, -0.1])
    set_weights(block.mlp, W_in=[[1.0, 0, 0.5], [0, 1, 0], [0, 0, 1], [1, -1, 0]], b_in=[0.0, 0.1, -0.2],
                W_out=[[1.0, 0, 0, 0], [0, 1, 0, 1], [0.5, 0, -1, 0]], b_out=[0.0, 0, 0.3, 0])
    set_weights(block.ln2, scale=[2, 1, 1, 1], bias=[0, 0, 0, 1])
    hooks = Recorder(watch={"b.attn.hook_pattern"})
    got = block(jnp.asarray(X[None], jnp.float32), jnp.asarray(MASK, bool)[None, None, None], hooks, "b")
    p = block_weights(block)
    _, attn = hand_attention()
    np.testing.assert_array_equal(hooks.values["b.hook_resid_pre"][0], X)
    assert_fp32_close(hooks.values["b.hook_resid_mid"][0], X + attn, steps=21)  # attention 20, the sum 1
    # Error budget in roundings of values ≤ 5 (X's largest): each LayerNorm multiplies its input's error by
    # gain/σ (gains ≤ 2; σ from the layer's own hook_scale) and adds its 14; the MLP adds 16, the residual 1.
    amplify = [2 / hooks.values[f"b.{ln}.hook_scale"][0].min() for ln in ("ln1", "ln2")]
    ln1_steps = 21 * amplify[0] + 14
    out_steps = (ln1_steps + 17) * amplify[1] + 14
    mid = layer_norm_ref(X + attn, p["ln1.scale"], p["ln1.bias"])
    assert_fp32_close(hooks.values["b.ln1.hook_out"][0], mid, steps=math.ceil(5 * ln1_steps))
    assert_fp32_close(got[0], block_ref(X, MASK, p), steps=math.ceil(5 * out_steps))
    np.testing.assert_array_equal(hooks.values["b.hook_normalized_resid_post"][0], got[0])


# ---- the stages compose to the forward ---------------------------------------------------------------------

@pytest.mark.slow  # two eager forwards: every op dispatched on its own
def test_stages_compose_to_the_forward_and_match_the_references():
    cfg = tiny_config(num_hidden_layers=2)
    module = Encoder(cfg, rngs=nnx.Rngs(3))
    ids, types = jnp.array([[2, 5, 6, 3, 0]]), jnp.array([[0, 0, 1, 1, 0]])
    mask = jnp.array([[1, 1, 1, 1, 0]])
    hooks = Recorder()
    out = module(ids, types, mask, hooks)

    key_mask = module.key_mask(mask)
    assert key_mask.shape == (1, 1, 1, 5) and key_mask.dtype == bool
    stages = [module.embedding(ids, types)]
    for i in range(cfg.num_hidden_layers):
        stages.append(module.block(i, stages[-1], key_mask))
    composed = module.head(stages[-1])
    np.testing.assert_array_equal(composed.last_hidden_state, out.last_hidden_state)  # the same program
    np.testing.assert_array_equal(composed.pooler_output, out.pooler_output)

    real = 4  # compare the real positions; the padding row is nobody's input
    embed = module.embed
    summed = (np.asarray(embed.word[...])[ids[0]] + np.asarray(embed.position[...])[:5]
              + np.asarray(embed.token_type[...])[types[0]])
    x = layer_norm_ref(summed, np.asarray(embed.ln.scale[...]), np.asarray(embed.ln.bias[...]))
    # Budget as in the block test, in roundings of O(1) values (LayerNorm gains start at 1): the embedding
    # sums 2 roundings of values ≤ max|summed| and its LayerNorm divides by σ; each block then adds
    # attention 21 and MLP 17 through two LayerNorms (gain/σ from their hook_scale values).
    scale = lambda name: float(hooks.values[name][0, :real].min())
    steps = 2 * np.abs(summed).max() / scale("embed.ln.hook_scale") + 14
    assert_fp32_close(stages[0][0, :real], x[:real], steps=math.ceil(steps))
    for i in range(cfg.num_hidden_layers):
        x = block_ref(x, mask[0], block_weights(module.blocks[i]))
        gains = [float(np.abs(np.asarray(getattr(module.blocks[i], ln).scale[...])).max()) for ln in ("ln1", "ln2")]
        steps = (steps + 21) * gains[0] / scale(f"blocks.{i}.ln1.hook_scale") + 14
        steps = (steps + 17) * gains[1] / scale(f"blocks.{i}.ln2.hook_scale") + 14
        assert_fp32_close(stages[i + 1][0, :real], x[:real], steps=math.ceil(steps))
    pooled = np.tanh(x[0] @ np.asarray(module.pooler.W[...]) + np.asarray(module.pooler.b[...]))
    # tanh' ≤ 1; the product sums D = 4 terms of the last hidden state's error times |W| ≤ 1, plus 8 of its own.
    assert_fp32_close(out.pooler_output[0], pooled, steps=math.ceil(4 * steps + 8))
