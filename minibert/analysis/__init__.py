"""Attention analyses: head statistics, word-level attention, rollout and flow, norms, gradients,
clustering and sentence embeddings (definitions in docs, after Clark et al. 2019 and successors)."""
