"""Model diffing (docs/diffing.md): what fine-tuning changed, between two models of one width and tokenizer.

    from minibert.analysis import diffing
    stream = diffing.paired_activations(base, tuned, texts, "blocks.3.hook_resid_post")   # [N, 2, D] batches
    trainer = diffing.CrosscoderTrainer(diffing.CrosscoderConfig(d_in=384, d_sae=4096, k=32,
                                                                 hook_name="blocks.3.hook_resid_post"))
    trainer.train(stream, steps=2000, progress=True)
    x, where = diffing.paired_token_activations(base, tuned, held_out, "blocks.3.hook_resid_post")
    table = diffing.latent_table(trainer.config, trainer.params, x)     # norms, r, cosine, latent scaling, labels
    diffing.weight_change(base, tuned)                                  # relative Frobenius change per matrix/head
    diffing.representation_similarity(base, tuned, texts)               # linear CKA per layer
    diffing.output_change(base, tuned, texts)                           # KL of the heads' distributions per token
    figures.what_changed(diffing.what_changed(base, tuned, held_out, trainer.config, trainer.params), path="d.png")
"""

from minibert.analysis.diffing.crosscoder import (
    ARCHITECTURES,
    CrosscoderConfig,
    contributions,
    decode,
    decoder_norms,
    encode,
    init_params,
)
from minibert.analysis.diffing.diffs import (
    AttentionChange,
    WeightChange,
    attention_change,
    difference_lens,
    output_change,
    representation_similarity,
    weight_change,
)
from minibert.analysis.diffing.latents import LABELS, LatentTable, latent_table, norm_labels
from minibert.analysis.diffing.pairs import check_pair, pair_names, paired_activations, paired_token_activations
from minibert.analysis.diffing.report import DiffReport, Example, checked_site, top_examples, what_changed
from minibert.analysis.diffing.training import CrosscoderTrainer

__all__ = [
    "ARCHITECTURES",
    "AttentionChange",
    "CrosscoderConfig",
    "CrosscoderTrainer",
    "DiffReport",
    "Example",
    "LABELS",
    "LatentTable",
    "WeightChange",
    "attention_change",
    "check_pair",
    "checked_site",
    "contributions",
    "decode",
    "decoder_norms",
    "difference_lens",
    "encode",
    "init_params",
    "latent_table",
    "norm_labels",
    "output_change",
    "pair_names",
    "paired_activations",
    "paired_token_activations",
    "representation_similarity",
    "top_examples",
    "weight_change",
    "what_changed",
]
