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
# # 8. Probes and sparse autoencoders
#
# Attention maps show where a head looks; probes and sparse autoencoders ask what the
# activations *encode*. Both are small models trained on a frozen encoder: a **probe**
# predicts a labelled property (a part of speech, a tree distance) from one layer's
# activations; a **sparse autoencoder** (SAE) rewrites them as a sparse sum of learned
# directions, with no labels at all. Definitions: the *Probes and SAEs* page.
#
# **Data sizes are tiny on purpose** (this page runs in CI on two cores): the bundled sample
# treebank has 36 hand-annotated sentences, and every other text here is *generated* below
# (templated sentences, their numbers and their pairings).
# The numbers show how the tools work, not findings about the model; bring UD English EWT for
# real ones.

# %%
import random
import tempfile
from pathlib import Path

import numpy as np

import minibert
from minibert.analysis import probes, sae, syntax
from minibert.app.tutorials import expect
from minibert.viz.features import feature_browser

model = minibert.load()  # all-MiniLM-L6-v2: 6 layers, width 384
sentences = syntax.read_conllu(syntax.sample_treebank())
print(len(sentences), "sentences,", sum(len(s.words) for s in sentences), "words")

# %% [markdown]
# ## Linear probes for parts of speech, with a control task
#
# One logistic-regression probe per layer reads each word's first wordpiece at
# `hook_resid_post`; all six train at once in one compiled program. The **control task**
# (Hewitt & Liang 2019) gives every word type a random tag drawn from the same tag
# distribution: a probe that does well there memorises words rather than reading syntax.
# **Selectivity** = accuracy − control accuracy. Intervals are 95% bootstrap intervals over
# the held-out sentences.

# %%
upos = probes.token_probe(model, [s.words for s in sentences], [s.upos for s in sentences], l2=1e-2, samples=500)
for row in upos.table():
    print(f"layer {row['layer']}: accuracy {row['accuracy']:.2f} [{row['low']:.2f}, {row['high']:.2f}]  "
          f"control {row['control']:.2f}  selectivity {row['selectivity']:+.2f}")
majority = max(np.mean([t == tag for s in sentences for t in s.upos]) for tag in {t for s in sentences for t in s.upos})
expect(upos.accuracy.max() > majority, f"the best layer beats always guessing the most frequent tag ({majority:.2f})",
       "the probe learnt less than the tag frequencies: check the labels line up with the words.")

# %% [markdown]
# ## A fact computable offline: is the word a number?
#
# Generated sentences mix words and numbers; the label is whether a word is made of digits.
# Any layer should find this easy — the point is the recipe for your own labels.

# %%
rng = random.Random(0)
nouns = ["cat", "dog", "house", "river", "song", "idea", "train", "letter"]
generated = [[rng.choice(["the", "a", "one"]), rng.choice(nouns), "had", str(rng.randint(2, 999)),
              rng.choice(nouns) + "s"] for _ in range(60)]
digits = probes.token_probe(model, generated, [[w.isdigit() for w in s] for s in generated], control=False,
                            samples=500)
print("is a number, accuracy per layer:", np.round(digits.accuracy, 2))
expect(digits.accuracy.min() >= 0.9, "every layer tells numbers from words (accuracy ≥ 0.9)",
       "some layer lost the surface form of its tokens; look at that layer's accuracy and interval.")

# %% [markdown]
# ## A fact of sentence pairs: is the token in sentence B?
#
# For labels that come from the tokenization itself, `token_features` gives every token of
# texts or pairs (no `[CLS]`/`[SEP]`) with its text and its segment. Here the same generated
# sentences are paired up, and the probe predicts whether a token belongs to the second text.
# The control task gives every token type one random label, so a probe cannot pass it by
# remembering which words come second: the pairs draw their words from the same lists.

# %%
pair_features = probes.token_features(model, [" ".join(s) for s in generated[:30]],
                                      [" ".join(s) for s in generated[30:]])
in_b = pair_features.segment.tolist()
segment = probes.probe(pair_features, in_b, samples=500)
segment.control = probes.probe(pair_features, probes.control_labels(list(pair_features.tokens), in_b), samples=500)
for row in segment.table():
    print(f"layer {row['layer']}: in sentence B {row['accuracy']:.2f}, control {row['control']:.2f}, "
          f"selectivity {row['selectivity']:+.2f}")
expect(segment.selectivity.min() > 0, "every layer reads 'in sentence B' better than its control task",
       "a layer's probe does no better than memorising token types: the segment is not linearly there.")

# %% [markdown]
# The control task scores high as well: these generated pairs use a dozen words and some
# numbers, so a linear probe can memorise a label for every token type it sees. Selectivity,
# what is left above that, is small here; a larger vocabulary (real text) makes memorising
# harder and the control a stronger baseline.

# %% [markdown]
# ## Structural probes: trees as distances
#
# Hewitt & Manning's distance probe learns B so that ‖B(h_i − h_j)‖² matches the number of
# edges between words i and j in the dependency tree. UUAS compares the minimum spanning tree
# of the predicted distances with the gold tree (punctuation left out); Spearman compares the
# distances themselves. Thirty-six sentences train a rank-32 probe poorly; expect low numbers.

# %%
distance = probes.structural_probe(model, sentences, "distance", rank=32, epochs=20, batch_size=8)
for row in distance.table():
    print(f"layer {row['layer']}: UUAS {row['uuas']:.2f}, Spearman {row['spearman']:.2f}")
expect(np.all((distance.uuas >= 0) & (distance.uuas <= 1)), "UUAS is a share of gold edges, in [0, 1]",
       "the spanning trees were compared wrongly.")

# %% [markdown]
# ## Clark et al.'s attention-based probe
#
# Clark et al. (2019, Table 3) predict each word's syntactic head from *every* head's word-level
# attention at once: the score of candidate j for word i is Σ_k w_k(v_i ⊕ v_j)·α^k_ij, over all
# heads in both directions, with the weights a linear function of the two words' embeddings.
# They used GloVe vectors for v; we use the model's own input embeddings. Their baseline sees
# only word distances and the embeddings. Both report UAS (punctuation not scored).

# %%
for kind in probes.CLARK_PROBES:
    uas, _ = probes.clark_probe(model, sentences, kind, epochs=2)
    print(f"{kind}: UAS {uas:.2f} on {round(0.2 * len(sentences))} held-out sentences")
    expect(0 <= uas <= 1, f"{kind}'s UAS is a share of scored words", "the heads were scored wrongly.")

# %% [markdown]
# ## A sparse autoencoder on layer 3's residual stream
#
# A TopK SAE (Gao et al. 2024) with 512 latents, 16 active per token, trained on activations
# streamed from a generated corpus of templated sentences (packed several to a row as the survey
# packs them, shuffled in a bounded buffer), four passes over it. The decoder's bias starts at
# the mean activation. `sae.activations` also reads corpus files and can cache to disk.

# %%
subjects = ["the cat", "my sister", "the old train", "a small bird", "the committee", "our teacher"]
verbs = ["saw", "painted", "ignored", "described", "followed", "remembered"]
objects = ["the river", "a red house", "the letter", "three songs", "the map", "an idea"]
places = ["in Paris", "at night", "on Monday", "near the station", "in 1999", "after lunch"]
corpus = [f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} {rng.choice(places)}."
          for _ in range(600)]
hook = "blocks.3.hook_resid_post"
config = sae.SAEConfig(d_in=384, d_sae=512, k=16, hook_name=hook, model_name="all-MiniLM-L6-v2")
trainer = sae.Trainer(config, learning_rate=2e-3, warmup=20, dead_tokens=20_000)
trainer.center(sae.token_activations(model, corpus[:64], hook))
history = trainer.train(sae.activations(model, corpus * 4, hook, batch_size=128, buffer_tokens=2048))
print(f"{len(history)} steps; loss {history[0]['total']:.1f} → {history[-1]['total']:.2f}")
held_out = sae.token_activations(model, corpus[:64], hook)
metrics = sae.evaluate(config, trainer.params, held_out)
print({name: round(value, 3) for name, value in metrics.items() if name != "frequency"})
expect(history[-1]["total"] < history[0]["total"] and metrics["fvu"] < 1,
       "training lowered the loss, and the SAE explains part of the variance (FVU < 1)",
       "the SAE learnt nothing: try a higher learning rate or more passes.")

# %% [markdown]
# **Spliced-in fidelity**: run the model with the SAE's reconstruction written in place of
# layer 3's residual stream. This checkpoint is a sentence-transformer, so we compare sentence
# embeddings (cosine 1 would be a perfect substitute).

# %%
fidelity = sae.spliced_fidelity(model, config, trainer.params, corpus[:32])
print(fidelity)
expect(-1 <= fidelity["cosine"] <= 1, "the spliced-in run gives sentence vectors, compared by their cosine",
       "the spliced run failed to give sentence embeddings.")

# %% [markdown]
# The feature browser shows, per latent, the contexts it fires on most, its activation
# histogram and the tokens nearest its decoder direction. It is one offline HTML file; the SAE
# saves in SAELens' layout, so SAELens can load it too.

# %%
with tempfile.TemporaryDirectory() as directory:
    page = feature_browser(model, config, trainer.params, corpus[:200]).save(Path(directory) / "features.html")
    sae.save(Path(directory) / "sae", config, trainer.params)
    files = sorted(p.name for p in (Path(directory) / "sae").iterdir())
    print(page.name, f"{page.stat().st_size / 1e3:.0f} kB;", files)
    loaded_config, loaded = sae.load(Path(directory) / "sae")
expect(loaded_config == config and all(np.array_equal(loaded[k], np.asarray(v)) for k, v in trainer.params.items()),
       "the SAE reads back from SAELens' layout exactly", "saving or loading changed the SAE.")
