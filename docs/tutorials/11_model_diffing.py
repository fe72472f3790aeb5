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
# # 11. Model diffing: what did fine-tuning change?
#
# **All data on this page is synthetic**, generated from templates below (seed 002's study, as in
# tutorial 7): aspect sentiment posed as a sentence pair — a question about one aspect and a review
# that mentions two — labelled with the sentiment toward the asked aspect. We fine-tune the bundled
# MiniLM briefly, then diff the fine-tune (B) against the base (A):
#
# - which **heads** moved (relative weight change, attention similarity),
# - which **layers** changed their representation (linear CKA),
# - which **features** the fine-tune added — a crosscoder between the two models, its latents labelled
#   shared / base-only / fine-tune-only by latent scaling — and whether those read the aspect word.
#
# **It is small on purpose** (this page runs in CI on two cores): 128 training pairs, two epochs of
# batches of 8 (32 optimisation steps), a crosscoder of 768 latents trained for a few hundred steps.
# Read the numbers as a demonstration of the tools, not as findings. docs/diffing.md has the definitions.

# %%
import random

import numpy as np

import minibert
from minibert import training, viz
from minibert.analysis import diffing
from minibert.app.tutorials import expect
from minibert.core.config import head_label
from minibert.viz import figures

base = minibert.load()  # all-MiniLM-L6-v2: 6 layers × 12 heads, 384 wide
L, H = base.config.num_hidden_layers, base.config.num_attention_heads

# %% [markdown]
# ## The synthetic data and a short fine-tune
#
# Each review names the asked aspect and one other, each with its own sentiment word; the other
# aspect's sentiment is drawn independently, so only the *asked* aspect's word answers the question.

# %%
ASPECTS = ["food", "service", "staff", "music", "price", "wine", "coffee", "view", "room", "menu"]
POSITIVE = ["great", "excellent", "lovely", "good", "wonderful", "superb"]
NEGATIVE = ["awful", "terrible", "bad", "poor", "horrible", "dreadful"]
QUESTION = "what do you think of the {a} ?"
TEMPLATES = ["the {a} was {s} but the {b} was {t} .", "the {b} was {t} but the {a} was {s} .",
             "i found the {a} {s} , while the {b} was {t} ."]


def generate(n: int, seed: int):
    """n (question, review, label) rows, half positive, half negative."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        positive = i % 2 == 0
        a, b = rng.sample(ASPECTS, 2)
        s = rng.choice(POSITIVE if positive else NEGATIVE)
        t = rng.choice(POSITIVE + NEGATIVE)
        rows.append((QUESTION.format(a=a), rng.choice(TEMPLATES).format(a=a, b=b, s=s, t=t),
                     "positive" if positive else "negative"))
    return rows


train, held_out = generate(128, seed=0), generate(48, seed=1)
print(train[0])
tuned = training.finetune(base, train, epochs=2, batch_size=8, learning_rate=1e-4, warmup=0.1, seed=0,
                          progress=False, eval_data=held_out)
finetuned = tuned.model
print("held-out accuracy per epoch:", [round(e["accuracy"], 3) for e in tuned.history.eval], "(chance 0.5)")
expect(np.isfinite(tuned.history.loss).all(), "every training loss is finite", "the run diverged; lower the rate")

# %% [markdown]
# ## Which heads moved?
#
# `weight_change` reads both models' weights through their accessors and reports
# ‖W_B − W_A‖_F / ‖W_A‖_F for every matrix, and for each head's slice of W_Q, W_K, W_V and W_O.
# `attention_change` puts the heads' behaviour side by side: Clark et al.'s statistics of each model and
# `compare_models`' similarity of the two attention maps (1 = unchanged).

# %%
change = diffing.weight_change(base, finetuned)
per_head = np.mean([change.per_head[name] for name in ("W_Q", "W_K", "W_V", "W_O")], axis=0)  # [L, H]
order = np.argsort(-per_head, axis=None)[:5]
print("most-moved heads:", [(head_label(*np.unravel_index(i, per_head.shape)), round(float(per_head.flat[i]), 4))
                            for i in order])
print("MLP W_in change per layer:", np.round(change.per_matrix["mlp.W_in"], 4))
questions, reviews = [q for q, _, _ in held_out], [r for _, r, _ in held_out]
attention = diffing.attention_change(base, finetuned, questions, pairs=reviews)
print("least similar heads after fine-tuning:",
      [head_label(*np.unravel_index(i, attention.similarity.shape)) for i in np.argsort(attention.similarity,
                                                                                          axis=None)[:5]])
expect(np.all(per_head > 0) and np.all(per_head < 0.5), "every head moved, none by half its norm",
       "a short fine-tune nudges every weight; a head unchanged or moved by more than half its norm would mean "
       "frozen weights or a diverged run")

# %% [markdown]
# ## Which layers changed their representation?
#
# Linear CKA compares the two models' token vectors at each stream (the embeddings, then each block's output)
# up to rotation and scale: 1 means the same geometry.

# %%
texts = list(zip(questions, reviews))
cka = diffing.representation_similarity(base, finetuned, texts)
print("CKA per stream (embedding, blocks 1…6):", np.round(cka, 3))
expect(cka[0] > cka[-1], "the last block's output changed more than the embeddings",
       "fine-tuning with a classifier on top usually moves the top layers most; here it did not")

# %% [markdown]
# ## Which features are new? A crosscoder between the two models
#
# `paired_activations` packs the texts once and runs each packed batch through both models, giving each
# token's two vectors side by side at one site. A BatchTopK crosscoder learns one set of latents that
# reconstructs both; each latent has a decoder in each model. Latent scaling then asks, for each latent,
# how much of its direction each model's activations really hold, and labels it shared, A-only (base) or
# B-only (fine-tune).

# %%
SITE = "blocks.4.hook_normalized_resid_post"  # block 5's output (1-indexed)
corpus = [(q, r) for q, r, _ in train] + [(q, r) for q, r, _ in generate(256, seed=2)]
batches = list(diffing.paired_activations(base, finetuned, corpus, SITE, batch_size=256, buffer_tokens=2048))
config = diffing.CrosscoderConfig(d_in=base.config.hidden_size, d_sae=768, k=16, hook_name=SITE)
trainer = diffing.CrosscoderTrainer(config, learning_rate=1e-3, warmup=20, dead_tokens=256 * 40)
trainer.center(np.concatenate(batches))
history = [step for _ in range(8) for step in trainer.train(batches)]  # 8 passes over the cached batches
print(f"{trainer.steps} steps; squared error per token, first step {history[0]['mse']:.2f}, "
      f"last {history[-1]['mse']:.2f}")

x, where = diffing.paired_token_activations(base, finetuned, texts, SITE)
reconstruction = np.asarray(diffing.decode(trainer.params, diffing.encode(config, trainer.params, x)))
fvu = [float(np.sum((x[:, m] - reconstruction[:, m]) ** 2) / np.sum((x[:, m] - x[:, m].mean(0)) ** 2))
       for m in range(2)]
table = diffing.latent_table(config, trainer.params, x)
print(f"fraction of variance unexplained on held-out pairs: base {fvu[0]:.3f}, fine-tune {fvu[1]:.3f}")
print("latents by label:", table.count())
expect(max(fvu) < 0.5, "the crosscoder reconstructs both models' held-out activations (FVU < 0.5)",
       "it is undertrained: give it more steps or text")
expect(table.count()["shared"] > table.count()["A-only"] + table.count()["B-only"],
       "most live latents are shared", "a brief fine-tune should keep most of the base's features")

# %% [markdown]
# ## Do the fine-tune-only latents read the aspect word?
#
# For each latent latent scaling calls fine-tune-only, its strongest held-out tokens, with what each model's
# own vector contributes to the latent (A | B). We count how many of those tokens are aspect words.

# %%
# `finetuned` keeps the base's `source` (where it was loaded from), so we name the two ourselves.
report = diffing.what_changed(base, finetuned, texts, config, trainer.params, top=4, examples=5,
                              names=("base", "fine-tuned"))
for latent, examples in report.examples.items():
    on_aspect = np.mean([e.token in ASPECTS for e in examples]) if examples else 0
    print(f"latent {latent}: ν_error {table.nu['error'][latent]:.2f}, {100 * on_aspect:.0f}% of its top tokens "
          f"are aspect words")
    for e in examples[:3]:
        print(f"    {e.activation:5.2f} (A {e.contributions[0]:+.2f} | B {e.contributions[1]:+.2f})  {e.context}")
if not report.examples:
    print("no latent was labelled fine-tune-only at this size: the fine-tune re-used the base's features")

# %% [markdown]
# ## The "what changed" sheet
#
# Everything above on one page: weight change by head, CKA by layer, the latents' relative decoder norms split
# by their latent-scaling label, and the top fine-tune-only latents with their examples.
# `figures.what_changed(report, path="what_changed.png")` saves it (an existing file only with
# `overwrite=True`).

# %%
figures.what_changed(report)

# %% [markdown]
# ## Every latent, in both models
#
# The feature browser takes the crosscoder and the two models: for each latent, its top held-out contexts with
# what the base's and the fine-tune's vectors each contribute at the peak, its relative decoder norm and its
# latent-scaling label. `browser.save("crosscoder.html")` writes the page.

# %%
browser = viz.features.feature_browser((base, finetuned), config, trainer.params, texts, names=("base", "fine-tuned"))
print("labels on the browsed tokens:", {label: sum(latent["label"] == label for latent in browser.data["latents"])
                                         for label in diffing.LABELS})
browser
