"""Attention analyses: head statistics, word-level attention, dependency heads, head clustering,
rollout and flow, attention norms, gradients and sentence embeddings.

Definitions are docs/definitions.md's (Clark et al. 2019 and successors); each module's docstring states them.

    from minibert import analysis
    stats = analysis.attention_statistics(model, texts)        # {statistic: [L, H]}
    analysis.head_table(stats)                                  # one row per head, with behaviour labels
    result = analysis.dependency_accuracy(model, analysis.read_conllu(analysis.sample_treebank()))
    result.table()                                              # best head per relation vs the offset baseline
"""

from minibert.analysis import (
    clustering,
    compare,
    embeddings,
    flow,
    gradients,
    heads,
    interventions,
    lens,
    mixing,
    norms,
    probes,
    sae,
    syntax,
    words,
)
from minibert.analysis.clustering import js_divergence, mds, stress
from minibert.analysis.compare import Comparison, RelationExample, RelationResult, compare_models, relation_accuracy
from minibert.analysis.embeddings import attention_to_word, pca, sentence_vectors, word_positions
from minibert.analysis.flow import attention_flow, attention_rollout, max_flow, mixing_matrices
from minibert.analysis.gradients import (
    attention_gradients,
    gradient_by_target,
    gradient_times_attention,
    mask_tokens,
    mlm_loss,
    mlm_loss_fn,
    token_targets,
)
from minibert.analysis.heads import (
    BEHAVIOURS,
    STATISTICS,
    attention_statistics,
    behaviour_labels,
    head_statistics,
    head_table,
    model_token_masks,
    token_masks_from_ids,
)
from minibert.analysis.interventions import (
    ablate_heads,
    ablation_sweep,
    attribution_patching,
    block_attention,
    head_importance,
    head_mask,
    mean_z,
    patch_activations,
    scale_attention,
)
from minibert.analysis.lens import logit_contributions, logit_lens
from minibert.analysis.mixing import alti, attention_attribution, value_zeroing
from minibert.analysis.norms import attention_norms
from minibert.analysis.syntax import (
    ConllError,
    DependencyResult,
    Sentence,
    dependency_accuracy,
    read_conllu,
    sample_treebank,
    score_heads,
)
from minibert.analysis.words import word_attention, word_groups, word_labels

__all__ = [
    "BEHAVIOURS",
    "STATISTICS",
    "ConllError",
    "DependencyResult",
    "Sentence",
    "attention_flow",
    "attention_gradients",
    "attention_norms",
    "attention_rollout",
    "attention_statistics",
    "attention_to_word",
    "behaviour_labels",
    "dependency_accuracy",
    "gradient_by_target",
    "gradient_times_attention",
    "head_statistics",
    "head_table",
    "js_divergence",
    "mask_tokens",
    "max_flow",
    "mds",
    "mixing_matrices",
    "mlm_loss",
    "mlm_loss_fn",
    "model_token_masks",
    "pca",
    "read_conllu",
    "sample_treebank",
    "score_heads",
    "sentence_vectors",
    "stress",
    "token_masks_from_ids",
    "token_targets",
    "word_attention",
    "word_groups",
    "word_labels",
    "word_positions",
    "Comparison",
    "RelationExample",
    "RelationResult",
    "alti",
    "attention_attribution",
    "compare_models",
    "logit_contributions",
    "logit_lens",
    "relation_accuracy",
    "value_zeroing",
    "compare",
    "lens",
    "mixing",
    "ablate_heads",
    "ablation_sweep",
    "attribution_patching",
    "block_attention",
    "head_importance",
    "head_mask",
    "mean_z",
    "patch_activations",
    "scale_attention",
    "interventions",
    "clustering",
    "embeddings",
    "flow",
    "gradients",
    "heads",
    "norms",
    "probes",
    "sae",
    "syntax",
    "words",
]
