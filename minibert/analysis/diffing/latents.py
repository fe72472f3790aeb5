"""What each crosscoder latent is in each model: decoder norms, their relative norm and cosine, latent scaling
(Minder et al. 2025) and a label — shared, A-only (base-only), B-only (fine-tune-only) or dead.

For latent i with decoder rows d_i^A, d_i^B (axes as in crosscoder.py):
    r_i      = ‖d_i^B‖ / (‖d_i^A‖ + ‖d_i^B‖)          ≈ 0.5 shared, → 0 A-only, → 1 B-only (Lindsey et al.)
    cosine_i = ⟨d_i^A, d_i^B⟩ / (‖d_i^A‖ ‖d_i^B‖)
Latent scaling: d_i = the decoder row of the model where the latent is larger (B where r_i ≥ 0.5, else A), the
"owner"; for each model M the least-squares β_i^M = argmin_β Σ_n ‖y_{n,M} − β f_{n,i} d_i‖² over a corpus,
    β_i^M = Σ_n f_{n,i} ⟨y_{n,M}, d_i⟩ / (‖d_i‖² Σ_n f_{n,i}²),
with two targets y (Minder et al.'s two variants):
    "error":          y = x_M − x̂_M + f_i d_i^M   (M's activation less every other latent's reconstruction)
    "reconstruction": y = x̂_M − b_dec[M]          (what the other latents and this one reconstruct in M)
ν_i = β_i^other / β_i^owner for each variant. A latent the other model truly lacks has both ν small; an L1
artefact — a shared direction whose decoder in the other model shrank to 0 ("complete shrinkage"), or which
other latents reconstruct there ("latent decoupling") — keeps ν^error or ν^reconstruction large. Our rule (the
paper reads the ν distributions, it gives no single cut): exclusive to the owner when both ν < `exclusive_below`
(0.3 by default), else shared.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from minibert.analysis._finite import check_finite_params
from minibert.analysis.diffing.crosscoder import CrosscoderConfig, checked_pairs, decode, decoder_norms, encode
from minibert.errors import AnalysisError

LABELS = ("shared", "A-only", "B-only", "dead")
VARIANTS = ("error", "reconstruction")


@dataclasses.dataclass(frozen=True)
class LatentTable:
    """Per latent [S]: norms [2, S] (‖d_i^A‖, ‖d_i^B‖), relative_norm, cosine, frequency (fraction of tokens it
    fires on), beta {variant: [2, S]} (β_i^A, β_i^B against the owner's direction), nu {variant: [S]}, owner [S]
    (0 = A, 1 = B), labels [S] (LABELS); exclusive_below: the ν cut the labels used."""

    norms: np.ndarray
    relative_norm: np.ndarray
    cosine: np.ndarray
    frequency: np.ndarray
    beta: dict[str, np.ndarray]
    nu: dict[str, np.ndarray]
    owner: np.ndarray
    labels: np.ndarray
    exclusive_below: float

    def count(self) -> dict[str, int]:
        return {label: int(np.sum(self.labels == label)) for label in LABELS}

    def of(self, label: str) -> np.ndarray:
        """The indices of the latents labelled `label`, the most frequent first."""
        if label not in LABELS:
            raise AnalysisError(f"label={label!r}: pick one of {LABELS}.")
        chosen = np.flatnonzero(self.labels == label)
        return chosen[np.argsort(-self.frequency[chosen], kind="stable")]


def _chunk_sums(config, params, x):
    """Per chunk x [N, 2, D]: latents fired [S], Σ f² [S], Σ_n f ⟨x_M − x̂_M, d_i⟩ and Σ_n f ⟨x̂_M − b_dec[M], d_i⟩
    [2, S] (d_i the owner's decoder row)."""
    latents = encode(config, params, x)
    reconstruction = decode(params, latents)
    owner = (decoder_norms(params)[1] >= decoder_norms(params)[0]).astype(jnp.int32)  # [S]
    d = jnp.where(owner[:, None] == 1, params["W_dec"][1], params["W_dec"][0])  # [S, D]
    error_dot = jnp.einsum("NMD,SD->NMS", x - reconstruction, d)
    recon_dot = jnp.einsum("NMD,SD->NMS", reconstruction - params["b_dec"], d)
    return {"fired": jnp.sum(latents > 0, 0), "f2": jnp.sum(latents**2, 0),
            "error": jnp.einsum("NS,NMS->MS", latents, error_dot),
            "reconstruction": jnp.einsum("NS,NMS->MS", latents, recon_dot)}


_compiled_sums = jax.jit(_chunk_sums, static_argnums=0)


def latent_table(config: CrosscoderConfig, params, x, *, exclusive_below: float = 0.3,
                 chunk_tokens: int = 8192) -> LatentTable:
    """The LatentTable of a crosscoder on paired activations x [N, 2, d_in] (paired_token_activations, or
    batches of paired_activations concatenated), summed `chunk_tokens` tokens at a time."""
    if isinstance(exclusive_below, bool) or not isinstance(exclusive_below, int | float) or \
            not 0 < exclusive_below < 1:
        raise AnalysisError(f"exclusive_below={exclusive_below!r} must lie in (0, 1): the largest ν = β_other / "
                            f"β_owner of a latent the other model lacks.")
    x = checked_pairs(x, config.d_in, "x")
    check_finite_params(params, "latent_table: the crosscoder")
    params = {name: jnp.asarray(value) for name, value in params.items()}
    total = None
    for start in range(0, len(x), chunk_tokens):
        part = _compiled_sums(config, params, jnp.asarray(x[start:start + chunk_tokens]))
        total = part if total is None else jax.tree_util.tree_map(jnp.add, total, part)
    total = {name: np.asarray(value, np.float64) for name, value in total.items()}
    W_dec = np.asarray(params["W_dec"], np.float64)
    norms = np.linalg.norm(W_dec, axis=-1)
    owner = (norms[1] >= norms[0]).astype(int)
    d = np.where(owner[:, None] == 1, W_dec[1], W_dec[0])
    own_dot = np.einsum("MSD,SD->MS", W_dec, d)  # ⟨d_i^M, d_i⟩: the error target adds f_i d_i^M back
    denominator = np.sum(d**2, -1) * total["f2"]
    with np.errstate(divide="ignore", invalid="ignore"):
        beta = {"error": (total["error"] + total["f2"] * own_dot) / denominator,
                "reconstruction": total["reconstruction"] / denominator}
        nu = {name: b[1 - owner, np.arange(len(owner))] / b[owner, np.arange(len(owner))] for name, b in beta.items()}
        relative = norms[1] / (norms[0] + norms[1])
        cosine = np.sum(W_dec[0] * W_dec[1], -1) / (norms[0] * norms[1])
    exclusive = (nu["error"] < exclusive_below) & (nu["reconstruction"] < exclusive_below)
    labels = np.where(exclusive, np.where(owner == 1, "B-only", "A-only"), "shared").astype(object)
    labels[total["fired"] == 0] = "dead"
    return LatentTable(norms, relative, cosine, total["fired"] / len(x), beta, nu, owner,
                       np.asarray(labels, dtype=str), float(exclusive_below))


def norm_labels(relative_norm, exclusive_within: float = 0.1) -> np.ndarray:
    """The labels the relative decoder norm alone gives (Lindsey et al.'s reading, which latent scaling corrects):
    "A-only" where r < exclusive_within, "B-only" where r > 1 − exclusive_within, else "shared"."""
    r = np.asarray(relative_norm)
    return np.where(r < exclusive_within, "A-only", np.where(r > 1 - exclusive_within, "B-only", "shared"))
