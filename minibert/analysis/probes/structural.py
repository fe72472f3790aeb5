"""Structural probes (Hewitt & Manning 2019): a rank-r map B under which squared distances between word vectors
are tree distances (or squared norms are tree depths), trained as their released code does, scored by UUAS,
root accuracy and Spearman correlation."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from minibert.analysis.probes.features import split_sentences, word_features
from minibert.analysis.syntax import read_conllu
from minibert.errors import AnalysisError
from minibert.training.optim import adamw

STRUCTURAL_KINDS = ("distance", "depth")
PUNCTUATION = ("PUNCT",)  # UD's tag; their PTB code left out '' , . : `` -LRB- -RRB-
SPEARMAN_LENGTHS = range(5, 51)  # sentence lengths whose Spearman means are averaged, as their reports do


def tree_depths(heads: Sequence[int]) -> np.ndarray:
    """Edges from each word up to the root word (heads 1-indexed, 0 = ROOT as in CoNLL-U): [W]."""
    depths = np.zeros(len(heads), np.int64)
    for word in range(len(heads)):
        step, seen = word, 0
        while heads[step] != 0:
            step, seen = heads[step] - 1, seen + 1
            if seen > len(heads):
                raise AnalysisError(f"heads {list(heads)} contain a cycle; each word's chain must reach the root.")
        depths[word] = seen
    return depths


def tree_distances(heads: Sequence[int]) -> np.ndarray:
    """Path length between every two words of the tree: [W, W] (through their lowest common ancestor)."""
    chains = []
    for word in range(len(heads)):
        chain = [word]
        while heads[chain[-1]] != 0:
            chain.append(heads[chain[-1]] - 1)
        chains.append({node: steps for steps, node in enumerate(chain)})
    n = len(heads)
    distances = np.zeros((n, n), np.int64)
    for i in range(n):
        for j in range(n):
            distances[i, j] = min(steps + chains[j][node] for node, steps in chains[i].items() if node in chains[j])
    tree_depths(heads)  # a cycle would have looped above; heads past the sentence are the reader's error
    return distances


def _probe_values(B, x, kind):
    """Squared distances ‖B(h_i − h_j)‖² [..., W, W] or squared norms ‖B h_i‖² [..., W] of x [..., W, F]."""
    t = x @ B
    if kind == "depth":
        return jnp.sum(t**2, -1)
    return jnp.sum((t[..., :, None, :] - t[..., None, :, :]) ** 2, -1)


def structural_loss(B, x, targets, lengths, kind):
    """Their L1 loss: per sentence Σ |predicted − gold| over real words (pairs), divided by n (depth) or n²
    (distance), then the mean over the batch's sentences. x [S, W, F], targets [S, W(, W)] (−1: padding)."""
    real = targets >= 0
    per_sentence = jnp.sum(jnp.abs(_probe_values(B, x, kind) - targets) * real, axis=tuple(range(1, targets.ndim)))
    n = lengths.astype(x.dtype)
    return jnp.mean(per_sentence / (n if kind == "depth" else n**2))


@dataclasses.dataclass(frozen=True)
class Trees:
    """Sentences padded to W words: features [L, S, W, F], gold distances [S, W, W] or depths [S, W] (−1 on
    padding), lengths [S], punctuation [S, W] (UPOS PUNCT) and each sentence's root word [S]."""

    features: np.ndarray
    targets: np.ndarray
    lengths: np.ndarray
    punctuation: np.ndarray
    roots: np.ndarray
    kind: str

    def take(self, chosen) -> Trees:
        return Trees(self.features[:, chosen], self.targets[chosen], self.lengths[chosen], self.punctuation[chosen],
                     self.roots[chosen], self.kind)


def tree_data(model, sentences, kind: str = "distance", site: str | None = None, pool: str = "mean") -> Trees:
    """Features and gold targets of CoNLL-U trees (syntax.Sentence list) for a structural probe; a word's feature is
    the mean of its wordpieces' by default, as their BERT features are."""
    if kind not in STRUCTURAL_KINDS:
        raise AnalysisError(f"kind={kind!r}: a structural probe predicts 'distance' (word pairs) or 'depth' (words).")
    flat = word_features(model, [s.words for s in sentences], site, pool)
    lengths = np.array([len(s.words) for s in sentences])
    S, W = len(sentences), int(lengths.max())
    features = np.zeros((flat.values.shape[0], S, W, flat.values.shape[-1]), np.float32)
    targets = np.full((S, W, W) if kind == "distance" else (S, W), -1.0, np.float32)
    punctuation = np.zeros((S, W), bool)
    start = 0
    for s, sentence in enumerate(sentences):
        n = lengths[s]
        features[:, s, :n] = flat.values[:, start:start + n]
        start += n
        gold = tree_distances(sentence.heads) if kind == "distance" else tree_depths(sentence.heads)
        targets[(s, *np.ix_(*[range(n)] * gold.ndim))] = gold
        punctuation[s, :n] = [tag in PUNCTUATION for tag in sentence.upos or [""] * n]
    roots = np.array([sentence.heads.index(0) for sentence in sentences])
    return Trees(features, targets, lengths, punctuation, roots, kind)


@functools.partial(jax.jit, static_argnames=("kind", "optimizer"))
def _structural_step(B, state, x, targets, lengths, scale, *, kind, optimizer):
    """One Adam step of every layer's probe: B [L, F, K], x [L, S, W, F], scale [L] (each layer's learning rate over
    the optimiser's: Adam's step is linear in it, as when torch's scheduler lowers the rate) → (B, state, loss [L])."""
    def one_layer(B, state, x, scale):
        loss, grad = jax.value_and_grad(structural_loss)(B, x, targets, lengths, kind)
        updates, state = optimizer.update(grad, state, B)
        return optax.apply_updates(B, jax.tree.map(lambda u: u * scale, updates)), state, loss

    return jax.vmap(one_layer)(B, state, x, scale)


@functools.partial(jax.jit, static_argnames="kind")
def _structural_losses(B, x, targets, lengths, *, kind):
    return jax.vmap(structural_loss, in_axes=(0, 0, None, None, None))(B, x, targets, lengths, kind)


@dataclasses.dataclass
class _Regimen:
    """Hewitt & Manning's regimen.py, per layer: ReduceLROnPlateau(mode="min", factor=0.1, patience=0) on the dev
    loss (torch's defaults: threshold 1e-4 relative, eps 1e-8), parameters kept when the dev loss falls below the
    best kept − 1e-4, and training stopped once the best is more than 4 epochs old."""

    rate: np.ndarray  # [L] each layer's learning rate
    plateau_best: np.ndarray  # [L] the scheduler's best dev loss
    kept_loss: np.ndarray  # [L] dev loss of the kept parameters
    kept_epoch: np.ndarray  # [L]
    stopped: np.ndarray  # [L] bool

    @classmethod
    def start(cls, layers: int, learning_rate: float) -> _Regimen:
        return cls(np.full(layers, learning_rate), np.full(layers, np.inf), np.full(layers, np.inf),
                   np.full(layers, -1), np.zeros(layers, bool))

    def epoch_end(self, epoch: int, dev_loss: np.ndarray) -> np.ndarray:
        """Update every running layer after an epoch; returns [L] whether to keep its current parameters."""
        running = ~self.stopped
        plateau = running & ~(dev_loss < self.plateau_best * (1 - 1e-4))  # patience 0: one bad epoch lowers the rate
        self.plateau_best = np.where(running & ~plateau, dev_loss, self.plateau_best)
        lowered = self.rate * 0.1
        self.rate = np.where(plateau & (self.rate - lowered > 1e-8), lowered, self.rate)
        keep = running & (dev_loss < self.kept_loss - 1e-4)
        self.kept_loss = np.where(keep, dev_loss, self.kept_loss)
        self.kept_epoch = np.where(keep, epoch, self.kept_epoch)
        self.stopped |= running & ~keep & (self.kept_epoch < epoch - 4)
        return keep


def fit_structural_probes(trees: Trees, *, rank: int | None = None, learning_rate: float = 1e-3, epochs: int = 40,
                          batch_size: int = 20, dev: Trees | None = None, seed: int = 0,
                          init=None) -> tuple[np.ndarray, np.ndarray]:
    """Train every layer's B [F, rank] (rank None: F, their configs' full rank) with Adam on their L1 loss, B
    uniform in ±0.05 (theirs) unless init [L, F, rank] is given, batches of 20 sentences, up to 40 epochs.

    With dev, each layer follows their regimen (_Regimen): its learning rate drops ×0.1 after each epoch whose dev
    loss is no better, the B of its best epoch is kept, and it stops 5 epochs after that; training ends when every
    layer has stopped. Without dev, the last epoch's B is returned. Returns (B [L, F, rank], training loss per step
    [steps, L]; a stopped layer's steps do not move its B)."""
    L, _, _, F = trees.features.shape
    if init is None:
        init = jax.random.uniform(jax.random.key(seed), (L, F, rank or F), jnp.float32, -0.05, 0.05)
    B = jnp.asarray(init, jnp.float32)
    optimizer = adamw(learning_rate, max_grad_norm=None)  # Adam: no weight decay, no clipping, as theirs
    state = jax.vmap(optimizer.init)(B)
    rng = np.random.default_rng(seed)
    regimen = _Regimen.start(L, learning_rate)
    losses, best = [], B
    for epoch in range(epochs):
        scale = jnp.asarray(np.where(regimen.stopped, 0.0, regimen.rate / learning_rate), jnp.float32)
        order = rng.permutation(len(trees.lengths))
        for start in range(0, len(order), batch_size):
            part = trees.take(order[start:start + batch_size])
            B, state, loss = _structural_step(B, state, part.features, part.targets, part.lengths, scale,
                                              kind=trees.kind, optimizer=optimizer)
            losses.append(np.asarray(loss))
        if dev is None:
            best = B
            continue
        keep = regimen.epoch_end(epoch, np.asarray(_structural_losses(B, dev.features, dev.targets, dev.lengths,
                                                                      kind=trees.kind)))
        best = jnp.where(keep[:, None, None], B, best)
        if regimen.stopped.all():
            break
    return np.asarray(best), np.array(losses)


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1…n with ties given their average rank (as Spearman's ρ needs)."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(a, b) -> float:
    """Spearman's ρ: Pearson's correlation of the ranks (NaN when either side is constant)."""
    ra, rb = _ranks(np.asarray(a, np.float64)), _ranks(np.asarray(b, np.float64))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = np.sqrt((ra**2).sum() * (rb**2).sum())
    return float((ra * rb).sum() / denominator) if denominator > 0 else float("nan")


def spanning_tree_edges(distances: np.ndarray, punctuation: np.ndarray) -> set[tuple[int, int]]:
    """Edges (i < j) of the minimum spanning tree of the words that are not punctuation (Kruskal: pairs by
    increasing distance, ties in row-major order, as their evaluation builds it)."""
    kept = np.flatnonzero(~punctuation)
    parent = {int(i): int(i) for i in kept}

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    pairs = [(i, j) for i in kept for j in kept]
    edges = set()
    for i, j in sorted(pairs, key=lambda pair: distances[pair]):
        a, b = root(int(i)), root(int(j))
        if a != b:
            parent[a] = b
            edges.add((int(min(i, j)), int(max(i, j))))
    return edges


def uuas(predicted: Sequence[np.ndarray], trees: Trees) -> float:
    """Undirected unlabelled attachment score: the share of gold edges (the spanning tree of the gold
    distances, punctuation left out) that the spanning tree of the predicted distances has, over all sentences."""
    correct = total = 0
    for s, distances in enumerate(predicted):
        n = trees.lengths[s]
        gold = spanning_tree_edges(trees.targets[s, :n, :n], trees.punctuation[s, :n])
        correct += len(gold & spanning_tree_edges(np.asarray(distances)[:n, :n], trees.punctuation[s, :n]))
        total += len(gold)
    return correct / total


def mean_spearman(predicted: Sequence[np.ndarray], trees: Trees) -> float:
    """Spearman between predicted and gold values, per word's row (distance) or per sentence (depth), averaged
    within each sentence length, then over lengths 5–50 (their report); NaN when no sentence has 5–50 words."""
    by_length: dict[int, list[float]] = {}
    for s, values in enumerate(predicted):
        n = int(trees.lengths[s])
        cut = (slice(0, n),) * (2 if trees.kind == "distance" else 1)
        values, gold = np.asarray(values)[cut], trees.targets[s][cut]
        rows = zip(values, gold) if trees.kind == "distance" else [(values, gold)]
        by_length.setdefault(n, []).extend(spearman(p, g) for p, g in rows)
    means = [np.mean(by_length[n]) for n in SPEARMAN_LENGTHS if n in by_length]
    return float(np.mean(means)) if means else float("nan")


def root_accuracy(predicted: Sequence[np.ndarray], trees: Trees) -> float:
    """Share of sentences whose least deep predicted word (punctuation left out) is the gold root."""
    hits = []
    for s, depths in enumerate(predicted):
        n = trees.lengths[s]
        depths = np.where(trees.punctuation[s, :n], np.inf, np.asarray(depths)[:n])
        hits.append(int(np.argmin(depths)) == trees.roots[s])
    return float(np.mean(hits))


@dataclasses.dataclass
class StructuralResult:
    """Per layer on the test sentences: UUAS and distance Spearman, or root accuracy and depth Spearman."""

    kind: str
    spearman: np.ndarray  # [L]
    uuas: np.ndarray | None  # [L], distance probes
    root_accuracy: np.ndarray | None  # [L], depth probes
    B: np.ndarray  # [L, F, rank]
    losses: np.ndarray  # [steps, L] training loss

    def table(self) -> list[dict]:
        score = self.uuas if self.kind == "distance" else self.root_accuracy
        name = "uuas" if self.kind == "distance" else "root_accuracy"
        return [{"layer": layer, name: float(score[layer]), "spearman": float(self.spearman[layer])}
                for layer in range(len(self.spearman))]


def evaluate_structural(B: np.ndarray, trees: Trees) -> dict[str, np.ndarray]:
    """Their metrics for every layer's B on `trees`: {"spearman", "uuas" | "root_accuracy"} each [L]."""
    scores: dict[str, list[float]] = {}
    for layer in range(B.shape[0]):
        predicted = np.asarray(_probe_values(jnp.asarray(B[layer]), trees.features[layer], trees.kind))
        scores.setdefault("spearman", []).append(mean_spearman(predicted, trees))
        if trees.kind == "distance":
            scores.setdefault("uuas", []).append(uuas(predicted, trees))
        else:
            scores.setdefault("root_accuracy", []).append(root_accuracy(predicted, trees))
    return {name: np.array(values) for name, values in scores.items()}


def structural_probe(model, sentences, kind: str = "distance", *, site: str | None = None,
                     pool: str = "mean", dev: float = 0.1, test: float = 0.2, seed: int = 0,
                     **options) -> StructuralResult:
    """Hewitt & Manning's distance or depth probe on every layer, trained on a split of the trees and scored
    on the held-out test sentences. sentences: syntax.Sentence list or a CoNLL-U path. options:
    fit_structural_probes' (rank, learning_rate, epochs, batch_size)."""
    sentences = read_conllu(sentences) if isinstance(sentences, str) or hasattr(sentences, "read_text") else sentences
    trees = tree_data(model, sentences, kind, site, pool)
    splits = split_sentences(len(sentences), dev, test, seed)
    B, losses = fit_structural_probes(trees.take(splits["train"]),
                                      dev=trees.take(splits["dev"]) if len(splits["dev"]) else None, seed=seed,
                                      **options)
    scores = evaluate_structural(B, trees.take(splits["test"]))
    return StructuralResult(kind, scores["spearman"], scores.get("uuas"), scores.get("root_accuracy"), B, losses)


