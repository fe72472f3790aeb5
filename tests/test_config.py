"""minibert/core/config.py and families/reading.py: strict config.json keys, field types, a Config's family and
architecture, the ARCHITECTURES table, head labels."""

from __future__ import annotations

import json

import pytest
import transformers

from minibert import ConfigError, Model
from minibert.core.config import Config, head_label
from minibert.families.registry import ARCHITECTURES, FAMILIES, config_for
from minibert.io.config_json import read_config

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64)
BERT_ARCHITECTURES = [name for name in ARCHITECTURES if name.startswith("Bert")]


def hf_config(architecture: str = "BertModel", **changes) -> dict:
    """The dict transformers writes as config.json for a tiny BERT (every bookkeeping key it adds included)."""
    return transformers.BertConfig(**TINY, architectures=[architecture]).to_dict() | changes


@pytest.mark.parametrize("architecture", BERT_ARCHITECTURES)
def test_real_hugging_face_configs_pass_the_allow_list(architecture):
    cfg = read_config(hf_config(architecture))
    assert (cfg.architecture, cfg.hidden_size, cfg.num_hidden_layers, cfg.head_dim) == (architecture, 32, 2, 8)


def test_bundled_config_json_passes(bundled_dir):
    cfg = read_config(bundled_dir)  # a directory: its config.json, as written by transformers 4.8
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (384, 6, 12)
    assert cfg.source.endswith("config.json")


@pytest.mark.parametrize("key, value, message", [
    ("position_embedding_type", "relative_key", "position_embedding_type 'relative_key' is not supported"),
    ("is_decoder", True, "is_decoder = True is not supported; minibert implements only is_decoder = False"),
    ("add_cross_attention", True, "add_cross_attention = True is not supported"),
    ("pruned_heads", {"0": [1]}, r"pruned_heads = \{'0': \[1\]\} is not supported"),
    ("rotary_dim", 8, r"config key 'rotary_dim' \(= 8\) is not one minibert implements"),
])
def test_keys_that_change_the_computation_are_named_with_their_value(key, value, message):
    with pytest.raises(ConfigError, match=message):
        read_config(hf_config(**{key: value}))


def test_harmless_keys_pass_at_their_harmless_values():
    cfg = read_config(hf_config(is_decoder=False, add_cross_attention=False, pruned_heads={},
                                gradient_checkpointing=True, classifier_dropout=0.3))
    assert cfg.architecture == "BertModel"


@pytest.mark.parametrize("key, value, message", [
    ("hidden_size", "32", "hidden_size must be a positive integer, got '32'"),
    ("num_hidden_layers", 0, "num_hidden_layers must be a positive integer, got 0"),
    ("vocab_size", True, "vocab_size must be a positive integer, got True"),
    ("pad_token_id", -1, "pad_token_id must be a non-negative integer, got -1"),
    ("layer_norm_eps", True, "layer_norm_eps must be a small positive number"),
    ("layer_norm_eps", 2.0, "layer_norm_eps must be a small positive number"),
    ("hidden_act", "swishy", "hidden_act 'swishy' is not supported"),
    ("num_attention_heads", 5, "hidden_size 32 is not divisible by num_attention_heads 5"),
    ("architectures", "BertModel", r"architectures must be a list of names such as \[\"BertModel\"\]"),
    ("id2label", ["neg", "pos"], "id2label must be an object"),
    ("id2label", {"first": "neg"}, r"id2label keys must be class numbers, got \['first'\]"),
])
def test_field_types_and_values_are_checked(key, value, message):
    with pytest.raises(ConfigError, match=message):
        read_config(hf_config(**{key: value}))


def test_errors_name_the_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(hf_config(hidden_act="swishy")))
    with pytest.raises(ConfigError, match=rf"{tmp_path / 'config.json'}: hidden_act 'swishy'"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="holds a JSON list; it must hold an object"):
        read_config(tmp_path)


def test_num_labels_counts_the_labels_where_there_is_no_id2label():
    config = hf_config("BertForSequenceClassification", num_labels=3)
    del config["id2label"]
    assert read_config(config).num_labels == 3
    with pytest.raises(ConfigError, match="num_labels must be a positive integer, got 0"):
        read_config(config | {"num_labels": 0})


def test_labels_come_from_id2label_in_class_order():
    labels = {"1": "pos", "0": "neg", "2": "mixed"}
    cfg = read_config(hf_config("BertForSequenceClassification", id2label=labels))
    assert cfg.id2label == ("neg", "pos", "mixed") and cfg.num_labels == 3


@pytest.mark.parametrize("architecture", BERT_ARCHITECTURES)
def test_architectures_table_matches_transformers_classes(architecture):
    """Each BERT row of ARCHITECTURES says which heads transformers' class of that name has."""
    heads = ARCHITECTURES[architecture]
    model = getattr(transformers, architecture)(transformers.BertConfig(**TINY))
    encoder = getattr(model, "bert", model)
    assert (getattr(encoder, "pooler", None) is not None) == heads.pooler
    predictions = getattr(getattr(model, "cls", None), "predictions", None)
    assert (predictions is not None) == heads.mlm
    assert (getattr(getattr(model, "cls", None), "seq_relationship", None) is not None) == heads.nsp
    assert (getattr(model, "classifier", None) is not None) == (heads.classifier is not None)


@pytest.mark.parametrize("architecture", BERT_ARCHITECTURES)
def test_architectures_table_decides_the_models_head_hooks(architecture):
    heads = ARCHITECTURES[architecture]
    names = set(Model(Config(**TINY, architecture=architecture)).hook_names)
    assert ("pooler.hook_pooler_out" in names) == heads.pooler
    assert ("unembed.hook_out" in names) == heads.mlm
    assert ("nsp_head.hook_nsp_out" in names) == heads.nsp
    assert ("classifier.hook_logits" in names) == (heads.classifier is not None)


def test_a_config_carries_its_family_and_an_architecture_of_that_family():
    """The family is a field (BERT's by default); the architecture defaults to the family's bare model, and another
    family's class name is refused, naming the way to build it (config_for sets the family from the registry)."""
    assert (Config().family, Config().architecture) == (FAMILIES["bert"], "BertModel")
    roberta = Config(family=FAMILIES["roberta"], pad_token_id=1)
    assert (roberta.model_type, roberta.architecture, roberta.heads) == ("roberta", "RobertaModel",
                                                                         ARCHITECTURES["RobertaModel"])
    assert config_for("RobertaForMaskedLM", pad_token_id=1).family is FAMILIES["roberta"]
    with pytest.raises(ConfigError, match=r"'RobertaModel' is not a BERT class; .*config_for\(architecture"):
        Config(architecture="RobertaModel")
    with pytest.raises(ConfigError, match="family must be a Family"):
        Config(family="roberta")
    with pytest.raises(ConfigError, match="architecture 'GPT2Model' is not supported"):
        config_for("GPT2Model")


def test_head_label_is_one_indexed():
    assert [head_label(0, 3), head_label(2, 5), head_label(11, 11)] == ["1-4", "3-6", "12-12"]


def test_id2label_answers_as_transformers_dict_and_as_the_tuple_it_was():
    """Before: config.id2label was a tuple only, so code written for transformers' dict (`.items()`, `.get`)
    failed, and Config(id2label={0: ..., 1: ...}) was taken as the dict itself. Now a dict in class order and a
    tuple give one config, whose id2label has transformers' items, keys, values and get, and is still the tuple
    of names (indexing, iteration, equality, hashing: Config is a static argument of jit)."""
    theirs = transformers.BertConfig(id2label={1: "pos", 0: "neg", 2: "mixed"}).id2label
    given = Config(id2label={1: "pos", 0: "neg", 2: "mixed"})
    assert given == Config(id2label=("neg", "pos", "mixed")) and hash(given) == hash(Config(id2label=("neg", "pos",
                                                                                                      "mixed")))
    labels = given.id2label
    assert dict(labels.items()) == theirs  # transformers keeps the order given; ours is class order
    assert list(labels.items()) == [(0, "neg"), (1, "pos"), (2, "mixed")]
    assert list(labels.keys()) == sorted(theirs) and list(labels.values()) == [theirs[c] for c in sorted(theirs)]
    assert labels.get(1) == theirs.get(1) == "pos" and labels.get(7) is theirs.get(7) is None
    assert labels == ("neg", "pos", "mixed") and list(labels) == ["neg", "pos", "mixed"] and labels[2] == "mixed"
    assert given.num_labels == 3
    loaded = read_config(hf_config("BertForSequenceClassification", id2label={"1": "pos", "0": "neg"}))
    assert dict(loaded.id2label.items()) == {0: "neg", 1: "pos"}
    with pytest.raises(ConfigError, match=r"id2label's class ids must be 0 … 1, got \[0, 2\]"):
        Config(id2label={0: "neg", 2: "pos"})
