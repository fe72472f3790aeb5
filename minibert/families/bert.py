"""BERT (Devlin et al., 2019): the family every default of Family describes."""

from minibert.families.base import Family, Heads

FAMILIES = (Family("bert", "BERT", "Bert", "bert", pretraining=Heads(pooler=True, mlm=True, nsp=True)),)
