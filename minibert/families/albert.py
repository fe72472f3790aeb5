"""ALBERT (Lan et al., 2020): one block's weights applied in every layer; narrow embeddings projected up."""

from minibert.core.family import Family, HeadKeys, LayerKeys

FAMILIES = (Family(
    "albert", "ALBERT", "Albert", "albert",
    keys=frozenset({"classifier_dropout_prob"}),
    # One group of one layer, shared by every block: the original ALBERT code's other structure keys, which
    # released config.json files carry at these values.
    values=(("num_hidden_groups", (1,)), ("inner_group_num", (1,)), ("down_scale_factor", (1,)), ("gap_size", (0,)),
            ("net_structure_type", (0,)), ("num_memory_blocks", (0,))),
    layer_keys=LayerKeys("encoder.albert_layer_groups.0.albert_layers.0", "attention.query", "attention.key",
                         "attention.value", "attention.dense", "attention.LayerNorm", "ffn", "ffn_output",
                         "full_layer_layer_norm"),
    head_keys=HeadKeys(pooler="pooler", sequence_pooler="pooler", projection="encoder.embedding_hidden_mapping_in",
                       mlm_dense="predictions.dense", mlm_ln="predictions.LayerNorm", mlm_bias="predictions.bias",
                       tied=(("predictions.decoder.weight", "embed.word"),
                             ("predictions.decoder.bias", "mlm.decoder_bias"))),
    tokenizer="unigram",
    special_tokens=(("cls_token", "[CLS]"), ("sep_token", "[SEP]"), ("pad_token", "<pad>"), ("unk_token", "<unk>"),
                    ("mask_token", "[MASK]")),
    projection="always", shared_layers=True),)
