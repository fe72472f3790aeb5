"""Model.save writes what save_pretrained wrote: every family and head, key for key, bit for bit; transformers
reads it back; and the data reader's errors."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file

import minibert
from minibert.errors import DataFileError, DataFileMissing, InputError
from minibert.training import data as data_
from minibert.training import examples
from tests.conftest import make_hf_model
from tests.test_families import HF_CLASSES, make_family_model
from tests.tolerances import assert_close_to_scale, forward_rtol, head_rtol

CASES = [("bert", suffix) for suffix in ("Model", "ForMaskedLM", "ForSequenceClassification",
                                         "ForTokenClassification")]
# XLM-R and CamemBERT keep RoBERTa's keys (one table): RoBERTa stands for the three.
CASES += [(family, "ForSequenceClassification") for family in ("roberta", "distilbert", "electra", "albert")]
CASES += [("electra", "ForMaskedLM"), ("albert", "ForMaskedLM"), ("distilbert", "ForMaskedLM")]


def _saved_by_transformers(tmp_path, family, suffix):
    if family == "bert":
        return make_hf_model(tmp_path, "Bert" + suffix)
    return make_family_model(tmp_path, family, suffix)


@pytest.mark.parametrize(("family", "suffix"), CASES)
def test_save_writes_what_save_pretrained_wrote(tmp_path, family, suffix):
    hf = _saved_by_transformers(tmp_path / "hf", family, suffix)
    model = minibert.load(tmp_path / "hf")
    model.save(tmp_path / "ours")
    original = load_file(tmp_path / "hf" / "model.safetensors")
    ours = load_file(tmp_path / "ours" / "model.safetensors")
    tied = {key for key, _ in model.config.family.head_keys.tied}
    assert set(ours) == {k for k in original if k.removeprefix(model.config.family.key_prefix + ".") not in tied}
    for key, value in ours.items():
        np.testing.assert_array_equal(value, original[key], err_msg=key)
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert config["architectures"] == [model.config.architecture]
    reloaded = getattr(transformers, HF_CLASSES.get(family, "Bert") + suffix).from_pretrained(tmp_path / "ours").eval()
    ids = torch.tensor([[2, 7, 9, 11, 3]])
    with torch.no_grad():
        want, got = hf.eval()(input_ids=ids), reloaded(input_ids=ids)
    field = "last_hidden_state" if suffix == "Model" else "logits"
    # The same weights, bit for bit (above), but two torch modules: their kernels may take other paths (memory
    # layout, alignment) and round differently on another CPU, so two forwards' rounding (tolerances.py).
    rtol = (forward_rtol if suffix == "Model" else head_rtol)(model.config, S=ids.shape[1])
    assert_close_to_scale(getattr(got, field).numpy(), getattr(want, field).numpy(), rtol, field)
    again = minibert.load(tmp_path / "ours")  # and minibert reads its own output
    assert dataclasses.replace(again.config, source=model.config.source) == model.config


def test_examples_read_tsv_csv_jsonl_and_tuples(tmp_path):
    (tmp_path / "a.tsv").write_text("text\tpair\tlabel\nthe food\tgood ?\t1\nthe room\tbad ?\t0\n")
    (tmp_path / "a.csv").write_text("text,label\n\"food, good\",pos\nroom,neg\n")
    (tmp_path / "a.jsonl").write_text('{"text": "a b", "label": ["X", "Y"]}\n\n{"text": "c", "label": ["X"]}\n')
    rows = [data_.Example("the food", "good ?", 1), data_.Example("the room", "bad ?", 0)]
    assert examples(tmp_path / "a.tsv") == rows
    assert [e.label for e in examples(tmp_path / "a.csv")] == ["pos", "neg"]
    assert examples(tmp_path / "a.jsonl", task="token-classification")[0].label == ["X", "Y"]
    assert examples([("x", 1), ("y", "z", 0)][:1]) == [data_.Example("x", None, 1)]
    assert examples(["just text"], task="masked-lm") == [data_.Example("just text")]
    assert data_.label_names(examples(tmp_path / "a.csv"), "sequence-classification", None) == ("neg", "pos")


@pytest.mark.parametrize(("content", "suffix", "task", "error", "message"), [
    ("", ".tsv", "sequence-classification", DataFileError, "is empty"),
    ("words\tlabel\nx\t1\n", ".tsv", "sequence-classification", DataFileError, "no 'text' column"),
    ("text\tpair\tlabel\nx\ty\t1\nz\t\t0\n", ".tsv", "sequence-classification", DataFileError,
     r"row 1 \(line 2\) has a pair but row 2 \(line 3\) has none"),
    ("text\tlabel\nx\t\n", ".tsv", "sequence-classification", DataFileError, r"row 1 \(line 2\) has no label"),
    ('{"text": "x"\n', ".jsonl", "masked-lm", DataFileError, "a.jsonl:1: not a JSON object"),
    ("text\n x \n", ".txt", "masked-lm", DataFileError, "neither TSV, CSV nor JSONL"),
])
def test_bad_data_files_name_the_problem(tmp_path, content, suffix, task, error, message):
    path = tmp_path / f"a{suffix}"
    path.write_text(content)
    with pytest.raises(error, match=message):
        examples(path, task=task)


def test_bad_labels_and_missing_files():
    with pytest.raises(DataFileMissing, match="does not exist"):
        examples("/nonexistent/train.tsv")
    with pytest.raises(InputError, match="label 5 is out of range for num_labels=2"):
        data_.label_names(examples([("a", 0), ("b", 5)]), "sequence-classification", 2)
    with pytest.raises(InputError, match="at least 2 labels"):
        data_.label_names(examples([("a", "x"), ("b", "x")]), "sequence-classification", None)
    with pytest.raises(InputError, match="task 'summarise'"):
        examples([("a", 0)], task="summarise")


def test_save_refuses_a_directory_holding_files_it_would_replace(tmp_path):
    """Docs-only tester, item 2: Model.save into a folder holding the user's config.json replaced it silently."""
    make_hf_model(tmp_path / "hf", "BertModel")
    model = minibert.load(tmp_path / "hf")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text("{mine}")
    (mine / "notes.txt").write_text("kept")
    with pytest.raises(DataFileError, match=r"already holds config.json; pass another directory, or overwrite=True"):
        model.save(mine)
    with pytest.raises(DataFileError, match=r"overwrite='no': pass True or False"):  # truthy, yet not a yes
        model.save(mine, overwrite="no")
    assert (mine / "config.json").read_text() == "{mine}" and sorted(p.name for p in mine.iterdir()) == \
        ["config.json", "notes.txt"]
    model.save(tmp_path / "ours")  # a new directory, then an empty one: no question
    (tmp_path / "empty").mkdir()
    model.save(tmp_path / "empty")
    with pytest.raises(DataFileError, match="already holds config.json, model.safetensors"):
        model.save(tmp_path / "ours")  # saving again is replacing a model: asked for by name
    model.save(mine, overwrite=True)
    assert json.loads((mine / "config.json").read_text())["architectures"] == ["BertModel"]
    assert (mine / "notes.txt").read_text() == "kept"


def test_save_over_a_sharded_checkpoint_leaves_only_the_new_weights(tmp_path):
    """Issue 40: overwrite=True into a folder holding a sharded checkpoint left its index and shards, which both
    loaders read before model.safetensors: minibert.load returned the old weights. The save removes the index,
    the shards it names and any pytorch_model.bin (weights the new model.safetensors replaces); without
    overwrite they count as held files. Its files take the same permissions (the umask's), model.safetensors
    included."""
    make_hf_model(tmp_path / "old", "BertModel", seed=0)
    old = transformers.BertModel.from_pretrained(tmp_path / "old")
    sharded = tmp_path / "sharded"
    old.save_pretrained(sharded, max_shard_size="20KB")
    shards = json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"].values()
    assert len(set(shards)) > 1
    torch.save(old.state_dict(), sharded / "pytorch_model.bin")
    (sharded / "notes.txt").write_text("kept")
    make_hf_model(tmp_path / "new", "BertModel", seed=1)
    new = minibert.load(tmp_path / "new")
    with pytest.raises(DataFileError, match="model.safetensors.index.json"):
        new.save(sharded)
    new.save(sharded, overwrite=True)
    assert sorted(p.name for p in sharded.iterdir()) == ["config.json", "model.safetensors", "notes.txt",
                                                         "tokenizer_config.json", "vocab.txt"]
    got = minibert.load(sharded).named_parameters()
    for name, value in new.named_parameters().items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)  # the bytes written, read back
    modes = {p.name: p.stat().st_mode & 0o777 for p in sharded.iterdir() if p.name != "notes.txt"}
    assert set(modes.values()) == {(sharded / "notes.txt").stat().st_mode & 0o777}, modes
