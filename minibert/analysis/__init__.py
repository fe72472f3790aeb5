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
    circuits,
    clustering,
    compare,
    diffing,
    embeddings,
    flow,
    gradients,
    graphs,
    heads,
    interventions,
    lens,
    mixing,
    norms,
    probes,
    sae,
    sweeps,
    syntax,
    transcoders,
    words,
)
from minibert.analysis.circuits import (
    Circuit,
    CircuitGraph,
    DirectAttribution,
    Faithfulness,
    TokenAttribution,
    circuit_faithfulness,
    direct_attribution,
    edge_attribution,
    path_patching,
    token_attribution,
)
from minibert.analysis.clustering import js_divergence, mds, stress
from minibert.analysis.compare import Comparison, RelationExample, RelationResult, compare_models, relation_accuracy
from minibert.analysis.embeddings import pca, sentence_vectors
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
    paired_inputs,
    patch_activations,
    scale_attention,
)
from minibert.analysis.lens import logit_contributions, logit_lens
from minibert.analysis.mixing import alti, attention_attribution, value_zeroing
from minibert.analysis.norms import attention_norms
from minibert.analysis.sweeps import residual_streams, sweep
from minibert.analysis.syntax import (
    ConllError,
    DependencyResult,
    Sentence,
    dependency_accuracy,
    read_conllu,
    sample_treebank,
    score_heads,
)
from minibert.analysis.words import attention_to_word, word_attention, word_groups, word_labels, word_positions

__all__ = [  # by topic, one name per line
    # modules
    "circuits",
    "clustering",
    "compare",
    "diffing",
    "embeddings",
    "flow",
    "gradients",
    "graphs",
    "heads",
    "interventions",
    "lens",
    "mixing",
    "norms",
    "probes",
    "sae",
    "sweeps",
    "syntax",
    "transcoders",
    "words",
    # head statistics (Clark et al. 2019)
    "STATISTICS",
    "BEHAVIOURS",
    "attention_statistics",
    "head_statistics",
    "head_table",
    "behaviour_labels",
    "model_token_masks",
    "token_masks_from_ids",
    # word-level attention
    "word_groups",
    "word_labels",
    "word_attention",
    "word_positions",
    "attention_to_word",
    # dependency heads
    "Sentence",
    "ConllError",
    "DependencyResult",
    "read_conllu",
    "sample_treebank",
    "score_heads",
    "dependency_accuracy",
    # comparing models
    "Comparison",
    "RelationExample",
    "RelationResult",
    "compare_models",
    "relation_accuracy",
    # head clustering
    "js_divergence",
    "mds",
    "stress",
    # rollout and flow
    "mixing_matrices",
    "attention_rollout",
    "attention_flow",
    "max_flow",
    # context mixing
    "attention_norms",
    "value_zeroing",
    "alti",
    "attention_attribution",
    # circuits (issue 30)
    "token_attribution",
    "TokenAttribution",
    "direct_attribution",
    "DirectAttribution",
    "edge_attribution",
    "CircuitGraph",
    "Circuit",
    "circuit_faithfulness",
    "Faithfulness",
    "path_patching",
    # gradients
    "attention_gradients",
    "gradient_times_attention",
    "gradient_by_target",
    "token_targets",
    "mask_tokens",
    "mlm_loss",
    "mlm_loss_fn",
    # interventions
    "ablate_heads",
    "head_mask",
    "mean_z",
    "scale_attention",
    "block_attention",
    "ablation_sweep",
    "patch_activations",
    "paired_inputs",
    "attribution_patching",
    "head_importance",
    # the sweep engine: an intervention of your own, as ablation and patching run
    "sweep",
    "residual_streams",
    # logit lens
    "logit_lens",
    "logit_contributions",
    # sentence vectors
    "sentence_vectors",
    "pca",
]
