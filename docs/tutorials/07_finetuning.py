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
# # 7. Fine-tuning, and what it changes
#
# **All data on this page is synthetic**, generated from templates below; nothing here is a
# finding about real reviews. The study is seed 002's: aspect sentiment posed as a sentence
# pair — a question about one aspect and a review that mentions two —
#
#     [CLS] what do you think of the food ? [SEP] the food was great but the service was slow . [SEP]
#
# labelled with the sentiment toward the asked aspect. We fine-tune the bundled MiniLM with a
# classification head in JAX (`minibert.training`), then ask what changed inside: per-head
# `relation_accuracy` (does the aspect word attend to *its* sentiment word?) and
# `compare_models` before against after. Last, an **interventional** run: the same
# fine-tuning with the most-changed head ablated throughout.
#
# **It is small on purpose** (this page runs in CI on two cores): 256 short training pairs,
# two epochs of batches of 8 (64 optimisation steps), twice. Read the numbers as a demonstration
# of the tools, not as results. It takes about 3 minutes of CPU time (11 minutes of wall time on
# a shared 2-core machine under heavy load).

# %%
import random

import matplotlib.pyplot as plt
import numpy as np

import minibert
from minibert import training
from minibert.analysis import compare, embeddings, interventions
from minibert.app.tutorials import expect
from minibert.core.config import head_label
from minibert.viz import figures

model = minibert.load()  # all-MiniLM-L6-v2: 6 layers × 12 heads
L, H = model.config.num_hidden_layers, model.config.num_attention_heads

# %% [markdown]
# ## The synthetic data
#
# Every review names the asked aspect and one other, each with its own sentiment word, maybe
# negated ("not great" is negative); the other aspect's sentiment is drawn independently, so
# only reading the *asked* aspect's word answers the question. The order of the two clauses
# varies. Labels are balanced. Two review templates are **held out**: the evaluation pairs use
# sentence shapes the model never trained on.

# %%
ASPECTS = ["food", "service", "staff", "music", "price", "wine", "coffee", "view", "room", "menu"]
POSITIVE = ["great", "excellent", "lovely", "good", "wonderful", "superb"]
NEGATIVE = ["awful", "terrible", "bad", "poor", "horrible", "dreadful"]
QUESTION = "what do you think of the {a} ?"
TRAIN_TEMPLATES = ["the {a} was {s} but the {b} was {t} .", "the {b} was {t} but the {a} was {s} .",
                   "i found the {a} {s} , while the {b} was {t} .", "the {b} was {t} ; the {a} , however , was {s} ."]
HELD_OUT_TEMPLATES = ["honestly the {a} seemed {s} and the {b} seemed {t} .", "as for the {b} it was {t} , and the {a} "
                      "was {s} ."]


def phrase(rng, positive: bool, avoid: str = "") -> tuple[str, str]:
    """A sentiment phrase of the given polarity and its adjective: "great", or a negated "not awful"."""
    negated = rng.random() < 0.3
    words = [w for w in (NEGATIVE if positive == negated else POSITIVE) if w != avoid]
    word = rng.choice(words)
    return ("not " + word if negated else word), word


def generate(templates, n: int, seed: int):
    """n (question, review, label, aspect, sentiment word, other aspect, its label) rows, half positive, half
    negative."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        positive = i % 2 == 0
        a, b = rng.sample(ASPECTS, 2)
        s, word = phrase(rng, positive)
        other_positive = rng.random() < 0.5
        t, _ = phrase(rng, other_positive, avoid=word)
        review = rng.choice(templates).format(a=a, b=b, s=s, t=t)
        rows.append((QUESTION.format(a=a), review, "positive" if positive else "negative", a, word,
                     b, "positive" if other_positive else "negative"))
    return rows


train_rows = generate(TRAIN_TEMPLATES, 256, seed=0)
test_rows = generate(HELD_OUT_TEMPLATES, 96, seed=1)
for row in train_rows[:3] + test_rows[:2]:
    print(row[2], "|", row[0], "|", row[1])
train = [(q, r, label) for q, r, label, *_ in train_rows]
held_out = [(q, r, label) for q, r, label, *_ in test_rows]

# %% [markdown]
# ## Fine-tuning
#
# `training.finetune` adds a classification head (initialised as transformers does) to the
# base model and trains everything with AdamW; the held-out pairs are scored after each epoch.
# An epoch is 32 steps of 8 pairs; the learning rate is above the usual 2e-5 because the run
# is so short.

# %%
SETTINGS = dict(epochs=2, batch_size=8, learning_rate=5e-5, warmup=0.1, seed=0, progress=False, eval_data=held_out)
tuned = training.finetune(model, train, **SETTINGS)
accuracy = tuned.history.eval[-1]["accuracy"]
print(f"loss: first step {tuned.history.loss[0]:.3f}, last {tuned.history.loss[-1]:.3f}")
print("held-out accuracy per epoch:", [round(e["accuracy"], 3) for e in tuned.history.eval],
      f"on {len(held_out)} pairs of unseen templates (chance 0.5)")
expect(np.isfinite(tuned.history.loss).all() and len(tuned.history.loss) == 64, "64 steps, every loss finite",
       "the run diverged or stopped early; look at tuned.history.loss")

# %% [markdown]
# ## Does the model read the question? A shortcut check
#
# Held-out accuracy alone cannot tell a model that reads *which* aspect is asked from one that
# found a shortcut (say, always answering with the first clause's sentiment). Ask each held-out
# review about its **other** aspect: the right answer is now the other phrase's polarity. A
# model that ignores the question scores near the share of reviews whose two phrases agree.

# %%
swapped = [(QUESTION.format(a=b), r, other) for q, r, _, a, word, b, other in test_rows]
agree = np.mean([label == other for _, _, label, *_, other in test_rows])
logits = tuned.model(tuned.model.tokenize([q for q, _, _ in swapped], [r for _, r, _ in swapped])).logits
answers = [tuned.model.config.id2label[i] for i in np.asarray(logits).argmax(-1)]
swap_accuracy = float(np.mean([a == gold for a, (_, _, gold) in zip(answers, swapped)]))
print(f"asked aspect: {accuracy:.3f}; other aspect asked: {swap_accuracy:.3f} "
      f"(a model that ignores the question: about {agree:.3f})")
expect(swap_accuracy > agree, "the answer changes with the aspect asked",
       "the model answers without reading which aspect is asked (a shortcut): train longer, or make the data "
       "break the shortcut")

# %% [markdown]
# ## Which heads changed?
#
# `compare_models` gives each head's cosine similarity between its attention maps before and
# after fine-tuning, on the held-out pairs (1: unchanged). Kovaleva et al. (2019) found
# fine-tuning changes the last layers most.

# %%
questions, reviews = [r[0] for r in test_rows], [r[1] for r in test_rows]
before_after = compare.compare_models(model, tuned.model, questions, reviews)
order = np.argsort(before_after.similarity.ravel())
changed = [(head_label(*divmod(int(i), H)), float(before_after.similarity.ravel()[i])) for i in order[:5]]
print("most changed heads (similarity before vs after):", [(h, round(s, 3)) for h, s in changed])
print("mean similarity per layer:", np.round(before_after.similarity.mean(1), 3))
most_changed = divmod(int(order[0]), H)

# %% [markdown]
# ## Does the aspect word attend to its sentiment word?
#
# `relation_accuracy` asks, per head, whether the aspect word in the review puts its largest
# attention on its own sentiment adjective (seed 002's aspect → sentiment relation), before and
# after fine-tuning; fixed-offset baselines say what a head must beat.

# %%
relations = [compare.RelationExample(q, a, word, pair=r, query_segment=1, target_segment=1)
             for q, r, _, a, word, *_ in test_rows]
relation_before = compare.relation_accuracy(model, relations)
relation_after = compare.relation_accuracy(tuned.model, relations)
print("best heads before:", [(h, round(a, 2)) for h, a in relation_before.best_heads(3)])
print("best heads after: ", [(h, round(a, 2)) for h, a in relation_after.best_heads(3)])
gain = relation_after.accuracy - relation_before.accuracy
top = np.unravel_index(np.argmax(gain), gain.shape)
print(f"largest gain: head {head_label(*top)} {relation_before.accuracy[top]:.2f} → {relation_after.accuracy[top]:.2f}")
print("best fixed-offset baseline:", round(max(relation_before.offset_accuracy.values()), 2))

# %% [markdown]
# ## Sentence embeddings before and after
#
# Mean-pooled embeddings of the held-out pairs in their first two principal components,
# coloured by label: fine-tuning should pull the two classes apart.

# %%
labels = [r[2] for r in test_rows]
fig, axes = plt.subplots(1, 2, figsize=(12, 5))
for ax, (name, m) in zip(axes, [("before", model), ("after", tuned.model)]):
    vectors = np.asarray(m.sentence_embeddings(m.tokenize(questions, reviews)))
    coords, explained, _ = embeddings.pca(vectors)
    figures.pca_scatter(coords, labels, explained=explained, title=f"held-out pairs, {name} fine-tuning", ax=ax)
fig

# %% [markdown]
# ## An interventional run: fine-tune with the most-changed head ablated
#
# The same fine-tuning, same data order and seed, with head `most_changed` zeroed in every
# step (`hooks=`, the hooks `run_with_hooks` takes). If the head carried what the task needs,
# accuracy drops; if not, the other heads take over. Then compare the two fine-tuned models'
# attention.

# %%
ablation = interventions.ablate_heads(interventions.head_mask(*most_changed, L, H))
ablated = training.finetune(model, train, hooks=ablation, **SETTINGS)
ablated_accuracy = ablated.history.eval[-1]["accuracy"]
print(f"head {head_label(*most_changed)} ablated throughout: held-out accuracy {ablated_accuracy:.3f} "
      f"(without ablation {accuracy:.3f})")
between = compare.compare_models(tuned.model, ablated.model, questions, reviews)
print("mean similarity per layer, fine-tuned vs fine-tuned-with-ablation:", np.round(between.similarity.mean(1), 3))
expect(np.all(np.isfinite(between.similarity)), "both runs trained to finite weights",
       "a run diverged; look at its history.loss")
