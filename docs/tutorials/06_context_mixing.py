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
# # 6. Context mixing: beyond attention weights
#
# An attention weight says how much of token *j*'s value vector a head copies into token *i*. It
# does not say how big that value vector is, how much the residual connection keeps of *i* itself,
# or what the layernorm and the feed-forward layer make of the mix. Three measures answer "how much
# does token *i* draw on token *j* in this layer?" with more of the block in view
# ([definitions](../context_mixing.md)):
#
# - **value zeroing** (Mohebbi et al. 2023): zero *j*'s value vector in every head, rerun the rest
#   of the block, and see how far *i*'s output turns (1 − cosine);
# - **ALTI** (Ferrando et al. 2022): split the block's output after the residual and LN1 into one
#   term per input token (plus the biases, which belong to no token) and measure how close each
#   term comes, in L1, to that real output;
# - **attention attribution** (Hao et al. 2021): integrate the gradient of an output with respect
#   to a layer's whole pattern, scaled from 0 to its real value.
#
# We use seed 002's setting — aspect-based sentiment as question answering: a question about one
# aspect paired with a review — on the bundled all-MiniLM-L6-v2, and ask one question: how much of
# each layer's mixing goes to the `[CLS]` token, which takes much of the attention weight
# ([findings](../findings.py))? Layers are 1-indexed in the text and 0-indexed in arrays.

# %%
import jax.numpy as jnp
import numpy as np

import minibert
from minibert import analysis
from minibert.app.tutorials import expect, position  # expect: prints each claim and what it means when it fails
from minibert.core.config import head_label

model = minibert.load()
L, H = model.config.num_hidden_layers, model.config.num_attention_heads
batch = model.tokenize(["what do you think of the food ?"], ["the food was great but the service was slow ."])
tokens = batch.tokens[0]
print(" ".join(tokens))

# %% [markdown]
# ## Three maps per layer
#
# Raw attention, as a per-layer map, is the mean over heads of the pattern. Value zeroing and ALTI
# each return `[L, B, T, T]` maps whose rows sum to 1 over the real tokens — the same shape, so they
# compare directly (and `analysis.attention_rollout` composes any of them across layers).

# %%
_, cache = model.run_with_cache(batch, names="blocks.*.attn.hook_pattern")
raw = np.asarray(cache.stack("attn.hook_pattern")).mean(2)  # [L, B, T, T], mean over heads
zeroing = analysis.value_zeroing(model, batch)
alti = analysis.alti(model, batch)
maps = {"raw attention": raw, "value zeroing": zeroing, "ALTI": alti}
for name, m in maps.items():
    expect(m.shape == (L, 1, len(tokens), len(tokens)) and np.allclose(m.sum(-1), 1.0, atol=1e-5),
           f"{name}: [L, B, T, T], each row a distribution over the tokens (sums to 1)",
           "a map whose rows do not sum to 1 cannot be compared with the others.")

# %% [markdown]
# ## How much of each layer's mixing goes to `[CLS]`
#
# The share of a layer's map in the `[CLS]` column, averaged over the query tokens other than
# `[CLS]` itself (its own row would count its residual).

# %%
def share_to_cls(m):
    """[L]: mean over query rows 1.. of the column of [CLS] (position 0)."""
    return m[:, 0, 1:, 0].mean(-1)


shares = {name: share_to_cls(m) for name, m in maps.items()}
print("layer  " + "  ".join(f"{name:>14}" for name in shares))
for layer in range(L):
    print(f"{layer + 1:>5}  " + "  ".join(f"{shares[name][layer]:14.3f}" for name in shares))

# %% [markdown]
# From layer 2 on, raw attention sends 0.3–0.5 of each layer's weight to `[CLS]`; value zeroing and ALTI,
# which see what the copied vectors do to the output, give `[CLS]` only a few percent: the sink
# takes attention and contributes little. The check below states it.

# %%
middle = slice(1, L)  # layers 2..L, where the sink forms
print(f"layers 2–{L}: raw {shares['raw attention'][middle].mean():.2f}, "
      f"value zeroing {shares['value zeroing'][middle].mean():.3f}, ALTI {shares['ALTI'][middle].mean():.3f}")
for name in ("value zeroing", "ALTI"):
    expect(shares[name][middle].mean() < 0.5 * shares["raw attention"][middle].mean(),
           f"{name} gives [CLS] under half the share raw attention gives it (layers 2–{L})",
           "for this text [CLS] contributes more than a sink: compare the table above.")

# %% [markdown]
# ## Where the question's aspect word draws from
#
# The row of "food" in the question, in the last layer: which tokens does its representation
# draw on, by each measure?

# %%
food = position(tokens, "food", instead=len(tokens) // 2)
for name, m in maps.items():
    row = m[-1, 0, food]
    top = np.argsort(-row)[:4]
    print(f"{name:>14}: " + ", ".join(f"{tokens[t]}@{t} {row[t]:.2f}" for t in top))

# %% [markdown]
# ## Attention attribution: which heads matter for an output
#
# Attribution needs an output to explain. Here F is how "food"-like the pair's sentence vector is:
# the mean-pooled last hidden state projected on the sentence vector of the word "food". For each
# layer, every head's pattern is scaled together from 0 to its real value in 20 steps and the
# gradients are averaged — one compiled program for every layer, the 20 steps batched.

# %%
food_vector = jnp.asarray(model.sentence_embeddings(["food"])[0])
real = jnp.asarray(batch.attention_mask, jnp.float32)[..., None]


def foodness(out):
    """[B]: mean-pooled last hidden state · the sentence vector of "food"."""
    pooled = (out.last_hidden_state * real).sum(1) / real.sum(1)
    return pooled @ food_vector


attribution = analysis.attention_attribution(model, batch, foodness, steps=20)  # [L, B, H, T, S]
per_head = attribution[:, 0].sum((-1, -2))  # [L, H]: total attribution of each head
order = np.argsort(-np.abs(per_head).ravel())[:3]
for index in order:
    layer, head = divmod(int(index), H)
    t, s = np.unravel_index(np.argmax(attribution[layer, 0, head]), attribution.shape[-2:])
    print(f"head {head_label(layer, head)} (L-H, 1-indexed): total {per_head[layer, head]:+.3f}; "
          f"strongest edge {tokens[t]}@{t} → {tokens[s]}@{s}")

# %% [markdown]
# Summed over the pattern, the attributions of one layer approximate F(A_l) − F(0) (the integrated
# gradient's completeness, up to the 20-step Riemann sum): the check below compares the two for the
# last layer, where zeroing the whole pattern is a hook away.

# %%
def zero_pattern(pattern, ctx):
    return jnp.zeros_like(pattern)


zeroed = model.run_with_hooks(batch, {f"blocks.{L - 1}.attn.hook_pattern": zero_pattern})
drop = float(foodness(model(batch))[0] - foodness(zeroed)[0])
print(f"last layer: Σ attribution {attribution[-1].sum():.4f}, F(A) − F(0) {drop:.4f}")
expect(abs(attribution[-1].sum() - drop) < 0.1 * abs(drop),
       "the last layer's attributions add up to F(A) − F(0) within 10% (completeness)",
       "raise `steps` (the Riemann sum's m): fewer steps approximate the integral less well.")

# %% [markdown]
# ## Next
#
# - `analysis.relation_accuracy(model, examples)` scores every head on word pairs you label
#   (seed 002's proposed study: does the question's aspect word attend to the same aspect in the review?).
# - `analysis.compare_models(pretrained, finetuned, texts)` shows which heads fine-tuning changed.
# - `analysis.logit_lens(model, batch)` reads each layer through a masked-LM head (for MLM checkpoints).
