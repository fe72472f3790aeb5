"""BertConfig: the shape and behaviour of a BERT encoder, with Hugging Face field names.

Built from a checkpoint's `config.json` (`BertConfig.from_hf`) or inferred from the
weights' shapes (`BertConfig.from_params`) when a checkpoint has no config.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
HEAD_ARCHITECTURES = (
    "BertModel",
    "BertForMaskedLM",
    "BertForPreTraining",
    "BertForSequenceClassification",
    "BertForTokenClassification",
)


class ConfigError(ValueError):
    """A config.json (or a set of weights) that describes no encoder minibert can run."""


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
        if self.architecture not in HEAD_ARCHITECTURES:
            raise ConfigError(
                f"{where}architecture {self.architecture!r} is not supported; minibert loads "
                f"{', '.join(HEAD_ARCHITECTURES)}."
            )
        for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                      "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            if getattr(self, field) < 1:
                raise ConfigError(f"{where}{field} must be a positive integer, got {getattr(self, field)}.")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_labels(self) -> int:
        return len(self.id2label)

    @property
    def has_pooler(self) -> bool:
        """Hugging Face builds the pooler for these architectures only."""
        return self.architecture in ("BertModel", "BertForPreTraining", "BertForSequenceClassification")

    @classmethod
    def from_hf(cls, config: str | Path | Mapping[str, Any]) -> "BertConfig":
        """From a Hugging Face `config.json` (path, directory containing it, or parsed dict)."""
        source = "<dict>"
        if not isinstance(config, Mapping):
            path = Path(config)
            if path.is_dir():
                path = path / "config.json"
            source = str(path)
            try:
                config = json.loads(path.read_text())
            except FileNotFoundError:
                raise ConfigError(f"{path} does not exist; a checkpoint directory needs a config.json.") from None
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path} is not valid JSON ({e}).") from None
        model_type = config.get("model_type", "bert")
        if model_type != "bert":
            raise ConfigError(f"{source}: model_type {model_type!r} is not a BERT encoder (expected 'bert').")
        architectures = config.get("architectures") or ["BertModel"]
        fields = {f.name for f in dataclasses.fields(cls)} - {"architecture", "id2label", "source"}
        values = {k: config[k] for k in fields if k in config}
        return cls(**values, architecture=architectures[0], id2label=_labels(config), source=source)

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
            num_hidden_layers=max(layers) + 1,
            intermediate_size=intermediate_size,
            max_position_embeddings=max_positions,
            type_vocab_size=type_vocab_size,
            # Head count is not in any shape; 64-wide heads is the BERT convention.
            num_attention_heads=max(1, hidden_size // 64),
            source="<inferred from weight shapes>",
        )
        return cls(**{**inferred, **overrides})


def _labels(config: Mapping[str, Any]) -> tuple[str, ...]:
    id2label = config.get("id2label")
    if id2label:
        return tuple(str(id2label[k]) for k in sorted(id2label, key=int))
    return tuple(f"LABEL_{i}" for i in range(config.get("num_labels", 2)))
