# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 4. Intervening: ablation, patching, gradients
#
# Looking at attention patterns tells us where a head looks, not whether the model needs it.
# This tutorial *changes* the computation and measures what moves:
#
# 1. **Head ablation** — remove one head's output (zero it, or replace it by its mean) and
#    watch the similarity of a paraphrase pair.
# 2. **Activation patching** — run a corrupted sentence, paste in one activation from the
#    clean run (one layer, one position at a time) and see where the difference is carried.
# 3. **Gradients with respect to attention** — $\partial\,\text{metric} / \partial A$ for every
#    layer's pattern, checked against a finite difference.
#
# All three are hooks that rewrite a value inside the jitted forward pass. The sweeps over them —
# `ablation_sweep` (every head), `patch_activations` (every layer × position) and its gradient
# estimate `attribution_patching` — are each one compiled program, batched over what they sweep.
# Layers and heads are 0-indexed in code; printouts name a head "L-H", counted from 1
# (`head_label`), with the 0-indexed layer and head beside it where both appear.

# %%
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import minibert
from minibert import HookFn
from minibert.analysis import ablate_heads, ablation_sweep, attribution_patching, head_mask, mean_z, patch_activations
from minibert.app.tutorials import expect  # prints each claim and what it means when it fails
from minibert.core.config import head_label

model = minibert.load()
L, H = model.config.num_hidden_layers, model.config.num_attention_heads
print(model)
print("sentence embedding:", model.pooling)

# %% [markdown]
# ## An MRPC-style pair
#
# The Microsoft Research Paraphrase Corpus asks whether two sentences say the same thing.
# all-MiniLM-L6-v2 answers with the cosine similarity of mean-pooled, normalised token
# vectors, which `model.sentence_embeddings` computes. To measure it under a hook we pool
# the hooked run's `last_hidden_state` the same way — and check that we agree. The pair is the
# first two of `sentences`: put two of your own there (one more is left out; one alone is paired
# with the second sentence below, with a line saying so).

# %%
sentences = ["The company said profits rose sharply.", "Profits climbed steeply, the firm said."]
if len(sentences) < 2:
    print(f"note: a pair needs two sentences; pairing yours with {'Profits climbed steeply, the firm said.'!r}.")
    sentences = [*sentences, "Profits climbed steeply, the firm said."]
expect(len(sentences) == 2, "the pair is the two sentences of `sentences`",
       f"only the first two of your {len(sentences)} sentences are compared; the rest are left out.")
pair = model.tokenize(sentences[:2])
real = jnp.asarray(pair.attention_mask, jnp.float32)[..., None]  # [B, T, 1]


def mean_pooled(out, real=real):
    """Mean over real tokens, L2-normalised: [B, D]."""
    pooled = (out.last_hidden_state * real).sum(1) / real.sum(1)
    return pooled / jnp.linalg.norm(pooled, axis=-1, keepdims=True)


def similarity(out):
    """Cosine similarity of the two sentences of `pair`."""
    a, b = mean_pooled(out)
    return (a * b).sum()


baseline = float(similarity(model(pair)))
reference = np.asarray(model.sentence_embeddings(pair))
expect(np.isclose(baseline, reference[0] @ reference[1], rtol=0, atol=1e-6),
       "pooling the hooked run's last_hidden_state gives model.sentence_embeddings' similarity",
       "mean_pooled no longer pools as the checkpoint's Pooling module does (mean over real tokens, normalised).")
print(f"cosine similarity of the pair: {baseline:.4f}")

# %% [markdown]
# ## Head ablation
#
# `ablate_heads(mask)` rewrites `attn.hook_z` (each head's mix of values, before $W_O$) in
# every layer: where `mask[layer, head] = 1` the head's $z$ becomes zero, so it adds nothing to
# the residual stream. *Mean ablation* replaces it instead by its average over the real tokens
# of the batch (`mean_z`) — it removes what the head says about each token while keeping its
# typical contribution, which is often a fairer test (zero may be far from anything the
# next layers have seen). Here the batch is the two sentences, each encoded on its own, as their
# similarity is; the workbench's mean mode takes the same mean, so its number for a pair and a
# head is this tutorial's.
#
# First, a check that the ready-made intervention is what we think it is: zeroing one head by
# hand gives the same output. The head is chosen once, 0-indexed as arrays and arguments count
# (layer 3, head 7); `head_label` prints it in the paper's 1-indexed "L-H" form. Change it here
# and every cell below follows.

# %%
LAYER, HEAD = 3, 7  # 0-indexed


def zero_one_head(z, ctx):
    return z.at[:, :, HEAD].set(0.0)  # z [B, T, H, K]


by_hand = model.run_with_hooks(pair, {f"blocks.{LAYER}.attn.hook_z": zero_one_head})
ready_made = model.run_with_hooks(pair, ablate_heads(head_mask(LAYER, HEAD, L, H)))
expect(np.allclose(ready_made.last_hidden_state, by_hand.last_hidden_state, rtol=0, atol=1e-6),
       "ablate_heads(head_mask(LAYER, HEAD, L, H)) is the hand-written zeroing of that head",
       "the two hooks zero different heads: check that both read LAYER and HEAD.")
untouched = model.run_with_hooks(pair, ablate_heads(np.zeros((L, H))))
expect(np.isclose(float(similarity(untouched)), baseline, rtol=0, atol=1e-6), "an all-zero mask changes nothing",
       "a mask of zeros ablates no head, so the similarity should be the baseline's.")
print(f"head {head_label(LAYER, HEAD)} (L-H, 1-indexed) zeroed: similarity {float(similarity(by_hand)):.4f} "
      f"(baseline {baseline:.4f})")

# %% [markdown]
# Now every head in turn. A Python loop over `head_mask(layer, head)` would run the whole
# model L·H = 72 times; `ablation_sweep(model, batch, metric, mode=)` does the same ablations in one
# compiled program: it runs the unablated model once, keeps the residual stream entering each
# block, and for the heads of layer l runs only blocks l…L−1, batched over the heads. The metric
# runs inside that program, so it is written with `jax.numpy` and returns one value per batch
# row, or one scalar as `similarity` does; the grid holds its mean over rows. `model.programs.traces`
# counts compilations.
#
# The sweep must agree with the hand-written ablation above: its cell [LAYER, HEAD] is the same
# intervention, and in mean mode the same as `ablate_heads(..., mean=mean_z(model, pair))`.

# %%
before = model.programs.traces
zero_grid = ablation_sweep(model, pair, similarity)  # [L, H]
mean_grid = ablation_sweep(model, pair, similarity, mode="mean")
print(f"compilations for {2 * L * H} ablated runs: {model.programs.traces - before}")
# Per mode: one capture of the inputs it reuses (the residual streams, shared; mean_z's capture of z)
# and one program for all the heads — never one per head.
expect(model.programs.traces - before <= 4, "the whole sweep compiled at most four programs, never one per head",
       "more compilations mean a hook or metric changed between runs (see the hooks section of the README).")
# Two fp32 programs that sum in different orders. The similarity (≤ 1) ends in a dot product over
# D = 384: pairwise summation, depth log2(384) ≈ 9 roundings of ≤ 6e-8 each, ≤ 5.4e-7; 1e-6 leaves the
# rest for the hidden states' own rounding differences (measured: 1.2e-7, one ulp at 1).
expect(np.isclose(zero_grid[LAYER, HEAD], float(similarity(by_hand)), rtol=0, atol=1e-6),
       f"the sweep's cell [{LAYER}, {HEAD}] equals the hand-written zero ablation",
       "the sweep and the hand-made hook ablate different heads, or their programs disagree beyond rounding.")
mean_by_hand = model.run_with_hooks(pair, ablate_heads(head_mask(LAYER, HEAD, L, H), mean=mean_z(model, pair)))
expect(np.isclose(mean_grid[LAYER, HEAD], float(similarity(mean_by_hand)), rtol=0, atol=1e-6),
       f"the sweep's cell [{LAYER}, {HEAD}] equals the hand-written mean ablation",
       "mean mode puts mean_z(model, pair) in place of the head's z; compare the two replacements.")

for name, grid in (("zero", zero_grid), ("mean", mean_grid)):
    layer, head = np.unravel_index(np.abs(grid - baseline).argmax(), grid.shape)
    print(f"{name} ablation: largest change {grid[layer, head] - baseline:+.4f} at head {head_label(layer, head)} "
          f"(L-H, 1-indexed); "
          f"mean |change| {np.abs(grid - baseline).mean():.4f}")

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), constrained_layout=True)
limit = np.abs(np.stack([zero_grid, mean_grid]) - baseline).max()
for ax, grid, name in zip(axes, (zero_grid, mean_grid), ("zero", "mean")):
    image = ax.imshow(grid - baseline, cmap="RdBu", vmin=-limit, vmax=limit)
    ax.set(title=f"{name} ablation: change in similarity", xlabel="head", ylabel="layer",
           xticks=range(H), yticks=range(L))
fig.colorbar(image, ax=axes, shrink=0.8)
plt.show()

# %% [markdown]
# No single head decides this pair: the largest change is small next to the similarity
# itself. That is typical of paraphrase similarity in a model with many heads — the
# information is spread out. Ablating a whole layer's heads at once shows more:

# %%
for layer in range(L):
    mask = np.zeros((L, H))
    mask[layer] = 1
    print(f"all heads of layer {layer} zeroed: similarity "
          f"{float(similarity(model.run_with_hooks(pair, ablate_heads(mask)))):.4f}")

# %% [markdown]
# ## Activation patching
#
# Take two sentences of the same length that differ in one word: a *clean* one and a
# *corrupted* one. Measure a metric on each. Then run the corrupted sentence while pasting
# in the clean run's activation at one layer and one position. If the metric moves back to
# its clean value, that activation carries the difference. Texts of different lengths work
# too: `patch_activations` pads the shorter on the right, so position t is the t-th token of
# each ([CLS] at 0), and where the clean text has no token nothing is patched.
#
# `patch_activations(model, clean, corrupted, metric, site)` does this for every layer × position
# of a per-block hook. The metric here: similarity of the (patched) sentence to a probe sentence
# that agrees with the clean one.

# %%
clean = model.tokenize(["The film was wonderful."])
corrupted = model.tokenize(["The film was terrible."])
expect(clean.input_ids.shape == corrupted.input_ids.shape, "the two texts have the same number of tokens",
       "patching then aligns them from the left, position by position (patch_activations' docstring), and the "
       "exact layer-0 checks below no longer hold: every position from the first difference on differs.")
n_clean, n_corrupted = len(clean.tokens[0]), len(corrupted.tokens[0])
T = max(n_clean, n_corrupted)  # the sweep's positions: the longer text's
padded = {"clean": clean.tokens[0] + ["·"] * (T - n_clean),  # "·": no token at this position
          "corrupted": corrupted.tokens[0] + ["·"] * (T - n_corrupted)}
tokens = [c if c == r else f"{c}/{r}" for c, r in zip(padded["clean"], padded["corrupted"])]  # clean/corrupted
differ = [t for t in range(T) if padded["clean"][t] != padded["corrupted"][t]]
changed = differ[0] if differ else 1  # the first position where the texts differ
expect(differ, "the clean and corrupted texts differ in at least one token",
       "they tokenize alike (words outside the model's vocabulary all become [UNK]): patching has no difference "
       "to carry, and the fractions restored below are set to 0.")
# With no difference every claim about what patching carries is about nothing: those lines say "not tested".
no_difference = None if differ else "the clean and corrupted texts tokenize alike: patching has nothing to carry."
probe = np.asarray(model.sentence_embeddings(model.tokenize(["I loved this movie."])))[0]
# the patched run is the corrupted text: pool its real tokens (padded to T when the clean text is longer)
corrupted_real = jnp.asarray(np.arange(T) < n_corrupted, jnp.float32)[None, :, None]


def probe_similarity(out, real=corrupted_real):
    return (mean_pooled(out, real=real[:, : out.last_hidden_state.shape[1]])[0] * probe).sum()


clean_value = float(probe_similarity(model(clean), real=jnp.ones((1, n_clean, 1), jnp.float32)))
corrupted_value = float(probe_similarity(model(corrupted)))
print(f"{tokens}\nfirst changed position {changed} ({padded['clean'][changed]!r} vs {padded['corrupted'][changed]!r}; "
      f"· marks no token)")
print(f"similarity to the probe: clean {clean_value:.4f}, corrupted {corrupted_value:.4f}")

resid = patch_activations(model, clean, corrupted, probe_similarity, site="hook_resid_pre")  # [L, T]

# %% [markdown]
# Two checks that must hold exactly. At layer 0 the residual stream is just the embeddings:
# patching the changed position's `hook_resid_pre` turns the corrupted input into the clean
# one (metric = clean value), while patching any other position pastes an identical vector
# (metric = corrupted value).

# %%
expect(np.isclose(resid[0, changed], clean_value, rtol=0, atol=1e-5),
       "at layer 0, patching the changed position gives the clean run's value",
       "the embeddings of the changed position are the whole difference only when the texts have one length.",
       untested=no_difference)
others = np.delete(resid[0], changed)
expect(np.allclose(others, corrupted_value, rtol=0, atol=1e-5),
       "at layer 0, patching any other position leaves the corrupted value",
       "the texts differ at more than one position (or in length): each changed position moves the metric.",
       untested=no_difference)
print(f"layer 0: patched at {changed} → {resid[0, changed]:.4f}; elsewhere → {others.min():.4f}…{others.max():.4f}")

# %% [markdown]
# The grid reads top to bottom as the difference travels through the network, normalised
# so 0 = corrupted and 1 = clean. At layer 0 only the changed word carries it; in later layers
# patching a single position restores less, because attention has already copied part of
# the difference to the other positions. (`site=` takes any per-block hook with positions on
# axis 1: `attn.hook_z`, `hook_attn_out`, `hook_mlp_out`, ...)

# %%
spread = clean_value - corrupted_value
restored = (resid - corrupted_value) / spread if spread else np.zeros_like(resid)
fig, ax = plt.subplots(figsize=(6, 3.6), constrained_layout=True)
image = ax.imshow(restored, cmap="Blues", vmin=min(0, restored.min()), vmax=1)
ax.set(title="patching hook_resid_pre: fraction restored", xlabel="position", ylabel="layer",
       xticks=range(T), yticks=range(L))
ax.set_xticklabels(tokens, rotation=45, ha="right")
fig.colorbar(image, ax=ax)
plt.show()
for layer in range(L):
    print(f"layer {layer}:", "  ".join(f"{t} {f:+.2f}" for t, f in zip(tokens, restored[layer])))

# %% [markdown]
# ### Attribution patching: the whole grid from one backward pass
#
# Patching runs the suffix of the model once per cell. `attribution_patching` estimates every
# cell at once, to first order: $(a_\text{clean} - a_\text{corrupted}) \cdot
# \partial\,\text{metric} / \partial a$, the gradient taken on the corrupted run — one forward
# and one backward, however large the grid. It estimates the *change* a patch makes,
# `patch_activations(...) − metric(corrupted)`. A linearisation is good where the patched
# change is small: compare the swapped word's residual stream, which changes a lot, with the
# attention outputs, which change little.

# %%
effects = {"hook_resid_pre": resid - corrupted_value,  # [L, T], the patching grid above
           "hook_attn_out": patch_activations(model, clean, corrupted, probe_similarity, site="hook_attn_out")
           - corrupted_value}
estimates = {site: attribution_patching(model, clean, corrupted, probe_similarity, site=site) for site in effects}
correlation = {site: np.corrcoef(effects[site].ravel(), estimates[site].ravel())[0, 1] for site in effects}

fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
for ax, site in zip(axes, effects):
    print(f"{site}: correlation {correlation[site]:.3f}; largest patching effect {np.abs(effects[site]).max():.3f}, "
          f"largest estimate error {np.abs(estimates[site] - effects[site]).max():.3f}")
    ax.scatter(effects[site].ravel(), estimates[site].ravel(), s=12)
    ax.axline((0, 0), slope=1, color="grey", lw=0.8)
    ax.set(title=site, xlabel="patching: change in similarity", ylabel="attribution patching estimate")
plt.show()
swapped, estimated = effects["hook_resid_pre"][0, changed], estimates["hook_resid_pre"][0, changed]
print(f"the swapped word at layer 0: patching {swapped:+.3f}, estimate {estimated:+.3f}")

# %% [markdown]
# The attention outputs, each a small change, lie close to the diagonal. The residual stream at
# the swapped word carries the whole difference between *wonderful* and *terrible*, far from the
# point where the gradient was taken, and there the estimate misses much of the effect. A
# common workflow follows: rank the cells with attribution patching (one backward pass), then
# confirm the few that matter with real patching.

# %%
expect(correlation["hook_attn_out"] > 0.95, "attribution patching ranks hook_attn_out's cells as real patching does",
       f"the correlations are {correlation}: the linear estimate is less reliable for this pair.",
       untested=no_difference)
expect(abs(estimated - swapped) > 0.3 * abs(swapped), "on the one large change the first-order estimate misses ≥ 30%",
       "this pair's change is small enough for the linearisation: try a bigger edit of the text.",
       untested=no_difference)

# %% [markdown]
# ## Gradients with respect to attention
#
# `model.grad(batch, loss_fn, names)` returns $\partial\,\text{loss} / \partial\,\text{value}$ for
# any hook values. With `names="blocks.*.attn.hook_pattern"` we get, for every layer,
# an array shaped like the pattern `[B, H, T, S]`: how the pair's similarity would change
# if query $t$ of head $h$ paid a little more attention to key $s$ (holding everything else
# computed from it fixed — the pattern is treated as an input to the rest of the network).

# %%
loss, grads = model.grad(pair, similarity, names="blocks.*.attn.hook_pattern")
expect(np.isclose(float(loss), baseline, rtol=0, atol=1e-6), "model.grad's loss is the similarity computed above",
       "model.grad returns loss_fn's value on the unhooked run: the pair or the metric changed since.")
_, cache = model.run_with_cache(pair, names="blocks.*.attn.hook_pattern")
patterns = np.asarray(cache.stack("hook_pattern"))  # [L, B, H, T, S]
gradient = np.stack([np.asarray(grads[f"blocks.{layer}.attn.hook_pattern"]) for layer in range(L)])
print("∂similarity/∂pattern:", gradient.shape)

# %% [markdown]
# **A finite-difference check.** Add $\pm\varepsilon$ to one entry of one pattern through a
# hook and compare the change in similarity with the gradient:
# $\frac{f(A + \varepsilon e) - f(A - \varepsilon e)}{2\varepsilon} \approx \frac{\partial f}{\partial A}\cdot e$.
# We take the entry with the largest gradient.

# %%
entry = np.unravel_index(np.abs(gradient).argmax(), gradient.shape)
layer, b, head, t, s = (int(i) for i in entry)


def nudge(pattern, ctx, delta):
    return pattern + delta


def nudged_similarity(eps):
    delta = jnp.zeros(patterns.shape[1:], jnp.float32).at[b, head, t, s].set(eps)
    hooks = {f"blocks.{layer}.attn.hook_pattern": HookFn(nudge, delta=delta)}
    return float(similarity(model.run_with_hooks(pair, hooks)))


eps = 1e-2
finite_difference = (nudged_similarity(eps) - nudged_similarity(-eps)) / (2 * eps)
print(f"entry: head {head_label(layer, head)} (L-H, 1-indexed; 0-indexed layer {layer}, head {head}), sentence {b}, "
      f"query {pair.tokens[b][t]!r} → key {pair.tokens[b][s]!r}")
print(f"gradient {gradient[entry]:.5f}, finite difference {finite_difference:.5f}")
expect(np.isclose(finite_difference, gradient[entry], rtol=2e-2, atol=0),
       "the finite difference agrees with the gradient within 2%",
       "eps trades truncation error (the curvature, ∝ eps²) against rounding (∝ 1/eps): try eps between 1e-3 "
       "and 3e-2, or an entry with a larger gradient.")

# %% [markdown]
# **Gradient × attention** weighs each gradient by the attention actually paid; summed over a
# head's queries and keys it is a first-order estimate of how much the similarity would
# change if that head's pattern were removed.

# %%
attribution = (gradient * patterns).sum(axis=(1, 3, 4))  # [L, H]
fig, ax = plt.subplots(figsize=(6, 3.6), constrained_layout=True)
limit = np.abs(attribution).max()
image = ax.imshow(attribution, cmap="RdBu", vmin=-limit, vmax=limit)
ax.set(title="gradient × attention, per head", xlabel="head", ylabel="layer", xticks=range(H), yticks=range(L))
fig.colorbar(image, ax=ax)
plt.show()

# %% [markdown]
# Is a key that receives much attention also a key whose attention matters? Clark et al.
# (2019) asked this of `[SEP]` in BERT-base: heavily attended, yet with small gradients. Here
# we compare, per layer, the mean attention paid to `[CLS]`, to `[SEP]` and to the other
# tokens with the mean |gradient| on those keys (real query and key tokens only).

# %%
real_tokens = np.asarray(pair.attention_mask, bool)  # [B, T]
kinds = {"[CLS]": np.array([[tok == "[CLS]" for tok in row] for row in pair.tokens]),
         "[SEP]": np.array([[tok == "[SEP]" for tok in row] for row in pair.tokens])}
kinds["other"] = real_tokens & ~kinds["[CLS]"] & ~kinds["[SEP]"]


def mean_over(layer, keys, values):
    """Mean of values[layer] [B, H, T, S] over real query rows and the chosen key columns."""
    chosen = np.broadcast_to(real_tokens[:, None, :, None] & keys[:, None, None, :], values[layer].shape)
    return values[layer][chosen].mean()


print("layer  " + "  ".join(f"{kind:>7s} attn  |∂/∂A|  " for kind in kinds))
for layer in range(L):
    print(f"{layer:5d}  " + "  ".join(f"{mean_over(layer, keys, patterns):12.3f} "
                                      f"{mean_over(layer, keys, np.abs(gradient)):8.1e}" for keys in kinds.values()))

# %% [markdown]
# In this distilled model the role Clark et al. saw for `[SEP]` falls to `[CLS]`: after the
# first layer it receives the most attention of the three groups, yet the similarity is least
# sensitive to it. A plausible reading (theirs, for `[SEP]`) is that attending to it is
# a head's way of doing nothing.

# %%
for layer in range(1, L):
    attention = {kind: mean_over(layer, keys, patterns) for kind, keys in kinds.items()}
    sensitivity = {kind: mean_over(layer, keys, np.abs(gradient)) for kind, keys in kinds.items()}
    expect(max(attention, key=attention.get) == "[CLS]" and min(sensitivity, key=sensitivity.get) == "[CLS]",
           f"layer {layer + 1} (1-indexed; {layer} in code): [CLS] gets the most attention and the least gradient",
           "in this layer another token is the sink, or [CLS] matters: see the two dicts.")
    print(f"layer {layer + 1} (1-indexed; {layer} in code): [CLS] gets {attention['[CLS]'] / attention['other']:.0f}× "
          f"the attention of another token and {sensitivity['other'] / sensitivity['[CLS]']:.0f}× less gradient")
