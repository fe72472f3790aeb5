"""Config: the shape and behaviour of a BERT-family encoder, with Hugging Face field names.

A plain frozen record: its family (a minibert.families Family, BERT's by default) and its architecture (a class
name of that family, "<prefix>Model" by default) are fields like the sizes. A checkpoint's config.json is read
into one by minibert.io.config_json.read_config, which sets the family from model_type; `Config.from_params`
infers a BERT config from the weights' shapes when a checkpoint has none. `BertConfig` is the same class under its
first name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from minibert.core.family import BERT, Family, Heads
from minibert.errors import ConfigError

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
# The most applications of a shared block (ALBERT) a config may ask for. The weights hold one block, so they
# cannot confirm num_hidden_layers, and a typo (1200 for 12) would build and compile for a very long time;
# released ALBERT models apply their block 12 (base, xxlarge) or 24 (large, xlarge) times; 4× the most any of
# them uses leaves room for experiments.
MAX_SHARED_LAYERS = 96


def head_label(layer: int, head: int, layers: int | None = None, heads: int | None = None) -> str:
    """The paper's 1-indexed "L-H" label of 0-indexed (layer, head): (0, 3) → "1-4" (Clark et al.). Both must be
    whole numbers ≥ 0, below `layers` and `heads` where given (Config.head_label gives the model's): a flat
    index from argmax over [L, H] is refused — np.unravel_index (or divmod by H) gives (layer, head)."""
    for name, value, limit in (("layer", layer, layers), ("head", head, heads)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0 or \
                (limit is not None and value >= limit):
            bound = "" if limit is None else f" and < {limit}"
            raise ConfigError(f"head_label: {name} must be a whole number ≥ 0{bound} (0-indexed), got {value!r}; "
                              f"for a flat index over [L, H] use divmod(index, H).")
    return f"{layer + 1}-{head + 1}"


class Labels(tuple):
    """The class names in class order (Config.id2label): the tuple minibert has always given — labels[c],
    len, iteration over the names, equality with a tuple, a hash — that also answers as transformers' id2label
    dict does: .items() (class id, name), .keys(), .values(), .get(c). Iteration and `in` are the tuple's (the
    names), not the dict's (the ids)."""

    __slots__ = ()

    def items(self) -> list[tuple[int, str]]:
        return list(enumerate(self))

    def keys(self) -> range:
        return range(len(self))

    def values(self) -> tuple[str, ...]:
        return tuple(self)

    def get(self, c, default=None):
        whole = isinstance(c, (int, np.integer)) and not isinstance(c, bool)
        return self[c] if whole and 0 <= c < len(self) else default


@dataclasses.dataclass(frozen=True)
class Config:
    """Sizes and settings of one encoder of one family (BERT's unless `family` says otherwise)."""

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
    family: Family = BERT  # how this model_type differs from BERT (minibert.families.registry.FAMILIES)
    architecture: str | None = None  # a class name of the family's (Family.architectures); None: "<prefix>Model"
    id2label: tuple[str, ...] = ("LABEL_0", "LABEL_1")  # Labels; a {class id: name} dict is taken in class order
    settings: tuple[tuple[str, Any], ...] = ()  # the family's own config.json settings (Family.settings)
    source: str = "<config>"  # where the config came from, for error messages

    def __post_init__(self):
        where = f"{self.source}: "
        if not isinstance(self.family, Family):
            raise ConfigError(f"{where}family must be a Family (minibert.families.registry.FAMILIES[model_type]), "
                              f"got {self.family!r}.")
        if self.architecture is None:  # frozen: the default is filled in once, here
            object.__setattr__(self, "architecture", self.family.prefix + "Model")
        labels = self.id2label
        if isinstance(labels, Mapping):  # transformers' {class id: name}
            ids = sorted(labels, key=lambda c: (not isinstance(c, int), c))
            if ids != list(range(len(ids))):
                raise ConfigError(f"{where}id2label's class ids must be 0 … {len(ids) - 1}, got {ids}; number the "
                                  f"classes from 0.")
            labels = [labels[c] for c in ids]
        object.__setattr__(self, "id2label", Labels(labels))
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
        if self.architecture not in self.family.architectures():
            raise ConfigError(f"{where}architecture {self.architecture!r} is not a {self.family.name} class; "
                              f"{self.family.name} has {', '.join(self.family.architectures())}. Another family's "
                              f"architecture needs its family: minibert.families.registry.config_for(architecture, "
                              f"...) sets it.")
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
        """config.json's model_type of this family ("bert", "roberta", …)."""
        return self.family.model_type

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
        """What the architecture puts on top of the encoder (Family.architectures): it follows from the two fields,
        so it is not a third that could disagree with them."""
        return self.family.architectures()[self.architecture]

    def head_label(self, layer: int, head: int) -> str:
        """head_label checked against this model's layers and heads: (0, 3) → "1-4"."""
        return head_label(layer, head, self.num_hidden_layers, self.num_attention_heads)

    def setting(self, name: str):
        """One of the family's own settings (Family.settings), as config.json gave it or its default."""
        return (dict(self.family.settings) | dict(self.settings))[name]

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
