"""Masked-LM batches (training.data.mask_tokens, batches): BERT's recipe measured on many draws — 15% of the
maskable tokens chosen, 80% of those [MASK], 10% a uniformly random id, 10% unchanged — and special tokens and
padding never chosen."""

from __future__ import annotations

import math

import numpy as np

import minibert
from minibert.training import data as data_

VOCAB, MASK = 30522, 103


def _within(count: int, n: int, p: float, what: str) -> None:
    """A binomial(n, p) count within 6 standard deviations of n·p: a failure probability of 2e-9 per check when the
    recipe is right, while a recipe off by a tenth of p (e.g. 13.5% chosen) is 10+ σ away at these n."""
    sigma = math.sqrt(n * p * (1 - p))
    assert abs(count - n * p) <= 6 * sigma, f"{what}: {count} of {n}, expected {n * p:.0f} ± {6 * sigma:.0f}"


def test_mask_tokens_follows_berts_recipe():
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, VOCAB, size=(400, 500)).astype(np.int32)  # no id equals [MASK]
    maskable = rng.random(ids.shape) < 0.9
    inputs, labels = data_.mask_tokens(ids, maskable, np.random.default_rng(1), MASK, VOCAB)

    chosen = labels != data_.IGNORE
    assert not np.any(chosen & ~maskable)  # specials and padding are never chosen
    np.testing.assert_array_equal(labels[chosen], ids[chosen])  # a chosen token's label is its own id
    np.testing.assert_array_equal(inputs[~chosen], ids[~chosen])  # the rest of the input is untouched
    n_maskable, n_chosen = int(maskable.sum()), int(chosen.sum())
    _within(n_chosen, n_maskable, 0.15, "chosen")

    became_mask = chosen & (inputs == MASK)
    kept = chosen & (inputs == ids)
    replaced = chosen & (inputs != MASK) & (inputs != ids)
    # A random replacement draws [MASK] or the token itself with probability 1/V each: 0.1·(1/V) of the chosen,
    # under one token in 100k, so these counts are the 80/10/10 split up to that.
    _within(int(became_mask.sum()), n_chosen, 0.8, "[MASK]")
    _within(int(replaced.sum()), n_chosen, 0.1, "random id")
    _within(int(kept.sum()), n_chosen, 0.1, "unchanged")
    # The random ids are uniform over the vocabulary: their mean is (V − 1)/2 within 6 standard errors.
    drawn = inputs[replaced].astype(np.float64)
    assert abs(drawn.mean() - (VOCAB - 1) / 2) <= 6 * VOCAB / math.sqrt(12 * drawn.size)


def test_batches_mask_real_tokens_only_and_rebuild_alone():
    """encode marks the text's tokens maskable, never [CLS], [SEP] or padding; batch b's masks come from
    (*mask_seed, b), so a batch rebuilt alone (first=b, as a resumed run does) has the same masks."""
    model = minibert.load()
    texts = ["the food was great", "a much longer sentence about the service and the staff", "ok"]
    rows = [data_.Example(t) for t in texts * 20]
    encoded = data_.encode(model, rows, "masked-lm", ())
    special = set(model.tokenize([model.tokenizer.mask_token]).input_ids[0, [0, 2]].tolist())  # [CLS], [SEP]
    for ids, maskable in zip(encoded.ids, encoded.labels):
        assert maskable[0] == 0 and maskable[-1] == 0 and ids[0] in special and ids[-1] in special
        assert maskable[1:-1].all()
    mask_id = int(model.tokenize([model.tokenizer.mask_token]).input_ids[0, 1])
    settings = dict(batch_size=8, task="masked-lm", buckets=model.length_buckets, pad_id=0, mask_id=mask_id,
                    vocab_size=model.config.vocab_size, mask_seed=(3, 1))
    order = np.arange(len(encoded))
    every = list(data_.batches(encoded, order, **settings))
    for batch in every:
        chosen = batch["labels"] != data_.IGNORE
        assert not np.any(chosen & (batch["attention_mask"] == 0))
        assert not np.any(chosen[:, 0])  # [CLS]
    again = next(data_.batches(encoded, order, first=5, **settings))
    for key in every[5]:
        np.testing.assert_array_equal(again[key], every[5][key])
    assert sum(int((b["labels"] != data_.IGNORE).sum()) for b in every) > 0
