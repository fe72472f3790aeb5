"""Config: the shape and behaviour of a BERT-family encoder, with Hugging Face field names.

Built from a checkpoint's `config.json` (`Config.from_hf`) or inferred from the weights'
shapes (`Config.from_params`) when a BERT checkpoint has no config. `BertConfig` is the same
class under its first name.

Two tables say everything that differs between checkpoints, both kept by minibert/families/: FAMILIES
(model_type → its config keys, key table, tokenizer and forward variations, one module per family) and
ARCHITECTURES (class name of config.json → the heads on top). config re-exports both.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from minibert.deprecation import deprecated_values
from minibert.errors import ConfigError
from minibert.families import ARCHITECTURE_FAMILY, ARCHITECTURES, FAMILIES, Family, Heads  # noqa: F401 (re-exported)

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
# The most applications of a shared block (ALBERT) a config may ask for. The weights hold one block, so they
# cannot confirm num_hidden_layers, and a typo (1200 for 12) would build and compile for a very long time;
# released ALBERT models apply their block 12 (base, xxlarge) or 24 (large, xlarge) times; 4× the most any of
# them uses leaves room for experiments.
MAX_SHARED_LAYERS = 96


# The families (model_type → how the encoder, its keys and its tokenizer differ from BERT's) and the
# architectures (class name of config.json → the heads on top) live in minibert/families/, one module each;
# config, model, checkpoint, hooks and the analyses read these tables.


def architectures_with(part: str) -> list[str]:
    """The architectures that have a head part ("pooler", "mlm", "nsp", "classifier" or "discriminator")."""
    return [name for name, heads in ARCHITECTURES.items() if getattr(heads, part)]


def head_label(layer: int, head: int) -> str:
    """The paper's 1-indexed "L-H" label of 0-indexed (layer, head): (0, 3) → "1-4" (Clark et al.)."""
    return f"{layer + 1}-{head + 1}"


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


@dataclasses.dataclass(frozen=True)
class Config:
    """Sizes and settings of one encoder; the family (FAMILIES) follows from the architecture's class name."""

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
    embedding_size: int | None = None  # ELECTRA, ALBERT: width E of the embeddings (None: hidden_size)
    architecture: str = "BertModel"
    id2label: tuple[str, ...] = ("LABEL_0", "LABEL_1")
    settings: tuple[tuple[str, Any], ...] = ()  # the family's own config.json settings (Family.settings)
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
        if self.family.shared_layers and self.num_hidden_layers > MAX_SHARED_LAYERS:
            raise ConfigError(f"{where}num_hidden_layers {self.num_hidden_layers} is above {MAX_SHARED_LAYERS}, the "
                              f"most applications of {self.family.name}'s one shared block minibert builds (its "
                              f"weights cannot confirm the count; released models use 12 to 24). Fix "
                              f"num_hidden_layers in config.json.")
        if self.embedding_size is not None:
            if isinstance(self.embedding_size, bool) or not isinstance(self.embedding_size, int) \
                    or self.embedding_size < 1:
                raise ConfigError(f"{where}embedding_size must be a positive integer, got {self.embedding_size!r}.")
            if self.family.projection is None and self.embedding_size != self.hidden_size:
                raise ConfigError(f"{where}embedding_size {self.embedding_size} differs from hidden_size "
                                  f"{self.hidden_size}, but {self.family.name} has no embedding projection; "
                                  f"remove embedding_size from config.json.")
        if self.family.position_offset and self.max_tokens < 1:
            raise ConfigError(f"{where}{self.family.name} numbers positions from pad_token_id + 1 = "
                              f"{self.pad_token_id + 1}, which leaves no row of the {self.max_position_embeddings} "
                              f"position embeddings for a token. Fix pad_token_id or max_position_embeddings.")

    @property
    def model_type(self) -> str:
        """config.json's model_type of this architecture's family ("bert", "roberta", …)."""
        return ARCHITECTURE_FAMILY[self.architecture]

    @property
    def family(self) -> Family:
        """How this family lays out the encoder (the FAMILIES table)."""
        return FAMILIES[self.model_type]

    @property
    def embed_dim(self) -> int:
        """E, the width of the embedding tables: embedding_size, else hidden_size."""
        return self.embedding_size or self.hidden_size

    @property
    def has_projection(self) -> bool:
        """Whether a dense layer maps the E-wide embeddings to the D-wide residual stream."""
        projection = self.family.projection
        return projection == "always" or (projection == "when_sizes_differ" and self.embed_dim != self.hidden_size)

    @property
    def first_position(self) -> int:
        """Row of the position table the first token reads: pad_token_id + 1 for RoBERTa, else 0."""
        return self.pad_token_id + 1 if self.family.position_offset else 0

    @property
    def max_tokens(self) -> int:
        """The longest row the position table covers."""
        return self.max_position_embeddings - self.first_position

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

    def setting(self, name: str):
        """One of the family's own settings (Family.settings), as config.json gave it or its default."""
        return (dict(self.family.settings) | dict(self.settings))[name]

    @classmethod
    def from_hf(cls, config: str | Path | Mapping[str, Any], architecture: str | None = None) -> Config:
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
        fields = _family_fields(cls, family)
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
        return cls(**values, architecture=architecture, id2label=_labels(config, source), settings=settings,
                   source=source)

    @classmethod
    def from_params(cls, shapes: Mapping[str, tuple[int, ...]], **overrides) -> Config:
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


BertConfig = Config  # the first name of the class, kept for existing code

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


def _family_fields(cls, family: Family) -> set[str]:
    """The Config fields a family's config.json may set."""
    fields = {f.name for f in dataclasses.fields(cls)} - {"architecture", "id2label", "settings", "source"}
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


_MOVED = {  # names that moved into minibert/families/ (kept one release; README "Moved")
    "FAMILY_VALUES": lambda: {t: dict(f.values) for t, f in FAMILIES.items() if f.values},
    "FIELDS_WITHOUT": lambda: {t: set(dict(f.fixed)) for t, f in FAMILIES.items() if f.fixed},
}


__getattr__ = deprecated_values("minibert.config", _MOVED,
                                "each family's module in minibert/families/ holds it (Family.values, Family.fixed).")
