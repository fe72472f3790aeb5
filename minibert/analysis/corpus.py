"""The corpus runner: stream texts (or pairs) through the model and accumulate head statistics on the device.

    result = minibert.analysis.corpus.survey(model, texts, pairs=None)      # lists, or iterables of str
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

Scale-out: the batch axis is sharded over the local devices (`jax.sharding`, one mesh axis "data"). On
several hosts, call `jax.distributed.initialize()` in every process first, then let every process call
`survey` with its own share of the corpus (e.g. every `jax.process_count()`-th document, starting at
`jax.process_index()`). Each step's global batch is built from every process's rows with
`jax.make_array_from_process_local_data`; before each chunk the processes agree (one small all-gather)
on how many batches of each bucket to run, and a process with fewer documents runs empty ones; the
totals come back reduced over all processes, so every process gets the same SurveyResult. (The
multi-host path is written for, not tested on, several hosts; tests cover several devices of one.)
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import sys
import weakref
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from minibert.analysis import heads
from minibert.hooks import HookFn
from minibert.errors import AnalysisError, DataFileMissing

CHUNK = 256  # documents tokenized at a time: the next chunk is tokenized while the device runs a batch
_STEPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model → {js_divergence: jitted step}


@dataclasses.dataclass
class SurveyResult:
    """Per-head statistics averaged over documents ([L, H] each; layers and heads 0-indexed)."""

    mean: dict[str, np.ndarray]
    documents: int
    js_divergence: np.ndarray | None = None  # [L·H, L·H], summed over documents (ANALYSIS.md)
    settings: dict = dataclasses.field(default_factory=dict)
    counts: dict = dataclasses.field(default_factory=dict)  # batches, tokens_run (padded), real_tokens

    def table(self) -> list[dict]:
        return heads.head_table(self.mean)

    def save(self, path: str | Path) -> tuple[Path, Path]:
        """Write `path.npz` (arrays) and `path.json` (settings, documents, tidy per-head table). A
        suffix .npz, .json or .csv on `path` is dropped; any other dot stays part of the name."""
        arrays = dict(self.mean)
        if self.js_divergence is not None:
            arrays["js_divergence"] = self.js_divergence
        npz, js = output_paths(path)
        np.savez_compressed(npz, **arrays)
        js.write_text(json.dumps({"documents": self.documents, "settings": self.settings, "counts": self.counts,
                                  "heads": self.table()}, indent=1))
        return npz, js

    @classmethod
    def load(cls, path: str | Path) -> "SurveyResult":
        """Read back what `save(path)` wrote."""
        npz, js_path = output_paths(path)
        with np.load(npz) as arrays:
            mean = {name: arrays[name] for name in arrays.files if name != "js_divergence"}
            js = arrays["js_divergence"] if "js_divergence" in arrays.files else None
        info = json.loads(js_path.read_text())
        return cls(mean, info["documents"], js, info["settings"], info.get("counts", {}))


def output_paths(path: str | Path) -> tuple[Path, Path]:
    """(prefix.npz, prefix.json) for a prefix, or for a path that already ends in .npz, .json or .csv."""
    path = Path(path)
    prefix = path.with_suffix("") if path.suffix in (".npz", ".json", ".csv") else path
    return prefix.with_name(prefix.name + ".npz"), prefix.with_name(prefix.name + ".json")


# ---- reading a corpus ---------------------------------------------------------------------------------

def read_corpus(path: str | Path, pairs: bool = False) -> tuple[list[str], list[str] | None]:
    """(texts, pairs or None) from a file; blank lines are skipped.

    .tsv, or any text file with pairs=True: one `A<TAB>B` pair per line. .jsonl: one JSON object per
    line, with "text", or "text_a" and "text_b". Any other suffix (.txt): one text per line.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFileMissing(f"{path} is not a file; pass a .txt (one text per line), .tsv (A<TAB>B per "
                                f"line) or .jsonl file.")
    lines = [(number, line) for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if line.strip()]
    if not lines:
        raise AnalysisError(f"{path} holds no text; put one text per line (or A<TAB>B pairs in a .tsv).")
    if path.suffix == ".jsonl":
        return _read_jsonl(path, lines)
    if path.suffix == ".tsv" or pairs:
        split = [(number, line.split("\t")) for number, line in lines]
        bad = [number for number, parts in split if len(parts) != 2]
        if bad:
            raise AnalysisError(f"{path}: lines {bad[:5]} do not hold exactly two tab-separated texts (A<TAB>B).")
        return [a for _, (a, _) in split], [b for _, (_, b) in split]
    return [line for _, line in lines], None


def _read_jsonl(path: Path, lines) -> tuple[list[str], list[str] | None]:
    rows = []
    for number, line in lines:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise AnalysisError(f"{path}, line {number}: not valid JSON ({error.msg}); write one object per line, "
                             f'e.g. {{"text": "..."}} or {{"text_a": "...", "text_b": "..."}}.') from None
    keys = ("text_a", "text_b") if isinstance(rows[0], dict) and "text_a" in rows[0] else ("text",)
    for (number, _), row in zip(lines, rows):
        if not isinstance(row, dict) or any(not isinstance(row.get(key), str) for key in keys):
            raise AnalysisError(f"{path}, line {number}: expected an object with string field(s) "
                             f"{' and '.join(repr(k) for k in keys)} like the first line; got {str(row)[:60]}.")
    if len(keys) == 2:
        return [row["text_a"] for row in rows], [row["text_b"] for row in rows]
    return [row["text"] for row in rows], None


# ---- batching -----------------------------------------------------------------------------------------

def default_buckets(max_length: int) -> tuple[int, ...]:
    """Row lengths 128, 256, 512, … up to max_length (just max_length when it is at most 128). Rows pack
    several documents, so one row length wastes little; each length is one program to compile — on a
    CPU a compile costs as much as running ten to twenty thousand tokens — and attention over long rows
    costs more per token, hence a few lengths for long documents."""
    buckets, size = [], 128
    while size < max_length:
        buckets.append(size)
        size *= 2
    return (*buckets, max_length)


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

def survey(model, texts: Iterable[str], pairs: Iterable[str] | None = None, *, batch_tokens: int | None = None,
           batch_size: int | None = None, max_length: int = 128, buckets: Sequence[int] | None = None,
           pack: bool = True, segment_ids: str = "real", js_divergence: bool = False, progress: bool = True,
           devices: Sequence | None = None) -> SurveyResult:
    """Clark et al. head statistics over a corpus (ANALYSIS.md), each averaged over documents.

    texts (and pairs, one second text per text): lists or any iterables of strings, streamed a chunk at
    a time. Segments longer than max_length tokens are truncated (longest first).
    batch_tokens: tokens per batch (default: default_batch_tokens of the devices' platform); rows of
      length T run batch_tokens // T at a time (rounded down to a multiple of the device count). With
      several processes: per process.
    batch_size: rows per batch for every row length instead (a multiple of the device count).
    buckets: the row lengths (default: default_buckets(max_length)); one compiled program each.
    pack: several documents per row (True), or one (False).
    segment_ids: "real" (sentence B gets type 1) or "zeros" (Clark et al.'s extraction script).
    js_divergence: also accumulate the Jensen–Shannon matrix between heads (much more work per batch).
    devices: the local devices to shard each batch over (default: all of them).
    Several hosts: see the module docstring.
    """
    heads.check_segment_ids(segment_ids)
    devices = _checked_devices(devices)
    batch_tokens = default_batch_tokens(devices[0].platform) if batch_tokens is None else batch_tokens
    if batch_size is not None and (batch_size < 1 or batch_size % len(devices)):
        suggestion = len(devices) * max(1, batch_size // len(devices))
        raise AnalysisError(f"batch_size {batch_size} must be a positive multiple of the {len(devices)} devices "
                         f"each batch is sharded over; try batch_size={suggestion}.")
    if batch_tokens < 1:
        raise AnalysisError(f"batch_tokens must be positive (tokens per batch, e.g. 2048); got {batch_tokens}.")
    buckets = _checked_buckets(buckets, max_length, model.config.max_position_embeddings)
    rows = (lambda size: batch_size) if batch_size else (lambda size: batch_rows(size, batch_tokens, len(devices)))

    mesh = Mesh(np.array(devices if jax.process_count() == 1 else jax.devices()), ("data",))
    replicated, by_rows = NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec("data"))
    state = jax.device_put(model.state, replicated)
    step = _survey_step(model, js_divergence)
    totals = jax.device_put(_zeros(model, js_divergence), replicated)
    packer = _Packer(buckets, rows, pack)
    bar = _progress(texts, progress)
    previous, counts = None, dict(batches=0, tokens_run=0, real_tokens=0)

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

    chunks = _tokenized_chunks(model, texts, pairs, max_length)
    for start in itertools.count(0, CHUNK):
        batch = next(chunks, None)
        if batch is not None:
            lengths = batch.attention_mask.sum(1)
            if lengths.max() > buckets[-1]:
                raise AnalysisError(f"document {start + int(lengths.argmax())} has {lengths.max()} tokens but the largest "
                                 f"bucket is {buckets[-1]}; add a bucket of {max_length} (max_length).")
            packer.add(batch)
        batches, more = _agreed(packer.full_batches(), buckets, more=batch is not None)
        run(batches)
        if not more:
            break
    run(_agreed(packer.flush(), buckets, more=False)[0])
    if bar is not None:
        if previous is not None:
            bar.update(previous[1])
        bar.close()
    totals = {name: np.asarray(value, np.float64) for name, value in totals.items()}
    documents = int(round(float(totals.pop("documents"))))
    if documents == 0:
        raise AnalysisError("survey got no texts; pass a non-empty list (or iterable) of strings.")
    js = totals.pop("js_divergence", None)
    settings = dict(batch_tokens=None if batch_size else batch_tokens, batch_size=batch_size,
                    max_length=max_length, buckets=list(buckets), pack=pack, segment_ids=segment_ids,
                    devices=len(devices), processes=jax.process_count(), model=model.source)
    return SurveyResult({name: totals[name] / documents for name in heads.STATISTICS}, documents, js, settings,
                        counts)


def _checked_devices(devices) -> list:
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
    if jax.process_count() > 1 and devices != local:
        raise AnalysisError("with several processes every process shards over all its local devices; leave "
                         "devices out.")
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


def _tokenized_chunks(model, texts, pairs, max_length: int) -> Iterator:
    """Batches of up to CHUNK tokenized documents (rows padded to the chunk's longest)."""
    if isinstance(texts, str) or isinstance(pairs, str):
        raise AnalysisError("survey takes a list (or iterable) of texts, not one string; wrap it: [text].")
    if pairs is not None and hasattr(texts, "__len__") and hasattr(pairs, "__len__") and len(texts) != len(pairs):
        raise AnalysisError(f"got {len(texts)} texts but {len(pairs)} pairs; pass one second text per text.")
    rows = iter(texts) if pairs is None else zip(texts, pairs, strict=True)
    for start in itertools.count(0, CHUNK):
        try:
            chunk = list(itertools.islice(rows, CHUNK))
        except ValueError as error:  # zip(strict=True) of iterables of different lengths
            raise AnalysisError(f"texts and pairs have different lengths ({error}).") from None
        if not chunk:
            return
        first = chunk if pairs is None else [a for a, _ in chunk]
        second = None if pairs is None else [b for _, b in chunk]
        for name, values in (("texts", first), ("pairs", second or ())):
            bad = next((i for i, v in enumerate(values) if not isinstance(v, str)), None)
            if bad is not None:
                raise AnalysisError(f"{name}[{start + bad}] is not a string but {type(values[bad]).__name__}; "
                                 f"pass text.")
        yield model.tokenize(first, second, max_length=max_length)


def _agreed(batches: list, buckets: Sequence[int], more: bool) -> tuple[list, bool]:
    """The same batch shapes in every process: each runs, per bucket, as many batches as the process
    with the most, the missing ones empty (None); `more`: whether any process has documents left."""
    if jax.process_count() == 1:
        return batches, more
    from jax.experimental import multihost_utils

    counts = np.array([more] + [sum(size == s for s, _ in batches) for size in buckets], np.int32)
    agreed = np.asarray(multihost_utils.process_allgather(counts)).max(0)
    padded = [b for size in buckets for b in [x for x in batches if x[0] == size]]
    for size, wanted in zip(buckets, agreed[1:]):
        padded += [(size, None)] * int(wanted - sum(size == s for s, _ in batches))
    return padded, bool(agreed[0])


def _packed_rows(model, size: int, rows: list | None, n_rows: int, segment_ids: str) -> dict[str, np.ndarray]:
    """The arrays of one batch: `rows` (lists of (ids, types) documents) laid out in n_rows × size, with
    each token's document number in its row (1, 2, …; 0 padding) and its position within its document,
    plus the token masks the statistics use. Rows past len(rows) are empty."""
    fields = ("input_ids", "token_type_ids", "documents", "positions")
    arrays = {name: np.zeros((n_rows, size), np.int32) for name in fields}
    for r, documents in enumerate(rows or ()):
        start = 0
        for number, (ids, types) in enumerate(documents, 1):
            span = slice(start, start + len(ids))
            arrays["input_ids"][r, span], arrays["token_type_ids"][r, span] = ids, types
            arrays["documents"][r, span], arrays["positions"][r, span] = number, np.arange(len(ids))
            start += len(ids)
    if segment_ids == "zeros":
        arrays["token_type_ids"][:] = 0
    arrays["attention_mask"] = (arrays["documents"] > 0).astype(np.int32)
    return dict(arrays, **heads.model_token_masks(model, arrays["input_ids"], arrays["attention_mask"]))


def _progress(texts, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=len(texts) if hasattr(texts, "__len__") else None, unit="doc", desc="survey",
                file=sys.stderr)


def _zeros(model, js: bool) -> dict[str, jax.Array]:
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    zeros = {name: jnp.zeros((L, H), jnp.float32) for name in heads.STATISTICS}
    zeros["documents"] = jnp.zeros((), jnp.float32)
    if js:
        zeros["js_divergence"] = jnp.zeros((L * H, L * H), jnp.float32)
    return zeros


def _survey_step(model, js: bool) -> Callable:
    """The jitted step for this model, made once and kept while the model lives (jit then caches one
    program per batch shape). It holds the model weakly, so the cache does not keep the model alive."""
    steps = _STEPS.setdefault(model, {})
    if js not in steps:
        steps[js] = jax.jit(functools.partial(_step, weakref.ref(model), model.config.num_hidden_layers, js))
    return steps[js]


def _positions_within_documents(value, ctx, positions):
    """embed.hook_pos_embed [B, T, D] (table rows 0…T−1 on every row) → the rows of each token's position."""
    return value[0][positions]


def _within_documents(value, ctx, same):
    """attn.hook_attn_scores [B, H, T, S]: a query sees only the keys of its own document."""
    return jnp.where(same[:, None], value, jnp.finfo(value.dtype).min)


def _step(model_ref, layers: int, js: bool, state, totals, arrays):
    """Forward over packed rows with every layer's pattern captured, statistics layer by layer, sums into
    totals. Two hooks make a packed row behave as its documents run one by one: positions restart at
    each document, and attention stays within each document (the softmax gives other documents' keys
    exactly 0), so every document's pattern is the one it has alone."""
    names = [f"blocks.{i}.attn.hook_pattern" for i in range(layers)]
    documents = arrays["documents"]
    same = heads.same_document(documents)  # [B, T, S]
    hooks = {"embed.hook_pos_embed": HookFn(_positions_within_documents, positions=arrays["positions"]),
             "blocks.*.attn.hook_attn_scores": HookFn(_within_documents, same=same)}
    forward = model_ref().forward_fn(names=names, hooks=hooks)
    _, captured = forward(state, (arrays["input_ids"], arrays["token_type_ids"], arrays["attention_mask"]))
    masks = (arrays["is_cls"], arrays["is_sep"], arrays["is_punct"])
    per_layer = [heads.layer_statistics(captured[name], documents, *masks) for name in names]  # {name: [B, H]}
    new = {name: totals[name] + jnp.stack([s[name] for s in per_layer]).sum(1) for name in heads.STATISTICS}
    new["documents"] = totals["documents"] + documents.max(1).sum()
    if js:
        pattern = jnp.stack([captured[name] for name in names])
        new["js_divergence"] = totals["js_divergence"] + heads.js_divergence_batch(
            pattern, documents, (documents.max(1) > 0).astype(jnp.float32))
    return new
