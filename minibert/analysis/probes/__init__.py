"""Probes: small models trained on a frozen encoder's activations, every layer at once (docs/probes.md).

Linear probes (Alain & Bengio 2016; Hewitt & Liang 2019) are multinomial logistic regressions, one per layer,
on the activations of one hook site ("hook_normalized_resid_post", "mlp.hook_post", "attn.hook_z" flattened over
heads, …). Token-level probes label words: a word's feature is its first wordpiece's activation or the
mean of its wordpieces' ("first" | "mean", as word-level attention pools rows). Sentence-level probes
label texts: the [CLS] position or the mean over real tokens. token_features gives every token of texts or
pairs as the model tokenizes them, for labels computed from the tokenization ("the token is in sentence B").
Labels come as lists, or from TSV files (read_word_labels, read_text_labels); trees from CoNLL-U.

Every layer's probe trains in one compiled program (`jax.vmap` over layers on accelerators, `lax.map` on CPU,
where batched matmuls are slow) on the objective

    mean_i CE(x_i W + b, y_i) + (l2 / 2)·‖W‖²            (b is not penalised)

which is scikit-learn's LogisticRegression with C = 1 / (l2 · n_train). The solver is full-batch L-BFGS
(optax), so the probe reaches the convex optimum; with a dev split it stops early, keeping the parameters
of the step with the lowest dev cross-entropy once `patience` steps bring no improvement.

Control tasks (Hewitt & Liang 2019): each word type gets a random label drawn from the task's label
distribution; a probe that scores well on the control task memorises types rather than reading the
property. Selectivity = task accuracy − control accuracy, per layer.

    result = token_probe(model, words, labels, pool="first", control=True)   # site: each block's output
    result.accuracy, result.interval, result.selectivity    # [L], [L, 2] (bootstrap 95%), [L]
    result.l2, result.sweep                                  # the l2 chosen by dev selectivity, and the sweep
    result.test, result.gold, result.predicted               # test item indices, gold classes, [L, n] predictions

The default site is each block's output (layer_output_site): in post-LN BERT that is hook_normalized_resid_post,
the LayerNorm'd layer output the probing papers read — hook_resid_post there is the sum before that LayerNorm.

Modules: features (activations and labels), linear (logistic-regression probes, control tasks), structural
(Hewitt & Manning), clark (Clark et al.'s attention-based parser probe); every name is importable from here.
"""

from __future__ import annotations

from minibert.analysis.probes.clark import (
    CLARK_PROBES,
    DISTANCE_FEATURES,
    ParseData,
    clark_logits,
    clark_probe,
    distance_features,
    fit_clark_probe,
    init_clark_probe,
    parse_data,
    unlabelled_attachment,
)
from minibert.analysis.probes.features import (
    SENTENCE_POOLS,
    WORD_POOLS,
    Features,
    control_labels,
    encode_labels,
    layer_output_site,
    read_text_labels,
    read_word_labels,
    sentence_features,
    split_sentences,
    token_features,
    word_features,
)
from minibert.analysis.probes.linear import (
    DEFAULT_L2,
    L2_GRID,
    SPLITS,
    ProbeResult,
    bootstrap_accuracy,
    fit_linear_probes,
    predict,
    probe,
    sentence_probe,
    token_probe,
    vectorised_layers,
)
from minibert.analysis.probes.structural import (
    PUNCTUATION,
    SPEARMAN_LENGTHS,
    STRUCTURAL_KINDS,
    StructuralResult,
    Trees,
    evaluate_structural,
    fit_structural_probes,
    mean_spearman,
    read_conllu,
    root_accuracy,
    spanning_tree_edges,
    spearman,
    structural_loss,
    structural_probe,
    tree_data,
    tree_depths,
    tree_distances,
    uuas,
)

__all__ = [
    "DEFAULT_L2",
    "L2_GRID",
    "SPLITS",
    "layer_output_site",
    "CLARK_PROBES",
    "DISTANCE_FEATURES",
    "Features",
    "PUNCTUATION",
    "ParseData",
    "ProbeResult",
    "SENTENCE_POOLS",
    "SPEARMAN_LENGTHS",
    "STRUCTURAL_KINDS",
    "StructuralResult",
    "Trees",
    "WORD_POOLS",
    "bootstrap_accuracy",
    "clark_logits",
    "clark_probe",
    "control_labels",
    "distance_features",
    "encode_labels",
    "evaluate_structural",
    "fit_clark_probe",
    "fit_linear_probes",
    "fit_structural_probes",
    "init_clark_probe",
    "mean_spearman",
    "parse_data",
    "predict",
    "probe",
    "read_conllu",
    "read_text_labels",
    "read_word_labels",
    "root_accuracy",
    "sentence_features",
    "sentence_probe",
    "spanning_tree_edges",
    "spearman",
    "split_sentences",
    "structural_loss",
    "structural_probe",
    "token_features",
    "token_probe",
    "tree_data",
    "tree_depths",
    "tree_distances",
    "unlabelled_attachment",
    "uuas",
    "vectorised_layers",
    "word_features",
]
