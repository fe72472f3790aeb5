"""`minibert demo`: the seed analyses on the bundled sentences, written into one folder.

    model = minibert.load()
    paths, result = build(model, "out")   # figures/, three views, statistics, index.html
    print(report.head_summary(result.mean, result.documents, model.tokenizer))   # minibert.viz.report

The sentences live in `minibert/data/demo.json`: seed 000's groups of similar sentences (each with
a label that colours it and the word whose attention is followed) and seed 004's MRPC pair.
What is written, under `out`:

    figures/pca.{png,svg}                PCA of each group's sentence vectors (seed 000, Fig. 1)
    figures/attention_to_word.{png,svg}  attention paid to the chosen word, by layer (seed 000, Fig. 2)
    figures/head_heatmap.{png,svg}       the head where "mistake" attends most to "made" (seed 000, Fig. 3)
    figures/head_grid.{png,svg}          layers × heads for the pair
    figures/neuron.{png,svg}             q, k, q×k, q·k, softmax for one query of the pair (seed 001)
    figures/head_statistics.{png,svg}    Clark et al.'s head statistics over the demo's sentences
    figures/head_mds.{png,svg}           heads placed by the Jensen–Shannon distance of their attention
    head_view.html  model_view.html  neuron_view.html   the pair (seed 004)
    head_statistics.{csv,json,npz}       one row per head (layer, head 0-indexed; label "L-H" 1-indexed)
    index.html                           links every file above, with the summary

Layers and heads are 0-indexed in code and files; figures and pages label them "L-H", 1-indexed
(Clark et al.): layer 2, head 5 is "3-6".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from minibert import viz
from minibert.analysis import clustering, corpus, embeddings, heads, words
from minibert.core.config import head_label
from minibert.errors import DataFileError, InputError, refuse_unless_flag
from minibert.viz import figures, report

FIGURE_FORMATS = (".png", ".svg")


@dataclasses.dataclass(frozen=True)
class Group:
    """Similar sentences, a label for each (its colour), and the word followed in each (None: not followed)."""

    name: str
    sentences: list[str]
    labels: list[str]
    words: list[str | None]


@dataclasses.dataclass(frozen=True)
class DemoText:
    groups: list[Group]
    head_sentence: str
    head_from: str
    head_to: str
    text: str
    pair: str

    @property
    def sentences(self) -> list[str]:
        """Every sentence of the demo, the pair's two included: the documents of its head statistics."""
        return [s for group in self.groups for s in group.sentences] + [self.text, self.pair]


def demo_text() -> DemoText:
    """The bundled sentences (minibert/data/demo.json)."""
    data = json.loads((resources.files("minibert") / "data" / "demo.json").read_text(encoding="utf-8"))
    groups = [Group(name, g["sentences"], g["labels"], g["words"]) for name, g in data["groups"].items()]
    head, pair = data["head"], data["pair"]
    return DemoText(groups, head["sentence"], head["from"], head["to"], pair["text"], pair["pair"])


# ---- the analyses -----------------------------------------------------------------------------------

def _save(fig: Figure, stem: Path) -> list[Path]:
    """The figure in each format; build checked the folder for files of these names first."""
    return [figures.save(fig, stem.with_suffix(suffix), overwrite=True) for suffix in FIGURE_FORMATS]


def _panels(n: int, width: float, height: float) -> tuple[Figure, list]:
    fig = figures.NotebookFigure(figsize=(width * n, height), layout="constrained")
    return fig, list(fig.subplots(1, n))


def pca_figure(model, groups: Sequence[Group]) -> Figure:
    """One panel per group: its sentence vectors (mean pooling) in their first two principal components."""
    fig, axes = _panels(len(groups), 6.3, 5.2)
    vectors = embeddings.sentence_vectors(model, [s for group in groups for s in group.sentences])  # one batch
    ends = np.cumsum([len(group.sentences) for group in groups])
    for ax, group, end in zip(axes, groups, ends):
        coords, explained, _ = embeddings.pca(vectors[end - len(group.sentences):end])
        figures.pca_scatter(coords, group.labels, group.sentences, explained, ax=ax, title=group.name)
    fig.suptitle("sentence vectors of each group, PCA (mean of the last layer's token vectors)")
    return fig


def word_attention(model, group: Group) -> tuple[np.ndarray, list[int]]:
    """([N', L] attention paid to each followed sentence's word by layer, the N' sentence indices).
    Sentences that follow the same word run as one batch."""
    followed = [i for i, word in enumerate(group.words) if word is not None]
    values = {}
    for word in dict.fromkeys(group.words[i] for i in followed):
        rows = [i for i in followed if group.words[i] == word]
        values |= zip(rows, words.attention_to_word(model, [group.sentences[i] for i in rows], word))
    return np.stack([values[i] for i in followed]), followed


def attention_to_word_figure(model, groups: Sequence[Group]) -> Figure:
    fig, axes = _panels(len(groups), 6.3, 4.6)
    for ax, group in zip(axes, groups):
        values, rows = word_attention(model, group)
        chosen = sorted({group.words[i] for i in rows})
        figures.attention_to_word_plot(values, [group.sentences[i] for i in rows],
                                       word=chosen[0] if len(chosen) == 1 else "the chosen word",
                                       groups=[group.labels[i] for i in rows], ax=ax, title=group.name)
    fig.suptitle("attention paid to the chosen word (summed over query tokens, mean over heads)")
    return fig


def _word_start(batch, word: str) -> int:
    """The first token position of the one-word `word` in the one document of `batch`."""
    groups = words.word_groups(batch.word_ids[0], batch.sequence_ids[0], batch.attention_mask[0])
    positions = words.word_positions(batch.tokens[0], groups, [word.lower()])
    if positions is None:
        raise InputError(f"the sentence has no word {word!r}; its words are "
                         f"{words.word_labels(batch.tokens[0], groups)}.")
    return positions[0]


def strongest_head(model, sentence: str, source: str, target: str) -> tuple[int, int, viz.Document]:
    """(layer, head) in which `source`'s first token attends most to `target`'s, and the sentence's document."""
    batch = model.tokenize([sentence])
    doc = viz.document(model, batch)
    weights = doc.attention[:, :, _word_start(batch, source), _word_start(batch, target)]
    layer, head = np.unravel_index(weights.argmax(), weights.shape)
    return int(layer), int(head), doc


def featured_head(mean: dict[str, np.ndarray]) -> tuple[int, int]:
    """The pair's views open on the strongest previous-token head: a pattern the neuron view explains well."""
    layer, head = np.unravel_index(np.asarray(mean["prev"]).argmax(), np.shape(mean["prev"]))
    return int(layer), int(head)


# ---- the demo ---------------------------------------------------------------------------------------

def _quiet(what: str) -> None:
    pass


FIGURES = ("pca", "attention_to_word", "head_heatmap", "head_grid", "neuron", "head_statistics", "head_mds")
VIEWS = ("head_view", "model_view", "neuron_view")


def written_names() -> list[str]:
    """Every file build writes, relative to its folder (the module docstring's list)."""
    return [*(f"figures/{name}{suffix}" for name in FIGURES for suffix in FIGURE_FORMATS),
            *(f"{name}.html" for name in VIEWS), "head_statistics.csv", "head_statistics.json",
            "head_statistics.npz", "index.html"]


def build(model, out: str | Path, step: Callable[[str], None] = _quiet, *,
          overwrite: bool = False) -> tuple[list[Path], corpus.SurveyResult]:
    """Write the demo into `out` (created if needed); returns (every path written, the head statistics).
    `step(what)` is called as each step starts, naming what it writes (the command line prints it). A folder
    already holding a file of a name it writes (written_names) is refused before any work unless overwrite=True:
    an index.html there may be the user's own. Files an earlier build wrote there and nobody changed since (their
    digests are in MANIFEST) are the demo's own, and a rerun replaces them."""
    out, overwrite = Path(out), refuse_unless_flag("overwrite", overwrite, DataFileError)
    if out.exists() and not out.is_dir():
        raise DataFileError(f"{out} is a file; pass a folder for the demo (--out DIR).")
    own = _own_files(out)
    held = [name for name in written_names() if (out / name).exists() and name not in own]
    if held and not overwrite:
        shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        raise DataFileError(f"{out} already holds {shown}, which the demo would replace; pass another folder "
                            f"(--out DIR), or --overwrite (overwrite=True) to replace them.")
    figure_dir = out / "figures"
    figure_dir.mkdir(parents=True, exist_ok=True)
    text = demo_text()
    paths: list[Path] = []
    captions: dict[str, str] = {}

    def figure(name: str, fig: Figure, caption: str) -> None:
        paths.extend(_save(fig, figure_dir / name))
        captions[name] = caption

    step("figures/pca: each group's sentence vectors in two principal components")
    figure("pca", pca_figure(model, text.groups),
           "Sentence vectors of each group in two principal components, coloured by a property of the sentence.")
    step("figures/attention_to_word: attention paid to the chosen word, by layer")
    figure("attention_to_word", attention_to_word_figure(model, text.groups),
           "Attention paid to the chosen word in each layer, one line per sentence.")
    step(f"figures/head_heatmap, figures/head_grid: every head's attention on {text.head_sentence!r}")
    layer, head, doc = strongest_head(model, text.head_sentence, text.head_from, text.head_to)
    label = head_label(layer, head)
    relation = f"{text.head_from!r} attends to {text.head_to!r}"
    figure("head_heatmap", figures.attention_heatmap(doc.attention[layer, head], doc.tokens,
                                                     title=f"head {label}: {relation}"),
           f"Head {label}, the head in which {relation} most: query rows, key columns.")
    figure("head_grid", figures.head_grid(doc.attention, doc.tokens, title=f"{text.head_sentence!r}: every head"),
           f"Every head's attention on {text.head_sentence!r}, layers down, heads across.")

    step(f"head statistics over the demo's {len(text.sentences)} sentences, with the distances between heads")
    result = corpus.survey(model, text.sentences, js_divergence=True, progress=False)
    layer, head = featured_head(result.mean)
    label = head_label(layer, head)
    pair = viz.document(model, text.text, text.pair)
    query = 1  # the pair's first word
    step(f"figures/neuron: how head {label} computes one query's attention")
    figure("neuron", figures.neuron_figure(pair.q[layer, :, head], pair.k[layer, :, head], pair.tokens, query,
                                           title=f"head {label} (the strongest previous-token head): "
                                                 f"{pair.tokens[query]!r} attending"),
           f"How head {label} computes the attention of {pair.tokens[query]!r}: q, each k, q×k, q·k, "
           "q·k/√K and the softmax.")
    step("figures/head_statistics, figures/head_mds: the heads by their statistics")
    figure("head_statistics", figures.head_statistics_figure(
        result.mean, title=f"head statistics over the demo's {result.documents} sentences",
        cls_token=model.tokenizer.cls_token, sep_token=model.tokenizer.sep_token),
        "Clark et al.'s head statistics: attention to special tokens and entropy by layer; positional heads.")
    coords, _ = clustering.mds(result.js_divergence / result.documents)
    figure("head_mds", figures.mds_scatter(coords, heads.behaviour_labels(result.mean), annotate=True),
           "Heads placed by the Jensen–Shannon distance between their attention maps (MDS), coloured by layer.")

    step("head_view.html, model_view.html, neuron_view.html: interactive views of the pair")
    views = {
        "head_view": (pair.head_view(layer=layer, heads=[head], title="Head view: the MRPC pair"),
                      f"token-to-token lines of each layer's heads (opens on head {label}; the coloured "
                      "buttons switch the others on)"),
        "model_view": (pair.model_view(title="Model view: the MRPC pair"),
                       "every layer and head at once; click one to enlarge it"),
        "neuron_view": (pair.neuron_view(layer=layer, head=head, query_index=query, title="Neuron view: the MRPC pair"),
                        f"how one query's attention is computed (opens on head {label})"),
    }
    for name, (view, caption) in views.items():
        paths.append(view.save(out / f"{name}.html", overwrite=True))  # the demo's own folder
        captions[name] = caption

    step("head_statistics.csv, .json, .npz and index.html")
    npz, json_path = result.save(out / "head_statistics", overwrite=True)  # the demo's own folder, as the views
    paths += [report.write_table(result.table(), out / "head_statistics.csv", overwrite=True), json_path, npz]
    index = out / "index.html"
    summary = report.head_summary(result.mean, result.documents, model.tokenizer)
    index.write_text(report.index_page(out, paths, captions, summary, model.source), encoding="utf-8")
    _write_manifest(out)
    return [*paths, index], result


MANIFEST = ".minibert-demo.json"  # what the last build wrote here, with each file's digest


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _own_files(out: Path) -> set[str]:
    """The files of `out` that an earlier build wrote and nobody has changed since (a rerun replaces them)."""
    try:
        written = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    if not isinstance(written, dict):
        return set()
    names = set(written_names())
    return {name for name, digest in written.items()
            if name in names and (out / name).is_file() and _digest(out / name) == digest}


def _write_manifest(out: Path) -> None:
    written = {name: _digest(out / name) for name in written_names() if (out / name).is_file()}
    (out / MANIFEST).write_text(json.dumps(written, indent=1), encoding="utf-8")
