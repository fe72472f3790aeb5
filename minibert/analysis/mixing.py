"""Context mixing: how much each token's representation draws on every other token, layer by layer.

Three measures of the same question, each a per-layer map over one batch (docs/context_mixing.md):

    value_zeroing(model, batch)                       C [L, B, T, S]  Mohebbi, Zuidema, Chrupała & Alishahi 2023
    alti(model, batch)                                C [L, B, T, S]  Ferrando, Gállego & Costa-jussà 2022
    attention_attribution(model, batch, target_fn)    Attr [L, B, H, T, S]  Hao, Dong, Wei & Xu 2021

The two maps C have rows over real query tokens summing to 1 and zeros at padding rows and columns, so
`analysis.attention_rollout` composes them into whole-model maps. Layers, heads and tokens are 0-indexed.

Each is one compiled program over everything it sweeps: value zeroing maps one block over every zeroed
token, ALTI maps its decomposition over layers and documents, attribution maps the gradient over the
integration steps — chunked (`jax.lax.map(batch_size=...)`) so a sweep's live memory stays near
accounting.MEMORY_BUDGET bytes. Attribution runs each step from the residual stream entering block l, captured
once, through blocks l..L−1 and the head only (Model.suffix, the sweeps' mechanism: the layer is
traced, so every layer shares the program).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from minibert.analysis.sweeps import live_chunk
from minibert.core.contract import StaticFn, metric_values, static_metric, traced_call
from minibert.core.encoder import Output, unrolled_stack
from minibert.core.hooks import HookFn, writers_for
from minibert.core.site_names import (
    LN_OUT,
    LN_SCALE,
    PATTERN,
    RESID_MID,
    RESID_PRE,
    V,
    every_block,
    in_block,
    layernorm,
)
from minibert.core.sites import PATTERNS
from minibert.errors import AnalysisError
from minibert.runtime.accounting import EXACT, activation_bytes, alti_bytes, items_per_chunk


def _real_pairs(attention_mask) -> jax.Array:
    """float32 [B, T, S]: 1 where query t and key s are both real tokens."""
    real = jnp.asarray(attention_mask, jnp.float32)
    return real[:, :, None] * real[:, None, :]


def normalize_rows(scores) -> jax.Array:
    """Each row divided by its sum; rows summing to 0 (padding queries) stay 0."""
    total = scores.sum(-1, keepdims=True)
    return scores / jnp.where(total > 0, total, 1.0)


# ---- value zeroing --------------------------------------------------------------------------------------

def _zero_value(v, ctx, token, head):
    """v [B, S, H, K] with key position `token` zeroed in head `head`, or in every head for head −1 (token −1
    zeroes nothing)."""
    at = (jnp.arange(v.shape[1]) == token)[:, None] & ((jnp.arange(v.shape[2]) == head) | (head < 0))[None, :]
    return jnp.where(at[None, :, :, None], 0.0, v).astype(v.dtype)


def cosine_distance(x, y) -> jax.Array:
    """1 − cos(x, y) over the last axis, as ½‖x̂ − ŷ‖² of the unit vectors: accurate where cos is near 1,
    where 1 − x̂·ŷ would cancel to float32 noise (≈ 6e-8) long before reaching distances of 1e-9."""
    unit = lambda a: a / jnp.linalg.norm(a, axis=-1, keepdims=True)
    return 0.5 * jnp.sum((unit(x) - unit(y)) ** 2, axis=-1)


def _value_zeroing_distances(model, state, resid_pre, inputs, writers, *, chunk: int, per_head: bool) -> jax.Array:
    """resid_pre [L, B, T, D] (each block's captured input) → 1 − cos(x̃_t^¬s, x̃_t), [L, B, T, S], or with
    per_head [L, H, B, T, S], one head's value zeroed at a time (model.jit). writers: the caller's hooks
    ({hook name: (HookFn, …)}, traced), applied in every block run before the zeroing."""
    S = resid_pre.shape[2]
    heads = model.config.num_attention_heads if per_head else 1
    per_layer = []

    def with_zeroing(layer, zeroing):
        """Block `layer`'s output [B, T, D] under the caller's hooks, then `zeroing` on its values."""
        hooks = [*writers.items(), (in_block(layer, V), zeroing)]
        return model.block(state, layer, resid_pre[layer], inputs, hooks)

    for layer in range(model.config.num_hidden_layers):
        def output(item, layer=layer):
            """Block `layer`'s output [B, T, D] with the value of key item % S zeroed in head item // S (every
            head unless per_head)."""
            head = item // S if per_head else jnp.int32(-1)
            return with_zeroing(layer, HookFn(_zero_value, token=item % S, head=head))

        nothing = HookFn(_zero_value, token=jnp.int32(-1), head=jnp.int32(-1))  # the same hook, zeroing nothing
        clean = with_zeroing(layer, nothing)  # x̃
        distances = jax.lax.map(lambda item, clean=clean: cosine_distance(output(item), clean),
                                jnp.arange(heads * S), batch_size=chunk)  # [H·S, B, T]
        per_layer.append(distances.reshape(heads, S, *distances.shape[1:]).transpose(0, 2, 3, 1))  # [H, B, T, S]
    stacked = jnp.stack(per_layer)  # [L, H, B, T, S]
    return stacked if per_head else stacked[:, 0]


def value_zeroing(model, batch, *, normalize: bool = True, per_head: bool = False, hooks=None) -> np.ndarray:
    """Value zeroing (Mohebbi et al. 2023): C [L, B, T, S], NumPy float32; per_head=True: C [L, H, B, T, S].

    In block l, the value vector of key token s is set to zero in every head — the attention pattern
    stays as computed — and the rest of that block runs (attention output, residual, LN1, FFN, residual,
    LN2). C[l, b, t, s] = 1 − cos(x̃_t^¬s, x̃_t), x̃ the block's output with and without the zeroing,
    then each row divided by its sum over real keys (normalize=False keeps the raw distances).
    Padding rows and columns are 0. Each block's input comes from one captured forward pass; then one
    compiled program runs every block over every zeroed token (chunked to accounting.MEMORY_BUDGET).
    per_head=True zeroes token s's value in head h only (the other heads keep it), H times the work: C[l, h]
    is head h's map, each row normalised on its own — to set beside head h's attention pattern.
    hooks ({name or glob: fn} or (name, fn) pairs, as run_with_hooks takes them): the map of the model as they
    change it (e.g. interventions.ablate_heads) — they act in the captured forward and in every block run, the
    zeroing after them; HookFn arrays are traced, so other ablations reuse the program.
    """
    inputs = model.inputs(batch)
    resid_pre = model.run(inputs, names=every_block(RESID_PRE), hooks=hooks)[1].stack(RESID_PRE)
    _, B, T, _ = resid_pre.shape
    items = T * (model.config.num_attention_heads if per_head else 1)
    chunk = items_per_chunk(activation_bytes(model.config, B, T), items)  # one zeroed value runs one block
    program = model.jit(_value_zeroing_distances, static_argnames=("chunk", "per_head"), what="value zeroing")
    writers = writers_for(hooks, model.hook_names, model.config)
    distances = program(model.state, resid_pre, inputs, writers, chunk=chunk, per_head=bool(per_head))
    distances = distances * _real_pairs(inputs.attention_mask)
    return np.asarray(normalize_rows(distances) if normalize else distances)


# ---- ALTI -----------------------------------------------------------------------------------------------

def alti_terms(x, v, pattern, scale, gamma, W_O, normalized: bool = True) -> jax.Array:
    """ALTI's per-token terms T_t(x_s) of one document and layer, [T, S, D].

    x [S, D] the block input, v [S, H, K] (with b_V), pattern [H, T, S], scale [T, 1] the σ LN1 divided
    by, gamma [D] LN1's gain, W_O [H, K, D]. z_ts = Σ_h α^h_ts f^h(x_s) + [t = s] x_s with
    f^h(x) = (x W_V + b_V) W_O^h (b_O excluded); T_t(x_s) = γ ⊙ (z_ts − mean z_ts) / σ_t. normalized=False
    (a pre-LN block, where no LayerNorm follows the residual; its v is computed from LN1(x_s), a function of
    x_s alone): T_t(x_s) = z_ts, and scale and gamma are unused.
    """
    f = jnp.einsum("SHK,HKD->SHD", v, W_O, precision=EXACT)
    z = jnp.einsum("HTS,SHD->TSD", pattern, f, precision=EXACT)
    z = z + jnp.eye(pattern.shape[1], x.shape[0], dtype=z.dtype)[:, :, None] * x[None]
    return gamma * (z - z.mean(-1, keepdims=True)) / scale[:, :, None] if normalized else z


def alti_head_terms(v, pattern, scale, gamma, W_O, normalized: bool = True) -> jax.Array:
    """ALTI's terms split by head, [H, T, S, D]: T^h_t(x_s) = γ ⊙ (z^h_ts − mean z^h_ts) / σ_t with
    z^h_ts = α^h_ts f^h(x_s). Over heads they add up to alti_terms less the residual's own term, which belongs
    to no head: Σ_h T^h_t(x_s) + [t = s] γ ⊙ (x_s − mean x_s)/σ_t = T_t(x_s). Arguments as alti_terms."""
    f = jnp.einsum("SHK,HKD->SHD", v, W_O, precision=EXACT)
    z = jnp.einsum("HTS,SHD->HTSD", pattern, f, precision=EXACT)
    return gamma * (z - z.mean(-1, keepdims=True)) / scale[None, :, :, None] if normalized else z


def _alti_contributions(x, v, pattern, scale, y, gamma, W_O, per_head: bool = False,
                        normalized: bool = True) -> jax.Array:
    """c_ts = max(0, ‖y_t‖₁ − ‖y_t − T_t(x_s)‖₁) with y [T, D] LN1's real output: [T, S], before normalising;
    per_head: the same with each head's term T^h_t(x_s), [H, T, S].

    y, not Σ_s T_t(x_s): the whole each term is measured against also holds β and the b_O term, as in the
    authors' released code (which asserts that y equals the post-LayerNorm states)."""
    terms = (alti_head_terms(v, pattern, scale, gamma, W_O, normalized) if per_head
             else alti_terms(x, v, pattern, scale, gamma, W_O, normalized))
    l1 = lambda a: jnp.abs(a).sum(-1)
    return jnp.maximum(0.0, l1(y)[..., :, None] - l1(y[:, None] - terms))


@partial(jax.jit, static_argnames=("chunk", "per_head", "normalized"))
def _alti(resid_pre, v, pattern, scale, y, gamma, W_O, attention_mask, chunk: int, per_head: bool,
          normalized: bool) -> jax.Array:
    """Stacked per-layer captures ([L, B, ...]) and weights ([L, ...]) → unnormalised c [L, B, T, S], or
    [L, H, B, T, S] per head."""
    def layer(args):
        x, v, pattern, scale, y, gamma, W_O = args
        one = lambda doc: _alti_contributions(*doc, gamma, W_O, per_head, normalized)
        return jax.lax.map(one, (x, v, pattern, scale, y), batch_size=chunk)

    f32 = lambda a: jnp.asarray(a, jnp.float32)
    contributions = jax.lax.map(layer, tuple(map(f32, (resid_pre, v, pattern, scale, y, gamma, W_O))))
    if per_head:  # [L, B, H, T, S] → [L, H, B, T, S]
        return contributions.transpose(0, 2, 1, 3, 4) * _real_pairs(attention_mask)
    return contributions * _real_pairs(attention_mask)


def alti(model, batch, *, per_head: bool = False, hooks=None) -> np.ndarray:
    """ALTI (Ferrando et al. 2022): C [L, B, T, S], NumPy float32, rows over real tokens summing to 1;
    per_head=True: C [L, H, B, T, S], each head's terms (alti_head_terms) measured against y_t the same way
    and each head's rows normalised on their own — to set beside head h's attention pattern.

    The attention block's output after its residual and LN1 is split into one term per input token,
    T_t(x_s) = γ ⊙ (z_ts − mean z_ts)/σ_t with z_ts = Σ_h α^h_ts f^h(x_s) + [t = s] x_s (alti_terms), so
    that Σ_s T_t(x_s) = y_t − β − γ ⊙ (b_O − mean b_O)/σ_t, y_t being LN1's real output. Token s's
    contribution to t is how close its term comes to y_t in L1, against y_t's own norm: c_ts = max(0, ‖y_t‖₁ −
    ‖y_t − T_t(x_s)‖₁), rows normalised — measured against y_t itself, as the authors' released code does.
    Computed from one captured forward pass (resid_pre, v, pattern, LN1's σ and output) in one compiled
    program over layers and documents. Padding rows and columns are 0.
    A pre-LN block (ModernBERT) has no LayerNorm after the residual, and its LN1 acts on each x_s alone before
    the values, so the sub-block's output y_t = hook_resid_mid splits exactly into T_t(x_s) = z_ts (plus b_O);
    c_ts is measured against that y_t the same way (docs/context_mixing.md).
    hooks (as run_with_hooks takes them): the map of the model as they change it. They act on that captured
    forward, and the terms are built from its (hooked) patterns and values: a hook that replaces a head's output
    z with something no token feeds (an ablation) must also zero that head's `attn.hook_pattern`, so that the
    head carries no token's term and its replacement, like b_O, belongs to no token.
    """
    inputs = model.inputs(batch)
    norm = next(iter(model.config.family.stream_norms), None)  # the LayerNorm on resid_mid (post-LN's ln1)
    post_norm = norm is not None
    # Pre-LN: the whole is resid_mid = x_t + Σ_s Σ_h α f(LN1(x_s)) + b_O, no LayerNorm after it (σ = γ = 1, unused)
    sites = [RESID_PRE, V, PATTERN,
             *((layernorm(norm, LN_SCALE), layernorm(norm, LN_OUT)) if post_norm else (RESID_MID,))]
    _, cache = model.run(inputs, names=[every_block(site) for site in sites], hooks=hooks)
    captured = [cache.stack(site) for site in sites]
    W_O = model.weights.o  # [L, H, K, D]
    if post_norm:
        gamma = model.weights.read(f"{norm}_scale")  # [L, D]
    else:
        gamma = jnp.ones((W_O.shape[0], W_O.shape[-1]), jnp.float32)
        captured.insert(3, jnp.ones((*captured[0].shape[:-1], 1), jnp.float32))
    _, B, T, _ = captured[0].shape
    chunk = items_per_chunk(alti_bytes(model.config, T, per_head=bool(per_head)), B)  # documents side by side
    contributions = _alti(*captured, gamma, W_O, inputs.attention_mask, chunk, bool(per_head), post_norm)
    return np.asarray(normalize_rows(contributions))


# ---- attention attribution ------------------------------------------------------------------------------



def _replace_pattern(pattern, ctx, layer, replacement):
    """In block `layer` the pattern becomes `replacement` [B, H, T, S]; other blocks keep theirs."""
    return jnp.where(ctx.layer == layer, replacement, pattern).astype(pattern.dtype)


def _suffix_target(model, state, inputs, resid, layer, target_fn: StaticFn, pattern) -> jax.Array:
    """Σ over rows of target_fn(output), with block `layer`'s attention pattern replaced by `pattern` [B, H, T, S],
    run from resid [B, T, D], the residual stream entering block `layer` (traced): blocks before it are skipped."""
    hooks = {PATTERNS: HookFn(_replace_pattern, layer=layer, replacement=pattern)}
    out = model.suffix(state, layer, resid, inputs, hooks)
    values = metric_values(traced_call(target_fn.fn, out, "target_fn"), resid.shape[0], "target_fn")
    return values.sum()  # rows do not interact, so ∂(Σ rows)/∂pattern[b] is row b's own gradient (or the batch's F)


MAX_STEPS = 2**31 - 2**20  # the steps' count and index are int32 in the program (a chunk past m included)
RIEMANN_FIRST_STEP = {"right": 1, "left": 0}  # k of the first step α = k/m: the paper's sum, Hao et al.'s code


def _integrated_gradient(model, state, inputs, resid, pattern, layer, steps, *, target_fn: StaticFn, riemann: str,
                         chunk: int):
    """A_l ⊙ (1/m) Σ_k ∂F(k/m · A_l)/∂A_l for one layer's pattern A_l [B, H, T, S], k = 1..m ("right") or
    0..m−1 ("left"), each step run and differentiated from resid [B, T, D], the residual stream entering
    block l (layer and m = `steps` traced: one program, compiled with model.jit, for every layer and every m of
    a bucket of counts, analysis.sweeps.live_chunk). `chunk` steps run side by side, a lax.fori_loop over the
    ceil(m / chunk) chunks holding a step, and their gradients are added into one running sum, so memory does
    not grow with m (stacking the m gradients [m, B, H, T, S] asked for terabytes at steps=10**9); the last
    chunk's α past k = m are computed and left out."""
    gradient = jax.grad(unrolled_stack()(partial(_suffix_target, model, state, inputs, resid, layer, target_fn)))
    first = RIEMANN_FIRST_STEP[riemann]

    def add_chunk(i, total):
        k = i * chunk + jnp.arange(chunk)
        grads = jax.vmap(lambda alpha: gradient(alpha * pattern))((first + k).astype(pattern.dtype) / steps)
        return total + jnp.where((k < steps).reshape(-1, *[1] * pattern.ndim), grads, 0).sum(0)

    total = jax.lax.fori_loop(0, (steps + chunk - 1) // chunk, add_chunk, jnp.zeros_like(pattern))
    return pattern * (total / steps)


def attention_attribution(model, batch, target_fn: Callable[[Output], jax.Array], steps: int = 20,
                          riemann: str = "right") -> np.ndarray:
    """Self-attention attribution (Hao et al. 2021): Attr [L, B, H, T, S], NumPy float32.

    Attr(A_l) = A_l ⊙ (1/m) Σ_{k=1..m} ∂F(k/m · A_l)/∂A_l, a Riemann sum of the integrated gradient
    along the path from a zero pattern to A_l with m = `steps` — the paper's sum (riemann="right").
    riemann="left" sums k = 0..m−1 instead, as the authors' released code does (α = 0, 1/m, …, (m−1)/m),
    and reproduces its numbers. All heads of block l are scaled together; the other blocks compute their
    patterns as usual (from the changed residual stream). target_fn(output) returns one value F per batch
    row (e.g. `lambda out: out.logits[:, 0, c]`), rows attributed separately, or one F for the whole batch
    (the metric contract of `interventions`). The steps only change blocks l and after, so the residual
    stream entering each block is captured once and every step runs and differentiates blocks l..L−1 and
    the head alone (Model.suffix). One compiled program serves every layer and every m of a bucket of counts
    (1–16 steps, 17–32, …: analysis.sweeps.padded_count): the layer and m are traced, and the m steps run in
    chunks of batched gradients (within accounting.MEMORY_BUDGET).
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise AnalysisError(f"steps must be a positive int (the m of the Riemann sum; 20 in the paper); got {steps!r}.")
    if steps > MAX_STEPS:
        raise AnalysisError(f"steps={steps} is more than {MAX_STEPS:,} (each step is a forward and backward of the "
                            f"blocks after the layer: years on a CPU); the paper uses 20.")
    if riemann not in RIEMANN_FIRST_STEP:
        raise AnalysisError(f"riemann must be 'right' (the paper's sum over k/m, k = 1..m) or 'left' (Hao et al.'s "
                            f"released code, k = 0..m−1); got {riemann!r}.")
    inputs = model.inputs(batch)
    _, cache = model.run_with_cache(inputs, names=[PATTERNS, every_block(RESID_PRE)])
    patterns = cache.stack(PATTERN)  # [L, B, H, T, S]
    resids = cache.stack(RESID_PRE)  # [L, B, T, D]
    L, B, _, T, _ = patterns.shape
    # One step is a forward and a backward pass through the blocks after l: at most all L blocks kept.
    chunk = live_chunk(activation_bytes(model.config, B, T, blocks=L, backward=True), steps)
    keyed = static_metric(target_fn)  # a changed global or closed-over value it reads recompiles, as in the sweeps
    program = model.jit(_integrated_gradient, static_argnames=("target_fn", "riemann", "chunk"),
                        what="attention attribution")
    return np.stack([np.asarray(program(model.state, inputs, resids[layer], patterns[layer], jnp.int32(layer),
                                        jnp.int32(steps), target_fn=keyed, riemann=riemann, chunk=chunk))
                     for layer in range(L)])
