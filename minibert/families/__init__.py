"""The families minibert loads: one module each, registered in one table.

A family module (bert.py, roberta.py, …) holds everything about its model_type in one `Family`
(families/base.py): its config.json keys, its checkpoint key table, its tokenizer kind and special tokens,
and the forward variations it selects, with its own block or embedding code where BERT's do not compute
them. MODULES below is the one table: adding a family is its module plus its name there
(docs/families.md says how, step by step).

    from minibert.families import FAMILIES, ARCHITECTURES
    FAMILIES["roberta"].special_tokens        # config, checkpoint, model, tokenizers and sources read this
"""

from __future__ import annotations

import importlib

from minibert.errors import ConfigError
from minibert.families.base import VARIATIONS, Family, Heads
from minibert.families.keys import HeadKeys, LayerKeys

# The registry: each module's FAMILIES are loaded, in this order (the order error messages list them in).
MODULES = ("bert", "roberta", "distilbert", "electra", "albert", "modernbert", "deberta_v2")

FAMILIES: dict[str, Family] = {}  # model_type (config.json) → Family
ARCHITECTURES: dict[str, Heads] = {}  # class name of config.json's architectures → the heads on top
ARCHITECTURE_FAMILY: dict[str, str] = {}  # class name → model_type


def register(family: Family) -> None:
    """Add a family and its architectures (<prefix>Model, <prefix>ForMaskedLM, …) to the tables."""
    if family.model_type in FAMILIES:
        raise ConfigError(f"model_type {family.model_type!r} is registered already, by "
                          f"{FAMILIES[family.model_type].name}; give the new family its own model_type.")
    FAMILIES[family.model_type] = family
    for name, heads in architectures(family).items():
        ARCHITECTURES[name] = heads
        ARCHITECTURE_FAMILY[name] = family.model_type


def unregister(model_type: str) -> Family:
    """Remove a family and its architectures (tests register families of their own)."""
    family = FAMILIES.pop(model_type)
    for name in architectures(family):
        del ARCHITECTURES[name], ARCHITECTURE_FAMILY[name]
    return family


def architectures(family: Family) -> dict[str, Heads]:
    """A family's class names → heads. Sequence classifiers of families without a pooler put a dense layer and
    the family's activation on token 0: minibert calls that layer the pooler."""
    suffixes = {
        "Model": Heads(pooler=family.base_pooler),
        "ForMaskedLM": Heads(pooler=False, mlm=True),
        "ForPreTraining": family.pretraining,
        "ForSequenceClassification": Heads(pooler=True, classifier="sequence"),
        "ForTokenClassification": Heads(pooler=False, classifier="token"),
    }
    return {family.prefix + suffix: heads for suffix, heads in suffixes.items() if heads is not None}


for _module in MODULES:
    for _family in importlib.import_module(f"minibert.families.{_module}").FAMILIES:
        register(_family)

__all__ = ["ARCHITECTURES", "ARCHITECTURE_FAMILY", "FAMILIES", "MODULES", "VARIATIONS", "Family", "HeadKeys", "Heads",
           "LayerKeys", "architectures", "register", "unregister"]
