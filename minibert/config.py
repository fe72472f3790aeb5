"""Config: the shape and behaviour of a BERT-family encoder, with Hugging Face field names.

Built from a checkpoint's `config.json` (`Config.from_hf`) or inferred from the weights'
shapes (`Config.from_params`) when a BERT checkpoint has no config. `BertConfig` is the same
class under its first name.

Two tables say everything that differs between checkpoints: FAMILIES (model_type → how the
encoder is laid out: positions, segments, embedding projection, shared layers, activations,
special tokens) and ARCHITECTURES (class name of config.json → the heads on top).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from minibert.errors import ConfigError

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
# The most applications of a shared block (ALBERT) a config may ask for. The weights hold one block, so they
# cannot confirm num_hidden_layers, and a typo (1200 for 12) would build and compile for a very long time;
# released ALBERT models apply their block 12 (base, xxlarge) or 24 (large, xlarge) times; 4× the most any of
# them uses leaves room for experiments.
MAX_SHARED_LAYERS = 96


@dataclasses.dataclass(frozen=True)
class Heads:
    """What sits on top of the encoder for one architecture name of config.json."""

    pooler: bool  # tanh(h_[CLS] W + b), pooler_output
    mlm: bool = False  # masked-LM logits over the vocabulary
    nsp: bool = False  # next-sentence logits on the pooled output
    classifier: str | None = None  # "sequence" (on the pooled output) or "token" (on every position)
    discriminator: bool = False  # ELECTRA's replaced-token detector: one logit per position


@dataclasses.dataclass(frozen=True)
class Family:
    """How one model_type lays out a post-LN BERT encoder. Every family computes, per block,
    LayerNorm(x + Attention(x)) then LayerNorm(· + MLP(·)); they differ only in what this says."""

    name: str  # how people write it, for repr and messages
    prefix: str  # class-name prefix in config.json's architectures ("Roberta" → "RobertaForMaskedLM")
    key_prefix: str  # the encoder's key prefix in head checkpoints ("roberta.encoder.layer.0...")
    layer_keys: str  # which per-layer key names checkpoint.py reads: "bert", "distilbert" or "albert"
    # RoBERTa (fairseq) numbers positions from pad_token_id + 1 and gives padding the pad row.
    position_offset: bool = False
    token_types: bool = True  # has a segment-embedding table (DistilBERT has none)
    # Embeddings narrower than the blocks, projected up to hidden_size: never, "when_sizes_differ"
    # (ELECTRA builds the projection only then) or "always" (ALBERT).
    projection: str | None = None
    shared_layers: bool = False  # ALBERT: one block's weights applied num_hidden_layers times
    base_pooler: bool = True  # whether the bare <prefix>Model has a pooler
    pooler_activation: str = "tanh"  # of the pooler, or of the dense layer a sequence classifier puts on token 0
    mlm_activation: str | None = None  # of the masked-LM transform; None: the config's hidden_act
    pretraining: Heads | None = None  # what <prefix>ForPreTraining puts on top, if the family has one
    renames: tuple[tuple[str, str], ...] = ()  # config.json key → the Hugging Face name Config uses
    keys: frozenset = frozenset()  # the family's own config.json keys that change nothing minibert computes
    special_tokens: tuple[tuple[str, str], ...] = (("cls_token", "[CLS]"), ("sep_token", "[SEP]"),
                                                   ("pad_token", "[PAD]"), ("unk_token", "[UNK]"),
                                                   ("mask_token", "[MASK]"))


_ROBERTA_TOKENS = (("cls_token", "<s>"), ("sep_token", "</s>"), ("pad_token", "<pad>"), ("unk_token", "<unk>"),
                   ("mask_token", "<mask>"))


def _roberta_like(name: str, prefix: str) -> Family:
    """RoBERTa and the families that reuse its code and key names (XLM-R, CamemBERT)."""
    return Family(name, prefix, "roberta", "bert", position_offset=True, mlm_activation="gelu",
                  special_tokens=_ROBERTA_TOKENS)


# The one table of families: model_type (config.json) → layout. config, model, checkpoint, tokenizer read it.
FAMILIES: dict[str, Family] = {
    "bert": Family("BERT", "Bert", "bert", "bert", pretraining=Heads(pooler=True, mlm=True, nsp=True)),
    "roberta": _roberta_like("RoBERTa", "Roberta"),
    "xlm-roberta": _roberta_like("XLM-RoBERTa", "XLMRoberta"),
    "camembert": _roberta_like("CamemBERT", "Camembert"),
    "distilbert": Family(
        "DistilBERT", "DistilBert", "distilbert", "distilbert", token_types=False, base_pooler=False,
        pooler_activation="relu",
        renames=(("dim", "hidden_size"), ("n_layers", "num_hidden_layers"), ("n_heads", "num_attention_heads"),
                 ("hidden_dim", "intermediate_size"), ("activation", "hidden_act")),
        # The position table is stored in the weights whether it was learned or sinusoidal.
        keys=frozenset({"dropout", "attention_dropout", "qa_dropout", "seq_classif_dropout", "sinusoidal_pos_embds",
                        "tie_weights_"})),
    "electra": Family(
        "ELECTRA", "Electra", "electra", "bert", projection="when_sizes_differ", base_pooler=False,
        pooler_activation="gelu", mlm_activation="gelu", pretraining=Heads(pooler=False, discriminator=True),
        keys=frozenset({"summary_type", "summary_use_proj", "summary_activation", "summary_last_dropout"})),
    "albert": Family(
        "ALBERT", "Albert", "albert", "albert", projection="always", shared_layers=True,
        keys=frozenset({"classifier_dropout_prob"}),
        special_tokens=(("cls_token", "[CLS]"), ("sep_token", "[SEP]"), ("pad_token", "<pad>"),
                        ("unk_token", "<unk>"), ("mask_token", "[MASK]"))),
}
# Config keys a family may set only to these values. ALBERT: one group of one layer, shared by every block;
# the original ALBERT code's other structure keys, which released config.json files carry at these values.
FAMILY_VALUES = {"albert": {"num_hidden_groups": (1,), "inner_group_num": (1,), "down_scale_factor": (1,),
                            "gap_size": (0,), "net_structure_type": (0,), "num_memory_blocks": (0,)}}
FIELDS_WITHOUT = {  # Config fields a family's config.json does not have (their defaults stand)
    "distilbert": {"type_vocab_size", "layer_norm_eps", "position_embedding_type"},
}


def _architectures() -> tuple[dict[str, Heads], dict[str, str]]:
    """Every family's class names → heads, and → model_type. Sequence classifiers of families without a
    pooler put a dense layer and the family's activation on token 0: minibert calls that layer the pooler."""
    heads, family_of = {}, {}
    for model_type, family in FAMILIES.items():
        suffixes = {
            "Model": Heads(pooler=family.base_pooler),
            "ForMaskedLM": Heads(pooler=False, mlm=True),
            "ForPreTraining": family.pretraining,
            "ForSequenceClassification": Heads(pooler=True, classifier="sequence"),
            "ForTokenClassification": Heads(pooler=False, classifier="token"),
        }
        for suffix, head in suffixes.items():
            if head is None:  # the family has no such class
                continue
            heads[family.prefix + suffix] = head
            family_of[family.prefix + suffix] = model_type
    return heads, family_of


# The one table of architectures → heads; model.py, checkpoint.py, hooks.py and the analyses read it.
ARCHITECTURES, ARCHITECTURE_FAMILY = _architectures()


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
        if model_type not in FAMILIES:
            raise ConfigError(f"{source}: model_type {model_type!r} is not a family minibert loads; it loads "
                              f"{', '.join(map(repr, FAMILIES))}.")
        family = FAMILIES[model_type]
        config = _renamed(config, family, source)
        fields = _family_fields(cls, model_type)
        _check_keys(config, fields, source, family.keys, FAMILY_VALUES.get(model_type, {}))
        architectures = config.get("architectures") or [family.prefix + "Model"]
        if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
            raise ConfigError(f"{source}: architectures must be a list of names such as [\"{family.prefix}Model\"], "
                              f"got {architectures!r}.")
        architecture = architectures[0] if architecture is None else architecture
        if ARCHITECTURE_FAMILY.get(architecture, model_type) != model_type:
            raise ConfigError(f"{source}: architecture {architecture!r} belongs to model_type "
                              f"{ARCHITECTURE_FAMILY[architecture]!r}, but config.json says {model_type!r}; use "
                              f"{family.prefix}Model or another {family.prefix}… class.")
        values = {k: config[k] for k in fields if k in config}
        if not family.token_types:
            values["type_vocab_size"] = 1  # no segment table: segment ids other than 0 are refused
        return cls(**values, architecture=architecture, id2label=_labels(config, source), source=source)

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


def _family_fields(cls, model_type: str) -> set[str]:
    """The Config fields a family's config.json may set."""
    fields = {f.name for f in dataclasses.fields(cls)} - {"architecture", "id2label", "source"}
    if FAMILIES[model_type].projection is None:
        fields.discard("embedding_size")
    return fields - FIELDS_WITHOUT.get(model_type, set())


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
