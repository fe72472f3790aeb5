"""The workbench's "what changed" panel (issue 39): for the text as typed, the crosscoder latents (docs/diffing.md)
whose activations differ most between the main model A and --compare's model B, computed only when the page asks
(`changed`), after the run's tokens and views.

    minibert serve --model A --compare B --crosscoder run.npz     # run.npz: a CrosscoderTrainer.save checkpoint

A crosscoder latent has one activation f per token, read from both models at once; what each model's own vector
gives it is its share of the pre-activation, c^M_{t,i} = (x^M_t − b_dec^M) · W_enc^M_i (the "what changed" sheet's
reading: pre = c^A + c^B + b_enc). The panel lists the TOP_LATENTS latents, among those that fire on the text,
with the largest max_t |c^B − c^A| over the tokens where they fire, each with its per-token f, c^A and c^B, its
relative decoder norm r and cosine, and its class: the norm reading (diffing.norm_labels) always, and the latent
scaling label (diffing.latent_table) of the text's own tokens — a quick estimate from one text, not a corpus's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from minibert.analysis import diffing
from minibert.analysis._finite import check_finite_params
from minibert.errors import AnalysisError, DataFileError, InputError
from minibert.runtime.buckets import cut as cut_to_length
from minibert.viz._panel import Panel

TOP_LATENTS = 8  # latents listed, by the largest gap between the two models' shares

HINT = ("Start the workbench with two models and a crosscoder trained on them (docs/diffing.md: "
        "diffing.CrosscoderTrainer, then trainer.save(\"run.npz\")): minibert serve --model A --compare B "
        "--crosscoder run.npz.")


class LoadedCrosscoder:
    """A crosscoder checked against the two models at start-up: its config, params and the site it reads."""

    def __init__(self, model_a, model_b, config, params, source: dict | None = None):
        if config.hook_name is None:
            raise InputError("the crosscoder's config names no site (hook_name): train it on a paired stream "
                             "(diffing.paired_activations), which records it.")
        if config.hook_name not in model_a.hook_names:
            raise InputError(f"the crosscoder reads {config.hook_name!r}, which model A does not have; pass one "
                             f"trained on these models.")
        try:
            width = diffing.check_pair(model_a, model_b, config.hook_name)
        except AnalysisError as error:
            raise InputError(f"--compare: {error}") from None
        if width != config.d_in:
            raise InputError(f"the crosscoder reads {config.d_in}-wide vectors at {config.hook_name!r}, where these "
                             f"models have {width}; pass one trained on these models.")
        try:  # the library's own check (what_changed's): the config's and the trainer's record of the pair
            diffing.checked_site(model_a, model_b, config, source=source)
        except AnalysisError as error:
            raise InputError(f"--model/--compare: {error}") from None
        try:
            check_finite_params(params, "--crosscoder")
        except AnalysisError as error:
            raise InputError(str(error)) from None
        self.model_b, self.config = model_b, config
        self.params = {name: jnp.asarray(value) for name, value in params.items()}


def load_crosscoder(model_a, model_b, path) -> LoadedCrosscoder:
    """--crosscoder's file (a CrosscoderTrainer.save checkpoint), checked against A and B (--model, --compare)."""
    if model_b is None:
        raise InputError("--crosscoder needs --compare: the crosscoder reads two models, --model (A) and --compare "
                         "(B).")
    path = Path(path)
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.npz"))
        raise InputError(f"--crosscoder {path} is a folder; pass the .npz file CrosscoderTrainer.save wrote, e.g. "
                         f"{path / (inside[0] if inside else 'run.npz')}"
                         f"{f' (this folder holds {len(inside)}: ' + ', '.join(inside[:5]) + ')' if inside else ''}.")
    if not path.is_file():
        raise InputError(f"--crosscoder {path}: no such file; pass the .npz a CrosscoderTrainer.save wrote.")
    try:
        trainer = diffing.CrosscoderTrainer.resume(path)
    except (AnalysisError, DataFileError) as error:
        raise InputError(f"--crosscoder {path}: {error}") from None
    return LoadedCrosscoder(model_a, model_b, trainer.config, trainer.params, trainer.source)


def paired(workbench, loaded: LoadedCrosscoder, request) -> np.ndarray:
    """x [T, 2, D]: the site's vectors of the text in A (this workbench's model) then B, one program per bucket."""
    padded = workbench.padded_inputs(request)
    length = int(np.asarray(workbench.cached_run(request).ids).shape[0])
    name = loaded.config.hook_name
    vectors = []
    for model in (workbench.model, loaded.model_b):
        with workbench.compiling("changed", padded["input_ids"].shape[1]):
            _, cache = model.run(padded, names=[name])
        vectors.append(np.asarray(cut_to_length(name, cache[name], length))[0])
    return np.stack(vectors, axis=1)


def shares(params, x: np.ndarray) -> np.ndarray:
    """[2, T, S]: c^M = (x^M − b_dec^M) · W_enc^M, each model's share of every latent's pre-activation."""
    return np.asarray(jnp.einsum("TMD,MDS->MTS", jnp.asarray(x) - params["b_dec"], params["W_enc"]))


def changed(workbench, body: Mapping) -> dict:
    """The answer to the page's "changed" request (docs/serve.md): {tokens, site, latents: [{latent, gap,
    relative_norm, cosine, norm_label, scaling_label, activation [T], a [T], b [T]}], hint}; without --compare and
    --crosscoder, {tokens: None, latents: None, hint} saying what to pass."""
    loaded = workbench.resource("crosscoder")
    if loaded is None:
        return {"tokens": None, "latents": None, "hint": HINT}
    request = workbench.request({**body, "ablate": []})
    run = workbench.cached_run(request)
    x = paired(workbench, loaded, request)
    f = np.asarray(diffing.encode(loaded.config, loaded.params, jnp.asarray(x)))  # [T, S]
    c = shares(loaded.params, x)
    gap = np.where(f > 0, np.abs(c[1] - c[0]), -np.inf).max(0)  # [S]; a latent silent on the text: −∞
    order = [int(i) for i in np.argsort(-gap, kind="stable")[:TOP_LATENTS] if np.isfinite(gap[i])]
    table = diffing.latent_table(loaded.config, loaded.params, x)  # its norms are the decoders'; its β this text's
    by_norm = diffing.norm_labels(table.relative_norm)
    latents = [{"latent": i, "gap": float(gap[i]), "relative_norm": float(table.relative_norm[i]),
                "cosine": float(table.cosine[i]), "norm_label": str(by_norm[i]), "scaling_label": str(table.labels[i]),
                "activation": [float(v) for v in f[:, i]], "a": [float(v) for v in c[0, :, i]],
                "b": [float(v) for v in c[1, :, i]]} for i in order]
    return {"tokens": run.tokens, "site": loaded.config.hook_name, "latents": latents,
            "hint": None if latents else "No crosscoder latent fires on this text."}


PANEL = Panel("changed", answer=changed, script="changed_view.js", constructor="minibertChanged",
              programs=("changed",))
