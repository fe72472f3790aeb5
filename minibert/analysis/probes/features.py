"""Probe inputs: a frozen encoder's activations at one hook site for words, texts or tokens (Features), labels
read from lists or TSV files, control-task labels and the sentence split every probe uses."""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Hashable, Sequence
from pathlib import Path

import numpy as np

from minibert.analysis.syntax import encode_words
from minibert.core.hooks import site_axes
from minibert.core.site_names import MLP_POST, NORMALIZED_RESID_POST, RESID_POST, Z, in_block
from minibert.errors import AnalysisError, DataFileError, DataFileMissing
from minibert.training.data import read_text

WORD_POOLS = ("first", "mean")
SENTENCE_POOLS = ("cls", "mean")
HEADER = ("text", "label")  # training.examples' header row, skipped by read_text_labels


@dataclasses.dataclass(frozen=True)
class Features:
    """Activations of one hook site for every layer: values [L, N, F] (N items: words, tokens or sentences),
    and the sentence each item comes from ([N], for splits and the bootstrap that resample sentences).
    token_features also gives each token's text and segment (0: first text, 1: the pair's second) [N]."""

    values: np.ndarray
    sentence: np.ndarray
    site: str
    tokens: np.ndarray | None = None
    segment: np.ndarray | None = None

    def __len__(self) -> int:
        return self.values.shape[1]

    def take(self, items: np.ndarray) -> Features:
        return Features(self.values[:, items], self.sentence[items], self.site,
                        *(None if a is None else a[items] for a in (self.tokens, self.segment)))


def layer_output_site(model) -> str:
    """Each block's output, the default probe site: hook_normalized_resid_post in post-LN models (BERT's blocks end
    with LayerNorm(x + MLP(x)); their hook_resid_post is the sum before that LayerNorm), hook_resid_post in pre-LN
    ones (ModernBERT), where it is the output. The probing papers read these layer outputs."""
    return NORMALIZED_RESID_POST if in_block(0, NORMALIZED_RESID_POST) in model.hook_names else RESID_POST


def _checked_site(model, site: str | None) -> str:
    """`site` without a block prefix, checked to be a per-layer hook with a token axis (not a [T, S] map); None:
    the block's output (layer_output_site)."""
    if site is None:
        return layer_output_site(model)
    name = f"blocks.0.{site}"
    if name not in model.hook_names:
        examples = sorted({n.split(".", 2)[2] for n in model.hook_names if n.startswith("blocks.0.")})
        raise AnalysisError(f"{site!r} is not a per-layer hook site of this model; pick one of {', '.join(examples)}.")
    axes = site_axes(name)
    if axes[:2] != ["B", "T"] or "S" in axes:
        raise AnalysisError(f"{site!r} has axes {axes}: a probe needs one vector per token ([B, T, ...]); "
                            f"try {RESID_POST!r}, {MLP_POST!r} or {Z!r}.")
    return site


def _padded(rows: Sequence[Sequence[int]]) -> dict[str, np.ndarray]:
    """Token id rows padded on the right, as a batch (segment ids 0)."""
    ids = np.zeros((len(rows), max(map(len, rows))), np.int32)
    mask = np.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, :len(row)], mask[b, :len(row)] = row, 1
    return dict(input_ids=ids, token_type_ids=np.zeros_like(ids), attention_mask=mask)


def _encoded_runs(model, encoded, names, batch_size: int):
    """(sentence indices, Cache) per batch of encoded sentences (syntax.encode_words), similar lengths together."""
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]))
    for start in range(0, len(order), batch_size):
        chosen = order[start:start + batch_size]
        yield chosen, model.run_with_cache(_padded([encoded[i][0] for i in chosen]), names=names)[1]


def _encoded_sentences(model, sentences: Sequence[Sequence[str]]) -> list:
    """syntax.encode_words of each sentence, checked to fit the model's positions."""
    if not sentences or any(len(words) == 0 for words in sentences):
        raise AnalysisError("pass at least one sentence, each a non-empty list of words.")
    for i, words in enumerate(sentences):
        for j, word in enumerate(words):
            if not str(word).strip():  # it has no wordpiece: its feature would be [UNK]'s
                raise AnalysisError(f"sentences[{i}][{j}] is an empty word ({word!r}); leave it (and its label) out.")
    encoded = [encode_words(model.tokenizer, words) for words in sentences]
    too_long = [i for i, (ids, _) in enumerate(encoded) if len(ids) > model.config.max_tokens]
    if too_long:
        raise AnalysisError(f"sentence {too_long[0]} has {len(encoded[too_long[0]][0])} tokens, more than the model's "
                            f"{model.config.max_tokens} positions; split it or leave it out.")
    return encoded


def _pool_words(values: np.ndarray, groups: Sequence[Sequence[int]], pool: str) -> np.ndarray:
    """[L, T, F] of one sentence → [L, W, F]: each word's first wordpiece, or the mean of its wordpieces."""
    if pool == "first":
        return values[:, [group[0] for group in groups]]
    return np.stack([values[:, group].mean(1) for group in groups], axis=1)


def word_features(model, sentences: Sequence[Sequence[str]], site: str | None = None, pool: str = "first",
                  batch_size: int = 32) -> Features:
    """Per-word features [L, N, F] of pre-split sentences (lists of words, e.g. a CoNLL-U treebank's).

    Each word is tokenized on its own (syntax.encode_words), between [CLS] and [SEP]; a word's feature is its
    first wordpiece's activation ("first") or the mean over its wordpieces ("mean").
    """
    site = _checked_site(model, site)
    if pool not in WORD_POOLS:
        raise AnalysisError(f"pool={pool!r}: a word's feature is its 'first' wordpiece's or the 'mean' of its pieces.")
    encoded = _encoded_sentences(model, sentences)
    pooled: list[np.ndarray | None] = [None] * len(encoded)
    for chosen, cache in _encoded_runs(model, encoded, f"blocks.*.{site}", batch_size):
        values = np.asarray(cache.stack(site), np.float32)
        values = values.reshape(*values.shape[:3], -1)
        for b, i in enumerate(chosen):
            pooled[i] = _pool_words(values[:, b], encoded[i][1][1:-1], pool)  # [CLS] and [SEP] are no words
    sentence = np.concatenate([np.full(len(words), i) for i, words in enumerate(sentences)])
    return Features(np.concatenate(pooled, axis=1), sentence, site)


def _checked_texts(texts, pairs) -> list:
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts or (pairs is not None and len(pairs) != len(texts)):
        raise AnalysisError(f"pass at least one text (and one pair per text): {len(texts)} texts, "
                            f"{'no' if pairs is None else len(pairs)} pairs.")
    return texts


def _text_runs(model, texts: list, pairs, site: str, batch_size: int, max_length: int | None):
    """(first text's index, Batch, the site's values [L, B, T, F] flattened per token) per batch of texts."""
    for start in range(0, len(texts), batch_size):
        batch = model.tokenize(texts[start:start + batch_size],
                               None if pairs is None else list(pairs[start:start + batch_size]), max_length=max_length)
        _, cache = model.run_with_cache(batch, names=f"blocks.*.{site}")
        values = np.asarray(cache.stack(site), np.float32)
        yield start, batch, values.reshape(*values.shape[:3], -1)


def sentence_features(model, texts, pairs=None, site: str | None = None, pool: str = "cls",
                      batch_size: int = 32, max_length: int | None = None) -> Features:
    """Per-text features [L, N, F]: the [CLS] position's activation ("cls") or the mean over real tokens."""
    site = _checked_site(model, site)
    if pool not in SENTENCE_POOLS:
        raise AnalysisError(f"pool={pool!r}: a sentence's feature is its 'cls' position's or the 'mean' of its tokens.")
    texts = _checked_texts(texts, pairs)
    chunks = []
    for _, batch, values in _text_runs(model, texts, pairs, site, batch_size, max_length):
        if pool == "cls":
            chunks.append(values[:, :, 0])
        else:
            mask = np.asarray(batch.attention_mask, np.float32)[None, :, :, None]
            chunks.append((values * mask).sum(2) / mask.sum(2))
    return Features(np.concatenate(chunks, axis=1), np.arange(len(texts)), site)


def token_features(model, texts, pairs=None, site: str | None = None, batch_size: int = 32,
                   max_length: int | None = None) -> Features:
    """Per-token features [L, N, F] of texts (and pairs, second texts) as the model tokenizes them: every real
    token but the special ones ([CLS], [SEP], …), with its text (`tokens`) and segment (`segment`: 1 in the
    pair's second text) for labels computed from the tokenization, e.g. "the token is in sentence B"."""
    site = _checked_site(model, site)
    texts = _checked_texts(texts, pairs)
    values, sentence, tokens, segment = [], [], [], []
    for start, batch, stacked in _text_runs(model, texts, pairs, site, batch_size, max_length):
        # the tokenizer's sequence ids: 0 in the text, 1 in its pair, None on special tokens and padding
        sequence = np.array([[-1 if i is None else i for i in row] for row in batch.sequence_ids])
        rows, columns = np.nonzero(sequence >= 0)
        values.append(stacked[:, rows, columns])
        sentence.append(start + rows)
        tokens += model.tokenizer.convert_ids_to_tokens(np.asarray(batch.input_ids)[rows, columns].tolist())
        segment.append(sequence[rows, columns])
    return Features(np.concatenate(values, axis=1), np.concatenate(sentence), site, np.array(tokens, dtype=object),
                    np.concatenate(segment))


def _tsv_rows(path):
    """(line number, tab-separated columns) of a TSV file's lines, blank lines as [] and '#' comments skipped."""
    path = Path(path)
    if not path.is_file():
        raise DataFileMissing(f"no TSV file at {path}; pass the path of a tab-separated file.")
    for number, line in enumerate(read_text(path).splitlines(), start=1):  # UTF-8 (BOM dropped), else named
        if not line.startswith("#"):
            yield number, line.split("\t") if line.strip() else []


def read_word_labels(path, column: int = -1) -> tuple[list[list[str]], list[list[str]]]:
    """(sentences, labels) for token_probe from a TSV file: one word per line, the word in the first column and
    its label in `column` (default the last; CoNLL-style files work with the column's index), a blank line
    between sentences, lines starting with '#' ignored."""
    sentences, labels, words, tags = [], [], [], []
    for number, columns in _tsv_rows(path):
        if not columns:
            if words:
                sentences.append(words)
                labels.append(tags)
            words, tags = [], []
            continue
        if len(columns) < 2 or not -len(columns) <= column < len(columns) or not columns[0]:
            raise DataFileError(f"{path}, line {number}: expected a word and its label separated by a tab (label in "
                                f"column {column}); found {len(columns)} column(s).")
        words.append(columns[0])
        tags.append(columns[column])
    if words:
        sentences.append(words)
        labels.append(tags)
    if not sentences:
        raise DataFileError(f"{path} holds no labelled words; write one word<TAB>label per line.")
    return sentences, labels


def read_text_labels(path) -> tuple[list[str], list[str] | None, list[str]]:
    """(texts, pairs or None, labels) for sentence_probe from a TSV file: text<TAB>label per line, or
    text<TAB>second text<TAB>label for pairs (every line alike); blank lines and '#' lines ignored, and a first
    line text<TAB>label (or text<TAB>pair<TAB>label: training.examples' header) skipped."""
    rows = [(number, columns) for number, columns in _tsv_rows(path) if columns]
    if rows and [name.strip().lower() for name in rows[0][1]] in (list(HEADER), [HEADER[0], "pair", HEADER[1]]):
        rows = rows[1:]  # training.examples' header row
    if not rows:
        raise DataFileError(f"{path} holds no labelled texts; write one text<TAB>label per line.")
    width = len(rows[0][1])
    for number, columns in rows:
        if len(columns) != width or width not in (2, 3):
            raise DataFileError(f"{path}, line {number}: expected text<TAB>label or text<TAB>pair<TAB>label like "
                                f"the first line ({width} columns); found {len(columns)} column(s).")
    texts, labels = [c[0] for _, c in rows], [c[-1] for _, c in rows]
    return texts, ([c[1] for _, c in rows] if width == 3 else None), labels


def encode_labels(labels: Sequence[Hashable], classes: Sequence[Hashable] | None = None) -> tuple[np.ndarray, tuple]:
    """(integer labels [N], the classes in order): classes sorted by their text unless given; a missing label
    (None, NaN: a DataFrame's empty cell) is refused rather than made a class."""
    missing = next((i for i, label in enumerate(labels)
                    if label is None or (isinstance(label, numbers.Real) and label != label)), None)
    if missing is not None:
        raise AnalysisError(f"labels[{missing}] is missing ({labels[missing]!r}); give every item a label, or "
                            f"leave the item out.")
    classes = tuple(sorted(set(labels), key=str)) if classes is None else tuple(classes)
    index = {c: i for i, c in enumerate(classes)}
    unknown = [label for label in labels if label not in index]
    if unknown:
        raise AnalysisError(f"label {unknown[0]!r} is not one of the classes {classes[:10]}; pass classes=None.")
    return np.array([index[label] for label in labels], np.int32), classes


def control_labels(words: Sequence[str], labels: Sequence[Hashable], seed: int = 0) -> list:
    """Hewitt & Liang's control task: every word type (its text, lowercased) gets one label drawn at random
    from the task's empirical label distribution; each word occurrence takes its type's label."""
    if len(words) != len(labels):
        raise AnalysisError(f"{len(words)} words but {len(labels)} labels; pass one label per word.")
    rng = np.random.default_rng(seed)
    types = sorted({w.lower() for w in words})
    drawn = rng.choice(len(labels), size=len(types))  # a uniformly drawn occurrence: the label distribution
    by_type = {t: labels[i] for t, i in zip(types, drawn)}
    return [by_type[w.lower()] for w in words]


def split_sentences(n_sentences: int, dev: float = 0.1, test: float = 0.2, seed: int = 0) -> dict[str, np.ndarray]:
    """{"train", "dev", "test"}: sentence indices shuffled and cut by the fractions (dev may be 0)."""
    if not (0 <= dev < 1 and 0 < test < 1 and dev + test < 1):
        raise AnalysisError(f"dev={dev}, test={test}: fractions in [0, 1) with dev + test < 1 and a test split.")
    order = np.random.default_rng(seed).permutation(n_sentences)
    n_test, n_dev = max(1, round(test * n_sentences)), round(dev * n_sentences)
    if n_test + n_dev >= n_sentences:
        raise AnalysisError(f"{n_sentences} sentences leave nothing to train on with dev={dev}, test={test}.")
    return {"test": np.sort(order[:n_test]), "dev": np.sort(order[n_test:n_test + n_dev]),
            "train": np.sort(order[n_test + n_dev:])}


