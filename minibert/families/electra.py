"""ELECTRA (Clark et al., 2020): BERT's blocks; embeddings projected up when narrower; a discriminator head."""

from minibert.core.family import Family, HeadKeys, Heads

FAMILIES = (Family(
    "electra", "ELECTRA", "Electra", "electra",
    keys=frozenset({"summary_type", "summary_use_proj", "summary_activation", "summary_last_dropout"}),
    head_keys=HeadKeys(pooler=None, sequence_pooler="classifier.dense", classifier="classifier.out_proj",
                       projection="embeddings_project", mlm_dense="generator_predictions.dense",
                       mlm_ln="generator_predictions.LayerNorm", mlm_bias="generator_lm_head.bias",
                       tied=(("generator_lm_head.weight", "embed.word"),)),
    projection="when_sizes_differ", base_pooler=False, pooler_activation="gelu", mlm_activation="gelu",
    pretraining=Heads(pooler=False, discriminator=True)),)
