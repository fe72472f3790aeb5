"""minibert/checkpoint.py: the layouts a checkpoint comes in (sharded, half precision, `bert.`-prefixed,
a pickled pytorch_model.bin behind an opt-in, a sentence-transformers folder), each loaded to parity
with transformers; labels from config.json. The key-table errors are in test_errors.py."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from conftest import make_hf_model, random_batch
from test_parity import TINY, assert_parity

import minibert
from minibert.io import checkpoint


def test_sequence_classifier_labels(tmp_path):
    labels = {0: "negative", 1: "neutral", 2: "positive"}
    make_hf_model(tmp_path, "BertForSequenceClassification", num_labels=3, id2label=labels,
                  label2id={name: number for number, name in labels.items()})
    assert minibert.load(tmp_path).config.id2label == ("negative", "neutral", "positive")


@pytest.mark.slow  # three tiny checkpoints written and loaded, each to parity
def test_sharded_and_half_precision_checkpoints(tmp_path):
    import transformers

    sharded = tmp_path / "sharded"
    hf_model = make_hf_model(sharded, "BertModel")
    hf_model.save_pretrained(sharded, max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").exists()
    (sharded / "model.safetensors").unlink(missing_ok=True)
    batch = random_batch(np.random.default_rng(3), 2, 7, 99)
    assert_parity(minibert.load(sharded), hf_model, batch, TINY)

    for dtype in (torch.float16, torch.bfloat16):
        directory = tmp_path / str(dtype)
        make_hf_model(directory, "BertModel", dtype=dtype)
        upcast = transformers.BertModel.from_pretrained(directory, attn_implementation="eager",
                                                        dtype=torch.float32).eval()
        assert_parity(minibert.load(directory), upcast, batch, TINY)


def test_bert_prefixed_bare_layout(tmp_path):
    from safetensors.numpy import load_file, save_file

    hf_model = make_hf_model(tmp_path, "BertModel")
    tensors = load_file(tmp_path / "model.safetensors")
    save_file({f"bert.{k}": v for k, v in tensors.items()}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    assert_parity(minibert.load(tmp_path), hf_model, random_batch(np.random.default_rng(4), 2, 6, 99), TINY)


def test_pytorch_bin_needs_opt_in_and_converts(tmp_path):
    hf_model = make_hf_model(tmp_path, "BertModel", safe_serialization=False)
    assert not (tmp_path / "model.safetensors").exists()
    with pytest.raises(minibert.CheckpointError, match="pickle"):
        minibert.load(tmp_path)
    batch = random_batch(np.random.default_rng(5), 2, 6, 99)
    assert_parity(minibert.load(tmp_path, allow_pickle=True), hf_model, batch, TINY)
    minibert.convert_bin_to_safetensors(tmp_path / "pytorch_model.bin")
    assert_parity(minibert.load(tmp_path), hf_model, batch, TINY)


def write_sentence_transformers(directory, modules, pooling: dict | None = None) -> None:
    """A sentence-transformers folder: modules.json, and 1_Pooling/config.json when `pooling` is given."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (directory / "1_Pooling").mkdir()
        (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling))


TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}
POOLING = {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
NORMALIZE = {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}


@pytest.mark.parametrize("modules, settings, expected", [
    ([TRANSFORMER, POOLING, NORMALIZE], {"pooling_mode_mean_tokens": True}, {"mode": "mean", "normalize": True}),
    ([TRANSFORMER, POOLING], {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False},
     {"mode": "cls", "normalize": False}),
    ([TRANSFORMER, POOLING], {"pooling_mode_max_tokens": True}, {"mode": "max", "normalize": False}),
])
def test_sentence_transformers_layout_reads_pooling_and_normalize(tmp_path, modules, settings, expected):
    write_sentence_transformers(tmp_path, modules, settings)
    assert checkpoint.sentence_transformers_layout(tmp_path) == (tmp_path, expected)


def test_sentence_transformers_encoder_in_a_subfolder_loads(tmp_path):
    hf_model = make_hf_model(tmp_path / "0_Transformer", "BertModel")
    write_sentence_transformers(tmp_path, [{**TRANSFORMER, "path": "0_Transformer"}, POOLING],
                                {"pooling_mode_cls_token": True})
    model = minibert.load(tmp_path)
    assert model.pooling == {"mode": "cls", "normalize": False}
    assert_parity(model, hf_model, random_batch(np.random.default_rng(7), 2, 6, 99), TINY)


def test_plain_checkpoint_has_no_pooling_settings(tmp_path):
    assert checkpoint.sentence_transformers_layout(tmp_path) == (tmp_path, None)


@pytest.mark.parametrize("text, message", [
    ("{not json", "modules.json is not valid JSON"),
    ('{"type": "Transformer"}', "modules.json must be a JSON list of objects with 'type' and 'path' strings"),
    ('[{"type": 3}]', "must be a JSON list of objects"),
])
def test_malformed_modules_json_is_named(tmp_path, text, message):
    (tmp_path / "modules.json").write_text(text)
    with pytest.raises(minibert.CheckpointError, match=message):
        checkpoint.sentence_transformers_layout(tmp_path)


@pytest.mark.parametrize("output", ["pytorch_model.bin", "sub/../pytorch_model.bin", "link.bin"])
def test_convert_refuses_to_overwrite_its_input(tmp_path, capsys, output):
    """`minibert convert x.bin --output x.bin` (also through .. or a link) is refused, leaving the input whole."""
    from minibert.app import cli

    make_hf_model(tmp_path, "BertModel", safe_serialization=False)
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.bin").symlink_to(tmp_path / "pytorch_model.bin")
    before = (tmp_path / "pytorch_model.bin").read_bytes()
    status = cli.main(["convert", str(tmp_path / "pytorch_model.bin"), "--output", str(tmp_path / output)])
    assert status == cli.USER_ERROR
    assert "is the input file" in capsys.readouterr().err
    assert (tmp_path / "pytorch_model.bin").read_bytes() == before


def test_nonfinite_weights_are_refused_by_name_unless_allowed(tmp_path):
    from safetensors.numpy import load_file, save_file

    make_hf_model(tmp_path, "BertModel")
    tensors = load_file(tmp_path / "model.safetensors")
    key = "encoder.layer.1.output.dense.weight"
    tensors[key][3, 4], tensors[key][0, 0] = np.nan, np.inf
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(minibert.CheckpointError, match=re.escape(f"'{key}' holds 2 NaN or infinite value(s) of "
                                                                 f"{tensors[key].size}")):
        minibert.load(tmp_path)
    model = minibert.load(tmp_path, allow_nonfinite=True)
    assert np.isnan(model.params["blocks"][1]["mlp"]["W_out"][4, 3])  # stored [in, out]: PyTorch's [3, 4] transposed


def _edit_header(path, key: str, **fields) -> None:
    """Rewrite `path`'s safetensors header entry of tensor `key` with `fields` (dtype, shape), keeping the header's
    length so that the data offsets stay where they were."""
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    header[key] |= fields
    text = json.dumps(header, separators=(",", ":")).encode().ljust(size)
    assert len(text) == size
    path.write_bytes(data[:8] + text + data[8 + size:])


KEY = "encoder.layer.0.attention.self.key.weight"  # [32, 32] float32: 4096 bytes


@pytest.mark.parametrize("fields, message", [
    # As wide as F32, so the sizes agree: the safetensors reader accepts it; minibert refuses non-float weights.
    (dict(dtype="I32"), f"'{KEY}' is stored as int32, but weights are floating point"),
    # dtype × shape × bytes disagrees with the header's offsets: the safetensors reader refuses it.
    (dict(shape=[32, 16]), "invalid shape, data type, or offset for tensor"),
    (dict(dtype="F64"), "invalid shape, data type, or offset for tensor"),
])
def test_a_header_that_misdescribes_a_tensor_is_refused(tmp_path, fields, message):
    make_hf_model(tmp_path, "BertModel")
    _edit_header(tmp_path / "model.safetensors", KEY, **fields)
    with pytest.raises(minibert.CheckpointError, match=re.escape(message)):
        minibert.load(tmp_path)
