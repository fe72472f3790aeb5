"""RoBERTa (Liu et al., 2019) and the families that reuse its code and key names: XLM-RoBERTa, CamemBERT.

BERT's encoder with fairseq's position numbering (from pad_token_id + 1), a byte-level BPE (RoBERTa) or
SentencePiece (XLM-R, CamemBERT) tokenizer with <s> </s> tokens, and its own head key names.
"""

from minibert.core.family import Family, HeadKeys

HEAD_KEYS = HeadKeys(
    sequence_pooler="classifier.dense", classifier="classifier.out_proj", mlm_dense="lm_head.dense",
    mlm_ln="lm_head.layer_norm", mlm_bias="lm_head.bias",
    tied=(("lm_head.decoder.weight", "embed.word"), ("lm_head.decoder.bias", "mlm.decoder_bias")))
SPECIAL_TOKENS = (("cls_token", "<s>"), ("sep_token", "</s>"), ("pad_token", "<pad>"), ("unk_token", "<unk>"),
                  ("mask_token", "<mask>"))


def roberta_like(model_type: str, name: str, prefix: str, tokenizer: str) -> Family:
    return Family(model_type, name, prefix, "roberta", head_keys=HEAD_KEYS, tokenizer=tokenizer,
                  special_tokens=SPECIAL_TOKENS, position_offset=True, mlm_activation="gelu")


FAMILIES = (
    roberta_like("roberta", "RoBERTa", "Roberta", "bpe"),
    roberta_like("xlm-roberta", "XLM-RoBERTa", "XLMRoberta", "unigram"),
    roberta_like("camembert", "CamemBERT", "Camembert", "unigram"),
)
