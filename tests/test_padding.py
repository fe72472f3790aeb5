"""Texts of different token lengths: tokenize's padding option, Batch rows by index, batches that mix single
sentences and pairs (WordPiece and the `tokenizers` families, against transformers row by row), and activation
/ attribution patching of two texts of different lengths, against a loop of hooked runs on a tiny random model."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from conftest import make_hf_model
from tolerances import forward_rtol

import minibert
from minibert.analysis import interventions
from minibert.errors import TokenizerError

MIXED_TEXTS = ["The cat sat.", "A dog barked loudly at night.", "Hello", "Short one."]
MIXED_PAIRS = [None, "It was late.", "world and more words", None]


def hf_row(hf_tokenizer, text, pair) -> list[int]:
    return hf_tokenizer(text, pair)["input_ids"]


def assert_rows_match_transformers(batch, hf_tokenizer, texts, pairs, pad_id):
    """Each row as transformers encodes that text (or pair) alone, then padded to the batch's width."""
    for row, (text, pair) in enumerate(zip(texts, pairs)):
        encoded = hf_tokenizer(text, pair, return_offsets_mapping=True, return_token_type_ids=True)
        n = len(encoded["input_ids"])
        width = batch.input_ids.shape[1]
        assert batch.input_ids[row].tolist() == encoded["input_ids"] + [pad_id] * (width - n), (text, pair)
        assert batch.attention_mask[row].tolist() == [1] * n + [0] * (width - n)
        assert batch.token_type_ids[row, :n].tolist() == encoded["token_type_ids"]
        assert batch.sequence_ids[row][:n] == encoded.sequence_ids()
        assert batch.word_ids[row][:n] == encoded.word_ids()
        assert batch.offsets[row][:n] == [tuple(span) for span in encoded["offset_mapping"]]


def test_wordpiece_batch_mixes_single_sentences_and_pairs(bundled, bundled_dir):
    hf_tokenizer = transformers.BertTokenizerFast.from_pretrained(str(bundled_dir))
    batch = bundled.tokenize(MIXED_TEXTS, MIXED_PAIRS)
    assert_rows_match_transformers(batch, hf_tokenizer, MIXED_TEXTS, MIXED_PAIRS, bundled.tokenizer.pad_token_id)
    assert batch.pairs == MIXED_PAIRS


def test_tokenizers_library_batch_mixes_single_sentences_and_pairs(tmp_path):
    from test_families import write_tokenizer

    from minibert.families.registry import config_for
    from minibert.io.tokenizers_hf import SubwordTokenizer, tokenizer_for

    write_tokenizer(tmp_path, "roberta")
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ours = tokenizer_for(tmp_path, config_for("RobertaModel", type_vocab_size=1,
                                              pad_token_id=hf_tokenizer.pad_token_id))
    assert isinstance(ours, SubwordTokenizer)
    batch = ours(MIXED_TEXTS, MIXED_PAIRS)
    assert_rows_match_transformers(batch, hf_tokenizer, MIXED_TEXTS, MIXED_PAIRS, hf_tokenizer.pad_token_id)


def test_padding_max_length_pads_every_row_as_transformers_does(bundled, bundled_dir):
    hf_tokenizer = transformers.BertTokenizerFast.from_pretrained(str(bundled_dir))
    batch = bundled.tokenize(["great", "not great"], padding="max_length", max_length=10)
    want = hf_tokenizer(["great", "not great"], padding="max_length", max_length=10)
    assert batch.input_ids.tolist() == want["input_ids"]
    assert batch.attention_mask.tolist() == want["attention_mask"]
    with pytest.raises(TokenizerError, match="with max_length=N"):
        bundled.tokenize("great", padding="max_length")


def test_batch_rows_by_index_and_slice(bundled):
    batch = bundled.tokenize(MIXED_TEXTS, MIXED_PAIRS)
    one = batch[1]
    assert len(one) == 1 and one.texts == [MIXED_TEXTS[1]] and one.pairs == [MIXED_PAIRS[1]]
    np.testing.assert_array_equal(one.input_ids, batch.input_ids[1:2])
    assert one.tokens == batch.tokens[1:2] and one.offsets == batch.offsets[1:2]
    tail = batch[2:]
    np.testing.assert_array_equal(tail.attention_mask, batch.attention_mask[2:])
    assert tail.word_ids == batch.word_ids[2:] and tail.sequence_ids == batch.sequence_ids[2:]
    assert [row.texts[0] for row in batch] == MIXED_TEXTS
    np.testing.assert_array_equal(batch[-1].input_ids, batch.input_ids[-1:])
    with pytest.raises(TokenizerError, match="out of range: the batch has 4 rows"):
        batch[4]


# ---- patching two texts of different token lengths ----------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-padding")
    make_hf_model(directory, num_hidden_layers=2)
    return minibert.load(directory)


def cls_metric(model):
    """Cosine of the [CLS] hidden state with a fixed unit vector: one value per row, at a position every
    length has."""
    direction = jnp.asarray(np.random.default_rng(3).normal(size=model.config.hidden_size), jnp.float32)
    direction = direction / jnp.linalg.norm(direction)

    def metric(out):
        cls = out.last_hidden_state[:, 0]
        return cls @ direction / jnp.linalg.norm(cls, axis=-1)
    return metric


def _patch_at(value, ctx, layer, position, clean):
    at = (jnp.arange(value.shape[1]) == position).reshape(1, -1, *[1] * (value.ndim - 2))
    return jnp.where((ctx.layer == layer) & at, clean[ctx.layer], value)


def patching_by_hand(model, clean_text, corrupt_text, metric, site, length):
    """The documented alignment, one hooked run per cell: both texts padded on the right to `length`; at the
    positions of clean tokens the clean value is written, elsewhere the corrupted run is left alone."""
    clean = model.tokenize(clean_text, padding="max_length", max_length=length)
    corrupted = model.tokenize(corrupt_text, padding="max_length", max_length=length)
    values = model.run_with_cache(clean, names=f"blocks.*.{site}")[1].stack(site)
    unpatched = float(metric(model(corrupted))[0])
    grid = np.full((model.config.num_hidden_layers, length), unpatched)
    for layer, position in np.ndindex(grid.shape):
        if clean.attention_mask[0, position]:
            hook = minibert.HookFn(_patch_at, layer=jnp.int32(layer), position=jnp.int32(position), clean=values)
            grid[layer, position] = float(metric(model.run_with_hooks(corrupted, {f"blocks.*.{site}": hook}))[0])
    return grid, unpatched


@pytest.mark.slow  # 12 hooked runs per case, besides the sweeps' own programs
@pytest.mark.parametrize("clean_text, corrupt_text", [("a b", "a c d b"), ("a c d b", "a b")],
                         ids=["clean-shorter", "clean-longer"])
def test_patching_texts_of_different_lengths(tiny, clean_text, corrupt_text):
    """patch_activations takes the two texts as they are (4 and 6 tokens) and aligns them from the left; the
    grid is [L, 6] and equals the hand-made loop. Tolerance: two fp32 programs of the whole forward
    (tolerances.forward_rtol); a cosine is a weighted average of the coordinates, so its error is as large."""
    metric = cls_metric(tiny)
    atol = forward_rtol(tiny.config, S=6)
    grid = interventions.patch_activations(tiny, clean_text, corrupt_text, metric)
    want, unpatched = patching_by_hand(tiny, clean_text, corrupt_text, metric, "hook_resid_pre", 6)
    assert grid.shape == want.shape == (2, 6)
    np.testing.assert_allclose(grid, want, atol=atol)
    assert np.ptp(want) > 10 * atol
    # Attribution patching aligns the same way: where the clean text has no token its estimate is exactly 0
    # (clean − corrupted = 0 there by construction).
    estimate = interventions.attribution_patching(tiny, clean_text, corrupt_text, metric)
    clean_length = len(tiny.to_str_tokens(clean_text))
    assert estimate.shape == (2, 6) and (estimate[:, clean_length:] == 0).all()
    assert np.abs(estimate[:, :clean_length]).max() > 0


def test_patching_refuses_batches_of_different_row_counts(tiny):
    with pytest.raises(minibert.MinibertError, match="as many rows"):
        interventions.patch_activations(tiny, ["a b", "c"], ["a c"], cls_metric(tiny))
