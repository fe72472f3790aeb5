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

from minibert.analysis._finite import check_finite_params
from minibert.analysis.diffing.crosscoder import CrosscoderConfig, checked_pairs, contributions, encode
from minibert.analysis.diffing.diffs import WeightChange, representation_similarity, weight_change
from minibert.analysis.diffing.latents import LatentTable, latent_table
from minibert.analysis.diffing.pairs import check_pair, model_name, pair_names, pair_source, paired_token_activations
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
    parts = np.asarray(contributions(params, jnp.asarray(x)))  # [N, 2, S]
    found = {}
    for latent in map(int, latents):
        order = np.argsort(-activations[:, latent], kind="stable")[:k]
        found[latent] = [Example(*where[n], float(activations[n, latent]),
                                 (float(parts[n, 0, latent]), float(parts[n, 1, latent])))
                         for n in order if activations[n, latent] > 0]
    return found


def checked_site(model_a, model_b, config: CrosscoderConfig, hook_name: str | None = None,
                 source: dict | None = None) -> str:
    """The site a crosscoder reads in these two models, or an AnalysisError: a hook_name= that is not the config's,
    a site that is not the models' or not d_in wide, a config or a trainer record (`source`: CrosscoderTrainer's
    .source, the stream it trained on) that names another site or other models."""
    site = hook_name or config.hook_name
    if site is None:
        raise AnalysisError("the crosscoder's config names no hook_name; pass hook_name=.")
    if config.hook_name is not None and site != config.hook_name:
        raise AnalysisError(f"hook_name={site!r} but the crosscoder's config reads {config.hook_name!r}; its "
                            f"latents mean nothing at another site: drop hook_name=, or use a crosscoder trained "
                            f"there.")
    if source is not None and source.get("hook_name") != site:
        raise AnalysisError(f"the crosscoder's config reads {site!r} but it was trained on {source.get('hook_name')!r} "
                            f"(its trainer's source): the config was edited; use the config saved with the "
                            f"crosscoder (CrosscoderTrainer.resume(path).config).")
    width = check_pair(model_a, model_b, site)
    if width != config.d_in:
        raise AnalysisError(f"{site!r} gives {width}-wide vectors in these models but the crosscoder reads "
                            f"d_in={config.d_in}; pass the models and site it was trained on.")
    names = model_name(model_a), model_name(model_b)
    if config.model_names is not None and names != config.model_names:
        swapped = " (swapped: pass A first)" if names[::-1] == config.model_names else ""
        raise AnalysisError(f"the crosscoder is between {config.model_names} but these models are {names}"
                            f"{swapped}; pass the two models it was trained on, A (the base) first.")
    if source is not None and source.get("weights") is not None:
        weights = pair_source(model_a, model_b, site)["weights"]
        if list(weights) != list(source["weights"]):
            swapped = (" — the same two models, swapped: pass A (the base) first"
                       if list(weights[::-1]) == list(source["weights"]) else "")
            raise AnalysisError(f"the crosscoder was trained on models with weights {list(source['weights'])} and "
                                f"these have {weights}{swapped}; pass the two models it was trained on.")
    return site


def what_changed(model_a, model_b, texts, config: CrosscoderConfig, params, *, hook_name: str | None = None,
                 source: dict | None = None, names: tuple[str, str] | None = None, top: int = 4,
                 examples: int = 5, max_length: int | None = None) -> DiffReport:
    """Everything the "what changed" sheet shows, on `texts` (held-out text: the latent table and examples are
    computed on it). source: the trainer's record of what it trained on (CrosscoderTrainer.source, kept by save
    and resume), checked against the config's site and the models' weights; names: how the sheet names A and B
    (pair_names: by default where they were loaded from, told apart where that is the same place)."""
    hook_name = checked_site(model_a, model_b, config, hook_name, source)
    check_finite_params(params, "what_changed: the crosscoder")
    names = pair_names(model_a, model_b, names)
    x, where = paired_token_activations(model_a, model_b, texts, hook_name, max_length)
    table = latent_table(config, params, x)
    chosen = table.of("B-only")[:top]
    return DiffReport(names, weight_change(model_a, model_b),
                      representation_similarity(model_a, model_b, texts, max_length=max_length), table,
                      top_examples(config, params, x, where, chosen, examples), hook_name)
