"""The families minibert loads: one module each, registered in one table.

A family module (bert.py, roberta.py, …) holds everything about its model_type in one `Family`
(families/base.py): its config.json keys, its checkpoint key table, its tokenizer kind and special tokens,
and the forward variations it selects, with its own block or embedding code where BERT's do not compute
them. registry.py is the one table (FAMILIES, ARCHITECTURES): adding a family is its module plus its name there
(docs/families.md says how, step by step); reading.py reads a checkpoint's config.json into a Config of its family.

    from minibert.families.registry import FAMILIES, ARCHITECTURES
    FAMILIES["roberta"].special_tokens        # checkpoint, model, tokenizers and sources read this

This package's own namespace holds only the records a family is written with, so that config.py (which carries
a Family) can import them without the registry, whose family modules stand on model.py.
"""

from minibert.core.family import VARIATIONS, Family, HeadKeys, Heads, LayerKeys

__all__ = ["VARIATIONS", "Family", "HeadKeys", "Heads", "LayerKeys"]
