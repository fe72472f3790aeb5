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
# # 1. One head by hand
#
# Self-attention is a handful of array operations. In this tutorial we redo them in NumPy
# for one head of the bundled checkpoint (all-MiniLM-L6-v2), starting from the block's
# input, and check every step against the value the model itself computed — each
# intermediate is a *hook point* that `run_with_cache` can hand back
# (the *Hook points* page lists them all; `minibert hooks` prints the same table).
#
# For one head, with the block input $x \in \mathbb{R}^{T \times D}$:
#
# $$
# q = x W_Q + b_Q,\quad k = x W_K + b_K,\quad v = x W_V + b_V \qquad (T \times K)
# $$
# $$
# \text{scores} = \frac{q k^\top}{\sqrt{K}} + \text{mask},\qquad
# \text{pattern} = \operatorname{softmax}_{\text{keys}}(\text{scores}),\qquad
# z = \text{pattern}\, v
# $$
#
# and the block's attention output adds up every head's $z_h W_O^{(h)}$ plus a bias.
# Axis letters used throughout minibert: B batch, T query positions, S key positions,
# H heads, K head dimension, D model width. Layers and heads are **0-indexed** in code;
# Clark et al.'s figures label them 1-indexed ("L-H").
#
# Every number below is printed by the code. Each step written by hand is compared with the hook's
# value by `np.testing.assert_allclose`, which stops the notebook if they disagree; every other claim
# is printed as it is checked — ✓ when it holds, ✗ with what that means when your edit changed it,
# "not tested" when your text has nothing to test it on (the test suite runs this file with ✗ as an
# error, so running it is a test).

# %%
import numpy as np

import minibert
from minibert.app.tutorials import expect, position  # expect: prints each claim and what it means when it fails
from minibert.core.config import head_label

model = minibert.load()
cfg = model.config
print(model)
print(f"{cfg.num_hidden_layers} layers, H = {cfg.num_attention_heads} heads, "
      f"K = {cfg.head_dim} dims per head, D = {cfg.hidden_size}")

# %% [markdown]
# ## A padded batch
#
# Two sentences of different lengths go in one batch. The tokenizer pads the shorter one
# with `[PAD]` and marks real tokens with `attention_mask = 1`. Padding is where attention
# implementations most often go wrong, so we keep it in the example. Below, `short` is the row
# of the shortest sentence (the padded one) and `full` the row of the longest (no padding); with
# sentences of your own — one, three, of equal lengths — they are whichever rows those are.

# %%
sentences = ["The cat sat on the mat.", "The quick brown fox jumps over the lazy dog."]
batch = model.tokenize(sentences)
for tokens, mask in zip(batch.tokens, batch.attention_mask):
    print(" ".join(f"{t}:{m}" for t, m in zip(tokens, mask)))
mask = np.asarray(batch.attention_mask, bool)  # [B, T]
short, full = int(mask.sum(1).argmin()), int(mask.sum(1).argmax())  # rows: the most padded, the longest
print(f"row {short} is the shortest sentence ({(~mask[short]).sum()} [PAD]); row {full} the longest")
expect(not mask[short].all(), "the shortest sentence is padded to the longest one's length",
       "every sentence has the same number of tokens, so there is no padding: the mask checks below have "
       "nothing to test. Give two sentences of different lengths to see them.")

# %% [markdown]
# We study layer 0, head 2 — a head that, in this checkpoint, attends to the previous token
# (the code checks that below). We capture everything the layer computes on the way.

# %%
LAYER, HEAD = 0, 2
sites = ["hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_qk", "attn.hook_attn_scores",
         "attn.hook_pattern", "attn.hook_z", "attn.hook_result", "hook_attn_out"]
out, cache = model.run_with_cache(batch, names=[f"blocks.{LAYER}.{site}" for site in sites])
hooked = {name.split(".", 2)[2]: value for name, value in cache.numpy().items()}  # "attn.hook_q" → array
for site, value in hooked.items():
    print(f"{site:22s} {value.shape}")

attn = model.params["blocks"][LAYER]["attn"]  # weights in the shape the maths uses
W_Q, W_K, W_V, W_O = (np.asarray(attn[w]) for w in ("W_Q", "W_K", "W_V", "W_O"))  # [D,H,K] ×3, [H,K,D]
b_Q, b_K, b_V, b_O = (np.asarray(attn[b]) for b in ("b_Q", "b_K", "b_V", "b_O"))  # [H,K] ×3, [D]
print("W_Q", W_Q.shape, " W_O", W_O.shape)

# %% [markdown]
# ## Step 1: queries, keys and values
#
# Each head has its own $D \times K$ slice of the projection matrices. Every token's
# residual-stream vector $x_t$ is projected to a query $q_t$ (what it is looking for), a key
# $k_t$ (what it offers to be found by) and a value $v_t$ (what it passes on when found).

# %%
x = hooked["hook_resid_pre"]  # [B, T, D]
q = np.einsum("BTD,DHK->BTHK", x, W_Q) + b_Q
k = np.einsum("BSD,DHK->BSHK", x, W_K) + b_K
v = np.einsum("BSD,DHK->BSHK", x, W_V) + b_V
for name, ours in (("q", q), ("k", k), ("v", v)):
    gap = np.abs(ours - hooked[f"attn.hook_{name}"]).max()
    print(f"{name}: {ours.shape}, largest difference from attn.hook_{name}: {gap:.1e}")
    np.testing.assert_allclose(ours, hooked[f"attn.hook_{name}"], atol=1e-4, rtol=1e-5)

# %% [markdown]
# ## Step 2: raw scores q·k
#
# The score of query $t$ for key $s$ is the dot product $q_t \cdot k_s = \sum_i q_{t,i}\,k_{s,i}$.
# The neuron view (at the end) draws the elementwise product $q \times k$ whose sum this is:
# a few large entries of the same sign are how a head "matches" a key.

# %%
qk = np.einsum("BTHK,BSHK->BHTS", q, k)
np.testing.assert_allclose(qk, hooked["attn.hook_qk"], atol=1e-3, rtol=1e-5)
print("q·k matches attn.hook_qk; largest difference", f"{np.abs(qk - hooked['attn.hook_qk']).max():.1e}")

# query "sat" and key "cat" in the shortest sentence (with other words: the third token and the one before it)
t = position(batch.tokens[short], "sat", instead=2)
s = position(batch.tokens[short], "cat", instead=t - 1)
product = q[short, t, HEAD] * k[short, s, HEAD]  # q×k, elementwise: K numbers
print(f"q×k for {batch.tokens[short][t]!r} → {batch.tokens[short][s]!r}: the {len(product)} terms sum to "
      f"{product.sum():.4f} = q·k {qk[short, HEAD, t, s]:.4f}")
largest = np.argsort(-np.abs(product))[:4]
print("largest terms (dimension: value):", ", ".join(f"{i}: {product[i]:+.2f}" for i in largest))

# %% [markdown]
# ## Step 3: scale by √K
#
# If the $K$ components of $q$ and $k$ were independent with unit variance, $q\cdot k$
# would have variance $K$; dividing by $\sqrt{K}$ keeps the scores' spread the same whatever
# $K$ is (Vaswani et al. 2017). Without it, large scores make the softmax *peaked*: nearly all
# weight on one key, and gradients near zero for the others (the softmax *saturates*).

# %%
scaled = qk / np.sqrt(cfg.head_dim)
real_pairs = np.broadcast_to(mask[:, None, :, None] & mask[:, None, None, :], qk.shape)  # real query, real key
print(f"√K = {np.sqrt(cfg.head_dim):.3f}; std of raw scores {qk[real_pairs].std():.2f}, "
      f"scaled {scaled[real_pairs].std():.2f}")

# %% [markdown]
# ## Step 4: the padding mask
#
# A query must not attend to `[PAD]` keys. Before the softmax, their scores are set to $-\infty$
# (what TransformerLens' `hook_attn_scores` holds; Hugging Face uses the most negative float32
# instead, which gives the same softmax). A row whose keys were all masked would be NaN after a
# plain softmax; minibert's softmax keeps such rows finite. The mask is on **keys** only: the
# `[PAD]` rows are still computed, and ignored later.

# %%
NEG = -np.inf
key_mask = mask[:, None, None, :]  # [B, 1, 1, S]
scores = np.where(key_mask, scaled, NEG)
np.testing.assert_allclose(scores, hooked["attn.hook_attn_scores"], atol=1e-4, rtol=1e-5)
padded_keys = ~mask[short]
no_padding = None if padded_keys.any() else "no sentence is padded (all have one length): there is no padded key."
expect((hooked["attn.hook_attn_scores"][short, :, :, padded_keys.nonzero()[0]] == NEG).all(),
       "every score at a padded key holds the mask value", "the mask did not reach the scores.", untested=no_padding)
print(f"scores match attn.hook_attn_scores; the {padded_keys.sum()} [PAD] keys of sentence {short} hold {NEG:.3e}")

# %% [markdown]
# ## Step 5: softmax over keys
#
# $$\text{pattern}_{t,s} = \frac{e^{\text{score}_{t,s} - m_t}}{\sum_{s'} e^{\text{score}_{t,s'} - m_t}},
# \qquad m_t = \max_{s'} \text{score}_{t,s'}$$
#
# Subtracting the row maximum changes nothing mathematically and keeps $e^x$ from
# overflowing. Each row is a probability distribution over the keys; padded keys get exactly 0.

# %%
shifted = np.exp(scores - scores.max(-1, keepdims=True))
pattern = shifted / shifted.sum(-1, keepdims=True)
np.testing.assert_allclose(pattern, hooked["attn.hook_pattern"], atol=1e-6)
np.testing.assert_allclose(pattern.sum(-1), 1.0, atol=1e-6)
expect((hooked["attn.hook_pattern"][short, :, :, padded_keys.nonzero()[0]] == 0).all(),
       "padded keys get exactly zero attention after the softmax", "the mask did not reach the softmax.",
       untested=no_padding)
print(f"pattern matches attn.hook_pattern; rows sum to 1; the {padded_keys.sum()} [PAD] keys get weight "
      f"{pattern[short][..., padded_keys].sum():g} in all")

n = mask[full].sum()  # the longest sentence's real tokens (all of its row)
tokens = batch.tokens[full][:n]
print(f"\nhead {head_label(LAYER, HEAD)} (L-H, 1-indexed): where each token of sentence {full} looks most")
for t, token in enumerate(tokens):
    s = pattern[full, HEAD, t, :n].argmax()
    print(f"  {token:>8s} → {tokens[s]:<8s} {pattern[full, HEAD, t, s]:.3f}")

# %% [markdown]
# This is a *previous-token head*: almost all of each token's attention goes to the token
# just before it. Averaged over the real tokens after `[CLS]`:

# %%
previous = np.mean([pattern[full, HEAD, t, t - 1] for t in range(1, n)])
print(f"mean attention to the previous token: {previous:.3f}")
expect(previous > 0.9, f"head {head_label(LAYER, HEAD)} puts over 0.9 of its attention on the previous token",
       "with another LAYER, HEAD or sentence the head may do something else: print pattern[full, HEAD] to see what.")

# %% [markdown]
# Padding changes nothing for the real tokens: the padded sentence, run alone (no padding),
# gives the same pattern over its real tokens.

# %%
alone = model.tokenize([sentences[short]])
_, cache_alone = model.run_with_cache(alone, names=f"blocks.{LAYER}.attn.hook_pattern")
n0 = mask[short].sum()
single = np.asarray(cache_alone[f"blocks.{LAYER}.attn.hook_pattern"])[0]
gap = np.abs(single - pattern[short, :, :n0, :n0]).max()
print(f"{n0} real tokens; largest difference between padded and unpadded patterns: {gap:.1e}")
np.testing.assert_allclose(single, pattern[short, :, :n0, :n0], atol=1e-5)

# %% [markdown]
# ## Step 6: mix the values
#
# Each query's output is the attention-weighted average of the value vectors,
# $z_t = \sum_s \text{pattern}_{t,s}\, v_s$. For a previous-token head, $z_t \approx v_{t-1}$:
# the head copies information one position to the right.

# %%
z = np.einsum("BHTS,BSHK->BTHK", pattern, v)
np.testing.assert_allclose(z, hooked["attn.hook_z"], atol=1e-4, rtol=1e-5)
copy_gap = np.abs(z[full, 1:n, HEAD] - v[full, : n - 1, HEAD]).mean() / np.abs(v[full, :n, HEAD]).mean()
print(f"z matches attn.hook_z; mean |z_t − v_(t−1)| / mean |v| = {copy_gap:.1e} "
      f"for head {head_label(LAYER, HEAD)} (L-H, 1-indexed)")

# %% [markdown]
# ## Step 7: back to the residual stream
#
# Each head writes $z_h W_O^{(h)}$ ($T \times D$) — `attn.hook_result` holds these per head.
# The block's attention output is their sum plus one bias that belongs to no head:
# $\text{attn\_out} = \sum_h z_h W_O^{(h)} + b_O$. Here we use every head's $z$ at once.

# %%
result = np.einsum("BTHK,HKD->BTHD", hooked["attn.hook_z"], W_O)
np.testing.assert_allclose(result, hooked["attn.hook_result"], atol=1e-4, rtol=1e-5)
attn_out = result.sum(axis=2) + b_O
np.testing.assert_allclose(attn_out, hooked["hook_attn_out"], atol=1e-4, rtol=1e-5)
norms = np.linalg.norm(result[full, :n], axis=-1).mean(0)  # [H]: how much each head writes, on average
print("result and attn_out match; mean ‖z_h W_O‖ per head:", np.array2string(norms, precision=2))

# %% [markdown]
# ## Two paths, one answer
#
# When no hook asks for the scores or the pattern, minibert never materialises them: it calls
# the fused `jax.nn.dot_product_attention` (a flash-attention kernel on GPU). Capturing only
# `attn.hook_z` takes that path; it agrees with the explicit one.

# %%
_, fused = model.run_with_cache(batch, names=f"blocks.{LAYER}.attn.hook_z")
gap = np.abs(np.asarray(fused[f"blocks.{LAYER}.attn.hook_z"]) - hooked["attn.hook_z"])[mask].max()
print(f"fused vs explicit z on real tokens: largest difference {gap:.1e}")
expect(gap < 1e-5, "the fused z equals the one computed step by step, up to float32 rounding",
       "a larger gap means a step above was changed: compare each intermediate with its hook again.")

# %% [markdown]
# ## The neuron view
#
# The neuron view of Vig (2019) draws this computation for one query: its $q$, every key's
# $k$, the elementwise $q\times k$, the score $q\cdot k$ and the softmax — positive values
# blue, negative orange. Click a token on the left to make it the query; the selectors
# switch layer and head (labelled 1-indexed, "L-H", in the page). `viz.document` runs the
# model once on one document and keeps its real tokens' $q$, $k$ (`[L, T, H, K]`) and
# patterns (`[L, H, T, S]`) — the same arrays we computed above.

# %%
from minibert import viz

doc = viz.document(model, sentences[full])
n = mask[full].sum()  # its real tokens: the document has no padding, while a shorter row of the batch has some
np.testing.assert_allclose(doc.q[LAYER], q[full, :n], atol=1e-4, rtol=1e-5)
# a run of another shape (one document, its own bucket) sums in another order: float32's ~6e-8 relative rounding,
# carried through the blocks before this one and scores spread ~13 wide, moves a probability by ~1e-6 — the same
# 1e-5 bound as "padding changes nothing" above
np.testing.assert_allclose(doc.attention[LAYER], pattern[full, :, :n, :n], atol=1e-5)
view = doc.neuron_view(layer=LAYER, head=HEAD, query_index=position(batch.tokens[full], "fox", instead=4))
view  # in a notebook this shows the view; view.save("neuron_view.html") writes a standalone page
