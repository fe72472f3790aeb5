"""A checkpoint's config.json → a Config of its family: the family from model_type (the registry), its own key
names renamed to Hugging Face's BERT names, every key checked (one that changes the computation and that minibert
does not implement is refused, naming it), the family's own settings read into Config.settings.

    from minibert.io.config_json import read_config
    cfg = read_config("path/to/checkpoint")          # a directory, its config.json, or a parsed dict
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from minibert.core.config import Config
from minibert.core.family import Family
from minibert.errors import ConfigError
from minibert.families.registry import ARCHITECTURE_FAMILY, FAMILIES
from minibert.io.files import read_json_object

# Keys of Hugging Face config.json files that do not change what the encoder computes (training,
# generation and bookkeeping settings). Any other key that Config does not model is refused.
HARMLESS_KEYS = frozenset({
    "_name_or_path", "architectures", "model_type", "transformers_version", "torch_dtype", "dtype",
    "gradient_checkpointing", "use_cache", "classifier_dropout", "hidden_dropout_prob",
    "attention_probs_dropout_prob", "initializer_range", "id2label", "label2id", "num_labels",
    "problem_type", "finetuning_task", "output_attentions", "output_hidden_states", "return_dict",
    "torchscript", "use_return_dict", "tokenizer_class", "prefix", "task_specific_params",
    "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id", "mask_token_id", "unk_token_id",
    "decoder_start_token_id", "chunk_size_feed_forward", "output_past", "directionality",
    "pooler_fc_size", "pooler_num_attention_heads", "pooler_num_fc_layers", "pooler_size_per_head",
    "pooler_type", "max_length", "min_length", "do_sample", "early_stopping", "num_beams",
    "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
    "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate",
    "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens", "tf_legacy_loss",
    "cross_attention_hidden_size", "tie_encoder_decoder", "tie_word_embeddings", "layerdrop",
})
# Keys that are harmless at these values only (they change the computation otherwise).
HARMLESS_VALUES = {
    "is_decoder": (False,),
    "add_cross_attention": (False,),
    "is_encoder_decoder": (False,),
    "pruned_heads": ({},),
}


def read_config(config: str | Path | Mapping[str, Any], architecture: str | None = None) -> Config:
    """From a Hugging Face `config.json` (path, directory containing it, or parsed dict).

    `architecture` overrides the config's `architectures` (e.g. "BertModel" to drop a head).
    Keys that would change the computation and that minibert does not implement are errors.
    """
    source = "<dict>"
    if not isinstance(config, Mapping):
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        source = str(path)
        config = read_json_object(path, "a checkpoint directory needs a config.json", ConfigError)
    model_type = config.get("model_type", "bert")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise ConfigError(f"{source}: model_type {model_type!r} is not a family minibert loads; it loads "
                          f"{', '.join(map(repr, FAMILIES))} (a string, e.g. \"model_type\": \"bert\").")
    family = FAMILIES[model_type]
    config = _renamed(config, family, source)
    fields = _family_fields(family)
    _check_keys(config, fields, source, family.keys | dict(family.settings).keys(), dict(family.values))
    architectures = config.get("architectures") or [family.prefix + "Model"]
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ConfigError(f"{source}: architectures must be a list of names such as [\"{family.prefix}Model\"], "
                          f"got {architectures!r}.")
    architecture = architectures[0] if architecture is None else architecture
    if not isinstance(architecture, str):
        raise ConfigError(f"{source}: architecture must be a class name such as \"{family.prefix}Model\", got "
                          f"{architecture!r}.")
    if ARCHITECTURE_FAMILY.get(architecture, model_type) != model_type:
        raise ConfigError(f"{source}: architecture {architecture!r} belongs to model_type "
                          f"{ARCHITECTURE_FAMILY[architecture]!r}, but config.json says {model_type!r}; use "
                          f"{family.prefix}Model or another {family.prefix}… class.")
    values = {k: config[k] for k in fields if k in config} | dict(family.fixed)
    settings = tuple((key, _hashable(config.get(key, default))) for key, default in family.settings)
    return Config(**values, family=family, architecture=architecture, id2label=_labels(config, source),
                  settings=settings, source=source)


def _renamed(config: Mapping[str, Any], family: Family, source: str) -> dict[str, Any]:
    """config.json with the family's own key names replaced by Hugging Face's BERT names (DistilBERT's dim…)."""
    renamed = dict(config)
    for theirs, ours in family.renames:
        if theirs in renamed:
            if ours in renamed:
                raise ConfigError(f"{source}: both {theirs!r} and {ours!r} are set; {family.name} configs use "
                                  f"{theirs!r}. Remove {ours!r}.")
            renamed[ours] = renamed.pop(theirs)
    return renamed


def _family_fields(family: Family) -> set[str]:
    """The Config fields a family's config.json may set."""
    fields = {f.name for f in dataclasses.fields(Config)} - {"family", "architecture", "id2label", "settings",
                                                             "source"}
    if family.projection is None:
        fields.discard("embedding_size")
    return fields - dict(family.fixed).keys()


def _hashable(value):
    """A config.json value as Config can hold it (frozen, hashable: it keys compiled programs)."""
    if isinstance(value, list):
        return tuple(_hashable(item) for item in value)
    if isinstance(value, dict):
        return tuple((key, _hashable(item)) for key, item in value.items())
    return value


def _check_keys(config: Mapping[str, Any], fields: set[str], source: str, family_keys=frozenset(),
                family_values: Mapping[str, tuple] | None = None) -> None:
    """Refuse keys that change the computation but that Config does not model."""
    allowed_values = HARMLESS_VALUES | (family_values or {})
    for key, value in config.items():
        if key in fields or key in HARMLESS_KEYS or key in family_keys:
            continue
        if key in allowed_values:
            if value in allowed_values[key]:
                continue
            raise ConfigError(f"{source}: {key} = {value!r} is not supported; minibert implements only "
                              f"{key} = {allowed_values[key][0]!r}.")
        raise ConfigError(f"{source}: config key {key!r} (= {value!r}) is not one minibert implements, so it cannot "
                          f"promise the same computation. If the key is harmless bookkeeping, remove it from "
                          f"config.json.")


def _labels(config: Mapping[str, Any], source: str) -> tuple[str, ...]:
    id2label = config.get("id2label")
    if id2label:
        if not isinstance(id2label, Mapping):
            raise ConfigError(f"{source}: id2label must be an object {{\"0\": \"LABEL_0\", ...}}, got {id2label!r}.")
        try:
            return tuple(str(id2label[k]) for k in sorted(id2label, key=int))
        except ValueError:
            raise ConfigError(f"{source}: id2label keys must be class numbers, got {list(id2label)}.") from None
    num_labels = config.get("num_labels", 2)
    if isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 1:
        raise ConfigError(f"{source}: num_labels must be a positive integer, got {num_labels!r}.")
    return tuple(f"LABEL_{i}" for i in range(num_labels))
