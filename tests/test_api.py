"""minibert/api.py: what `Model` takes as a batch, its defaults, and sentence embeddings against NumPy
pooling of the model's own last hidden state. Hooks, caches and gradients: test_hooks.py; bad input:
test_errors.py; parity with transformers: test_parity.py."""

from __future__ import annotations

import numpy as np
import pytest

from minibert import Batch, BertConfig, InputError, Model
from minibert.api import POOLINGS, is_text


@pytest.fixture(scope="module")
def tiny():
    cfg = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=12,
                     max_position_embeddings=16)
    return Model(cfg, seed=1)


IDS = np.array([[2, 7, 9, 3, 0, 0], [2, 5, 6, 8, 11, 3]])
MASK = (IDS > 0).astype(np.int32)


@pytest.mark.parametrize("value, text", [
    ("one text", True), (["a", "b"], True), (("a", "b"), True), ([], True),
    ({"input_ids": IDS}, False), (IDS, False), ([[1, 2]], False), (["a", 3], False), (None, False),
])
def test_is_text_tells_texts_from_id_batches(value, text):
    assert is_text(value) is text


def test_inputs_fill_in_types_and_mask_as_int32(tiny):
    ids, types, mask = (np.asarray(a) for a in tiny.inputs({"input_ids": IDS}))
    np.testing.assert_array_equal(ids, IDS)
    np.testing.assert_array_equal(types, np.zeros_like(IDS))
    np.testing.assert_array_equal(mask, np.ones_like(IDS))
    assert {a.dtype for a in (ids, types, mask)} == {np.dtype(np.int32)}


def test_a_batch_and_its_dict_run_the_same(bundled):
    batch = bundled.tokenize(["The cat sat.", "A much longer sentence than the first one."])
    assert isinstance(batch, Batch)
    np.testing.assert_array_equal(bundled(batch).last_hidden_state, bundled(batch.to_dict()).last_hidden_state)
    np.testing.assert_array_equal(bundled(batch).last_hidden_state, bundled(list(batch.texts)).last_hidden_state)


def numpy_pooling(hidden, mask, mode):
    """Pooling by loops over the real tokens of each row."""
    rows = []
    for h, m in zip(np.asarray(hidden, np.float64), mask):
        real = h[m > 0]
        rows.append({"mean": real.mean(0), "cls": h[0], "max": real.max(0)}[mode])
    return np.array(rows)


@pytest.mark.parametrize("mode", POOLINGS)
@pytest.mark.parametrize("normalize", [False, True])
def test_sentence_embeddings_pool_the_last_hidden_state(tiny, mode, normalize):
    batch = {"input_ids": IDS, "attention_mask": MASK}
    hidden = tiny(batch).last_hidden_state
    expected = numpy_pooling(hidden, MASK, mode)
    if normalize:
        expected /= np.linalg.norm(expected, axis=-1, keepdims=True)
    got = np.asarray(tiny.sentence_embeddings(batch, mode=mode, normalize=normalize))
    # float32 roundings (u = 2⁻²⁴) of values ≤ max|hidden|: the mean's 5 additions and division, then the
    # norm's 8 squares summed, its square root and the division: 16.
    np.testing.assert_allclose(got, expected, rtol=0, atol=16 * 2.0**-24 * max(1.0, float(np.abs(hidden).max())))


def test_sentence_embeddings_default_to_the_checkpoints_setting(bundled, tiny):
    batch = {"input_ids": IDS, "attention_mask": MASK}
    assert tiny.pooling is None  # no sentence-transformers folder: mean, not normalised
    np.testing.assert_array_equal(tiny.sentence_embeddings(batch), tiny.sentence_embeddings(batch, "mean", False))
    assert bundled.pooling == {"mode": "mean", "normalize": True}
    norms = np.linalg.norm(np.asarray(bundled.sentence_embeddings(["It's fine.", "Fine."]), np.float64), axis=-1)
    # The float32 normalisation sums D = 384 squares (≤ 384 roundings), takes a root and divides: 386 · u.
    np.testing.assert_allclose(norms, 1.0, rtol=0, atol=386 * 2.0**-24)


def test_unknown_pooling_mode_fails_before_running(tiny):
    traces = tiny.traces
    with pytest.raises(InputError, match="pooling mode 'first' is not one of 'mean', 'cls', 'max'"):
        tiny.sentence_embeddings({"input_ids": IDS[:, :3]}, mode="first")  # a new shape: a run would trace
    assert tiny.traces == traces
