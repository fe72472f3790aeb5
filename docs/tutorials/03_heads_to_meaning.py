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
# # 3. From heads to meaning: groups of similar sentences
#
# A common first look at a model (here, the workflow of a company blog post on its
# fine-tuned BERT) takes small groups of sentences that mean nearly the same thing and asks:
#
# 1. Where do their **sentence vectors** land, relative to each other? (PCA of the embeddings.)
# 2. How much **attention** does a chosen word receive, layer by layer?
# 3. Which **single heads** connect that word to others, token to token?
#
# We run it on the bundled all-MiniLM-L6-v2 with `minibert.analysis.embeddings` and
# `minibert.viz.figures`. Layers and heads are 0-indexed in code and printouts; figures label
# them 1-indexed (layer 1 = code's layer 0; head "L-H" as in Clark et al.).

# %%
# %matplotlib inline
import re

import matplotlib.pyplot as plt
import numpy as np

import minibert
from minibert.analysis import embeddings, words
from minibert.app.tutorials import expect  # prints each claim and what it means when it fails
from minibert.viz import figures

model = minibert.load()
L = model.config.num_hidden_layers

groups = {
    "mistake": ["I made the mistake.", "You made the mistake.", "This was my mistake.", "This was your mistake.",
                "This was his mistake.", "This was a mistake."],
    "apology": ["This will get e-recorded instead.", "This will get e-recorded instead sorry.",
                "Sorry this will get e-recorded instead.", "I will over night it tomorrow morning.",
                "I will over night it tomorrow morning sorry.", "Sorry I will over night it tomorrow morning."],
    "good": ["It's acceptable.", "It's correct.", "It's fine.", "It's ok.", "It's good."],
}
texts = [text for group in groups.values() for text in group]
group_of = [name for name, group in groups.items() for _ in group]

# %% [markdown]
# ## Sentence vectors and PCA
#
# A sentence vector is the mean of the last layer's token vectors over the real tokens
# (`sentence_vectors(model, texts, pooling="mean")`; "cls" takes the `[CLS]` vector). PCA
# projects the 384-dimensional vectors onto the two directions of largest variance.

# %%
vectors = embeddings.sentence_vectors(model, texts)
coords, explained, _ = embeddings.pca(vectors)
print(f"{vectors.shape[0]} sentences × {vectors.shape[1]} dims; the first two components explain "
      f"{explained[0]:.1%} and {explained[1]:.1%} of the variance")
figures.pca_scatter(coords, group_of, texts, explained, title="all groups")

# %% [markdown]
# Across groups the picture is dominated by topic. Inside one group the differences are
# subtler, so we run PCA per group and colour each sentence by a property we suspect matters:
# the syntactic role of "mistake", where "sorry" stands, how formal the approval is.

# %%
properties = {
    "mistake": ["made the …", "made the …", "possessive", "possessive", "possessive", "a …"],
    "apology": ["no sorry", "sorry last", "sorry first", "no sorry", "sorry last", "sorry first"],
    "good": ["formal", "formal", "plain", "plain", "plain"],
}
fig, axes = plt.subplots(1, 3, figsize=(19, 5.2), constrained_layout=True)
per_group = {}
for ax, (group, sentences) in zip(axes, groups.items()):
    per_group[group], ratio, _ = embeddings.pca(embeddings.sentence_vectors(model, sentences))
    figures.pca_scatter(per_group[group], properties[group], sentences, ratio, ax=ax, title=group)
plt.show()


def separates(values, labels, side_a, side_b):
    """True when every `side_a` sentence lies on the other side of 0 than every `side_b` sentence."""
    a = np.array([v for v, label in zip(values, labels) if label in side_a])
    b = np.array([v for v, label in zip(values, labels) if label in side_b])
    return bool((a.max() < 0 < b.min()) or (b.max() < 0 < a.min()))


checks = {
    "mistake, PC 1: 'made the mistake' vs 'was <possessive> mistake'":
        separates(per_group["mistake"][:, 0], properties["mistake"], {"made the …"}, {"possessive"}),
    "good, PC 1: 'acceptable'/'correct' vs 'fine'/'ok'/'good'":
        separates(per_group["good"][:, 0], properties["good"], {"formal"}, {"plain"}),
    "apology, PC 2: without 'sorry' vs with 'sorry'":
        separates(per_group["apology"][:, 1], properties["apology"], {"no sorry"}, {"sorry last", "sorry first"}),
}
for check, holds in checks.items():
    print(f"{'yes' if holds else 'no '}  {check}")
expect(all(checks.values()), "every check above holds", "the lines marked 'no' are the ones that changed.")

# %% [markdown]
# The blog post saw the same kinds of split in its own fine-tuned model: "mistake" as a
# direct object versus after a possessive, formal versus plain approval. In the apology
# group, the first component separates the two base sentences, and the second separates
# sentences with "sorry" from those without — here wherever "sorry" stands (the post found
# a sentence-initial "Sorry" set apart in its model).
#
# ## Attention paid to a chosen word, by layer
#
# `attention_to_word(model, texts, word)` returns, for each sentence and layer, the attention
# the word receives: summed over the query rows and the word's wordpieces, averaged over heads
# — in "tokens' worth" (1.0 = one token's whole attention row). For the "good" group the
# chosen word is each sentence's own adjective.

# %%
# A sentence you edited so that it no longer has the whole word "mistake" is left out here, with a note.
kept = [r for r, text in enumerate(groups["mistake"]) if re.search(r"\bmistake\b", text.lower())]
for r, text in enumerate(groups["mistake"]):
    if r not in kept:
        print(f"note: {text!r} has no word 'mistake'; it is left out of the attention to 'mistake' below.")
if not kept:
    print("note: no sentence of the group has the word 'mistake'; using 'It was a mistake.' for this part.")
mistake_texts = [groups["mistake"][r] for r in kept] or ["It was a mistake."]
mistake_properties = [properties["mistake"][r] for r in kept] or ["a …"]
mistake = words.attention_to_word(model, mistake_texts, "mistake")  # [N, L]
with_sorry = [text for text in groups["apology"] if "sorry" in text.lower()]
sorry = words.attention_to_word(model, with_sorry, "sorry")
adjectives = [text.split()[-1].rstrip(".") for text in groups["good"]]
good = np.concatenate([words.attention_to_word(model, [text], word)
                       for text, word in zip(groups["good"], adjectives)])

fig, axes = plt.subplots(1, 3, figsize=(19, 4.6), constrained_layout=True)
figures.attention_to_word_plot(mistake, mistake_texts, word="mistake", groups=mistake_properties, ax=axes[0])
figures.attention_to_word_plot(sorry, with_sorry, word="sorry", ax=axes[1])
figures.attention_to_word_plot(good, groups["good"], word="the adjective", groups=properties["good"], ax=axes[2])
plt.show()

# %% [markdown]
# The post's observation was that within a group the curves start together in the shallow
# layers and spread apart in the deeper ones. The spread across sentences (standard
# deviation) per layer, and its ratio last layer / first layer:

# %%
for group, values in (("mistake", mistake), ("sorry", sorry), ("good", good)):
    spread = values.std(0)
    print(f"{group:>8s}: " + "  ".join(f"{s:.3f}" for s in spread) + f"   last/first = {spread[-1] / spread[0]:.1f}")
expect(mistake.std(0)[-1] > 3 * mistake.std(0)[0],
       "attention to 'mistake' spreads out over the layers (last layer's spread over 3× the first's)",
       "with other sentences the spread may grow less: the ratios are printed above.")
print("\nattention received by 'sorry' in the last layer:")
for text, value in zip(with_sorry, sorry[:, -1]):
    print(f"  {value:.2f}  {text}")

# %% [markdown]
# For the "mistake" group the spread in the last layers is several times that of the first
# (the code asserts it); for the other two groups the printout shows how far the pattern holds.

# %% [markdown]
# ## Token-to-token patterns of single heads
#
# Clark et al. found heads that follow syntax in BERT-base: in head 8-10 (1-indexed) direct
# objects attend to their verbs; in 7-6, possessive pronouns attend to their noun. We look for
# such heads in this model: for the direct object, the attention from "mistake" to "made"
# in both "… made the mistake." sentences; for the possessive, from "my"/"your"/"his" to
# "mistake". Each head is scored by its mean over the sentences.

# %%
batch = model.tokenize(mistake_texts)
_, cache = model.run_with_cache(batch, names="blocks.*.attn.hook_pattern")
patterns = np.asarray(cache.stack("attn.hook_pattern"))  # [L, B, H, T, S]


def attention_between(rows, source, target):
    """[L, H]: mean over the sentences `rows` of the attention from token `source` to token `target`."""
    return np.mean([patterns[:, r, :, batch.tokens[r].index(source(r)), batch.tokens[r].index(target(r))]
                    for r in rows], axis=0)


rows_with_made = [r for r, tokens in enumerate(batch.tokens) if "made" in tokens]  # "… made the mistake."
verb_object = attention_between(rows_with_made, lambda r: "mistake", lambda r: "made")
POSSESSIVES = {"my", "your", "his", "her", "their", "our"}
rows_with_possessive = [r for r, tokens in enumerate(batch.tokens) if POSSESSIVES & set(tokens)]  # found in the text
possessive = attention_between(rows_with_possessive, lambda r: next(t for t in batch.tokens[r] if t in POSSESSIVES),
                               lambda r: "mistake")
best = {}
for relation, values in (("object → verb", verb_object), ("possessive → noun", possessive)):
    layer, head = np.unravel_index(values.argmax(), values.shape)
    best[relation] = (int(layer), int(head))
    print(f"{relation}: head {figures.head_label(layer, head)} (L-H, 1-indexed): "
          f"mean attention {values[layer, head]:.2f}")

# %% [markdown]
# A check against the obvious alternative: a possessive pronoun sits right before its noun, so a
# *next-token* head also "attends from the possessive to its noun". Is the best possessive head
# one that attends to the next token in general?

# %%
n_tokens = batch.attention_mask.sum(1)
next_share = np.mean([np.mean([patterns[:, r, :, t, t + 1] for t in range(int(n) - 1)], axis=0)
                      for r, n in enumerate(n_tokens)], axis=0)  # [L, H]
layer, head = best["possessive → noun"]
top_layer, top_head = (int(i) for i in np.unravel_index(next_share.argmax(), next_share.shape))
print(f"head {figures.head_label(layer, head)} (L-H, 1-indexed) puts {next_share[layer, head]:.2f} of its attention "
      f"on the next token on average; the most next-token head, {figures.head_label(top_layer, top_head)}, puts "
      f"{next_share.max():.2f}")
expect(next_share[layer, head] < next_share.max() / 2,
       "the possessive head is not mainly a next-token head (under half the most next-token head's share)",
       "then it may just follow the next token: compare the two numbers printed above.")

# %% [markdown]
# So the possessive head is not mainly a next-token head: it singles out the noun after a
# possessive more than it follows the next token in general.

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), constrained_layout=True)
for ax, (relation, (layer, head)), row in zip(axes, best.items(), (rows_with_made[0], rows_with_possessive[0])):
    n = int(n_tokens[row])
    figures.attention_heatmap(patterns[layer, row, head, :n, :n], batch.tokens[row][:n], ax=ax,
                              title=f"{relation}: head {figures.head_label(layer, head)}")
plt.show()
for row in rows_with_made:  # the object → verb head is the best head in each sentence, not only on average
    single = attention_between([row], lambda r: "mistake", lambda r: "made")
    expect(np.unravel_index(single.argmax(), single.shape) == best["object → verb"],
           f"sentence {row}: the object → verb head is also the best head in this sentence alone",
           "the average hides sentences where another head wins: print `single` for this row.")

# %% [markdown]
# With a handful of sentences such heads are suggestive, not established: the blog post
# itself warns against leaping to conclusions from simple examples. Clark et al. measured
# them over a treebank — `minibert.analysis.syntax.dependency_accuracy` does that with gold
# dependency trees (a sample of UD English EWT is bundled).
