"""Numerical tolerances of the tests, each derived from the computation it bounds.

u is the unit roundoff: 2^-24 in float32, 2^-53 in float64, 2^-8 in bfloat16 (8 significant bits). Three bounds:

- A sum of n non-negative terms (softmax rows, head statistics) rounded in any order is within
  (n − 1)·u of the exact sum, relative (Higham 2002, §4.2): a strict bound.
- A dot product of length n with terms of both signs: the strict bound n·u·Σ|x_i y_i| is far too
  pessimistic for n in the hundreds, so we use the probabilistic bound of Higham & Mary (2019,
  "A new approach to probabilistic rounding error analysis", Thm 2.4): |error| ≤ λ·√n·u·Σ|x_i y_i|
  with probability at least 1 − 2n·exp(−λ²/2). λ = 7 makes that failure probability ≤ 5e-11·n per
  value, so ≤ 1e-4 over the ~10^5 values a test compares at n ≤ 2048. We take Σ|x_i y_i| to be the
  scale (max |value|) of the tensor the product feeds, and measure errors against that scale.
- A forward pass: one post-LN block chains the reductions q, k, v (D), q·k (K), pattern·v (S), W_O
  (D), LN1 (D), W_in (D), W_out (F), LN2 (D), and the embedding LN is one more stage. To first order
  the error of an output is a sum of every rounding made on the way, each times its sensitivity; the
  block's closing LayerNorm renormalises the residual stream, so we take each rounding to move the
  output by at most u times its scale (gain 1 from stage to stage). The roundings are independent and
  of mean zero — the model of Higham & Mary's theorem, applied to the whole chain rather than to one
  dot product — so their sum is within λ·√N·u of the scale, N the number of roundings (one per term
  of each reduction, over every stage). Two implementations compared are two such sums: N doubles.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

U32 = 2.0**-24
U64 = 2.0**-53
U_BF16 = 2.0**-8
LAMBDA = 7.0


def sum_rtol(n: int, u: float = U32) -> float:
    """Relative error of a sum of n non-negative terms."""
    return max(n - 1, 1) * u


def dot_rtol(n: int, u: float = U32) -> float:
    """Error of a length-n dot product relative to the scale of its result (probabilistic, λ = 7)."""
    return LAMBDA * math.sqrt(n) * u


def block_roundings(D: int, F: int, K: int, S: int) -> int:
    """Roundings one encoder block makes on the way to one output value (one per term of each reduction)."""
    return sum((D, D, K, S, D, D, D, F, D))


def block_rtol(D: int, F: int, K: int, S: int, u: float = U32) -> float:
    """One encoder block's rounding error relative to the residual stream's scale."""
    return LAMBDA * math.sqrt(block_roundings(D, F, K, S)) * u


def forward_rtol(config, S: int, programs: int = 2, u: float = U32) -> float:
    """Error of a whole forward (embedding LN + every block) relative to the hidden states' scale, for
    `programs` independent implementations compared (2: minibert vs transformers; 1: vs float64)."""
    D, F, K = config.hidden_size, config.intermediate_size, config.head_dim
    stages = config.num_hidden_layers + 1
    return LAMBDA * math.sqrt(programs * stages * block_roundings(D, F, K, S)) * u


def head_rtol(config, S: int, programs: int = 2, u: float = U32) -> float:
    """forward_rtol with a head's stage added (pooler and classifier, or the masked-LM transform, LayerNorm and
    unembedding: one block's worth of reductions or fewer), relative to the scale of the logits."""
    head = dataclasses.replace(config, num_hidden_layers=config.num_hidden_layers + 1)
    return forward_rtol(head, S, programs, u)


def assert_close_to_scale(ours, theirs, rtol: float, what: str = "", where=None) -> None:
    """max |ours − theirs| ≤ rtol · max |theirs| over the positions `where` selects (default: all)."""
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape} vs {theirs.shape}"
    if where is not None:
        ours, theirs = ours[where], theirs[where]
        if not ours.size:
            return
    scale = np.abs(theirs).max()
    err = np.abs(ours - theirs).max()
    assert err <= rtol * scale, f"{what}: max difference {err:.2e} > {rtol:.1e} × scale {scale:.2e}"


def score_delta(model, texts, pairs=None, row_length: int = 128, zero_segments: bool = False) -> float:
    """How far two programs' attention scores on these texts can differ: forward_rtol × max|score| (real keys)."""
    batch = model.tokenize(texts, pairs)
    fields = batch.to_dict()
    if zero_segments:
        fields["token_type_ids"] = np.zeros_like(fields["token_type_ids"])
    _, cache = model.run_with_cache(fields, names="blocks.*.attn.hook_attn_scores")
    scores = np.asarray(cache.stack("hook_attn_scores"))
    real = np.broadcast_to((np.asarray(batch.attention_mask) > 0)[None, :, None, None, :], scores.shape)
    return forward_rtol(model.config, S=row_length) * float(np.abs(scores[real]).max())


def survey_statistic_tolerances(model, texts, pairs=None, row_length: int = 128,
                                zero_segments: bool = False) -> tuple[float, float]:
    """(rtol, entropy atol) for head statistics of two programs on the same texts (corpus.survey's packed
    rows of `row_length` against attention_statistics' padded batch, or two device layouts).

    The programs' scores differ by δs (score_delta). Softmax moves each weight by ≤ 2·a·δs, so a statistic
    that sums weights moves by ≤ 2δs × its value, and an entropy by ≤ 2δs·Σ a(|ln p| + 1) ≤ 2δs·(H + 1)
    (−Σ a ln p is H up to the 1e-4 smoothing); the statistics' own fp32 sums add (2·row_length + 8)·u
    (see test_analysis_heads.statistic_rtol).
    """
    delta = score_delta(model, texts, pairs, row_length, zero_segments)
    return 2 * delta + (2 * row_length + 8) * U32, 2 * delta


def survey_js_atol(model, texts, pairs=None, row_length: int = 128) -> float:
    """Absolute bound for Jensen–Shannon sums of two programs on the same texts.

    ∂JS_row/∂p_j = ½ ln(p_j/m_j), |ln(p/m)| ≤ c = |ln(0.002/S)| (smoothed p ≥ 0.001/S, p/m < 2), and each
    smoothed weight moves by ≤ 2.002·p·δs (as in survey_statistic_tolerances): a row of a head pair moves
    by ≤ ½c·(2.002δs + 2.002δs). Summed over every real query row; the fp32 sums add (S + rows)·u·c per row.
    """
    rows = float(np.asarray(model.tokenize(texts, pairs).attention_mask).sum())
    c = abs(math.log(0.002 / row_length))
    return rows * c * (2.002 * score_delta(model, texts, pairs, row_length) + (row_length + rows) * U32)
