"""DistilBERT (Sanh et al., 2019): BERT's blocks under other names, no segment table, its own config keys."""

from minibert.core.family import Family, HeadKeys, LayerKeys

FAMILIES = (Family(
    "distilbert", "DistilBERT", "DistilBert", "distilbert",
    renames=(("dim", "hidden_size"), ("n_layers", "num_hidden_layers"), ("n_heads", "num_attention_heads"),
             ("hidden_dim", "intermediate_size"), ("activation", "hidden_act")),
    # The position table is stored in the weights whether it was learned or sinusoidal.
    keys=frozenset({"dropout", "attention_dropout", "qa_dropout", "seq_classif_dropout", "sinusoidal_pos_embds",
                    "tie_weights_"}),
    # No segment table: one row, so segment ids other than 0 are refused. Its LayerNorms use BERT's eps.
    fixed=(("type_vocab_size", 1), ("layer_norm_eps", 1e-12), ("position_embedding_type", "absolute")),
    layer_keys=LayerKeys("transformer.layer.{i}", "attention.q_lin", "attention.k_lin", "attention.v_lin",
                         "attention.out_lin", "sa_layer_norm", "ffn.lin1", "ffn.lin2", "output_layer_norm"),
    head_keys=HeadKeys(pooler=None, sequence_pooler="pre_classifier", mlm_dense="vocab_transform",
                       mlm_ln="vocab_layer_norm", mlm_bias="vocab_projector.bias",
                       tied=(("vocab_projector.weight", "embed.word"),)),
    token_types=False, base_pooler=False, pooler_activation="relu"),)
