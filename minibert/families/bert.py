"""BERT (Devlin et al., 2019): the family every default of Family describes, and Config's default family."""

from minibert.core.family import Family, Heads

BERT = Family("bert", "BERT", "Bert", "bert", pretraining=Heads(pooler=True, mlm=True, nsp=True))
FAMILIES = (BERT,)
