"""Reading a corpus: corpus files line by line (each process its share), lists and streams of texts, and
their tokenization a chunk at a time with truncation counted."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from minibert.errors import (
    AnalysisError,
    AnalysisWarning,
    DataFileError,
    DataFileMissing,
    MinibertError,
    outside_minibert,
)

CHUNK = 256  # documents tokenized at a time: the next chunk is tokenized while the device runs a batch


def read_corpus(path: str | Path, pairs: bool = False,
                shard: tuple[int, int] | None = None) -> tuple[list[str], list[str] | None]:
    """(texts, pairs or None) from a file; blank lines are skipped (CorpusFile.scan counts them).

    .tsv, or any text file with pairs=True: one `A<TAB>B` pair per line. .jsonl: one JSON object per
    line, with "text", or "text_a" and "text_b". Any other suffix (.txt): one text per line.
    shard=(index, count): only every count-th text from the index-th on (0-based, blank lines not
    counted), as one of `count` processes reads it; the file is streamed, never loaded whole.
    """
    corpus = CorpusFile(path, pairs)
    rows = list(corpus.rows(shard))
    return [a for a, _ in rows], [b for _, b in rows] if corpus.has_pairs else None


@dataclasses.dataclass
class Scan:
    """One pass over a corpus file: its share's rows, its blank lines, and a hash of every byte."""

    rows: int  # non-blank lines in the share
    blank_lines: int  # in the whole file
    first_blank: int | None  # its line number (1-based)
    fingerprint: str  # the size and sha256 of the whole file: any change to the file changes it


class CorpusFile:
    """A corpus file in read_corpus's formats, read line by line: `rows(shard)` yields (text, second text
    or None) for one process's share; `scan(shard)` reads it once to count and fingerprint it."""

    def __init__(self, path: str | Path, pairs: bool = False):
        self.path = Path(path)
        if not self.path.is_file():
            raise DataFileMissing(f"{self.path} is not a file; pass a .txt (one text per line), .tsv (A<TAB>B per "
                                  f"line) or .jsonl file.")
        first = next(self._lines(), None)
        if first is None:
            raise AnalysisError(f"{self.path} holds no text; put one text per line (or A<TAB>B pairs in a .tsv).")
        self.kind = "jsonl" if self.path.suffix == ".jsonl" else "pairs" if self.path.suffix == ".tsv" or pairs \
            else "texts"
        if self.kind == "jsonl":  # the first object's keys say whether the file holds texts or pairs
            row = self._json(*first)  # (number, line)
            self.keys = ("text_a", "text_b") if isinstance(row, dict) and "text_a" in row else ("text",)

    @property
    def has_pairs(self) -> bool:
        return self.kind == "pairs" or (self.kind == "jsonl" and len(self.keys) == 2)

    def rows(self, shard: tuple[int, int] | None = None, skip: int = 0) -> Iterator[tuple[str, str | None]]:
        """(text, second text or None) for every count-th non-blank line from the index-th on, after the
        first `skip` of them (a resumed survey's position)."""
        index, count = _checked_shard(shard)
        lines = itertools.islice(self._lines(), index, None, count)
        for number, line in itertools.islice(lines, skip, None):
            yield self.parse(line, number)

    def scan(self, shard: tuple[int, int] | None = None) -> Scan:
        """Every line of the share parsed once (a bad line near the end then costs a read of the file, not a
        survey thrown away), the blank lines counted, and every byte of the file hashed."""
        index, count = _checked_shard(shard)
        digest, size = hashlib.sha256(), 0
        rows = blank = seen = 0
        first_blank = None
        for number, raw, line in self._numbered():
            digest.update(raw)
            size += len(raw)
            if line is None:
                blank += 1
                first_blank = first_blank or number
                continue
            if seen % count == index:
                self.parse(line, number)
                rows += 1
            seen += 1
        return Scan(rows, blank, first_blank, f"{size} bytes, sha256 {digest.hexdigest()[:32]}")

    def _numbered(self) -> Iterator[tuple[int, bytes, str | None]]:
        """(line number from 1, its bytes, the line or None where it is blank) for every line."""
        with self.path.open("rb") as file:  # bytes, decoded line by line, so a decoding error names its line
            for number, raw in enumerate(file, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise DataFileError(f"{self.path}, line {number}: not valid UTF-8 (byte {raw[error.start]:#04x}, "
                                        f"the line's byte {error.start + 1}); save the file as UTF-8.") from None
                yield number, raw, line.rstrip("\r\n") if line.strip() else None

    def _lines(self) -> Iterator[tuple[int, str]]:
        """(line number from 1, line) for the lines that are not blank."""
        return ((number, line) for number, _, line in self._numbered() if line is not None)

    def parse(self, line: str, number: int | None = None) -> tuple[str, str | None]:
        """(text, second text or None) from one non-blank line (number: its line number, for errors)."""
        if self.kind == "texts":
            return line, None
        if self.kind == "pairs":
            parts = line.split("\t")
            if len(parts) != 2:
                bad = [] if number is None else [n for n, other in itertools.islice(self._lines_after(number), 4)
                                                 if other.count("\t") != 1]
                where = f"lines {[number, *bad]}" if number else _line(number, line)
                raise AnalysisError(f"{self.path}: {where} do not hold exactly two tab-separated texts (A<TAB>B).")
            return parts[0], parts[1]
        row = self._json(number, line)
        if not isinstance(row, dict) or any(not isinstance(row.get(key), str) for key in self.keys):
            raise AnalysisError(f"{self.path}, {_line(number, line)}: expected an object with string field(s) "
                                f"{' and '.join(repr(k) for k in self.keys)} like the first line; got {str(row)[:60]}.")
        return row[self.keys[0]], row[self.keys[1]] if len(self.keys) == 2 else None

    def _lines_after(self, number: int) -> Iterator[tuple[int, str]]:
        """Every non-blank line after line `number`: an error names up to five bad lines, not just one."""
        return ((n, line) for n, line in self._lines() if n > number)

    def _json(self, number: int | None, line: str):
        try:
            return json.loads(line)
        except json.JSONDecodeError as error:
            raise AnalysisError(f"{self.path}, {_line(number, line)}: not valid JSON ({error.msg}); write one object "
                                f'per line, e.g. {{"text": "..."}} or {{"text_a": "...", "text_b": "..."}}.') from None


def _line(number: int | None, line: str) -> str:
    """How an error names a line: by number where the reader knows it (a Ray block does not)."""
    return f"line {number}" if number else f"the line {line[:60]!r}"


def _checked_shard(shard) -> tuple[int, int]:
    if shard is None:
        return 0, 1
    try:
        index, count = (int(v) for v in shard)
    except (TypeError, ValueError):
        index, count = -1, 0
    if not 0 <= index < count:
        raise AnalysisError(f"shard must be (index, count) with 0 <= index < count, e.g. (jax.process_index(), "
                            f"jax.process_count()); got {shard!r}.")
    return index, count


class Source:
    """What a survey reads: a corpus file (each process its share) or lists / iterables of strings.

    total: documents this process will read (None for a stream); fingerprint: the file's, None for texts;
    blank_lines: the whole file's blank lines; strict: a blank line is an error instead of a count.
    """

    def __init__(self, texts, pairs, share: tuple[int, int] | None = None, strict: bool = False):
        self.share, self.blank_lines = share, 0
        if isinstance(texts, Path):
            if pairs is not None and not isinstance(pairs, bool):
                raise AnalysisError("with a corpus file, pairs is True (read a .txt as A<TAB>B) or left out; the "
                                    "second texts come from the file.")
            self.file = CorpusFile(texts, bool(pairs))
            scan = self.file.scan(share)
            if strict and scan.first_blank is not None:
                raise DataFileError(f"{texts}, line {scan.first_blank}: blank ({scan.blank_lines} blank lines in all); "
                                    f"remove blank lines, or survey with strict=False to skip and count them.")
            self.total, self.pairs, self.fingerprint = scan.rows, self.file.has_pairs, scan.fingerprint
            self.blank_lines = scan.blank_lines
            return
        if isinstance(texts, str) or isinstance(pairs, str):
            raise AnalysisError("survey takes a list (or iterable) of texts, or a pathlib.Path to a corpus file, not "
                                "one string; wrap a text as [text], a file name as Path(name).")
        if isinstance(pairs, bool):
            raise AnalysisError("pairs=True reads a corpus file's lines as A<TAB>B; with lists, pass the second "
                                "texts themselves.")
        if pairs is not None and hasattr(texts, "__len__") and hasattr(pairs, "__len__") and len(texts) != len(pairs):
            raise AnalysisError(f"got {len(texts)} texts but {len(pairs)} pairs; pass one second text per text.")
        for name, values in (("texts", texts), ("pairs", pairs)):
            if isinstance(values, Sequence):  # a list is checked whole before any batch runs; a stream, as read
                check_strings(name, values, 0, optional=name == "pairs")
        self.file, self.texts, self.second = None, texts, pairs
        self.pairs, self.fingerprint = pairs is not None, None
        self.total = len(texts) if hasattr(texts, "__len__") else None

    def rows(self, skip: int) -> Iterator[tuple[str, str | None]]:
        """(text, second text or None), after the first `skip` (a resumed survey's position)."""
        if self.file is not None:
            return self.file.rows(self.share, skip)
        rows = zip(self.texts, itertools.repeat(None)) if self.second is None else zip(self.texts, self.second,
                                                                                         strict=True)
        return itertools.islice(rows, skip, None)


def tokenized_chunks(model, rows: Iterator, pairs: bool, max_length: int, first: int,
                     strict: bool = False) -> Iterator[Tokenized]:
    """Up to CHUNK tokenized documents at a time, truncation counted; rows are padded to the chunk's
    longest; `first` numbers the first document in error messages. strict: a document longer than
    max_length is an error instead of a count."""
    for start in itertools.count(first, CHUNK):
        try:
            chunk = list(itertools.islice(rows, CHUNK))
        except ValueError as error:  # zip(strict=True) of iterables of different lengths
            if isinstance(error, MinibertError):  # a text's own error (a corpus line), already named
                raise
            raise AnalysisError(f"texts and pairs have different lengths ({error}).") from None
        if not chunk:
            return
        first_texts = [a for a, _ in chunk]
        second = [b for _, b in chunk] if pairs else None
        for name, values in (("texts", first_texts), ("pairs", second or ())):
            check_strings(name, values, start, optional=name == "pairs")
        yield _truncation_counted(model, first_texts, second, max_length, start, strict)


@dataclasses.dataclass
class Tokenized:
    """A chunk's token arrays ([B, T] int32, right-padded) and how many of its documents were truncated."""

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    attention_mask: np.ndarray
    truncated: int


class CutCount:
    """A stream's documents cut at max_length, counted; the first chunk that cuts any warns (once per stream) how
    many and how to keep them whole: training streams cut and say so, where held-out sets (sae.text_batch) refuse."""

    def __init__(self, max_length: int, positions: int):
        self.max_length, self.positions, self.read, self.cut, self.warned = max_length, positions, 0, 0, False

    def add(self, chunk: Tokenized) -> None:
        self.read += len(chunk.input_ids)
        self.cut += chunk.truncated
        if self.cut and not self.warned:
            self.warned = True
            more = (f"pass max_length= up to this model's {self.positions} positions" if self.max_length <
                    self.positions else "split long texts (this model reads no more tokens)")
            warnings.warn(f"{self.cut} of the first {self.read} texts had more than max_length={self.max_length} "
                          f"tokens and were cut to their first {self.max_length} (more may follow; this warning is "
                          f"given once per stream); to keep them whole, {more}.", AnalysisWarning,
                          stacklevel=outside_minibert())


def _truncation_counted(model, texts: list[str], pairs: list[str] | None, max_length: int, start: int,
                        strict: bool) -> Tokenized:
    """Tokenized with one token of room past max_length: the rows that use it are the truncated ones; only
    they are tokenized again at max_length, the others are already what max_length gives."""
    batch = model.tokenize(texts, pairs, max_length=max_length + 1)
    arrays = [batch.input_ids, batch.token_type_ids, batch.attention_mask]
    cut = np.flatnonzero(arrays[2].sum(1) > max_length)
    if cut.size and strict:
        raise AnalysisError(f"document {start + int(cut[0])} has more than max_length={max_length} tokens "
                            f"({cut.size} in this chunk of {len(texts)}); raise max_length, or survey with "
                            f"strict=False to truncate and count them.")
    if cut.size:
        again = model.tokenize([texts[i] for i in cut], None if pairs is None else [pairs[i] for i in cut],
                               max_length=max_length)
        for whole, part in zip(arrays, (again.input_ids, again.token_type_ids, again.attention_mask)):
            whole[cut] = 0  # past a row's mask nothing is read (the packer takes each row's first mask-sum tokens)
            whole[cut, :part.shape[1]] = part
    return Tokenized(*(a[:, :max_length] for a in arrays), truncated=int(cut.size))


def check_strings(name: str, values: Sequence, start: int, optional: bool = False) -> None:
    """Every value is a text (or None where `optional`: a second text left out, so that row is a single text, as
    tokenize reads pairs=[None, "B"]); the error names the first that is not by its index (`start` numbers
    values[0])."""
    bad = next((i for i, v in enumerate(values) if not isinstance(v, str) and not (optional and v is None)), None)
    if bad is not None:
        allowed = "text, or None for a row without a second text" if optional else "text"
        raise AnalysisError(f"{name}[{start + bad}] is not a string but {type(values[bad]).__name__}; pass "
                            f"{allowed}.")
