"""BertConfig: the shape and behaviour of a BERT encoder, with Hugging Face field names.

Built from a checkpoint's `config.json` (`BertConfig.from_hf`) or inferred from the
weights' shapes (`BertConfig.from_params`) when a checkpoint has no config.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping
from minibert.errors import ConfigError

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")


@dataclasses.dataclass(frozen=True)
class Heads:
    """What sits on top of the encoder for one architecture name of config.json."""

    pooler: bool  # tanh(h_[CLS] W + b), pooler_output
    mlm: bool = False  # masked-LM logits over the vocabulary
    nsp: bool = False  # next-sentence logits on the pooled output
    classifier: str | None = None  # "sequence" (on the pooled output) or "token" (on every position)


# The one table of architectures → heads; model.py, checkpoint.py, hooks.py and the analyses read it.
ARCHITECTURES: dict[str, Heads] = {
    "BertModel": Heads(pooler=True),
    "BertForMaskedLM": Heads(pooler=False, mlm=True),
    "BertForPreTraining": Heads(pooler=True, mlm=True, nsp=True),
    "BertForSequenceClassification": Heads(pooler=True, classifier="sequence"),
    "BertForTokenClassification": Heads(pooler=False, classifier="token"),
}


def architectures_with(part: str) -> list[str]:
    """The architectures that have a head part ("pooler", "mlm", "nsp" or "classifier")."""
    return [name for name, heads in ARCHITECTURES.items() if getattr(heads, part)]


def head_label(layer: int, head: int) -> str:
    """The paper's 1-indexed "L-H" label of 0-indexed (layer, head): (0, 3) → "1-4" (Clark et al.)."""
    return f"{layer + 1}-{head + 1}"


# Keys of Hugging Face config.json files that do not change what the encoder computes (training,
# generation and bookkeeping settings). Any other key that BertConfig does not model is refused.
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


@dataclasses.dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    position_embedding_type: str = "absolute"
    architecture: str = "BertModel"
    id2label: tuple[str, ...] = ("LABEL_0", "LABEL_1")
    source: str = "<config>"  # where the config came from, for error messages

    def __post_init__(self):
        where = f"{self.source}: "
        for field in INTEGER_FIELDS:
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if field == "pad_token_id" else 1):
                least = "a non-negative" if field == "pad_token_id" else "a positive"
                raise ConfigError(f"{where}{field} must be {least} integer, got {value!r}. Fix it in config.json.")
        if isinstance(self.layer_norm_eps, bool) or not isinstance(self.layer_norm_eps, (int, float)) \
                or not 0 < self.layer_norm_eps < 1:
            raise ConfigError(f"{where}layer_norm_eps must be a small positive number such as 1e-12, got "
                              f"{self.layer_norm_eps!r}. Fix it in config.json.")
        for field in ("hidden_act", "position_embedding_type", "architecture"):
            if not isinstance(getattr(self, field), str):
                raise ConfigError(f"{where}{field} must be a string, got {getattr(self, field)!r}.")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"{where}hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                f"{self.num_attention_heads}; every head needs the same width. Fix the config's "
                f"hidden_size or num_attention_heads."
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(
                f"{where}hidden_act {self.hidden_act!r} is not supported; minibert runs "
                f"{', '.join(ACTIVATIONS)}."
            )
        if self.position_embedding_type != "absolute":
            raise ConfigError(
                f"{where}position_embedding_type {self.position_embedding_type!r} is not supported; "
                f"minibert implements 'absolute' position embeddings only."
            )
        if self.architecture not in ARCHITECTURES:
            raise ConfigError(
                f"{where}architecture {self.architecture!r} is not supported; minibert loads "
                f"{', '.join(ARCHITECTURES)}."
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_labels(self) -> int:
        return len(self.id2label)

    @property
    def heads(self) -> Heads:
        """What the architecture puts on top of the encoder (the ARCHITECTURES table)."""
        return ARCHITECTURES[self.architecture]

    @classmethod
    def from_hf(cls, config: str | Path | Mapping[str, Any], architecture: str | None = None) -> "BertConfig":
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
        if model_type != "bert":
            raise ConfigError(f"{source}: model_type {model_type!r} is not a BERT encoder (expected 'bert').")
        fields = {f.name for f in dataclasses.fields(cls)} - {"architecture", "id2label", "source"}
        _check_keys(config, fields, source)
        architectures = config.get("architectures") or ["BertModel"]
        if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
            raise ConfigError(f"{source}: architectures must be a list of names such as [\"BertModel\"], "
                              f"got {architectures!r}.")
        values = {k: config[k] for k in fields if k in config}
        if architecture is not None:
            architectures = [architecture]
        return cls(**values, architecture=architectures[0], id2label=_labels(config, source), source=source)

    @classmethod
    def from_params(cls, shapes: Mapping[str, tuple[int, ...]], **overrides) -> "BertConfig":
        """Infer the sizes from Hugging Face weight names and shapes (no config.json needed).

        `shapes` maps checkpoint keys (bare or `bert.`-prefixed) to shapes. The activation,
        layer-norm epsilon and labels cannot be read off shapes: pass them as overrides.
        """
        bare = {k.removeprefix("bert."): v for k, v in shapes.items()}
        try:
            vocab_size, hidden_size = bare["embeddings.word_embeddings.weight"]
            max_positions = bare["embeddings.position_embeddings.weight"][0]
            type_vocab_size = bare["embeddings.token_type_embeddings.weight"][0]
            intermediate_size = bare["encoder.layer.0.intermediate.dense.weight"][0]
        except KeyError as e:
            raise ConfigError(f"cannot infer a BERT config: the weights have no {e.args[0]!r}.") from None
        layers = {int(k.split(".")[2]) for k in bare if k.startswith("encoder.layer.")}
        inferred = dict(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            num_hidden_layers=max(layers, default=-1) + 1,
            intermediate_size=intermediate_size,
            max_position_embeddings=max_positions,
            type_vocab_size=type_vocab_size,
            # Head count is not in any shape; 64-wide heads is the BERT convention.
            num_attention_heads=max(1, hidden_size // 64),
            source="<inferred from weight shapes>",
        )
        return cls(**{**inferred, **overrides})


INTEGER_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                  "max_position_embeddings", "type_vocab_size", "pad_token_id")
MAX_CONFIG_BYTES = 10_000_000  # a config.json is a few kilobytes; refuse to read a device or a huge file


def read_json_object(path: Path, needed_for: str, error: type[Exception]) -> dict:
    """A JSON file holding an object, read with a size limit; `error` names the file and the problem."""
    if not path.exists():
        raise error(f"{path} does not exist; {needed_for}.")
    if not path.is_file():
        raise error(f"{path} is not a regular file; {needed_for}.")
    with open(path, "rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise error(f"{path} is larger than {MAX_CONFIG_BYTES:,} bytes; a JSON settings file is a few kilobytes.")
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"{path} is not valid JSON ({e}).") from None
    if not isinstance(value, dict):
        raise error(f"{path} holds a JSON {type(value).__name__}; it must hold an object {{...}}.")
    return value


def _check_keys(config: Mapping[str, Any], fields: set[str], source: str) -> None:
    """Refuse keys that change the computation but that BertConfig does not model."""
    for key, value in config.items():
        if key in fields or key in HARMLESS_KEYS:
            continue
        if key in HARMLESS_VALUES:
            if value in HARMLESS_VALUES[key]:
                continue
            raise ConfigError(f"{source}: {key} = {value!r} is not supported; minibert implements only "
                              f"{key} = {HARMLESS_VALUES[key][0]!r} (a plain BERT encoder).")
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
