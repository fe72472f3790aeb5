"""What changed, in one record: the weight change by head, CKA by stream, the crosscoder's latent table and the
top fine-tune-only latents with their top examples — what viz.figures.what_changed draws on one sheet.

    found = what_changed(base, tuned, texts, trainer.config, trainer.params)
    figures.what_changed(found, path="what_changed.png")

A latent's activation reads both models at once (f = σ(Σ_M W_enc[M] x_M + b_enc)); an example shows, beside it,
what each model's own activation contributes to the pre-activation: x_A W_enc[A]_i and x_B W_enc[B]_i. A
fine-tune-only latent that B's side drives and A's side does not is one the fine-tune added.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from minibert.analysis.diffing.crosscoder import CrosscoderConfig, checked_pairs, encode
from minibert.analysis.diffing.diffs import WeightChange, representation_similarity, weight_change
from minibert.analysis.diffing.latents import LatentTable, latent_table
from minibert.analysis.diffing.pairs import model_name, paired_token_activations
from minibert.errors import AnalysisError


@dataclasses.dataclass(frozen=True)
class Example:
    """One token where a latent fires: its text, position, the token and its context, the latent's activation, and
    each model's contribution to its pre-activation (A, B)."""

    text: int
    position: int
    token: str
    context: str
    activation: float
    contributions: tuple[float, float]


@dataclasses.dataclass(frozen=True)
class DiffReport:
    """names (A, B); weights (WeightChange); cka [L + 1]; latents (LatentTable); examples {latent: [Example]}
    for the top fine-tune-only latents, most frequent first; hook_name: the crosscoder's site."""

    names: tuple[str, str]
    weights: WeightChange
    cka: np.ndarray
    latents: LatentTable
    examples: dict[int, list[Example]]
    hook_name: str


def top_examples(config: CrosscoderConfig, params, x, where, latents, k: int = 5) -> dict[int, list[Example]]:
    """{latent: its k strongest tokens} of paired activations x [N, 2, d] (where: paired_token_activations')."""
    x = checked_pairs(x, config.d_in, "x")
    if len(where) != len(x):
        raise AnalysisError(f"where names {len(where)} tokens but x holds {len(x)}; pass both from one "
                            f"paired_token_activations call.")
    params = {name: jnp.asarray(value) for name, value in params.items()}
    activations = np.asarray(encode(config, params, jnp.asarray(x)))
    found = {}
    for latent in map(int, latents):
        contributions = np.einsum("NMD,MD->NM", x, np.asarray(params["W_enc"][:, :, latent]))
        order = np.argsort(-activations[:, latent], kind="stable")[:k]
        found[latent] = [Example(*where[n], float(activations[n, latent]),
                                 (float(contributions[n, 0]), float(contributions[n, 1])))
                         for n in order if activations[n, latent] > 0]
    return found


def what_changed(model_a, model_b, texts, config: CrosscoderConfig, params, *, hook_name: str | None = None,
                 top: int = 4, examples: int = 5, max_length: int | None = None) -> DiffReport:
    """Everything the "what changed" sheet shows, on `texts` (held-out text: the latent table and examples are
    computed on it)."""
    hook_name = hook_name or config.hook_name
    if hook_name is None:
        raise AnalysisError("the crosscoder's config names no hook_name; pass hook_name=.")
    x, where = paired_token_activations(model_a, model_b, texts, hook_name, max_length)
    table = latent_table(config, params, x)
    chosen = table.of("B-only")[:top]
    return DiffReport((model_name(model_a), model_name(model_b)), weight_change(model_a, model_b),
                      representation_similarity(model_a, model_b, texts, max_length=max_length), table,
                      top_examples(config, params, x, where, chosen, examples), hook_name)
