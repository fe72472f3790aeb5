"""Training data: examples from files or tuples, their labels, and the batches a training step sees.

An example is a text, an optional second text (a pair) and a label: a class for sequence classification
(an int or a name), one label per word for token classification (words are the text split on spaces), none
for masked-LM. Files are UTF-8 (a byte-order mark, as Excel writes, is dropped): TSV or CSV with a header row
naming the columns `text`, `pair`, `label` (read by Python's csv module, so a quoted field keeps its commas and
newlines), or JSONL with those keys; a token-classification label cell holds the word labels separated by
spaces (JSONL: a list).

Labels are read one way everywhere (files and tuples): whitespace around a label is dropped, and a label that
spells an integer (`1`, ` 1`, `"-2"`) is a class number. The labels of one data set are all class numbers
(0 … N − 1, named LABEL_i) or all names (classes in sorted order), never a mix: in `2, neg, pos, 0` the `2`
could be a class number or a name, so the mix is refused rather than guessed. Class numbers without num_labels
leave no class below the largest without an example (label_names). Messages name a row by its number and, from a
file, its line (row_name).

Batches have a fixed number of rows (the last one padded with rows of weight 0) and one of a few lengths, so the
step compiles once per length: `step_lengths` chooses at most STEP_PROGRAMS of them from the run's own batches
(every epoch's order is known before the first step), those that pad the fewest tokens.
"""

from __future__ import annotations

import codecs
import csv
import dataclasses
import io
import json
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from minibert.errors import DataFileError, DataFileMissing, InputError, is_whole
from minibert.runtime.buckets import bucket_length

TASKS = ("sequence-classification", "token-classification", "masked-lm")
IGNORE = -100  # the label of positions no loss reads (transformers' ignore_index)
# Masked-LM as BERT (Devlin et al. 2019, §3.1) and transformers' DataCollatorForLanguageModeling choose:
MLM_PROBABILITY = 0.15  # of the real, non-special tokens are predicted; of those
MLM_MASKED, MLM_RANDOM = 0.8, 0.5  # 80% become [MASK], half of the rest (10%) a random token, the rest stay


@dataclasses.dataclass(frozen=True)
class Example:
    text: str
    pair: str | None = None
    label: object = None  # a class (int or name), a list of word labels, or None (masked-LM)
    line: int | None = dataclasses.field(default=None, compare=False)  # where the row begins in its file, if any


def row_name(rows: Sequence[Example], i: int) -> str:
    """How a message names rows[i]: "row 3" (counted from 1, as the examples are), with its line where it came from
    a file ("row 3 (line 4)": a header row comes first)."""
    line = rows[i].line
    return f"row {i + 1}" if line is None else f"row {i + 1} (line {line})"


def source_name(source, unnamed: str = "the data") -> str:
    """How a message names the data `examples` read from `source`: the file's path, or `unnamed`."""
    return str(source) if isinstance(source, (str, Path)) else unnamed


def checked_task(task: str) -> str:
    if task not in TASKS:
        raise InputError(f"task {task!r} is not one of {', '.join(map(repr, TASKS))}.")
    return task


def examples(source, *, task: str = "sequence-classification") -> list[Example]:
    """Examples from a TSV/CSV/JSONL file or a list of (text, label) / (text, pair, label) tuples (masked-LM:
    texts or (text,) / (text, pair) tuples). Every row must have a pair, or none must; labels are read as the
    module docstring says (class numbers or names, not both)."""
    checked_task(task)
    where = source_name(source)
    if isinstance(source, (str, Path)):
        rows = _read_file(Path(source))
    elif isinstance(source, Iterable):
        rows = [_tuple_row(item, task, i) for i, item in enumerate(source)]
    else:
        raise InputError(f"the data is {type(source).__name__}; pass a file's path or a list of examples.")
    if not rows:
        raise DataFileError(f"{where} holds no examples; pass at least one row.")
    rows = [dataclasses.replace(row, label=_labels(row.label, task)) for row in rows]
    for i, row in enumerate(rows):  # _label made class numbers ints: a float, a bool (True is no class) is left
        for label in row.label if isinstance(row.label, list) else [row.label]:
            if task != "masked-lm" and label is not None and (type(label) not in (int, str)):
                raise InputError(f"{where}: {row_name(rows, i)}'s label {label!r} is a {type(label).__name__}; a "
                                 f"label is a whole number (a class) or a name (a string).")
    found = [i for i, row in enumerate(rows) if row.pair is not None]
    if found and len(found) != len(rows):
        missing = next(i for i, row in enumerate(rows) if row.pair is None)
        raise DataFileError(f"{where}: {row_name(rows, found[0])} has a pair but {row_name(rows, missing)} has none; "
                            f"give every row a second text, or none.")
    for i, row in enumerate(rows):
        if not row.text.strip():
            raise DataFileError(f"{where}: {row_name(rows, i)} has an empty text.")
        if (row.label is None) != (task == "masked-lm"):
            need = "has a label, which masked-LM does not use" if row.label is not None else "has no label"
            raise DataFileError(f"{where}: {row_name(rows, i)} {need} (task {task!r}).")
    _check_one_kind_of_label(rows, task, where)
    return rows


INTEGER = re.compile(r"-?[0-9]+", re.ASCII)


def _labels(label, task: str):
    """A row's label as training reads it (a token-classification cell: its space-separated word labels)."""
    if task == "masked-lm" or label is None:
        return label
    if task == "token-classification":
        words = label.split() if isinstance(label, str) else label
        return [_label(x) for x in words] if isinstance(words, (list, tuple)) else words
    return _label(label)


def _label(value):
    """Whitespace around a text dropped (' 1' and '1' are one class, never two); a text spelling an integer,
    or a NumPy integer, is that class number; an empty text is no label."""
    if isinstance(value, str):
        value = value.strip()
        return int(value) if INTEGER.fullmatch(value) else value or None
    if is_whole(value):
        return int(value)
    return value


def _check_one_kind_of_label(rows: Sequence[Example], task: str, where: str) -> None:
    """Refuse labels that mix class numbers and names (what the number means would be a guess)."""
    if task == "masked-lm":
        return
    first = {}  # is a class number → (row, label) of the first such label
    for i, row in enumerate(rows):
        words = task == "token-classification" and isinstance(row.label, (list, tuple))  # else encode names it
        for label in row.label if words else [row.label]:
            first.setdefault(isinstance(label, int), (i, label))
        if len(first) == 2:
            (number_row, number), (name_row, name) = first[True], first[False]
            raise InputError(f"{where}: {row_name(rows, number_row)}'s label {number} is a class number but "
                             f"{row_name(rows, name_row)}'s {name!r} is a name; give every label as a name, or "
                             f"every label as a class number 0 … N − 1.")


def _tuple_row(item, task: str, i: int) -> Example:
    if isinstance(item, Example):
        return item
    if isinstance(item, str):
        item = (item,)
    labelled = task != "masked-lm"
    shape = "(text, label) or (text, pair, label)" if labelled else "a text, (text,) or (text, pair), with no label"
    if not isinstance(item, (tuple, list)) or not 1 + labelled <= len(item) <= 2 + labelled:
        raise InputError(f"example {i + 1} is {item!r}; each example is {shape}.")
    text, *rest = item
    label = rest.pop() if labelled else None
    if not all(isinstance(x, str) for x in [text, *rest]):
        raise InputError(f"example {i + 1} is {item!r}; for {'masked-LM' if not labelled else task} each example "
                         f"is {shape}, its texts strings.")
    return Example(text, rest[0] if rest else None, label)


def read_text(path: Path) -> str:
    """A data file's text: UTF-8, with a byte-order mark (Excel's "CSV UTF-8") dropped; any other encoding is a
    DataFileError naming the line, since guessing one would change the texts silently."""
    if not path.is_file():
        missing = not path.exists()
        raise (DataFileMissing if missing else DataFileError)(
            f"{path} {'does not exist' if missing else 'is not a file'}; pass a TSV, CSV or JSONL file of examples.")
    raw = path.read_bytes().removeprefix(codecs.BOM_UTF8)
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):  # Excel's "Unicode text"
        raise DataFileError(f"{path} is UTF-16 (it starts with UTF-16's byte-order mark); save it as UTF-8 (in Excel: "
                            f"CSV UTF-8).")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise DataFileError(f"{path}, line {line}: not valid UTF-8 (byte {raw[error.start]:#04x}); save the file "
                            f"as UTF-8 (a Latin-1 or Windows-1252 file: re-save it with the UTF-8 encoding).") from None


def _read_file(path: Path) -> list[Example]:
    suffix = path.suffix.lower()
    if path.exists() and suffix not in (".tsv", ".csv", ".jsonl", ".json"):
        raise DataFileError(f"{path}: the extension says neither TSV, CSV nor JSONL; rename it .tsv, .csv or .jsonl.")
    text = read_text(path)
    if not text.strip():
        raise DataFileError(f"{path} is empty; it needs a header row (text[, pair], label) and examples.")
    if suffix in (".jsonl", ".json"):
        records = []
        for n, line in enumerate(text.split("\n"), 1):  # not splitlines: a JSON string may hold U+2028 raw
            if line.strip():
                try:
                    records.append((n, json.loads(line)))
                except json.JSONDecodeError as e:
                    raise DataFileError(f"{path}:{n}: not a JSON object ({e.msg}); one object per line.") from None
    else:
        records = _table_records(path, text, "\t" if suffix == ".tsv" else ",")
    return [_record(path, n, record) for n, record in records]


def _table_records(path: Path, text: str, delimiter: str) -> list[tuple[int, dict]]:
    """(line number, {column: cell}) of each row of a TSV/CSV text after its header, blank lines skipped.
    The csv module reads the text wrapped with newline="" (so a quoted newline stays in its field), its field
    limit raised to the text's length for the read (a long text is a text like any other)."""
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    limit = csv.field_size_limit(max(csv.field_size_limit(), len(text)))
    try:
        header, records, line = next(reader), [], reader.line_num + 1
        if "text" not in header:
            raise DataFileError(f"{path}: the header row {header} has no 'text' column; name the columns "
                                f"text[, pair], label.")
        for cells in reader:
            if len(cells) > len(header):
                raise DataFileError(f"{path}, line {line}: {len(cells)} fields but the header row has "
                                    f"{len(header)}; quote a field that holds the delimiter {delimiter!r}.")
            if cells:
                records.append((line, dict(zip(header, cells))))
            line = reader.line_num + 1  # where the next row begins (a quoted newline spans lines)
    except csv.Error as error:
        raise DataFileError(f"{path}, line {reader.line_num}: {error}; fix the file's quoting.") from None
    finally:
        csv.field_size_limit(limit)
    return records


def _record(path: Path, line: int, record) -> Example:
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise DataFileError(f"{path}:{line}: each row needs a text (a string under 'text').")
    return Example(record["text"], record.get("pair") or None, record.get("label"), line)


# ---- labels -----------------------------------------------------------------------------------------------


def label_names(rows: Sequence[Example], task: str, num_labels: int | None, where: str = "the data"
                ) -> tuple[str, ...]:
    """The classes, in id order: 0 … num_labels − 1 for integer labels (named LABEL_i), else the sorted names.
    Integer labels without num_labels are counted from the largest, which must leave no class without an example:
    a stray label (a 5 among 0s and 1s) would otherwise add classes that nothing teaches, without a word."""
    if task == "masked-lm":
        return ()
    if num_labels is not None and (not is_whole(num_labels) or num_labels < 2):
        raise InputError(f"num_labels={num_labels!r}: pass the number of classes, a whole number of at least 2 "
                         f"(--num-labels), or leave it out to count them from the data.")
    labelled = [(i, x) for i, row in enumerate(rows)
                for x in (row.label if task == "token-classification" else [row.label])]
    flat = [x for _, x in labelled]
    if all(isinstance(x, int) for x in flat):
        negative = next(((i, x) for i, x in labelled if x < 0), None)
        if negative is not None:
            raise InputError(f"{where}: {row_name(rows, negative[0])}'s label {negative[1]} is negative; class "
                             f"numbers start at 0. Correct the row.")
        n = num_labels if num_labels is not None else max(flat) + 1
        outside = next(((i, x) for i, x in labelled if x >= n), None)
        if outside is not None:
            raise InputError(f"{where}: {row_name(rows, outside[0])}'s label {outside[1]} is out of range for "
                             f"num_labels={n}; labels are 0 … {n - 1}. Correct the row, or pass the number of "
                             f"classes (num_labels, --num-labels).")
        if num_labels is None:
            _check_every_class_has_an_example(rows, labelled, n, where)
        names = tuple(f"LABEL_{i}" for i in range(n))
    else:
        names = tuple(sorted({str(x) for x in flat}))
        if num_labels is not None and len(names) != num_labels:
            raise InputError(f"the data has {len(names)} label names {list(names)[:6]} but num_labels={num_labels}.")
    if len(names) < 2:
        raise InputError(f"classification needs at least 2 labels; got {list(names)}. Pass num_labels=2 or more.")
    return names


def _check_every_class_has_an_example(rows: Sequence[Example], labelled: list[tuple[int, int]], n: int,
                                      where: str) -> None:
    """Refuse class numbers 0 … n − 1 (n from the largest label) of which some have no example."""
    unused = sorted(set(range(n)) - {x for _, x in labelled})
    if unused:
        largest = next(i for i, x in labelled if x == n - 1)
        shown = ", ".join(map(str, unused[:6])) + (" …" if len(unused) > 6 else "")
        raise InputError(f"{where}: no row has label {shown}, but {row_name(rows, largest)}'s label {n - 1} makes "
                         f"{n} classes (0 … {n - 1}). Correct that row's label, or pass num_labels={n} (--num-labels "
                         f"{n}) if the classes with no example are meant.")


def label_ids(names: tuple[str, ...], where: str) -> Callable[[object, str], int]:
    """label_id(label, row) → the class id of a label under the training classes `names`; a label that is no
    class of theirs (eval data's included) is an InputError naming `where`, the row (row_name) and the classes."""
    ids = {name: i for i, name in enumerate(names)}
    numbered = names == tuple(f"LABEL_{i}" for i in range(len(names)))

    def label_id(label, row: str) -> int:
        if isinstance(label, int):
            if not numbered:
                raise InputError(f"{where}: {row}'s label {label} is a class number but the training labels are "
                                 f"names {list(names)[:6]}; use the names.")
            if not 0 <= label < len(names):
                raise InputError(f"{where}: {row}'s label {label} is not a class of the model: it has "
                                 f"{len(names)} classes, 0 … {len(names) - 1}.")
            return label
        if str(label) not in ids:
            raise InputError(f"{where}: {row}'s label {label!r} is not one of the training labels "
                             f"{list(names)[:6]}{' …' if len(names) > 6 else ''}.")
        return ids[str(label)]

    return label_id


# ---- encoding ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Encoded:
    """Tokenized examples, one unpadded row each (lists of int arrays)."""

    ids: list[np.ndarray]
    types: list[np.ndarray]
    labels: list[np.ndarray]  # per row: [1] class, [T] token labels (IGNORE where none), or [T] maskable (0/1)

    def __len__(self):
        return len(self.ids)


def encode(model, rows: Sequence[Example], task: str, names: tuple[str, ...], where: str = "the data") -> Encoded:
    """Tokenize every example once (truncated to the model's positions). Token labels go to each word's first
    word piece (transformers' run_ner convention); masked-LM rows mark the tokens it may mask (not specials).
    `names`: the training classes (label_names); a label outside them is an InputError naming `where`."""
    label_id = label_ids(names, where)
    texts = [row.text for row in rows]
    pairs = [row.pair for row in rows] if rows[0].pair is not None else None
    batch = model.tokenize(texts, pairs, max_length=model.config.max_tokens)
    encoded = Encoded([], [], [])
    cut = []
    for i, row in enumerate(rows):
        n, name = int(batch.attention_mask[i].sum()), row_name(rows, i)
        if n == model.config.max_tokens and _was_cut(row, batch.offsets[i][:n], batch.sequence_ids[i][:n]):
            cut.append(i)
        encoded.ids.append(np.asarray(batch.input_ids[i, :n], np.int32))
        encoded.types.append(np.asarray(batch.token_type_ids[i, :n], np.int32))
        if task == "sequence-classification":
            encoded.labels.append(np.array([label_id(row.label, name)], np.int32))
        elif task == "token-classification":
            encoded.labels.append(_word_labels(row, batch.offsets[i][:n], batch.sequence_ids[i][:n], label_id, name,
                                               where))
        else:
            encoded.labels.append(np.array([s is not None for s in batch.sequence_ids[i][:n]], np.int32))
    if len(cut) == 1:
        warnings.warn(f"{where}: {row_name(rows, cut[0])} is longer than the model's {model.config.max_tokens} tokens "
                      f"and was cut to fit; the model sees only its beginning.", stacklevel=3)
    elif cut:
        warnings.warn(f"{where}: {len(cut)} rows are longer than the model's {model.config.max_tokens} tokens and "
                      f"were cut to fit ({row_name(rows, cut[0])} the first); the model sees only their beginnings.",
                      stacklevel=3)
    return encoded


def _was_cut(row: Example, offsets, sequence_ids) -> bool:
    """Whether the row's tokens stop before the end of its text (or pair): truncation cut it."""
    ends = [0, 0]
    for (_, end), sequence in zip(offsets, sequence_ids):
        if sequence is not None:
            ends[sequence] = max(ends[sequence], end)
    return ends[0] < len(row.text.rstrip()) or (row.pair is not None and ends[1] < len(row.pair.rstrip()))


def _word_labels(row: Example, offsets, sequence_ids, label_id, name: str, where: str) -> np.ndarray:
    """Each word's label on its first word piece; words are the text split on spaces (found by offsets). `name`
    and `where`: the row and its data as messages name them (row_name, source_name)."""
    words = row.text.split()
    if not isinstance(row.label, (list, tuple)) or len(row.label) != len(words):
        count = len(row.label) if isinstance(row.label, (list, tuple)) else "no list of"
        raise InputError(f"{where}: {name} has {len(words)} words but {count} labels; token classification needs "
                         f"one label per space-separated word.")
    starts, position = [], 0
    for word in words:
        position = row.text.index(word, position)
        starts.append(position)
        position += len(word)
    word_at = np.searchsorted(starts, [start for start, _ in offsets], side="right") - 1
    labels, seen = np.full(len(offsets), IGNORE, np.int32), set()
    for t, (seq, w) in enumerate(zip(sequence_ids, word_at)):
        if seq == 0 and w not in seen:
            seen.add(w)
            labels[t] = label_id(row.label[w], name)
    return labels


# ---- batches ----------------------------------------------------------------------------------------------


def steps_per_epoch(n: int, batch_size: int) -> int:
    return -(-n // batch_size)


def epoch_order(n: int, epoch: int, seed: int, shuffle: bool) -> np.ndarray:
    """The order of the examples in `epoch`: a permutation drawn from (seed, epoch), so a resumed run
    sees the same order, or 0 … n − 1."""
    return np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)


STEP_PROGRAMS = 3  # step programs a run compiles at most (each costs seconds on a CPU)
ALIGN = 8  # step lengths are multiples of 8 (accelerators tile matmuls in 8s; a CPU does not mind)


def longest_rows(encoded: Encoded, orders: Iterable[np.ndarray], batch_size: int) -> np.ndarray:
    """The longest row of every batch `batches` makes from these epoch orders, in tokens."""
    lengths = np.array([len(ids) for ids in encoded.ids])
    return np.array([lengths[order[start:start + batch_size]].max()
                     for order in orders for start in range(0, len(order), batch_size)])


def step_lengths(longest: Sequence[int], limit: int, programs: int = STEP_PROGRAMS) -> tuple[int, ...]:
    """At most `programs` row lengths (multiples of ALIGN, at most `limit`) such that padding each batch to the
    shortest of them that holds its longest row (`longest`) pads the fewest tokens over the run: the optimal
    partition of the batches' lengths, by dynamic programming over the distinct ones.

    Fewer programs than a fixed grid of buckets (buckets.COARSE touches 5 or 6 for 2,000 short texts of lognormal
    lengths), and less padding: the lengths sit where this data's batches are."""
    rounded = np.minimum(-(-np.asarray(longest) // ALIGN) * ALIGN, limit)
    values, counts = np.unique(rounded, return_counts=True)
    before = np.concatenate([[0], np.cumsum(counts)])  # batches at the first i values: before[i]
    # cost[j][i]: padded length summed over the batches of values[:i], in j programs the last of which is values[i-1]
    cost = np.full((programs + 1, len(values) + 1), np.inf)
    cost[0, 0] = 0.0
    start = np.zeros((programs + 1, len(values) + 1), int)
    for j in range(1, programs + 1):
        for i in range(1, len(values) + 1):
            options = [cost[j - 1, a] + values[i - 1] * (before[i] - before[a]) for a in range(i)]
            start[j, i] = int(np.argmin(options))
            cost[j, i] = options[start[j, i]]
    j, i, chosen = int(np.argmin(cost[:, -1])), len(values), []
    while i > 0:
        chosen.append(int(values[i - 1]))
        i, j = start[j, i], j - 1
    return tuple(sorted(chosen))


def batches(encoded: Encoded, order: np.ndarray, batch_size: int, task: str, buckets: Sequence[int], *,
            pad_id: int, mask_id: int | None = None, vocab_size: int | None = None,
            mask_seed: Sequence[int] = (0,), first: int = 0, rows: int | None = None
            ) -> Iterator[dict[str, np.ndarray]]:
    """The batches of one epoch, in `order`: dicts of input_ids, token_type_ids, attention_mask [B, T], labels
    ([B] classes or [B, T] token labels, IGNORE where no loss) and weight [B] (0 for padding rows).
    Masked-LM batches are masked here (bert_masking), batch b with the generator seeded (*mask_seed, b), so any
    batch can be rebuilt alone (a resumed run starts at batch `first`). `rows`: rows per batch when more than
    batch_size (padding rows of weight 0, so that the rows split evenly over devices)."""
    for b, start in enumerate(range(0, len(order), batch_size)):
        if b < first:
            continue
        chosen = order[start:start + batch_size]
        length = bucket_length(max(len(encoded.ids[i]) for i in chosen), buckets)
        shape = (rows or batch_size, length)
        batch = {"input_ids": np.full(shape, pad_id, np.int32), "token_type_ids": np.zeros(shape, np.int32),
                 "attention_mask": np.zeros(shape, np.int32), "weight": np.zeros(shape[0], np.float32)}
        per_token = task != "sequence-classification"
        labels = np.full(shape if per_token else shape[:1], IGNORE if per_token else 0, np.int32)
        for row, i in enumerate(chosen):
            n = len(encoded.ids[i])
            batch["input_ids"][row, :n] = encoded.ids[i]
            batch["token_type_ids"][row, :n] = encoded.types[i]
            batch["attention_mask"][row, :n] = 1
            batch["weight"][row] = 1.0
            if per_token:
                labels[row, :n] = encoded.labels[i]
            else:
                labels[row] = encoded.labels[i][0]
        if task == "masked-lm":
            rng = np.random.default_rng([*mask_seed, b])
            batch["input_ids"], labels = bert_masking(batch["input_ids"], labels == 1, rng, mask_id, vocab_size)
        batch["labels"] = labels
        yield batch


def bert_masking(ids: np.ndarray, maskable: np.ndarray, rng: np.random.Generator, mask_id: int,
                vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, labels) for masked-LM: each maskable token is chosen with probability 0.15; a chosen token
    becomes [MASK] with probability 0.8, else a uniformly random id with probability 0.5, else stays; labels
    hold the original id at chosen positions and IGNORE elsewhere (DataCollatorForLanguageModeling's recipe)."""
    chosen = maskable & (rng.random(ids.shape) < MLM_PROBABILITY)
    labels = np.where(chosen, ids, IGNORE).astype(np.int32)
    masked = chosen & (rng.random(ids.shape) < MLM_MASKED)
    randomised = chosen & ~masked & (rng.random(ids.shape) < MLM_RANDOM)
    inputs = np.where(masked, mask_id, ids)
    inputs = np.where(randomised, rng.integers(0, vocab_size, ids.shape), inputs).astype(np.int32)
    return inputs, labels
