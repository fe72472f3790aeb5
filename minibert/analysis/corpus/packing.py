"""Packing documents into rows of a few fixed lengths, several to a row, and batches of those rows."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np

from minibert.analysis import heads
from minibert.errors import AnalysisError
from minibert.runtime.buckets import length_buckets


def default_buckets(max_length: int) -> tuple[int, ...]:
    """Row lengths 128, 256, 512, … up to max_length (just max_length when it is at most 128). Rows pack
    several documents, so one row length wastes little; each length is one program to compile — on a
    CPU a compile costs as much as many batches (benchmarks/RESULTS.md) — and attention over long rows
    costs more per token, hence a few lengths for long documents. The rule is the core's (buckets.length_buckets)."""
    return length_buckets(max_length, smallest=128, per_octave=1)


def default_batch_tokens(platform: str) -> int:
    """Tokens per batch: 2048 on a CPU, where bigger batches fall out of the caches and run slower per
    token (benchmarks/RESULTS.md); 16384 on GPUs and TPUs, which need wide batches to fill."""
    return 2048 if platform == "cpu" else 16384


def batch_rows(size: int, batch_tokens: int, multiple: int) -> int:
    """Rows per batch for rows of `size` tokens: batch_tokens // size, rounded down to a multiple of
    `multiple` (the devices a batch is sharded over), at least `multiple`."""
    return max(multiple, batch_tokens // size // multiple * multiple)


def checked_buckets(buckets, max_length: int, positions: int) -> tuple[int, ...]:
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


def pattern_bytes(config, rows: int, size: int) -> int:
    """A lower bound on one batch's memory: the float32 attention patterns of every layer it captures."""
    return 4 * rows * size * size * config.num_hidden_layers * config.num_attention_heads


def check_batch_fits(config, rows: Callable[[int], int], buckets: Sequence[int], devices: Sequence,
                     batch_tokens: int | None, batch_size: int | None) -> None:
    """Refuse, before any work, a batch whose patterns alone exceed the memory of the devices it is sharded
    over (a batch_tokens or batch_size typed with a few zeros too many) instead of failing on allocation."""
    size = max(buckets, key=lambda s: rows(s) * s * s)
    need, have = pattern_bytes(config, rows(size), size), len(devices) * device_memory(devices[0])
    if need > have:
        asked = f"batch_size={batch_size}" if batch_size else f"batch_tokens={batch_tokens}"
        raise AnalysisError(f"{asked} makes batches of {rows(size):,} rows of {size} tokens whose attention patterns "
                            f"alone take {need / 2**30:,.1f} GiB, more than the {have / 2**30:,.1f} GiB of the "
                            f"{len(devices)} device(s); leave it out for the default, or lower it.")


def device_memory(device) -> int:
    """Bytes a device can hold: its allocator's limit on accelerators, the machine's memory on a CPU."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class Packer:
    """Tokenized documents packed into rows of their bucket's length: first fit, longest first.

    A row holds one or more whole documents; a batch is rows(bucket) rows. Open rows keep taking
    documents until a batch of the fullest is sent; at the end the rest goes too.
    """

    def __init__(self, buckets: Sequence[int], rows: Callable[[int], int], pack: bool = True):
        self.buckets, self.rows, self.pack = tuple(buckets), rows, pack
        self.open: dict[int, list] = {size: [] for size in self.buckets}  # [free tokens, [(ids, types), …]]
        self.used: set[int] = set()  # buckets that ran a batch (their program is compiled)

    def add(self, batch) -> None:
        """Place every document of a tokenized chunk, longest first, in its bucket's first row with room."""
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


def packed_rows(model, size: int, rows: list | None, n_rows: int, segment_ids: str) -> dict[str, np.ndarray]:
    """The arrays of one batch: `rows` (lists of (ids, types) documents) laid out in n_rows × size, with
    each token's document number in its row (1, 2, …; 0 padding) and the position-table row it reads when
    its document runs alone (the model's own numbering), plus the token masks the statistics use. Rows
    past len(rows) are empty."""
    fields = ("input_ids", "token_type_ids", "documents", "positions")
    arrays = {name: np.zeros((n_rows, size), np.int32) for name in fields}
    for r, documents in enumerate(rows or ()):
        start = 0
        for number, (ids, types) in enumerate(documents, 1):
            span = slice(start, start + len(ids))
            arrays["input_ids"][r, span], arrays["token_type_ids"][r, span] = ids, types
            arrays["documents"][r, span] = number
            arrays["positions"][r, span] = _positions(model, np.asarray(ids))
            start += len(ids)
    if segment_ids == "zeros":
        arrays["token_type_ids"][:] = 0
    arrays["attention_mask"] = (arrays["documents"] > 0).astype(np.int32)
    return dict(arrays, **heads.model_token_masks(model, arrays["input_ids"], arrays["attention_mask"]))


def _positions(model, ids: np.ndarray) -> np.ndarray:
    """[n] the position-table rows of one document's tokens as the model numbers them when it runs alone."""
    return model.position_ids(ids[None])[0]
