"""BERT (Devlin et al., 2019): the family every default of Family describes, and Config's default family (its
record lives beside Family's, in core/family.py, since Config defaults to it)."""

from minibert.core.family import BERT

FAMILIES = (BERT,)
