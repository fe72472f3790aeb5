"""Bad checkpoints, configs and inputs get errors that name the problem and the fix."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import minibert
from minibert import sources
from conftest import make_hf_model


@pytest.fixture
def tiny(tmp_path):
    make_hf_model(tmp_path, "BertModel")
    return tmp_path


def test_truncated_safetensors_file(tiny):
    data = (tiny / "model.safetensors").read_bytes()
    (tiny / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(minibert.CheckpointError, match=r"model\.safetensors is not a readable safetensors file.*truncated or corrupt"):
        minibert.load(tiny)


def test_corrupt_safetensors_file(tiny):
    (tiny / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    with pytest.raises(minibert.CheckpointError, match="truncated or corrupt"):
        minibert.load(tiny)


def test_missing_key_is_named(tiny):
    tensors = load_file(tiny / "model.safetensors")
    del tensors["encoder.layer.1.attention.self.key.bias"]
    save_file(tensors, tiny / "model.safetensors")
    with pytest.raises(minibert.CheckpointError, match=r"missing 1 key.*encoder\.layer\.1\.attention\.self\.key\.bias"):
        minibert.load(tiny)


def test_unexpected_key_is_named(tiny):
    tensors = load_file(tiny / "model.safetensors")
    tensors["encoder.layer.7.attention.self.key.bias"] = np.zeros(32, np.float32)
    save_file(tensors, tiny / "model.safetensors")
    with pytest.raises(minibert.CheckpointError, match=r"unexpected key.*encoder\.layer\.7\.attention\.self\.key\.bias"):
        minibert.load(tiny)


def test_wrong_shape_is_named(tiny):
    tensors = load_file(tiny / "model.safetensors")
    tensors["encoder.layer.0.intermediate.dense.weight"] = np.zeros((36, 32), np.float32)
    save_file(tensors, tiny / "model.safetensors")
    with pytest.raises(minibert.CheckpointError, match=r"intermediate\.dense\.weight' has shape \(36, 32\), expected \(37, 32\)"):
        minibert.load(tiny)


def test_head_weights_with_a_bare_config(tmp_path):
    make_hf_model(tmp_path, "BertForSequenceClassification")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["BertModel"]}))
    with pytest.raises(minibert.CheckpointError, match="unexpected key.*classifier.*fix `architectures`"):
        minibert.load(tmp_path)


def _edit_config(directory, **changes):
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **changes}))


def test_unknown_activation(tiny):
    _edit_config(tiny, hidden_act="swishy")
    with pytest.raises(minibert.ConfigError, match=r"hidden_act 'swishy' is not supported; minibert runs gelu, gelu_new"):
        minibert.load(tiny)


def test_heads_must_divide_width(tiny):
    _edit_config(tiny, num_attention_heads=5)
    with pytest.raises(minibert.ConfigError, match="hidden_size 32 is not divisible by num_attention_heads 5"):
        minibert.load(tiny)


def test_relative_positions_are_refused(tiny):
    _edit_config(tiny, position_embedding_type="relative_key")
    with pytest.raises(minibert.ConfigError, match="position_embedding_type 'relative_key' is not supported"):
        minibert.load(tiny)


def test_config_from_params_infers_sizes(tiny):
    shapes = {k: v.shape for k, v in load_file(tiny / "model.safetensors").items()}
    cfg = minibert.BertConfig.from_params(shapes, num_attention_heads=4)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size, cfg.vocab_size) == (32, 2, 37, 99)
    with pytest.raises(minibert.ConfigError, match="the weights have no 'embeddings.word_embeddings.weight'"):
        minibert.BertConfig.from_params({})


def test_input_longer_than_positions(bundled):
    ids = np.full((1, 600), 1000)
    with pytest.raises(minibert.InputError, match=r"600 tokens per row but this model has 512 positions; tokenize with max_length=512"):
        bundled({"input_ids": ids})
    with pytest.raises(ValueError, match=r"513|max_length"):
        bundled.tokenize(["word " * 600])


def test_empty_batch(bundled):
    with pytest.raises(minibert.InputError, match="non-empty"):
        bundled({"input_ids": np.zeros((0, 5), int)})
    with pytest.raises(ValueError, match="empty"):
        bundled.tokenize([])


def test_ids_out_of_vocabulary(bundled):
    with pytest.raises(minibert.InputError, match=r"input_ids must lie in \[0, 30522\)"):
        bundled({"input_ids": np.array([[101, 40000, 102]])})


def test_unknown_checkpoint_name_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(sources.SourceError, match=r"no checkpoint 'nobody/no-such-bert' found.*download=True"):
        minibert.load("nobody/no-such-bert")


def test_weights_store_is_searched_by_name(tmp_path, monkeypatch):
    make_hf_model(tmp_path / "weights" / "tiny-bert", "BertModel")
    monkeypatch.chdir(tmp_path)
    assert minibert.load("tiny-bert").config.hidden_size == 32
