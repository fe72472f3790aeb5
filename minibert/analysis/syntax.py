"""Dependency syntax in attention heads: how often a head's most-attended word is the gold head (docs/definitions.md).

Clark et al. (2019), section 4.2: for each head, turn the token map into a word map (words.py), zero
its diagonal, drop the [CLS] and [SEP] rows and columns without renormalising, and predict each word's
head as the word it attends to most ("dependent→head"); in the other direction ("head→dependent") the
map is transposed, so the prediction is the word that attends most to it. ROOT is never predicted, so
the root word is never scored. The baseline predicts the word at a fixed offset k (k = −3…2) for every
word, and reports the best k per relation.

    sentences = read_conllu(sample_treebank())        # or a UD treebank, e.g. English EWT
    result = dependency_accuracy(model, sentences)
    result.best("obj")                                # {'layer', 'head' (0-indexed), 'label' ("L-H"), 'accuracy'}
    result.table()                                    # tidy rows: relation × direction, with the baseline

Each CoNLL-U word is tokenized on its own (the basic tokenizer would split words with punctuation
further), so every word owns a contiguous run of wordpieces between [CLS] and [SEP].
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np

from minibert.analysis.words import word_attention
from minibert.core.config import head_label
from minibert.core.site_names import PATTERN
from minibert.core.sites import PATTERNS
from minibert.errors import AnalysisError, ConllError, DataFileMissing

DEPENDENT_TO_HEAD = "dependent→head"
HEAD_TO_DEPENDENT = "head→dependent"
DIRECTIONS = (DEPENDENT_TO_HEAD, HEAD_TO_DEPENDENT)
OFFSETS = tuple(range(-3, 3))  # baseline: predict word i + k




@dataclasses.dataclass(frozen=True)
class Sentence:
    """One gold tree: words, each word's head (1-indexed, 0 = ROOT, as in CoNLL-U) and relation."""

    words: tuple[str, ...]
    heads: tuple[int, ...]
    relations: tuple[str, ...]
    sent_id: str | None = None
    upos: tuple[str, ...] = dataclasses.field(default=(), compare=False)  # UPOS tags (probes: labels, punctuation)


def sample_treebank() -> Path:
    """The bundled sample: 36 hand-annotated English sentences in UD style (minibert/data/README.md)."""
    return Path(str(resources.files("minibert") / "data" / "sample.conllu"))


def _source_text(source) -> tuple[str, str]:
    """(name for messages, text) of a path or of CoNLL-U text itself."""
    if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source and "\t" not in source):
        path = Path(source)
        if not path.is_file():
            raise DataFileMissing(f"no CoNLL-U file at {path}; pass a path to a .conllu file or its text.")
        return str(path), path.read_text(encoding="utf-8")
    return "<text>", str(source)


def read_conllu(path_or_text) -> list[Sentence]:
    """Gold trees from a CoNLL-U file (or its text). Comments, multiword token ranges ("1-2") and empty
    nodes ("1.1") are skipped; anything else malformed raises ConllError naming the file and line."""
    name, text = _source_text(path_or_text)
    sentences: list[Sentence] = []
    rows: list[tuple[int, str, int, str, str]] = []  # (line number, form, head, relation, UPOS)
    sent_id = None

    def fail(lineno, message):
        raise ConllError(f"{name}, line {lineno}: {message}")

    def close():
        nonlocal rows, sent_id
        if rows:
            for lineno, _, head, *_ in rows:
                if head > len(rows):
                    fail(lineno, f"HEAD {head} points past the sentence's {len(rows)} words.")
            sentences.append(Sentence(tuple(r[1] for r in rows), tuple(r[2] for r in rows),
                                      tuple(r[3] for r in rows), sent_id, tuple(r[4] for r in rows)))
        rows, sent_id = [], None

    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            close()
            continue
        if line.startswith("#"):
            key, _, value = line[1:].partition("=")
            if key.strip() == "sent_id":
                sent_id = value.strip()
            continue
        columns = line.split("\t")
        if len(columns) != 10:
            fail(lineno, f"expected 10 tab-separated columns (ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS "
                         f"MISC), found {len(columns)}.")
        word_id, form, head, relation = columns[0], columns[1], columns[6], columns[7]
        if "-" in word_id or "." in word_id:  # multiword token range or empty node: not a syntactic word
            if not all(part.isdigit() for part in word_id.replace("-", ".").split(".")):
                fail(lineno, f"ID {word_id!r} is neither a word number, a range like 1-2 nor an empty node like 1.1.")
            continue
        if not word_id.isdigit() or int(word_id) != len(rows) + 1:
            fail(lineno, f"ID {word_id!r}: word ids must count 1, 2, 3, … within a sentence; "
                         f"expected {len(rows) + 1}.")
        if not head.isdigit():
            fail(lineno, f"HEAD {head!r} is not a word number (0 for the root).")
        if relation in ("", "_"):
            fail(lineno, "DEPREL is empty; every word needs a relation to its head.")
        rows.append((lineno, form, int(head), relation, columns[3]))
    close()
    return sentences


def encode_words(tokenizer, words: Sequence[str]) -> tuple[list[int], list[list[int]]]:
    """([CLS] wordpieces… [SEP] ids, token positions of each word with [CLS] and [SEP] as words)."""
    ids, groups = [tokenizer.cls_token_id], [[0]]
    for i, word in enumerate(words):
        # Words after the first follow a space: byte-level BPE (RoBERTa) spells them so ("Ġword"); WordPiece
        # and SentencePiece tokenize " word" as "word".
        pieces = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(" " * (i > 0) + word)) or [tokenizer.unk_token_id]
        groups.append(list(range(len(ids), len(ids) + len(pieces))))
        ids += pieces
    groups.append([len(ids)])
    ids.append(tokenizer.sep_token_id)
    return ids, groups


def word_maps(model, encoded: Sequence[tuple[list[int], list[list[int]]]], mode: str = "mean",
              batch_size: int = 32) -> list[np.ndarray]:
    """Word-level attention of every head for each encoded sentence, [CLS]/[SEP] dropped: [L, H, W, W] each."""
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]))
    maps: list[np.ndarray | None] = [None] * len(encoded)
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        width = -(-max(len(encoded[i][0]) for i in rows) // 16) * 16  # round up: few compiled shapes
        ids = np.zeros((len(rows), width), np.int32)
        mask = np.zeros_like(ids)
        for b, i in enumerate(rows):
            ids[b, :len(encoded[i][0])] = encoded[i][0]
            mask[b, :len(encoded[i][0])] = 1
        _, cache = model.run_with_cache(dict(input_ids=ids, token_type_ids=np.zeros_like(ids), attention_mask=mask),
                                        names=PATTERNS)
        pattern = np.asarray(cache.stack(PATTERN), np.float32)  # [L, B, H, T, S]
        for b, i in enumerate(rows):
            maps[i] = word_attention(pattern[:, b], encoded[i][1], mode)[..., 1:-1, 1:-1]
    return maps


@dataclasses.dataclass
class DependencyResult:
    """Per relation ("all" first, then by frequency): head accuracies in both directions and the baseline."""

    accuracy: dict[str, dict[str, np.ndarray]]  # direction → relation → [L, H] fraction of words right
    counts: dict[str, int]  # relation → words scored (root words excluded)
    baseline: dict[str, dict[int, float]]  # relation → {offset k: accuracy of predicting word i + k}
    sentences: int  # sentences scored
    skipped: int = 0  # sentences longer than max_length, left out

    @property
    def relations(self) -> tuple[str, ...]:
        return tuple(self.counts)

    def best(self, relation: str = "all", direction: str = DEPENDENT_TO_HEAD) -> dict:
        """The most accurate head: layer and head 0-indexed, label 1-indexed "L-H", accuracy."""
        if direction not in DIRECTIONS:
            raise KeyError(f"direction must be one of {DIRECTIONS}, not {direction!r}.")
        if relation not in self.counts:
            raise KeyError(f"no word has relation {relation!r}; relations here: {', '.join(self.relations)}.")
        scores = self.accuracy[direction][relation]
        layer, head = np.unravel_index(int(np.argmax(scores)), scores.shape)
        return {"layer": int(layer), "head": int(head), "label": head_label(layer, head),
                "accuracy": float(scores[layer, head])}

    def best_baseline(self, relation: str = "all") -> tuple[int, float]:
        """(offset k, accuracy) of the best fixed-offset baseline for a relation."""
        scores = self.baseline[relation]
        k = max(scores, key=lambda offset: scores[offset])
        return k, scores[k]

    def table(self) -> list[dict]:
        """Tidy rows, one per relation and direction: the best head and the best baseline."""
        rows = []
        for relation, count in self.counts.items():
            k, baseline = self.best_baseline(relation)
            for direction in DIRECTIONS:
                rows.append({"relation": relation, "direction": direction, "count": count,
                             **self.best(relation, direction), "baseline_offset": k, "baseline_accuracy": baseline})
        return rows


def _predicted_heads(word_map: np.ndarray) -> np.ndarray:
    """argmax over words of each row with the diagonal zeroed: [..., W, W] → [..., W] (0-indexed words)."""
    scores = np.array(word_map, np.float32)
    diagonal = np.arange(scores.shape[-1])
    scores[..., diagonal, diagonal] = 0.0
    return scores.argmax(-1)


def score_heads(word_maps: Sequence[np.ndarray], sentences: Sequence[Sentence]) -> DependencyResult:
    """Accuracy of every head as a dependency predictor, from word maps [L, H, W, W] (one per sentence,
    W its words, [CLS]/[SEP] already dropped) and the gold trees."""
    if len(word_maps) != len(sentences):
        raise AnalysisError(f"{len(word_maps)} word maps for {len(sentences)} sentences; pass one per sentence.")
    correct = {d: {} for d in DIRECTIONS}
    baseline_correct: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    for index, (word_map, sentence) in enumerate(zip(word_maps, sentences)):
        word_map = np.asarray(word_map)
        n = len(sentence.words)
        if not len(sentence.heads) == len(sentence.relations) == n:
            raise AnalysisError(f"sentence {sentence.sent_id or index} has {n} words, {len(sentence.heads)} heads and "
                             f"{len(sentence.relations)} relations; it needs one head and one relation per word.")
        if word_map.ndim != 4 or word_map.shape[-2:] != (n, n):
            raise AnalysisError(f"sentence {sentence.sent_id or index} has {n} words but its word map has shape "
                             f"{word_map.shape}; expected [L, H, {n}, {n}].")
        gold = np.asarray(sentence.heads) - 1  # 0-indexed head word, −1 for ROOT
        scored = gold >= 0
        predictions = {DEPENDENT_TO_HEAD: _predicted_heads(word_map),
                       HEAD_TO_DEPENDENT: _predicted_heads(np.swapaxes(word_map, -1, -2))}
        offsets = np.arange(n)[None, :] + np.asarray(OFFSETS)[:, None]  # [K, W]: word i + k (out of range is wrong)
        baseline_hits = offsets == gold[None, :]
        relations = np.asarray(sentence.relations)
        for relation in ["all", *sorted({str(r) for r in relations[scored]})]:
            chosen = scored if relation == "all" else scored & (relations == relation)
            counts[relation] = counts.get(relation, 0) + int(chosen.sum())
            for direction, predicted in predictions.items():
                hits = (predicted[..., chosen] == gold[chosen]).sum(-1)
                correct[direction][relation] = correct[direction].get(relation, 0) + hits
            baseline_correct[relation] = baseline_correct.get(relation, 0) + baseline_hits[:, chosen].sum(-1)
    order = ["all", *sorted((r for r in counts if r != "all"), key=lambda r: (-counts[r], r))]
    counts = {r: counts[r] for r in order if counts[r] > 0}
    accuracy = {d: {r: correct[d][r] / counts[r] for r in counts} for d in DIRECTIONS}
    baseline = {r: {k: float(baseline_correct[r][i] / counts[r]) for i, k in enumerate(OFFSETS)} for r in counts}
    return DependencyResult(accuracy, counts, baseline, sentences=len(sentences))


def dependency_accuracy(model, sentences, mode: str = "mean", max_length: int = 128,
                        batch_size: int = 32) -> DependencyResult:
    """Every head's dependency accuracy over gold trees (Sentence list, or a CoNLL-U path or text).

    mode: how a word's row is made from its wordpieces' rows, "mean" (the paper) or "first" (Clark et
    al.'s code). Sentences longer than max_length tokens are left out (result.skipped counts them).
    """
    if isinstance(sentences, (str, Path)):
        sentences = read_conllu(sentences)
    if not sentences:
        raise AnalysisError("no sentences to score; pass gold trees (read_conllu) with at least one sentence.")
    encoded = [encode_words(model.tokenizer, s.words) for s in sentences]
    kept = [i for i, (ids, _) in enumerate(encoded) if len(ids) <= max_length]
    if not kept:
        raise AnalysisError(f"every sentence is longer than max_length={max_length} tokens; raise max_length.")
    maps = word_maps(model, [encoded[i] for i in kept], mode, batch_size)
    result = score_heads(maps, [sentences[i] for i in kept])
    result.skipped = len(sentences) - len(kept)
    return result
