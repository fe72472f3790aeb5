"""The tiered length policy (buckets.run_length): a batch of at least buckets.TIGHT_ROWS rows whose shape recurs
runs at its tight bucket (buckets.TIGHT: at most 1/8 above its length) from the shape's second call, the first call
served by the rule's program. Counted, never timed: the programs each call sequence compiles (model.programs.traces)
equal the policy's count worked out by hand, and every policy gives the exact-length forward's values."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from tolerances import assert_close_to_scale, forward_rtol

from minibert import BertConfig, Model
from minibert.runtime.buckets import FINE, RECURS_AT, TIGHT, TIGHT_ROWS, length_buckets, run_length

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=128)


@pytest.fixture
def model():
    return Model(BertConfig(**TINY), seed=1)


def batch(length: int, rows: int = TIGHT_ROWS) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(length).integers(5, 99, size=(rows, length))
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def test_tight_buckets_pad_no_length_by_more_than_an_eighth():
    """Every length to 512 runs at most 1.125× its tokens at its tight bucket (the issue asks ≤ 1.15×)."""
    tight = length_buckets(512, *TIGHT)
    worst = max(next(b for b in tight if b >= n) / n for n in range(1, 513))
    assert worst <= 1 + 1 / 8


def test_a_recurring_batch_gets_its_tight_program_at_its_second_call(model):
    """8 rows of 37 tokens: the first call runs at INTERACTIVE's 64 (one program), the second at the tight 40
    (32, 36, 40, …: one more program, 40 / 37 = 1.08×), the third and later reuse it."""
    assert RECURS_AT == 2
    assert [model.programs.padded_length(37, 8, calls=c) for c in (1, 2, 3)] == [64, 40, 40]
    traces = []
    for _ in range(4):
        before = model.programs.traces
        model(batch(37))
        traces.append(model.programs.traces - before)
    assert traces == [1, 1, 0, 0]
    assert model.programs.padded_length(37, 8) == 40  # the next call's length, counting this model's calls


def test_mixed_lengths_compile_the_policys_count(model):
    """8-row batches of 33, 37, 50, 37, 50, 60, 37 tokens: 64, 64, 64 (first calls: INTERACTIVE's 64), 40 (37
    again), 52 (50 again: 48, 52), 64 (60 first), 40 — the programs 64, 40 and 52: three."""
    lengths = (33, 37, 50, 37, 50, 60, 37)
    padded = []
    for n in lengths:
        padded.append(model.programs.padded_length(n, 8))
        model(batch(n))
    assert padded == [64, 64, 64, 40, 52, 64, 40]
    assert model.programs.traces == model.programs.count == 3


def test_a_few_rows_keep_the_notebook_policy(model):
    """Under TIGHT_ROWS rows nothing changes: a notebook's single sentences of 5 to 60 tokens, each length
    repeated, share INTERACTIVE's one program at 64 (buckets.FEW_ROWS_SMALLEST), as do 7 rows of 37 tokens."""
    for n in (5, 12, 5, 60, 12, 60, 5):
        model(batch(n, rows=1))
    for _ in range(3):
        model(batch(37, rows=7))
    assert model.programs.traces == 2  # [1, 64] and [7, 64]
    assert run_length(37, 7, model.programs.bucket_rule, 128, calls=5) == 64


def test_results_are_the_exact_lengths_under_every_policy(model):
    """The same 8 × 37 batch at the rule's 64 (first call), its tight 40 (second), FINE's 38 and at its own length
    (forward_fn, never padded): the same last hidden states. Padding is masked, so two fp32 programs of the whole
    forward differ by rounding only (tolerances.forward_rtol, at the longest padded length, 64)."""
    data = batch(37)
    exact = jax.jit(model.forward_fn())(model.state, model.inputs(data))[0].last_hidden_state
    runs = [model(data).last_hidden_state, model(data).last_hidden_state]
    model.programs.bucket_rule = FINE
    assert model.programs.padded_length(37, 8, calls=1) == 38
    runs.append(model(data).last_hidden_state)
    for got, length in zip(runs, (64, 40, 38)):
        assert got.shape == exact.shape == (8, 37, 32)
        assert_close_to_scale(got, exact, forward_rtol(model.config, S=64), f"padded to {length}")
