"""The corpus runner: stream texts (or pairs) through the model and accumulate head statistics on the device.

    result = minibert.analysis.corpus.survey(model, texts, pairs=None)      # lists, or iterables of str
    result = minibert.analysis.corpus.survey(model, Path("corpus.tsv"))     # a file, streamed
    result.mean["to_sep"]       # [L, H], averaged over documents (layers and heads 0-indexed)
    result.save("survey")       # survey.npz + survey.json

How a corpus runs:
- Texts are tokenized a chunk at a time (CHUNK documents), so an iterable corpus streams in bounded
  memory, and the host tokenizes the next chunk while the device runs a batch.
- Documents are packed into rows of a few fixed lengths (default_buckets: 128 for segments up to 128
  tokens; 128, 256, 512, … for longer ones), several to a row, first fit and longest first, so rows
  carry little padding and only one program per row length is compiled. Two hooks keep packed
  documents apart: positions restart at each document, and each token attends only to its own
  document (the softmax gives every other key exactly 0), so each document's patterns are the ones it
  has alone. pack=False puts one document per row instead (then use several buckets).
- A batch is `batch_tokens // row length` rows (rounded down to a multiple of the device count): 2048
  tokens on a CPU, where bigger batches fall out of the caches. The jitted step is cached per model,
  so a second survey on the same model compiles nothing.
- Each batch is one jitted step — forward, the statistics of heads.layer_statistics layer by layer
  (per-token weights make a row's sum the sum of its documents' statistics), sums into running totals —
  so attention patterns never leave the device. XLA drops what the statistics do not read (the last
  layer's values, output projection and FFN, the pooler).
- SurveyResult.counts says how many batches ran and how many tokens they held, padding included.
- Compiling takes a second or two per row length on a CPU. To keep the programs across processes,
  turn on JAX's persistent cache before the first survey:
  `jax.config.update("jax_compilation_cache_dir", "~/.cache/jax")`.

Scale-out (docs/scale_out.md): the batch axis is sharded over the local devices (`jax.sharding`, one mesh
axis "data"). Several processes (`initialize()`, i.e. jax.distributed, in each) run in one of two ways:
- reduce="global" (default): every process calls `survey(model, path)` with the same corpus file and reads
  and tokenizes only its share (every `jax.process_count()`-th text, streamed); the processes run in
  lockstep, one global batch at a time (`jax.make_array_from_process_local_data`), agree before each
  chunk on how many batches of each row length to run (a process with fewer documents runs empty
  ones), and all return the statistics of the whole corpus. At the start they check that they run the
  same settings, weights and corpus, and a process that stops answering ends the run with a
  DistributedError naming it after `timeout` seconds.
- reduce="local": no communication; each process returns the result of its own share, and
  `SurveyResult.merge` adds them up (the same engine a Ray fleet uses: corpus_ray.survey_ray).
checkpoint=path keeps the running totals and the position (rewritten atomically every `every` documents);
a survey started again with the same checkpoint resumes there, with totals identical to an
uninterrupted run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import itertools
import json
import os
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from minibert.analysis import heads
from minibert.api import length_buckets
from minibert.errors import AnalysisError, DataFileError, DataFileMissing, DistributedError, MinibertError
from minibert.hooks import HookFn
from minibert.model import position_rows

CHUNK = 256  # documents tokenized at a time: the next chunk is tokenized while the device runs a batch
_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model → {(js, sep_normalization): jitted step}
_PLACED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model → (state, device ids, state on them)
_DIGESTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model → (state, sha256 of the weights)
_RUNS = itertools.count()  # surveys started in this process: names each run's handshake keys
MERGE_KEYS = ("model", "max_length", "segment_ids", "sep_normalization")  # settings that change the numbers


@dataclasses.dataclass
class SurveyResult:
    """Per-head statistics averaged over documents ([L, H] each; layers and heads 0-indexed)."""

    mean: dict[str, np.ndarray]
    documents: int
    js_divergence: np.ndarray | None = None  # [L·H, L·H], summed over documents (docs/definitions.md)
    settings: dict = dataclasses.field(default_factory=dict)
    counts: dict = dataclasses.field(default_factory=dict)  # batches, tokens_run (padded), real_tokens

    def table(self) -> list[dict]:
        return heads.head_table(self.mean)

    @property
    def sums(self) -> dict[str, np.ndarray]:
        """Each statistic summed over the documents ([L, H]): mean × documents, what merging adds."""
        return {name: value * self.documents for name, value in self.mean.items()}

    @classmethod
    def merge(cls, results: Iterable[SurveyResult]) -> SurveyResult:
        """The result of one survey over the union of the results' corpora (each process's reduce="local"
        result, Ray blocks, saved and loaded parts): documents and counts summed, means weighted by
        documents, Jensen–Shannon sums added. The parts must agree on the settings in MERGE_KEYS."""
        results = list(results)
        if not results or not all(isinstance(r, SurveyResult) for r in results):
            raise AnalysisError("merge takes a non-empty list of SurveyResult (e.g. each process's "
                                "survey(..., reduce='local')).")
        _check_mergeable(results)
        documents = sum(r.documents for r in results)
        if documents == 0:
            raise AnalysisError("the results to merge hold no documents; survey at least one text.")
        mean = {name: sum(r.sums[name] for r in results) / documents for name in results[0].mean}
        js = None if results[0].js_divergence is None else sum(r.js_divergence for r in results)
        counts = {key: sum(r.counts.get(key, 0) for r in results) for key in results[0].counts}
        return cls(mean, documents, js, _merged_settings([r.settings for r in results]), counts)

    def save(self, path: str | Path) -> tuple[Path, Path]:
        """Write `path.npz` (arrays) and `path.json` (settings, documents, tidy per-head table). A
        suffix .npz, .json or .csv on `path` is dropped; any other dot stays part of the name.
        A result every process of a reduce="global" run holds is written by process 0 only (the others
        return the same paths and write nothing)."""
        npz, js = output_paths(path)
        if self.settings.get("reduce") == "global" and self.settings.get("processes", 1) > 1 \
                and jax.process_index() != 0:
            return npz, js
        arrays = dict(self.mean)
        if self.js_divergence is not None:
            arrays["js_divergence"] = self.js_divergence
        np.savez_compressed(npz, **arrays)
        js.write_text(json.dumps({"documents": self.documents, "settings": self.settings, "counts": self.counts,
                                  "heads": self.table()}, indent=1))
        return npz, js

    @classmethod
    def load(cls, path: str | Path) -> SurveyResult:
        """Read back what `save(path)` wrote."""
        npz, js_path = output_paths(path)
        with np.load(npz) as arrays:
            mean = {name: arrays[name] for name in arrays.files if name != "js_divergence"}
            js = arrays["js_divergence"] if "js_divergence" in arrays.files else None
        info = json.loads(js_path.read_text())
        return cls(mean, info["documents"], js, info["settings"], info.get("counts", {}))


def _check_mergeable(results: list[SurveyResult]) -> None:
    """The parts of a merge measure the same thing: the same statistics and head grid, the same settings
    in MERGE_KEYS, and a Jensen–Shannon matrix in all or none."""
    first = results[0]
    for number, result in enumerate(results[1:], 1):
        if set(result.mean) != set(first.mean) or any(result.mean[k].shape != first.mean[k].shape for k in first.mean):
            raise AnalysisError(f"result {number} holds other statistics or another head grid than result 0; merge "
                                f"only surveys of the same model.")
        differ = [key for key in MERGE_KEYS if result.settings.get(key) != first.settings.get(key)]
        if differ:
            key = differ[0]
            raise AnalysisError(f"result {number} was surveyed with {key}={result.settings.get(key)!r} but result 0 "
                                f"with {key}={first.settings.get(key)!r}; merge only surveys run with the same "
                                f"{', '.join(MERGE_KEYS)}.")
        if (result.js_divergence is None) != (first.js_divergence is None):
            raise AnalysisError(f"result {number} and result 0 differ in js_divergence (one has the matrix); run "
                                f"every part with the same js_divergence setting.")


def _merged_settings(settings: list[dict]) -> dict:
    """Settings of a merged result: what every part shares, devices and processes added up, and None where
    the parts differ in how they ran (batching, say)."""
    merged = {key: value if all(s.get(key) == value for s in settings) else None
              for key, value in settings[0].items()}
    for key in ("devices", "processes"):
        if all(key in s for s in settings):
            merged[key] = sum(s[key] for s in settings)
    merged["reduce"] = "merged"
    return merged


def output_paths(path: str | Path) -> tuple[Path, Path]:
    """(prefix.npz, prefix.json) for a prefix, or for a path that already ends in .npz, .json or .csv."""
    path = Path(path)
    prefix = path.with_suffix("") if path.suffix in (".npz", ".json", ".csv") else path
    return prefix.with_name(prefix.name + ".npz"), prefix.with_name(prefix.name + ".json")


# ---- reading a corpus ---------------------------------------------------------------------------------

def read_corpus(path: str | Path, pairs: bool = False,
                shard: tuple[int, int] | None = None) -> tuple[list[str], list[str] | None]:
    """(texts, pairs or None) from a file; blank lines are skipped.

    .tsv, or any text file with pairs=True: one `A<TAB>B` pair per line. .jsonl: one JSON object per
    line, with "text", or "text_a" and "text_b". Any other suffix (.txt): one text per line.
    shard=(index, count): only every count-th text from the index-th on (0-based, blank lines not
    counted), as one of `count` processes reads it; the file is streamed, never loaded whole.
    """
    corpus = CorpusFile(path, pairs)
    rows = list(corpus.rows(shard))
    return [a for a, _ in rows], [b for _, b in rows] if corpus.has_pairs else None


class CorpusFile:
    """A corpus file in read_corpus's formats, read line by line: `rows(shard)` yields (text, second text
    or None) for one process's share; `fingerprint()` tells copies of the file apart cheaply."""

    FINGERPRINT_BYTES = 1 << 20  # the file's size and a hash of its first MB identify it across processes

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

    def fingerprint(self) -> str:
        with self.path.open("rb") as file:
            head = file.read(self.FINGERPRINT_BYTES)
        return f"{self.path.stat().st_size} bytes, sha256 of the first MB {hashlib.sha256(head).hexdigest()[:16]}"

    def _lines(self) -> Iterator[tuple[int, str]]:
        """(line number from 1, line) for the lines that are not blank."""
        with self.path.open("rb") as file:  # bytes, decoded line by line, so a decoding error names its line
            for number, raw in enumerate(file, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise DataFileError(f"{self.path}, line {number}: not valid UTF-8 (byte {raw[error.start]:#04x}, "
                                        f"the line's byte {error.start + 1}); save the file as UTF-8.") from None
                if line.strip():
                    yield number, line.rstrip("\r\n")

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


# ---- batching -----------------------------------------------------------------------------------------

def default_buckets(max_length: int) -> tuple[int, ...]:
    """Row lengths 128, 256, 512, … up to max_length (just max_length when it is at most 128). Rows pack
    several documents, so one row length wastes little; each length is one program to compile — on a
    CPU a compile costs as much as running ten to twenty thousand tokens — and attention over long rows
    costs more per token, hence a few lengths for long documents. The rule is the core's (api.length_buckets)."""
    return length_buckets(max_length, smallest=128, per_octave=1)


def default_batch_tokens(platform: str) -> int:
    """Tokens per batch: 2048 on a CPU, where bigger batches fall out of the caches and run slower per
    token (benchmarks/RESULTS.md); 16384 on GPUs and TPUs, which need wide batches to fill."""
    return 2048 if platform == "cpu" else 16384


def batch_rows(size: int, batch_tokens: int, multiple: int) -> int:
    """Rows per batch for rows of `size` tokens: batch_tokens // size, rounded down to a multiple of
    `multiple` (the devices a batch is sharded over), at least `multiple`."""
    return max(multiple, batch_tokens // size // multiple * multiple)


class _Packer:
    """Tokenized documents packed into rows of their bucket's length: first fit, longest first.

    A row holds one or more whole documents; a batch is rows(bucket) rows. Open rows keep taking
    documents until a batch of the fullest is sent; at the end the rest goes too.
    """

    def __init__(self, buckets: Sequence[int], rows: Callable[[int], int], pack: bool = True):
        self.buckets, self.rows, self.pack = tuple(buckets), rows, pack
        self.open: dict[int, list] = {size: [] for size in self.buckets}  # [free tokens, [(ids, types), …]]
        self.used: set[int] = set()  # buckets that ran a batch (their program is compiled)

    def add(self, batch) -> None:
        """Place every document of a tokenized Batch, longest first, in its bucket's first row with room."""
        lengths = batch.attention_mask.sum(1)
        for i in np.argsort(-lengths, kind="stable"):
            n = int(lengths[i])
            self._place((batch.input_ids[i, :n], batch.token_type_ids[i, :n]))

    def _place(self, document, smallest: int | None = None) -> None:
        """Into the first open row with room, in the document's bucket or a longer one (a gap in a longer
        row costs nothing more), else into a new row of its bucket."""
        n = len(document[0])
        first = int(np.searchsorted(self.buckets, max(n, smallest or 0)))
        candidates = (row for size in self.buckets[first:] for row in self.open[size]) if self.pack else ()
        row = next((row for row in candidates if row[0] >= n), None)
        if row is None:
            row = [self.buckets[first], []]
            self.open[self.buckets[first]].append(row)
        row[0] -= n
        row[1].append(document)

    def _take(self, size: int, keep: int) -> list[tuple[int, list]]:
        """Full batches of the fullest open rows, leaving at least `keep` rows open."""
        n = self.rows(size)
        rows = sorted(self.open[size], key=lambda row: row[0])
        full = max(0, len(rows) - keep) // n * n
        self.open[size] = rows[full:]
        if full:
            self.used.add(size)
        return [(size, [row[1] for row in rows[start:start + n]]) for start in range(0, full, n)]

    def full_batches(self) -> list[tuple[int, list]]:
        """[(bucket, rows of documents)] for each full batch there is, keeping a batch of rows open in each
        bucket for the documents still to come."""
        return [batch for size in self.buckets for batch in self._take(size, keep=self.rows(size))]

    def flush(self) -> list[tuple[int, list]]:
        """Everything left. A bucket whose program is not compiled yet hands its documents up to the next
        bucket (a compile costs more than a batch on a CPU); otherwise its last rows run as one partly
        filled batch."""
        batches = []
        for lower, upper in zip(self.buckets, self.buckets[1:]):
            if lower not in self.used and self.open[lower]:
                for row in self.open.pop(lower):
                    for document in row[1]:
                        self._place(document, upper)
                self.open[lower] = []
            else:
                batches += self._flush(lower)
        return batches + self._flush(self.buckets[-1])

    def _flush(self, size: int) -> list[tuple[int, list]]:
        batches = self._take(size, keep=0)
        if self.open[size]:
            batches.append((size, [row[1] for row in self.open[size]]))
            self.open[size] = []
        return batches


# ---- the survey ---------------------------------------------------------------------------------------

def survey(model, texts: Iterable[str] | Path, pairs: Iterable[str] | bool | None = None, *,
           batch_tokens: int | None = None, batch_size: int | None = None, max_length: int = 128,
           buckets: Sequence[int] | None = None, pack: bool = True, segment_ids: str = "real",
           js_divergence: bool = False, progress: bool = True, devices: Sequence | None = None,
           sep_normalization: str = "clark", reduce: str = "global", checkpoint: str | Path | None = None,
           every: int = 100_000, timeout: float = 60.0) -> SurveyResult:
    """Clark et al. head statistics over a corpus (docs/definitions.md), each averaged over documents.

    texts: a pathlib.Path to a corpus file in read_corpus's formats (pairs=True reads a .txt as A<TAB>B),
      streamed; with several processes each reads and tokenizes only its share. Or lists / iterables of
      strings, streamed a chunk at a time (pairs: one second text per text); with several processes,
      each process's own share. Segments longer than max_length tokens are truncated (longest first).
    batch_tokens: tokens per batch (default: default_batch_tokens of the devices' platform); rows of
      length T run batch_tokens // T at a time (rounded down to a multiple of the device count). With
      several processes: per process.
    batch_size: rows per batch for every row length instead (a multiple of the device count).
    buckets: the row lengths (default: default_buckets(max_length)); one compiled program each.
    pack: several documents per row (True), or one (False).
    segment_ids: "real" (sentence B gets type 1) or "zeros" (Clark et al.'s extraction script).
    js_divergence: also accumulate the Jensen–Shannon matrix between heads (much more work per batch).
    sep_normalization: "clark" (sep_to_sep / 2, rest_to_sep / (n − 2), the paper's; default) or "count".
    devices: the local devices to shard each batch over (default: all of them).
    reduce: "global" — with several processes (initialize()) they run in lockstep and each returns the
      result of the whole corpus; "local" — this process's share alone, no communication: add the
      processes' results up with SurveyResult.merge.
    checkpoint: a file for the running totals and the position, rewritten atomically every `every`
      documents (per process) and at the end; a survey that finds it resumes there (same settings,
      weights, corpus and process count, else an error naming what differs). With reduce="global"
      process 0 writes it and every process reads it (put it on a disk they share); with "local" and
      several processes each process keeps its own (the file name plus ".process<i>").
    timeout: seconds a process waits at each chunk for the others before it stops with a
      DistributedError naming the missing ones; keep it below initialize()'s heartbeat_timeout.
    """
    heads.check_segment_ids(segment_ids)
    heads.check_sep_normalization(sep_normalization)
    if reduce not in ("global", "local"):
        raise AnalysisError(f"reduce must be 'global' (every process gets the whole corpus's result) or 'local' "
                            f"(this process's share, to merge later), not {reduce!r}.")
    if not every >= 1 or not timeout > 0:
        raise AnalysisError(f"every (documents between checkpoints) must be at least 1 and timeout (seconds) "
                            f"positive; got every={every}, timeout={timeout}.")
    devices = _checked_devices(devices, reduce)
    distributed = reduce == "global" and jax.process_count() > 1
    batch_tokens = default_batch_tokens(devices[0].platform) if batch_tokens is None else batch_tokens
    if batch_size is not None and (batch_size < 1 or batch_size % len(devices)):
        suggestion = len(devices) * max(1, batch_size // len(devices))
        raise AnalysisError(f"batch_size {batch_size} must be a positive multiple of the {len(devices)} devices "
                         f"each batch is sharded over; try batch_size={suggestion}.")
    if batch_tokens < 1:
        raise AnalysisError(f"batch_tokens must be positive (tokens per batch, e.g. 2048); got {batch_tokens}.")
    buckets = _checked_buckets(buckets, max_length, model.config.max_tokens)
    rows = (lambda size: batch_size) if batch_size else (lambda size: batch_rows(size, batch_tokens, len(devices)))
    settings = dict(batch_tokens=None if batch_size else batch_tokens, batch_size=batch_size,
                    max_length=max_length, buckets=list(buckets), pack=pack, segment_ids=segment_ids,
                    sep_normalization=sep_normalization, devices=len(devices), model=model.source)

    source = _Source(texts, pairs)
    # What processes and checkpoints compare; the weights' hash stands for the model, whose path may differ by host.
    run_id = dict({k: v for k, v in settings.items() if k != "model"}, js_divergence=js_divergence, reduce=reduce,
                  processes=jax.process_count(), chunk=CHUNK, every=-(-every // CHUNK) * CHUNK,
                  corpus=source.fingerprint)
    if distributed or checkpoint is not None:
        run_id["weights"] = _weights_digest(model)
    saved = _Checkpoint.open(checkpoint, reduce, run_id)
    documents_in = source.rows(skip=saved.chunks * CHUNK)
    if distributed:
        first = list(itertools.islice(documents_in, CHUNK))
        documents_in = itertools.chain(first, documents_in)
        _check_processes_agree(run_id, saved.chunks, first if source.fingerprint is None else None)

    mesh = Mesh(np.array(jax.devices() if distributed else devices), ("data",))
    replicated, by_rows = NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec("data"))
    state = _placed_state(model, mesh)
    step = _survey_step(model, js_divergence, sep_normalization)
    totals = _replicated(saved.totals or _zeros(model, js_divergence), replicated)
    packer = _Packer(buckets, rows, pack)
    packer.used = set(saved.used)
    bar = _progress(source.total, progress and (not distributed or jax.process_index() == 0))
    previous, counts = None, dict(batches=0, tokens_run=0, real_tokens=0)
    tag = f"minibert/survey/{next(_RUNS)}"

    def run(batches):
        nonlocal totals, previous
        for size, packed in batches:
            local = _packed_rows(model, size, packed, rows(size), segment_ids)
            documents = int(local["documents"].max(1).sum())
            counts["batches"] += 1
            counts["tokens_run"] += local["input_ids"].size
            counts["real_tokens"] += int(local["attention_mask"].sum())
            totals = step(state, totals, {k: jax.make_array_from_process_local_data(by_rows, v)
                                          for k, v in local.items()})
            if previous is not None:  # one batch in flight while the host prepares the next
                jax.block_until_ready(previous[0])
                if bar is not None:
                    bar.update(previous[1])
            previous = (totals, documents)

    def keep(chunks: int):
        """Run what the packer holds and save the totals: the position is then a whole number of chunks."""
        run(_agreed(packer.flush(), buckets, more=False)[0])
        host = {name: np.asarray(value) for name, value in totals.items()}
        everywhere = _summed_over_processes(counts) if distributed else counts
        if not distributed or jax.process_index() == 0:
            saved.save(chunks, host, packer.used, {k: v + saved.counts.get(k, 0) for k, v in everywhere.items()})

    chunks = _tokenized_chunks(model, documents_in, source.pairs, max_length, saved.chunks * CHUNK)
    with _named_peer_failures(distributed, timeout):
        for index in itertools.count(saved.chunks):
            batch = next(chunks, None)
            if batch is not None:
                lengths = batch.attention_mask.sum(1)
                if lengths.max() > buckets[-1]:
                    raise AnalysisError(f"document {index * CHUNK + int(lengths.argmax())} has {lengths.max()} tokens "
                                        f"but the largest bucket is {buckets[-1]}; add a bucket of {max_length} "
                                        f"(max_length).")
                packer.add(batch)
            if distributed:
                _await_peers(tag, index, timeout)
            batches, more = _agreed(packer.full_batches(), buckets, more=batch is not None)
            run(batches)
            if not more:
                break
            if saved.path is not None and (index + 1) * CHUNK % run_id["every"] == 0:
                keep(index + 1)
        if saved.path is not None:
            keep(index + 1)
        else:
            run(_agreed(packer.flush(), buckets, more=False)[0])
        if distributed:
            counts = _summed_over_processes(counts)
        if bar is not None:
            if previous is not None:
                bar.update(previous[1])
            bar.close()
        totals = {name: np.asarray(value, np.float64) for name, value in totals.items()}
    counts = {key: value + saved.counts.get(key, 0) for key, value in counts.items()}
    documents = int(round(float(totals.pop("documents"))))
    if documents == 0 and (reduce == "global" or jax.process_count() == 1):
        raise AnalysisError("survey got no texts; pass a non-empty list (or iterable) of strings, or a file.")
    js = totals.pop("js_divergence", None)
    settings.update(devices=mesh.size, processes=jax.process_count() if distributed else 1, reduce=reduce)
    mean = {name: totals[name] / max(documents, 1) for name in heads.STATISTICS}
    return SurveyResult(mean, documents, js, settings, counts)


class _Source:
    """What survey reads: a corpus file (each process its share) or lists / iterables of strings."""

    def __init__(self, texts, pairs):
        if isinstance(texts, Path):
            if pairs is not None and not isinstance(pairs, bool):
                raise AnalysisError("with a corpus file, pairs is True (read a .txt as A<TAB>B) or left out; the "
                                    "second texts come from the file.")
            self.file = CorpusFile(texts, bool(pairs))
            # Every line of this process's share is read and parsed once before the first batch (and counted,
            # for the progress bar): a bad line near the end costs a read of the file, not a survey thrown away.
            self.total = sum(1 for _ in self.file.rows(_process_share()))
            self.pairs, self.fingerprint = self.file.has_pairs, self.file.fingerprint()
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
                _check_strings(name, values, 0)
        self.file, self.texts, self.second = None, texts, pairs
        self.pairs, self.fingerprint = pairs is not None, None
        self.total = len(texts) if hasattr(texts, "__len__") else None

    def rows(self, skip: int) -> Iterator[tuple[str, str | None]]:
        """(text, second text or None), after the first `skip` (a resumed survey's position)."""
        if self.file is not None:
            return self.file.rows(_process_share(), skip)
        rows = zip(self.texts, itertools.repeat(None)) if self.second is None else zip(self.texts, self.second,
                                                                                         strict=True)
        return itertools.islice(rows, skip, None)


def _process_share() -> tuple[int, int] | None:
    """(index, count) of this process's share of a corpus file (CorpusFile.rows' shard); None: one process."""
    return (jax.process_index(), jax.process_count()) if jax.process_count() > 1 else None


def _checked_devices(devices, reduce: str) -> list:
    local = jax.local_devices()
    if devices is None:
        return local
    devices = list(devices)
    if not devices:
        raise AnalysisError("devices is empty; leave it out to use every local device, or pass some of "
                         "jax.local_devices().")
    foreign = [d for d in devices if d not in local]
    if foreign:
        raise AnalysisError(f"devices {foreign} are not local devices of this process; pick from {local}.")
    if jax.process_count() > 1 and reduce == "global" and devices != local:
        raise AnalysisError("with several processes and reduce='global' every process shards over all its local "
                            "devices; leave devices out (or use reduce='local').")
    return devices


def _checked_buckets(buckets, max_length: int, positions: int) -> tuple[int, ...]:
    if not 3 <= max_length <= positions:
        raise AnalysisError(f"max_length must lie between 3 ([CLS] text [SEP]) and the model's {positions} "
                         f"positions; got {max_length}.")
    if buckets is None:
        return default_buckets(max_length)
    buckets = tuple(sorted({int(b) for b in buckets}))
    if not buckets or buckets[0] < 1 or buckets[-1] > positions:
        raise AnalysisError(f"buckets must be row lengths from 1 to the model's {positions} positions, e.g. "
                         f"(128,); got {buckets}.")
    return buckets


def _tokenized_chunks(model, rows: Iterator, pairs: bool, max_length: int, first: int) -> Iterator:
    """Batches of up to CHUNK tokenized documents (rows padded to the chunk's longest); `first` numbers
    the first document in error messages."""
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
            _check_strings(name, values, start)
        yield model.tokenize(first_texts, second, max_length=max_length)


def _check_strings(name: str, values: Sequence, start: int) -> None:
    """Every value is a text; the error names the first that is not by its index (`start` numbers values[0])."""
    bad = next((i for i, v in enumerate(values) if not isinstance(v, str)), None)
    if bad is not None:
        raise AnalysisError(f"{name}[{start + bad}] is not a string but {type(values[bad]).__name__}; pass text.")


def _agreed(batches: list, buckets: Sequence[int], more: bool) -> tuple[list, bool]:
    """The same batch shapes in every process: each runs, per bucket, as many batches as the process
    with the most, the missing ones empty (None); `more`: whether any process has documents left."""
    if jax.process_count() == 1:
        return batches, more
    counts = np.array([more] + [sum(size == s for s, _ in batches) for size in buckets], np.int32)
    agreed = _gathered(counts).max(0)
    padded = [b for size in buckets for b in [x for x in batches if x[0] == size]]
    for size, wanted in zip(buckets, agreed[1:]):
        padded += [(size, None)] * int(wanted - sum(size == s for s, _ in batches))
    return padded, bool(agreed[0])


# ---- several processes --------------------------------------------------------------------------------

def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, heartbeat_timeout: int = 100) -> None:
    """Start jax.distributed for a multi-process survey; call it in every process before anything else
    touches JAX. Arguments left out come from JAX_COORDINATOR_ADDRESS (host:port of process 0),
    JAX_NUM_PROCESSES and JAX_PROCESS_ID. On CPUs the collectives go over gloo.
    heartbeat_timeout: seconds after which the runtime declares a silent process dead and aborts every
    other one (SIGABRT, which no Python code can catch); survey's `timeout` should stay below it so that
    the survey stops first, with an error that names the process."""
    values = {"JAX_COORDINATOR_ADDRESS": coordinator_address, "JAX_NUM_PROCESSES": num_processes,
              "JAX_PROCESS_ID": process_id}
    values = {name: os.environ.get(name) if value is None else value for name, value in values.items()}
    missing = [name for name, value in values.items() if value is None]
    if missing:
        raise DistributedError(f"{', '.join(missing)} not set; pass the coordinator address (host:port of process "
                               f"0), the number of processes and this process's id, or set those variables.")
    try:
        count, index = int(values["JAX_NUM_PROCESSES"]), int(values["JAX_PROCESS_ID"])
    except ValueError:
        raise DistributedError(f"the number of processes and the process id must be integers; got "
                               f"{values['JAX_NUM_PROCESSES']!r} and {values['JAX_PROCESS_ID']!r}.") from None
    if not 0 <= index < count:
        raise DistributedError(f"process id {index} must lie in 0 … {count - 1} (the number of processes is {count}).")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(values["JAX_COORDINATOR_ADDRESS"], count, index,
                               heartbeat_timeout_seconds=int(heartbeat_timeout))


def _gathered(values: np.ndarray) -> np.ndarray:
    """[processes, …]: every process's `values` (one small all-gather)."""
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(values))


def _summed_over_processes(counts: dict) -> dict:
    keys = sorted(counts)
    total = _gathered(np.array([counts[k] for k in keys], np.int64)).sum(0)
    return {key: int(value) for key, value in zip(keys, total)}


def _digest(value) -> np.ndarray:
    """sha256 of a JSON-able value as 32 uint8: what the processes compare."""
    text = json.dumps(value, sort_keys=True, default=str)
    return np.frombuffer(hashlib.sha256(text.encode()).digest(), np.uint8)


def _check_processes_agree(run_id: dict, position: int, first_texts: list | None) -> None:
    """Before the first batch: every process runs the same settings and weights on the same corpus file
    from the same checkpoint position, or the survey stops naming what differs. With lists of texts,
    every process getting the same first texts means each was handed the whole corpus."""
    items = {"settings": {k: v for k, v in run_id.items() if k not in ("weights", "corpus")},
             "weights": run_id.get("weights"), "corpus file": run_id["corpus"], "checkpoint position": position}
    mine = np.stack([_digest(value) for value in items.values()] + [_digest(first_texts)])
    every = _gathered(mine)  # [processes, items + 1, 32]
    for number, (name, value) in enumerate(items.items()):
        differ = [p for p in range(len(every)) if not np.array_equal(every[p, number], every[0, number])]
        if differ:
            raise DistributedError(f"processes {differ} differ from process 0 in their {name} (this process, "
                                   f"{jax.process_index()}, has {str(value)[:300]}); start every process with the "
                                   f"same model, settings, corpus file and checkpoint.")
    if first_texts is not None and all(np.array_equal(row, every[0, -1]) for row in every[:, -1]):
        raise DistributedError(f"all {len(every)} processes were given the same texts, so every document would count "
                               f"{len(every)} times; pass each process its own share, or a pathlib.Path to the "
                               f"corpus file, which survey shares out itself.")


def _await_peers(tag: str, index: int, timeout: float) -> None:
    """Every process says it reached chunk `index` and waits (at most `timeout` seconds) for the others,
    through jax.distributed's key-value store, so that a process that died or hangs is named in an error
    here instead of leaving the others blocked in a collective."""
    from jax._src.distributed import global_state  # the coordination client (no public handle to it)

    client, me = global_state.client, jax.process_index()
    key = f"{tag}/{index}"
    client.key_value_set(f"{key}/{me}", "1")
    deadline, missing = time.monotonic() + timeout, []
    for peer in range(jax.process_count()):
        if peer != me:
            try:
                client.blocking_key_value_get(f"{key}/{peer}", max(1, int((deadline - time.monotonic()) * 1000)))
            except jax.errors.JaxRuntimeError:
                missing.append(peer)
    if missing:
        raise DistributedError(f"process {me}: processes {missing} did not reach the same point of the survey within "
                               f"timeout={timeout:g} s (stopped, killed or hung); this run is over. Start every "
                               f"process again with the same checkpoint= to resume from the last saved position.")
    # Every peer has now passed the previous chunk, so no one reads this process's key for it any more.
    client.key_value_delete(f"{tag}/{index - 1}/{me}")


@contextlib.contextmanager
def _named_peer_failures(distributed: bool, timeout: float):
    """A collective that fails because a peer went away becomes a DistributedError that says so."""
    try:
        yield
    except jax.errors.JaxRuntimeError as error:
        if not distributed:
            raise
        first = str(error).strip().splitlines()[0][:300]
        raise DistributedError(f"process {jax.process_index()}: a collective with the other processes failed "
                               f"({first}); one of them has probably stopped. Start every process again with the "
                               f"same checkpoint= to resume from the last saved position.") from error


def _weights_digest(model) -> str:
    """sha256 of every weight, computed once per model (the processes compare it before a survey)."""
    known = _DIGESTS.get(model)
    if known is None or known[0] is not model.state:
        digest = hashlib.sha256()
        for leaf in jax.tree_util.tree_leaves(model.state):
            digest.update(np.ascontiguousarray(leaf).tobytes())
        known = _DIGESTS[model] = (model.state, digest.hexdigest()[:16])
    return known[1]


def _placed_state(model, mesh: Mesh):
    """The weights replicated over the mesh, placed once per model and mesh: device_put to devices of
    several processes would compare the weights across processes on every call (one all-gather per
    array); the start-of-survey check compares one hash of them instead."""
    ids = tuple(d.id for d in mesh.devices.flat)
    placed = _PLACED.get(model)
    if placed is None or placed[0] is not model.state or placed[1] != ids:
        placed = _PLACED[model] = (model.state, ids, _replicated(model.state, NamedSharding(mesh, PartitionSpec())))
    return placed[2]


def _replicated(tree, sharding: NamedSharding):
    """Each array of `tree` on every device of `sharding`, built from this process's copy (no cross-process
    check: callers compare hashes once instead)."""
    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)  # arrays already in place are kept, not copied

    def place(value):
        value = np.asarray(value)
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])
    return jax.tree_util.tree_map(place, tree)


# ---- checkpoints --------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Checkpoint:
    """A survey's saved position: whole chunks done, the running totals, the row lengths already compiled
    (the packer's flush depends on them) and the counts so far. One .npz, replaced atomically."""

    path: Path | None
    run_id: dict
    chunks: int = 0
    totals: dict | None = None
    used: tuple = ()
    counts: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def open(cls, checkpoint, reduce: str, run_id: dict) -> _Checkpoint:
        """The checkpoint at `checkpoint` if there is one (checked against this run), else an empty one."""
        if checkpoint is None:
            return cls(None, run_id)
        path = Path(checkpoint)
        if reduce == "local" and jax.process_count() > 1:
            path = path.with_name(f"{path.name}.process{jax.process_index()}")
        if not path.exists():
            return cls(path, run_id)
        try:
            with np.load(path) as stored:
                info = json.loads(str(stored["info"]))
                totals = {name[len("total."):]: stored[name] for name in stored.files if name.startswith("total.")}
        except (OSError, ValueError, KeyError) as error:
            raise DataFileError(f"checkpoint {path} cannot be read ({error}); delete it to start the survey "
                                f"afresh.") from None
        saved_id = json.loads(json.dumps(info["run_id"]))
        here = json.loads(json.dumps(run_id, default=str))
        differ = [key for key in sorted(set(saved_id) | set(here)) if saved_id.get(key) != here.get(key)]
        if differ:
            key = differ[0]
            raise DataFileError(f"checkpoint {path} belongs to another survey: its {key} is {saved_id.get(key)!r}, "
                                f"this run's is {here.get(key)!r}; run with the same settings, weights and corpus "
                                f"to resume, or delete the file to start afresh.")
        return cls(path, run_id, info["chunks"], totals, tuple(info["used"]), info["counts"])

    def save(self, chunks: int, totals: dict, used, counts: dict) -> None:
        info = json.dumps(dict(run_id=self.run_id, chunks=chunks, used=sorted(used), counts=counts), default=str)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with temporary.open("wb") as file:
            np.savez(file, info=np.array(info), **{f"total.{name}": value for name, value in totals.items()})
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.path)  # readers see the old checkpoint or the new one, never half of one


def _packed_rows(model, size: int, rows: list | None, n_rows: int, segment_ids: str) -> dict[str, np.ndarray]:
    """The arrays of one batch: `rows` (lists of (ids, types) documents) laid out in n_rows × size, with
    each token's document number in its row (1, 2, …; 0 padding) and the position-table row it reads when
    its document runs alone (the model's own rule, model.position_rows), plus the token masks the
    statistics use. Rows past len(rows) are empty."""
    fields = ("input_ids", "token_type_ids", "documents", "positions")
    arrays = {name: np.zeros((n_rows, size), np.int32) for name in fields}
    cfg = model.config
    for r, documents in enumerate(rows or ()):
        start = 0
        for number, (ids, types) in enumerate(documents, 1):
            span = slice(start, start + len(ids))
            arrays["input_ids"][r, span], arrays["token_type_ids"][r, span] = ids, types
            arrays["documents"][r, span] = number
            arrays["positions"][r, span] = position_rows(np.asarray(ids)[None], cfg.pad_token_id,
                                                         cfg.family.position_offset)[0]
            start += len(ids)
    if segment_ids == "zeros":
        arrays["token_type_ids"][:] = 0
    arrays["attention_mask"] = (arrays["documents"] > 0).astype(np.int32)
    return dict(arrays, **heads.model_token_masks(model, arrays["input_ids"], arrays["attention_mask"]))


def _progress(total: int | None, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="doc", desc="survey", file=sys.stderr)


def _zeros(model, js: bool) -> dict[str, np.ndarray]:
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    zeros = {name: np.zeros((L, H), np.float32) for name in heads.STATISTICS}
    zeros["documents"] = np.zeros((), np.float32)
    if js:
        zeros["js_divergence"] = np.zeros((L * H, L * H), np.float32)
    return zeros


def _survey_step(model, js: bool, sep_normalization: str) -> Callable:
    """The jitted step for this model, made once and kept while the model lives (jit then caches one
    program per batch shape). It holds the model weakly, so the cache does not keep the model alive."""
    steps = _STEPS.setdefault(model, {})
    key = (js, sep_normalization)
    if key not in steps:
        steps[key] = jax.jit(functools.partial(_step, weakref.ref(model), model.config.num_hidden_layers, js,
                                               sep_normalization))
    return steps[key]


def _positions_within_documents(value, ctx, table, positions):
    """embed.hook_pos_embed [B, T, E] → the position table's rows [B, T] each token reads in its own document."""
    return table[positions].astype(value.dtype)


def _within_documents(value, ctx, same):
    """attn.hook_attn_scores [B, H, T, S]: a query sees only the keys of its own document."""
    return jnp.where(same[:, None], value, jnp.finfo(value.dtype).min)


def _step(model_ref, layers: int, js: bool, sep_normalization: str, state, totals, arrays):
    """Forward over packed rows with every layer's pattern captured, statistics layer by layer, sums into
    totals. Two hooks make a packed row behave as its documents run one by one: positions restart at
    each document, and attention stays within each document (the softmax gives other documents' keys
    exactly 0), so every document's pattern is the one it has alone."""
    names = [f"blocks.{i}.attn.hook_pattern" for i in range(layers)]
    documents = arrays["documents"]
    same = heads.same_document(documents)  # [B, T, S]
    table = state["embed"]["position"][...]  # [max_position_embeddings, E], model.Embeddings.position
    hooks = {"embed.hook_pos_embed": HookFn(_positions_within_documents, table=table,
                                            positions=arrays["positions"]),
             "blocks.*.attn.hook_attn_scores": HookFn(_within_documents, same=same)}
    forward = model_ref().forward_fn(names=names, hooks=hooks)
    _, captured = forward(state, (arrays["input_ids"], arrays["token_type_ids"], arrays["attention_mask"]))
    masks = (arrays["is_cls"], arrays["is_sep"], arrays["is_punct"])
    per_layer = [heads.layer_statistics(captured[name], documents, *masks, sep_normalization)
                 for name in names]  # {name: [B, H]}
    new = {name: totals[name] + jnp.stack([s[name] for s in per_layer]).sum(1) for name in heads.STATISTICS}
    new["documents"] = totals["documents"] + documents.max(1).sum()
    if js:
        pattern = jnp.stack([captured[name] for name in names])
        new["js_divergence"] = totals["js_divergence"] + heads.js_divergence_batch(
            pattern, documents, (documents.max(1) > 0).astype(jnp.float32))
    return new
