"""corpus.packing: first-fit packing of documents into rows of a few lengths, and batches of those rows."""

from __future__ import annotations

import numpy as np
import pytest

from minibert.analysis import corpus
from minibert.analysis.corpus import packing


class Chunk:
    """What Packer.add reads from a tokenized batch: documents of the given lengths, every token of
    document k holding the id k."""

    def __init__(self, lengths, start):
        width = max(lengths)
        self.attention_mask = (np.arange(width)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
        self.input_ids = self.attention_mask * (start + np.arange(len(lengths)))[:, None]
        self.token_type_ids = np.zeros_like(self.input_ids)


def plan(lengths, buckets, rows, chunk, pack=True):
    """Run Packer over documents of the given lengths, `chunk` at a time; return the batches."""
    packer, batches = packing.Packer(buckets, rows, pack), []
    for start in range(0, len(lengths), chunk):
        packer.add(Chunk(lengths[start:start + chunk], start))
        batches += packer.full_batches()
    return batches + packer.flush()


@pytest.mark.parametrize("chunk", [1000, 13])
@pytest.mark.parametrize("pack, buckets, most", [(True, (128,), 1.12), (False, (32, 64, 96, 128), 1.4)])
def test_packer_places_every_document_once(chunk, pack, buckets, most):
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 129, size=300)
    rows = lambda size: corpus.batch_rows(size, 1024, 4)
    batches = plan(lengths, buckets, rows, chunk, pack)
    seen, partly_filled = [], []
    for size, packed in batches:
        assert size in buckets and 0 < len(packed) <= rows(size)
        partly_filled += [size] * (len(packed) < rows(size))
        for documents in packed:
            assert sum(len(ids) for ids, _ in documents) <= size
            assert pack or len(documents) == 1
            seen += [int(ids[0]) for ids, _ in documents]
            assert all(len(ids) == lengths[ids[0]] for ids, _ in documents)  # whole documents
    assert sorted(seen) == list(range(300))
    assert len(partly_filled) == len(set(partly_filled))  # at most one partly filled batch per row length
    assert sum(rows(size) * size for size, _ in batches) < most * lengths.sum()  # little padding


def test_small_corpus_runs_in_one_program():
    """Row lengths that never filled a batch hand their documents up: one batch, one compiled shape."""
    batches = plan(np.array([10, 12, 20, 40, 50]), (32, 64, 128), lambda size: corpus.batch_rows(size, 1024, 1), 100)
    assert [(size, sorted(len(ids) for documents in packed for ids, _ in documents)) for size, packed in batches] \
        == [(128, [10, 12, 20, 40, 50])]


def test_batch_rows_and_default_buckets():
    assert [corpus.batch_rows(size, 4096, 1) for size in (32, 64, 128)] == [128, 64, 32]
    assert corpus.batch_rows(128, 1000, 4) == 4  # rounded down to the device count
    assert corpus.batch_rows(512, 1000, 4) == 4  # at least one row per device
    assert corpus.default_buckets(128) == (128,)
    assert corpus.default_buckets(100) == (100,)
    assert corpus.default_buckets(512) == (128, 256, 512)




def test_batch_memory_bound_is_the_patterns_of_every_layer():
    """pattern_bytes counts rows × T² × L × H float32 probabilities; check_batch_fits refuses past the devices'
    memory and accepts the defaults."""
    class Config:
        num_hidden_layers, num_attention_heads = 6, 12

    assert packing.pattern_bytes(Config, 16, 128) == 16 * 128 * 128 * 6 * 12 * 4

    class Device:
        def memory_stats(self):
            return {"bytes_limit": 16 * 128 * 128 * 6 * 12 * 4}  # room for exactly 16 rows of 128

    fits = lambda rows: packing.check_batch_fits(Config, lambda size: rows, (128,), [Device()], None, rows)
    fits(16)
    with pytest.raises(ValueError, match=r"batch_size=17 makes batches of 17 rows of 128 tokens"):
        fits(17)
