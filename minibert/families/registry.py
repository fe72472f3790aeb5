"""The registry: model_type → Family, and config.json's class names → the heads on top, for every family module.

    from minibert.families.registry import FAMILIES, ARCHITECTURES
    FAMILIES["roberta"].special_tokens

MODULES is the one table: a new family is its module plus its name there (docs/families.md).
"""

from __future__ import annotations

from minibert.core.config import Config
from minibert.core.family import Family, Heads
from minibert.errors import ConfigError
from minibert.families import albert, bert, deberta_v2, distilbert, electra, modernbert, roberta

# Each module's FAMILIES are registered in this order (the order error messages list them in).
MODULES = (bert, roberta, distilbert, electra, albert, modernbert, deberta_v2)

FAMILIES: dict[str, Family] = {}  # model_type (config.json) → Family
ARCHITECTURES: dict[str, Heads] = {}  # class name of config.json's architectures → the heads on top
ARCHITECTURE_FAMILY: dict[str, str] = {}  # class name → model_type


def register(family: Family) -> None:
    """Add a family and its architectures (<prefix>Model, <prefix>ForMaskedLM, …) to the tables."""
    if family.model_type in FAMILIES:
        raise ConfigError(f"model_type {family.model_type!r} is registered already, by "
                          f"{FAMILIES[family.model_type].name}; give the new family its own model_type.")
    FAMILIES[family.model_type] = family
    for name, heads in family.architectures().items():
        ARCHITECTURES[name] = heads
        ARCHITECTURE_FAMILY[name] = family.model_type


def unregister(model_type: str) -> Family:
    """Remove a family and its architectures (tests register families of their own)."""
    family = FAMILIES.pop(model_type)
    for name in family.architectures():
        del ARCHITECTURES[name], ARCHITECTURE_FAMILY[name]
    return family


def architectures_with(part: str) -> list[str]:
    """The architectures that have a head part ("pooler", "mlm", "nsp", "classifier" or "discriminator")."""
    return [name for name, heads in ARCHITECTURES.items() if getattr(heads, part)]


def config_for(architecture: str, **fields) -> Config:
    """A Config of a registered architecture ("RobertaForMaskedLM"), its family from the registry, the other fields
    as given: how code builds a random model of a family without a config.json."""
    if architecture not in ARCHITECTURE_FAMILY:
        raise ConfigError(f"architecture {architecture!r} is not supported; minibert loads "
                          f"{', '.join(ARCHITECTURES)}.")
    return Config(family=FAMILIES[ARCHITECTURE_FAMILY[architecture]], architecture=architecture, **fields)


for _module in MODULES:
    for _family in _module.FAMILIES:
        register(_family)
