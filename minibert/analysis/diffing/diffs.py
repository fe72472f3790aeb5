"""Diffs beside the dictionary: how two models of one shape and tokenizer (A the base, B its fine-tune) differ in
their weights, their representations, their heads' behaviour and their outputs.

- weight_change: ‖W^B − W^A‖_F / ‖W^A‖_F per matrix and layer, and per head for W_Q, W_K, W_V (each head's
  [D, K] slice) and W_O (its [K, D] slice); read by role (model.weights, TransformerLens' model.W_Q …), so every
  family of one shape is compared the same way, fused or not.
- representation_similarity: linear CKA (Kornblith et al. 2019) per stream — the embedding output, then each
  block's output — over the real tokens of a corpus:  CKA(X, Y) = ‖Yᵀ X‖²_F / (‖Xᵀ X‖_F ‖Yᵀ Y‖_F), X and Y
  centred over tokens.
- attention_change: Clark et al.'s head statistics of both models side by side, and compare_models' per-head
  similarity and JS divergence of the patterns.
- output_change: per-token KL(P_A ‖ P_B) of the heads' distributions (masked-LM: every real position's
  vocabulary distribution; sequence classifier: each text's class distribution; token classifier: each token's).
- difference_lens: each stream's mean difference δ_l = mean_t(h^B_{l,t} − h^A_{l,t}) read through B's masked-LM
  head: log softmax(head(μ^A_l + δ_l)) − log softmax(head(μ^A_l)), μ^A_l A's mean stream — which tokens the
  fine-tune's shift promotes, layer by layer (the head is not linear, so the difference is read at A's mean).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from minibert.analysis import compare, heads
from minibert.analysis.diffing.pairs import check_pair, row_length
from minibert.analysis.gradients import require_mlm_head
from minibert.analysis.lens import _streams
from minibert.analysis.sae.source import text_batch
from minibert.errors import AnalysisError

HEAD_MATRICES = {"W_Q": (2, 3), "W_K": (2, 3), "W_V": (2, 3), "W_O": (2, 3)}  # [L, H, ·, ·]: a head's slice axes
# per_matrix's names → the role of model.weights each reads; "mlp.W_in" is TransformerLens' W_in, a gated MLP's two
# halves together.
LAYER_WEIGHTS = {"attn.W_Q": "q", "attn.W_K": "k", "attn.W_V": "v", "attn.W_O": "o", "mlp.W_in": "W_in",
                 "mlp.W_out": "w_out", "ln1.scale": "ln1_scale", "ln1.bias": "ln1_bias", "ln2.scale": "ln2_scale",
                 "ln2.bias": "ln2_bias"}


def _check_shapes(model_a, model_b) -> None:
    check_pair(model_a, model_b)
    ca, cb = model_a.config, model_b.config
    shape_a, shape_b = (ca.num_hidden_layers, ca.num_attention_heads), (cb.num_hidden_layers, cb.num_attention_heads)
    if shape_a != shape_b:
        raise AnalysisError(f"the models have {shape_a[0]} layers × {shape_a[1]} heads, and {shape_b[0]} × "
                            f"{shape_b[1]}; these diffs go layer by layer and head by head: pass two models of one "
                            f"shape.")


def _relative(a, b, axes) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.sqrt(np.sum((b - a) ** 2, axis=axes) / np.sum(a**2, axis=axes))


def _layer_weight(model, name: str):
    """The [L, ...] weight per_matrix calls `name`, by role; None where the family's blocks have none."""
    role = LAYER_WEIGHTS[name]
    return model.W_in if role == "W_in" else model.weights.read(role)


@dataclasses.dataclass(frozen=True)
class WeightChange:
    """per_matrix {name: [L]} (the relative Frobenius change of each block's matrix, names as layer_weights takes
    them; only those both models have), per_head {"W_Q", "W_K", "W_V", "W_O": [L, H]}."""

    per_matrix: dict[str, np.ndarray]
    per_head: dict[str, np.ndarray]


def weight_change(model_a, model_b) -> WeightChange:
    """‖W^B − W^A‖_F / ‖W^A‖_F of every block matrix (and LayerNorm gain and bias) per layer, and per head."""
    _check_shapes(model_a, model_b)
    per_head = {name: _relative(getattr(model_a, name), getattr(model_b, name), axes) for name, axes in
                HEAD_MATRICES.items()}
    per_matrix = {}
    for name in LAYER_WEIGHTS:
        a, b = _layer_weight(model_a, name), _layer_weight(model_b, name)
        if a is not None and b is not None:
            per_matrix[name] = _relative(a, b, tuple(range(1, np.ndim(a))))
    return WeightChange(per_matrix, per_head)


@jax.jit
def _linear_cka(x, y):
    """[L] linear CKA of x, y [L, N, D] over the N tokens (float32 sums of centred products)."""
    x, y = x - x.mean(1, keepdims=True), y - y.mean(1, keepdims=True)
    frobenius = lambda a, b: jnp.sum(jnp.einsum("LND,LNE->LDE", a, b) ** 2, (1, 2))
    return frobenius(y, x) / jnp.sqrt(frobenius(x, x) * frobenius(y, y))


def _real_streams(model, batch) -> jax.Array:
    """[L + 1, N, D]: the embedding output, then each block's output, at the batch's real tokens."""
    keep = np.nonzero(np.asarray(batch.attention_mask) > 0)
    return _streams(model, batch)[:, keep[0], keep[1]]


def representation_similarity(model_a, model_b, texts, *, pairs=None, max_length: int | None = None) -> np.ndarray:
    """[L + 1] linear CKA of the two models' streams (the embedding output, then each block's output) over the
    real tokens of `texts` (as sae.text_rows reads them), padded in one batch."""
    _check_shapes(model_a, model_b)
    batch = text_batch(model_a, texts, pairs, row_length(model_a, model_b, max_length), cut=True)
    if int(np.sum(batch.attention_mask)) < 2:
        raise AnalysisError("CKA needs at least two tokens to centre; pass more text.")
    return np.asarray(_linear_cka(_real_streams(model_a, batch), _real_streams(model_b, batch)))


@dataclasses.dataclass(frozen=True)
class AttentionChange:
    """statistics_a, statistics_b: Clark et al.'s head statistics {name: [L, H]} of each model; similarity and
    js_divergence [L, H]: compare_models' (the mean cosine of the two heads' maps, and their rows' JS divergence)."""

    statistics_a: dict[str, np.ndarray]
    statistics_b: dict[str, np.ndarray]
    similarity: np.ndarray
    js_divergence: np.ndarray


def attention_change(model_a, model_b, texts, *, pairs=None, batch_size: int = 16) -> AttentionChange:
    """How each head's attention changed on `texts` (a list; `pairs` its second texts)."""
    _check_shapes(model_a, model_b)
    found = compare.compare_models(model_a, model_b, texts, pairs, batch_size=batch_size)
    statistics = [heads.attention_statistics(model, list(texts), pairs) for model in (model_a, model_b)]
    return AttentionChange(*statistics, found.similarity, found.js_divergence)


def _head_kind(model) -> str:
    found = model.config.heads
    if found.mlm:
        return "mlm"
    if found.classifier is None:
        raise AnalysisError(f"output_change compares the heads' distributions; {model.source} is a "
                            f"{model.config.architecture} without a masked-LM or classifier head. Use "
                            f"representation_similarity for models without a head.")
    return found.classifier


@jax.jit
def _kl(logits_a, logits_b):
    log_a, log_b = jax.nn.log_softmax(logits_a, -1), jax.nn.log_softmax(logits_b, -1)
    return jnp.sum(jnp.exp(log_a) * (log_a - log_b), -1)


def output_change(model_a, model_b, texts, *, pairs=None, max_length: int | None = None) -> tuple[np.ndarray, list]:
    """(KL(P_A ‖ P_B) in nats, where): per real token [N] for masked-LM and token-classifier heads (where[n] =
    (text index, position, token)), per text [B] for sequence classifiers (where[b] = b). Texts run as given
    (put [MASK] in them to compare the predictions at a mask)."""
    _check_shapes(model_a, model_b)
    kinds = _head_kind(model_a), _head_kind(model_b)
    if kinds[0] != kinds[1]:
        raise AnalysisError(f"the models' heads differ ({kinds[0]} and {kinds[1]}); their distributions cannot be "
                            f"compared. Pass two models with the same kind of head.")
    batch = text_batch(model_a, texts, pairs, row_length(model_a, model_b, max_length), cut=True)
    logits = [jnp.asarray(model(batch).logits, jnp.float32) for model in (model_a, model_b)]
    if logits[0].shape != logits[1].shape:
        raise AnalysisError(f"the heads give {logits[0].shape[-1]} and {logits[1].shape[-1]} outputs; compare models "
                            f"with the same classes.")
    kl = np.asarray(_kl(*logits))
    if kinds[0] == "sequence":
        return kl, list(range(len(kl)))
    keep = np.nonzero(np.asarray(batch.attention_mask) > 0)
    return kl[keep], [(int(b), int(t), batch.tokens[b][t]) for b, t in zip(*keep, strict=True)]


def difference_lens(model_a, model_b, texts, *, top_k: int = 10, pairs=None, max_length: int | None = None):
    """(shift [L + 1, V], ids [L + 1, top_k], tokens): each stream's mean difference B − A read through B's
    masked-LM head at A's mean stream (see the module's docstring); ids: the tokens it promotes most, per stream;
    tokens: their strings."""
    _check_shapes(model_a, model_b)
    require_mlm_head(model_b, "the activation-difference lens")
    batch = text_batch(model_a, texts, pairs, row_length(model_a, model_b, max_length), cut=True)
    mean_a = _real_streams(model_a, batch).mean(1)  # [L + 1, D]
    delta = _real_streams(model_b, batch).mean(1) - mean_a
    read = lambda hidden: jax.nn.log_softmax(model_b.head(model_b.state, hidden[:, None]).logits[:, 0], -1)
    shift = np.asarray(read(mean_a + delta) - read(mean_a))
    ids = np.argsort(-shift, axis=-1, kind="stable")[:, :top_k]
    return shift, ids, [model_b.tokenizer.convert_ids_to_tokens(row) for row in ids]
