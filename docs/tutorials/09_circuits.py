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
# # 9. Circuits: which edges carry a decision
#
# **All data on this page is synthetic**, generated from templates as in tutorial 7; nothing here is a finding
# about real reviews. We fine-tune the bundled MiniLM on tutorial 7's aspect-sentiment task (a question about one
# aspect, a review that mentions two, the label the asked aspect's sentiment), then ask *how* it routes the asked
# aspect to its decision:
#
# - **token attributions** — which words the decision comes from (integrated gradients);
# - **direct attribution** — which heads and MLPs write the decision into the last hidden state;
# - **edge attribution patching** (EAP-IG) — which edges between components matter when the question asks about
#   the *other* aspect instead, and how **faithful** the circuit of the top edges is;
# - and how the circuit's heads compare with what head **ablation** and **activation patching** pick.
#
# The definitions are in [Circuits](../circuits.md). **It is small on purpose** (this page runs in CI on two
# cores): a short fine-tuning and 12 prompt pairs.

# %%
import random

import jax.numpy as jnp
import numpy as np

import minibert
from minibert import training
from minibert.analysis import circuits, interventions
from minibert.app.tutorials import expect
from minibert.core.config import head_label
from minibert.viz import circuits as circuit_views

model = minibert.load()  # all-MiniLM-L6-v2: 6 layers × 12 heads
L, H = model.config.num_hidden_layers, model.config.num_attention_heads

# %% [markdown]
# ## The task and the fine-tuned model
#
# Tutorial 7's data: each review names the asked aspect and another, each with its own (maybe negated)
# sentiment word; the label is the asked aspect's sentiment.

# %%
ASPECTS = ["food", "service", "staff", "music", "price", "wine", "coffee", "view", "room", "menu"]
POSITIVE = ["great", "excellent", "lovely", "good", "wonderful", "superb"]
NEGATIVE = ["awful", "terrible", "bad", "poor", "horrible", "dreadful"]
QUESTION = "what do you think of the {a} ?"
TEMPLATES = ["the {a} was {s} but the {b} was {t} .", "the {b} was {t} but the {a} was {s} .",
             "i found the {a} {s} , while the {b} was {t} .", "the {b} was {t} ; the {a} , however , was {s} ."]


def review(rng, a, b, positive_a: bool, positive_b: bool) -> str:
    word = lambda positive: rng.choice(POSITIVE if positive else NEGATIVE)  # noqa: E731
    return rng.choice(TEMPLATES).format(a=a, b=b, s=word(positive_a), t=word(positive_b))


def training_rows(n: int, seed: int):
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.sample(ASPECTS, 2)
        positive = i % 2 == 0
        rows.append((QUESTION.format(a=a), review(rng, a, b, positive, rng.random() < 0.5),
                     "positive" if positive else "negative"))
    return rows


tuned = training.finetune(model, training_rows(256, seed=0), epochs=2, batch_size=8, learning_rate=5e-5,
                          warmup=0.1, seed=0, progress=False)
tuned_model = tuned.model
positive_index = list(tuned_model.config.id2label).index("positive")
print("labels:", tuned_model.config.id2label, "— last training loss", round(float(tuned.history.loss[-1]), 3))

# %% [markdown]
# ## Clean and corrupted pairs
#
# A clean pair asks about aspect *a* of a review whose two aspects have **opposite** sentiments; its corrupted
# twin asks about the other aspect *b* of the same review, so the right answer flips. What differs between the
# two runs is only the asked aspect: the circuit we look for is the one that routes it to the decision. The
# metric is the logit difference toward the clean pair's label (positive: the model answers the clean question).
# A short fine-tuning leaves the model only weakly sensitive to which aspect is asked — the clean and corrupted
# metrics printed below are close — so read the circuit as a demonstration of the tools on a small effect.

# %%
rng = random.Random(1)
clean_questions, corrupt_questions, reviews, signs = [], [], [], []
for i in range(12):
    a, b = rng.sample(ASPECTS, 2)
    positive = i % 2 == 0
    reviews.append(review(rng, a, b, positive, not positive))
    clean_questions.append(QUESTION.format(a=a))
    corrupt_questions.append(QUESTION.format(a=b))
    signs.append(1.0 if positive else -1.0)
clean = tuned_model.tokenize(clean_questions, reviews)
corrupted = tuned_model.tokenize(corrupt_questions, reviews)
sign = jnp.asarray(signs)


def toward_clean_label(out):
    """The logit difference positive − negative, signed toward each clean pair's label, per row."""
    difference = out.logits[:, positive_index] - out.logits[:, 1 - positive_index]
    return difference * sign


m_clean = float(np.asarray(toward_clean_label(tuned_model(clean))).mean())
m_corrupt = float(np.asarray(toward_clean_label(tuned_model(corrupted))).mean())
print(f"metric: clean {m_clean:.3f}, corrupted {m_corrupt:.3f}")
print(clean_questions[0], "|", reviews[0])

# %% [markdown]
# ## Which words? Token attributions
#
# Integrated gradients on the word embeddings, from a `[PAD]` baseline (positions, segments and the special
# tokens kept), summed per word, 20 Gauss–Legendre points. Completeness says the scores of a row add up to the
# metric's change from the baseline: a check on the integral. The first two pairs, coloured (blue: toward the
# clean label):

# %%
words = circuits.token_attribution(tuned_model, clean, toward_clean_label, words=True, steps=20)
print("Σ scores − (F(x) − F(baseline)), first rows:", np.round(words.completeness_gap[:4], 4))
expect(np.all(np.abs(words.completeness_gap) < 0.05 * np.abs(words.total).max() + 1e-3),
       "integrated gradients are complete: each row's scores add up to F(x) − F(baseline)",
       "the integral is too coarse for this metric; raise steps=")
circuit_views.token_text(words, rows=[0, 1])

# %% [markdown]
# ## Which heads write the decision? Direct attribution
#
# Each head's output carried to the last hidden state along the skip path (the layernorms frozen at this run),
# read by the metric's gradient there. The parts add up to the metric's linear part; the pooler's `tanh` and the
# classifier's bias are the remainder.

# %%
direct = circuits.direct_attribution(tuned_model, clean, toward_clean_label)
print("largest direct effects:", [(name, round(float(v), 3)) for name, v in direct.top(6)])
parts = direct.heads.sum() + direct.mlps.sum() + direct.bias.sum() + direct.embed + direct.constant
expect(abs(parts - direct.linear) <= 1e-3 * (np.abs(direct.heads).sum() + np.abs(direct.mlps).sum() + 1),
       "the direct parts add up to the linearised metric", "the decomposition lost a component")

# %% [markdown]
# ## Which edges? EAP-IG and a circuit
#
# Every edge's score: the sender's change between the corrupted and the clean run, carried to the receiver, times
# the metric's gradient into that receiver alone (averaged over 5 runs between the two inputs). Then the
# faithfulness of the circuits of the top edges: the clean run with every other edge patched to its corrupted
# value, 1 for the full graph, 0 at the corrupted run.

# %%
graph = circuits.edge_attribution(tuned_model, clean, corrupted, toward_clean_label, method="eap-ig", steps=5)
print(f"{int(graph.edges.sum())} edges; the top ones:")
for sender, receiver, score in graph.top_edges(8):
    print(f"  {sender:>6} → {receiver:<10} {score:+.3f}")
sizes = [10, 40, 160, 640]
curve = circuits.circuit_faithfulness(tuned_model, clean, corrupted, toward_clean_label, graph.sweep(sizes))
print("faithfulness by size:", {n: round(float(v), 3) for n, v in zip(sizes, curve.values)})
print(f"empty graph {curve.empty:.3f} beside the corrupted run {curve.corrupted:.3f} (post-LN: an approximation)")
expect(np.all(np.isfinite(curve.values)), "every circuit's faithfulness is a number",
       "the clean and corrupted runs give the same metric: the pairs do not separate the two answers")
circuit_views.faithfulness_figure(curve)

# %%
circuit_views.circuit_figure(graph, graph.circuit(top=25))

# %% [markdown]
# ## The circuit's heads against ablation and patching
#
# A head's weight in the circuit: the summed |score| of the edges out of it and into its q, k, v
# (`circuits.head_scores(graph)`, [L, H]; `edges="out"` or `"in"` for one side). Head ablation
# (each head's z zeroed, alone) and activation patching (each head's clean z patched into the corrupted run)
# pick heads their own way; the overlap of the top picks says how far the three agree.

# %%
eap_heads = circuits.head_scores(graph)
ablation = interventions.ablation_sweep(tuned_model, clean, toward_clean_label)
patching = interventions.patch_activations(tuned_model, clean, corrupted, toward_clean_label, site="attn.hook_z",
                                           per="head")


def top_heads(scores, n=6):
    return {head_label(*divmod(int(i), H)) for i in np.argsort(-scores.ravel())[:n]}


picks = {"EAP-IG circuit": top_heads(eap_heads), "ablation": top_heads(np.abs(ablation - m_clean)),
         "patching": top_heads(np.abs(patching - m_corrupt))}
for name, heads in picks.items():
    print(f"{name:>15}: {sorted(heads)}")
print("in all three:", sorted(set.intersection(*picks.values())))
