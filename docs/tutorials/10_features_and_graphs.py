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
# # 10. Features, not heads: transcoders and attribution graphs
#
# **All data on this page is synthetic**, generated from templates below: short product reviews about a phone's
# battery, screen, camera, …; nothing here is a finding about real reviews. Tutorials 4 and 9 explained a number
# by *components* — heads, MLPs, the edges between them. Here we explain one by *features*, as Ameisen et al.
# (2025, "Circuit tracing") do:
#
# - a **transcoder** at every block stands in for its MLP: it reads the MLP's input and predicts its output
#   through a wide layer of sparse latents;
# - an **attribution graph** of one sentence traces a number — here the sentence vector's component along a
#   direction that tells battery reviews from screen reviews — back through those latents at each layer and
#   position, the transcoders' errors and the token embeddings;
# - we **intervene** on the real model (ablate and steer the graph's top features, the errors held) and compare
#   the number's change with what the graph predicts;
# - and **export** the graph for circuit-tracer's viewer and draw it.
#
# The definitions are in [Transcoders](../transcoders.md) and [Attribution graphs](../graphs.md). **It is small on
# purpose** (this page runs in CI on two cores): 256 latents per transcoder, a few hundred training steps on a few
# hundred sentences. Small transcoders reconstruct their MLPs poorly, and the graph's error nodes carry what they
# miss; read the numbers as a demonstration of the tools, not as findings about MiniLM.
#
# One design note: a graph's target here is a *sentence-vector direction*, because MiniLM (a sentence-transformers
# checkpoint) has no masked-LM head; on a model with one, `graphs.mlm_target` explains a logit at a `[MASK]`.

# %%
import random
import tempfile
from pathlib import Path

import numpy as np

import minibert
from minibert.analysis import graphs, transcoders
from minibert.app.tutorials import expect
from minibert.viz import graphs as graph_views

model = minibert.load()  # all-MiniLM-L6-v2: 6 layers, 384 wide, no masked-LM head
L, D = model.config.num_hidden_layers, model.config.hidden_size

# %% [markdown]
# ## Synthetic reviews
#
# Each review names one aspect of a phone with a sentiment word, in one of a few templates.

# %%
ASPECTS = ["battery", "screen", "camera", "speaker", "keyboard", "case", "charger", "price"]
POSITIVE = ["great", "excellent", "lovely", "good", "wonderful", "superb", "fine", "brilliant"]
NEGATIVE = ["awful", "terrible", "bad", "poor", "horrible", "dreadful", "weak", "disappointing"]
TEMPLATES = ["the {a} is {s} .", "i think the {a} is {s} .", "honestly , the {a} was {s} .",
             "the {a} on this phone is {s} .", "my new phone has a {s} {a} .", "what a {s} {a} !"]


def reviews(n: int, seed: int, aspects=ASPECTS):
    """n short reviews, each about one of `aspects`, half positive and half negative."""
    rng = random.Random(seed)
    return [rng.choice(TEMPLATES).format(a=rng.choice(aspects), s=rng.choice(POSITIVE if i % 2 else NEGATIVE))
            for i in range(n)]


corpus = reviews(400, seed=0)
held_out = reviews(64, seed=1)
print(corpus[:3])

# %% [markdown]
# ## A transcoder at every block
#
# `transcoders.sites(model, layer)` names the MLP's input and output hooks (in MiniLM, a post-LN BERT:
# `blocks.l.ln1.hook_out` and `blocks.l.hook_mlp_out`). `transcoders.activations` packs the texts, runs the model
# once per batch and streams the real tokens' (input, output) pairs. We read each layer's pairs once and train on
# them for several passes; TopK keeps each token's 8 largest latents of 256.
#
# Two numbers per layer: **FVU** of the MLP output on held-out tokens (0 perfect; 1 no better than the mean
# output), and the **spliced fidelity** — the cosine between the sentence embeddings with the transcoder in place
# of the MLP and without it (this model has no masked-LM head to score a loss with).

# %%
D_SAE, K, PASSES = 256, 8, 24
pairs, report = [], []
for layer in range(L):
    hook_in, hook_out = transcoders.sites(model, layer)
    config = transcoders.TranscoderConfig(d_in=D, d_sae=D_SAE, d_out=D, layer=layer, architecture="topk", k=K,
                                          hook_in=hook_in, hook_out=hook_out)
    batches = list(transcoders.activations(model, corpus, layer, batch_size=256))
    trainer = transcoders.Trainer(config, learning_rate=2e-3, warmup=20, dead_tokens=256 * 20)
    trainer.center(np.concatenate([y for _, y in batches]))
    history = [step for _ in range(PASSES) for step in trainer.train(batches)]
    held_out_pairs = transcoders.token_pairs(model, held_out, layer)  # (x, y) and the site: evaluate checks it
    scores = transcoders.evaluate(trainer.config, trainer.params, held_out_pairs)
    fidelity = transcoders.spliced_fidelity(model, trainer.config, trainer.params, held_out)
    pairs.append((trainer.config, trainer.params))
    report.append((scores["fvu"], fidelity))
    print(f"layer {layer}: {trainer.steps} steps, L0 {scores['l0']:.1f}, FVU {scores['fvu']:.3f}, "
          f"dead latents {scores['dead']:.2f}, spliced cosine {fidelity['cosine']:.3f}")

fvu = np.array([f for f, _ in report])
expect(np.all(fvu < 1), "every transcoder predicts its MLP's held-out output better than the mean output (FVU < 1)",
       "a transcoder no better than the mean has learnt nothing: give it more steps or text")

# %% [markdown]
# Read these as what they are: on a few hundred template sentences the transcoders leave around a tenth of each
# MLP output's variance unexplained, more than half of their latents never fire on the held-out reviews (dead),
# and swapping in even one of them moves the sentence embeddings. Real transcoders are trained on hundreds of
# millions of tokens with thousands of latents. What the small ones miss is not lost below: the graph keeps it in
# its error nodes.

# %% [markdown]
# ## A direction that tells battery reviews from screen reviews
#
# The sentence vector is the mean of the last hidden states over the row, as the target `graphs.direction_target`
# reads it (`sentence_embeddings(mode="mean", normalize=False)`: the same pooling, without the checkpoint's L2
# normalisation). The direction is the difference of the two groups' mean sentence vectors.

# %%
battery, screen = reviews(48, seed=2, aspects=["battery"]), reviews(48, seed=3, aspects=["screen"])
vectors = {name: np.asarray(model.sentence_embeddings(texts, mode="mean", normalize=False))
           for name, texts in (("battery", battery), ("screen", screen))}
direction = vectors["battery"].mean(0) - vectors["screen"].mean(0)
projection = {name: v @ direction for name, v in vectors.items()}
print({name: (round(float(p.mean()), 2), round(float(p.std()), 2)) for name, p in projection.items()},
      "(mean, std of each group's projection)")
expect(projection["battery"].min() > projection["screen"].max(),
       "the direction separates every battery review from every screen review",
       "the two groups overlap along the difference of their means")

# %% [markdown]
# ## The attribution graph of one review
#
# `graphs.attribute` runs the model once on the review, recording every attention pattern and LayerNorm scale, and
# builds the local replacement model: the model's own stages with patterns and scales frozen and every MLP replaced
# by its transcoder's latents plus an error node. In that replacement the target is affine in the writes, so each
# edge is a direct effect and every node's value is the sum of its incoming edges plus a bias. `graphs.prune` keeps
# the nodes carrying 80% of the influence on the target and the edges carrying 98%.
#
# The **replacement score** is the share of the input's influence on the target that reaches it through features
# rather than error nodes; the **completeness score** the share of the nodes' inputs that do not come from errors
# (both 1 for perfect transcoders).

# %%
TEXT = "the battery on this phone is excellent ."
target = graphs.direction_target(direction, pooling="mean")
graph = graphs.attribute(model, TEXT, pairs, target)
pruned = graphs.prune(graph, node_threshold=0.8, edge_threshold=0.98)
replacement, completeness = graphs.graph_scores(graph)
print(f"tokens: {graph.tokens}")
print(f"target {float(graph.target_values[0]):.3f}; {graph.n_features} active features; the pruned graph keeps "
      f"{pruned.n_nodes} nodes and {pruned.n_edges} edges")
print(f"replacement score {replacement:.3f}, completeness score {completeness:.3f}")
expect(abs(float(graph.remainder[0])) < 1e-3 * max(1.0, abs(float(graph.target_values[0]))),
       "the target is linear in the last hidden state (its remainder beyond ⟨g, h⟩ is rounding)",
       "a sentence-vector direction through a frozen last LayerNorm should have no remainder")

# %% [markdown]
# The features with the largest direct effect on the target, among those the pruning kept (an edge weight is the
# feature's activation times how much one unit of it moves the target through the frozen replacement):

# %%
n = graph.n_features
direct = graph.adjacency[-1, :n]
kept = np.flatnonzero(pruned.node_mask[:n])
top = kept[np.argsort(-np.abs(direct[kept]))][:5]
for node in top:
    layer, pos, latent = (int(v) for v in graph.active_features[node])
    print(f"  {graph.node_label(node):>12}  layer {layer}, position {pos} {graph.tokens[pos]!r}: activation "
          f"{graph.activations[node]:.2f}, direct effect on the target {direct[node]:+.3f}")
errors = graph.adjacency[-1, graph.error_slice].sum()
print(f"all features' direct effects {direct.sum():+.3f}, the error nodes' {errors:+.3f}")

# %% [markdown]
# ## Does the graph predict what the real model does?
#
# `graphs.intervene` runs the real model with every MLP replaced by its transcoder on the *live* MLP input and the
# error nodes held at the clean run's values, so the run without changes is the clean run. Attention patterns and
# LayerNorm scales are held too (`freeze=True`, as circuit-tracer does), which is the setting the graph's
# first-order prediction is made in. We ablate each top feature alone, then all of them together, and steer the
# first one by its own activation (doubling it). The graph cannot foresee a TopK latent switching on or off
# downstream, so prediction and change need not agree to rounding; they should agree in sign and roughly in size.

# %%
rows = []
for node in top:
    key = tuple(int(v) for v in graph.active_features[node])
    result = graphs.intervene(model, TEXT, pairs, graph, {key: 0.0}, mode="clamp")
    rows.append((f"ablate {graph.node_label(node)}", float(result.change[0]), float(result.predicted[0])))
keys = {tuple(int(v) for v in graph.active_features[node]): 0.0 for node in top}
together = graphs.intervene(model, TEXT, pairs, graph, keys, mode="clamp")
rows.append(("ablate all five", float(together.change[0]), float(together.predicted[0])))
first = tuple(int(v) for v in graph.active_features[top[0]])
steered = graphs.intervene(model, TEXT, pairs, graph, {first: float(graph.activations[top[0]])}, mode="steer")
rows.append((f"steer {graph.node_label(top[0])} ×2", float(steered.change[0]), float(steered.predicted[0])))
print(f"{'intervention':<28}{'real change':>12}{'graph says':>12}")
for name, change, predicted in rows:
    print(f"{name:<28}{change:>+12.3f}{predicted:>+12.3f}")

changes, predictions = np.array([r[1] for r in rows]), np.array([r[2] for r in rows])
expect(np.all(np.sign(changes) == np.sign(predictions)),
       "every intervention moves the target the way the graph predicts",
       "a feature whose ablation moves the target against the graph's sign: downstream latents switched on or off")
expect(np.all(np.abs(changes - predictions) <= 0.5 * np.abs(predictions)),
       "each real change is within half of the graph's prediction",
       "the first-order prediction missed by more than half: look at which latents the change switched")

# %% [markdown]
# The graph ranked these features, so ablating them should move the target more than ablating as many of the
# review's other active features, drawn at random:

# %%
rng = np.random.default_rng(0)
others = rng.choice(np.setdiff1d(np.arange(n), top), size=(8, len(top)), replace=True)
random_changes = [float(graphs.intervene(model, TEXT, pairs, graph,
                                         {tuple(int(v) for v in graph.active_features[i]): 0.0 for i in pick},
                                         mode="clamp").change[0]) for pick in others]
print(f"ablating the top five: {together.change[0]:+.3f}; five random active features (8 draws): "
      f"{np.round(random_changes, 3)}")
expect(abs(float(together.change[0])) > np.max(np.abs(random_changes)),
       "ablating the graph's top five features moves the target more than any of 8 random sets of five",
       "the graph's ranking is no better than chance on this review")

# %% [markdown]
# ## Export and draw
#
# `graphs.write_json` prunes the graph and writes circuit-tracer's frontend format (its viewer opens the file);
# `graph_views.graph_figure` draws the pruned graph: embeddings at the bottom, the target at the top, positions
# across, edges as wide as their weight. Both refuse an existing file unless `overwrite=True`; we write into a
# temporary folder.

# %%
with tempfile.TemporaryDirectory() as directory:
    written = graphs.write_json(graph, Path(directory) / "battery.json", slug="battery")
    figure = graph_views.graph_figure(pruned, path=Path(directory) / "battery.png")
    print(f"{written.name}: {written.stat().st_size // 1024} KiB; battery.png: "
          f"{(Path(directory) / 'battery.png').stat().st_size // 1024} KiB")
figure
