"""Transcoders on disk in SAELens 6's transcoder layout, so `SAE.load_from_disk(path)` reads minibert's files.

    path/cfg.json                 {"architecture", "d_in", "d_sae", "d_out", "dtype", "device",
                                   "apply_b_dec_to_input": false, "normalize_activations": "none",
                                   "reshape_activations": "none", "sae_lens_version": "6.0.0",
                                   "metadata": {"sae_lens_version", "model_name", "hook_name" (the MLP's input),
                                                "hook_name_out" (hook_mlp_out), ...},
                                   "minibert": {our architecture, k, layer, weights digest, training settings}}
    path/sae_weights.safetensors  W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_out], b_dec [d_out],
                                  threshold [d_sae] (JumpReLU), W_skip [d_out, d_in] (skip: SAELens' orientation,
                                  the transpose of ours; ŷ += x W_skipᵀ there)

Architectures, minibert → SAELens (SAELens' transcoders apply ReLU, then a JumpReLU's threshold mask):
    relu                  → "transcoder"            (skip: "skip_transcoder")
    jumprelu              → "jumprelu_transcoder"   (skip: "jumprelu_skip_transcoder"); θ ≥ 0, so
                            relu(pre)·H(pre − θ) = pre·H(pre − θ), our encode
    batchtopk             → "jumprelu_transcoder"   with its one θ repeated per latent, as SAELens saves its own
                            BatchTopK SAEs for inference; the "minibert" section restores the batchtopk config
    topk                  → "topk_transcoder" (ours: SAELens 6 has no TopK transcoder and refuses the file;
                            minibert reads it back)
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
from safetensors.numpy import save_file

from minibert.analysis._finite import check_finite_params
from minibert.analysis.sae.saelens import (
    CFG,
    SAELENS_LAYOUT,
    WEIGHTS,
    directory_path,
    read_cfg,
    read_weights,
    writable_directory,
)
from minibert.analysis.transcoders.model import TranscoderConfig, init_params
from minibert.errors import AnalysisError, DataFileError
from minibert.io.files import as_umask_allows

SAELENS_NAMES = {("relu", False): "transcoder", ("relu", True): "skip_transcoder",
                 ("jumprelu", False): "jumprelu_transcoder", ("jumprelu", True): "jumprelu_skip_transcoder",
                 ("topk", False): "topk_transcoder", ("topk", True): "topk_skip_transcoder"}
SAELENS_NAMES |= {("batchtopk", skip): SAELENS_NAMES["jumprelu", skip] for skip in (False, True)}
READ = {name: key for key, name in SAELENS_NAMES.items() if key[0] != "batchtopk"}
# what the "minibert" section holds beyond SAELens' own fields: every config field SAELens does not carry
OURS = ("architecture", "k", "layer", "weights", "k_aux", "aux_coefficient", "l1_coefficient", "l0_coefficient",
        "sparsity_warmup", "bandwidth", "threshold_init", "threshold_rate")


def _our_shapes(config: TranscoderConfig) -> dict[str, tuple[int, ...]]:
    """The parameters' names and shapes in minibert (init_params', without computing them)."""
    return {name: tuple(value.shape) for name, value in jax.eval_shape(lambda: init_params(config)).items()}


def _shapes(config: TranscoderConfig) -> dict[str, tuple[int, ...]]:
    """The arrays in SAELens' names and shapes: a threshold per latent, W_skip in its [d_out, d_in] orientation."""
    shapes = _our_shapes(config)
    if "threshold" in shapes:
        shapes["threshold"] = (config.d_sae,)
    if config.skip:
        shapes["W_skip"] = (config.d_out, config.d_in)
    return shapes


def _saelens_arrays(config: TranscoderConfig, params) -> dict[str, np.ndarray]:
    """Our parameters as SAELens stores them, each checked against the config's shape."""
    ours = _our_shapes(config)
    for name, expected in ours.items():
        found = tuple(np.shape(params[name])) if name in params else None
        if found != expected:
            raise DataFileError(f"transcoders.save: {name} should be {expected} for this config; found "
                                f"{found or 'nothing'}.")
    arrays = {name: np.asarray(params[name], np.float32) for name in ours}
    check_finite_params(arrays, "transcoders.save")
    if "threshold" in arrays:
        if np.any(arrays["threshold"] < 0):  # SAELens' ReLU before the mask would disagree with our encode
            raise AnalysisError("transcoders.save: a JumpReLU threshold is negative; SAELens' transcoders apply ReLU "
                                "first and would compute other latents. Clip it at 0 (training does).")
        arrays["threshold"] = np.broadcast_to(arrays["threshold"], (config.d_sae,)).copy()
    if config.skip:
        arrays["W_skip"] = np.ascontiguousarray(arrays["W_skip"].T)
    return arrays


def save(path, config: TranscoderConfig, params, *, overwrite: bool = False) -> Path:
    """Write cfg.json and sae_weights.safetensors into the directory `path` (created if needed); a directory
    already holding either is refused unless overwrite=True."""
    arrays = _saelens_arrays(config, params)
    path = writable_directory(path, overwrite, "transcoder")
    metadata = {"sae_lens_version": SAELENS_LAYOUT, "sae_lens_training_version": SAELENS_LAYOUT,
                "model_name": config.model_name, "hook_name": config.hook_in, "hook_name_out": config.hook_out,
                "hook_head_index": None}
    cfg = {"architecture": SAELENS_NAMES[config.architecture, config.skip], "d_in": config.d_in,
           "d_sae": config.d_sae, "d_out": config.d_out, "dtype": "float32", "device": "cpu",
           "apply_b_dec_to_input": False, "normalize_activations": "none", "reshape_activations": "none",
           "sae_lens_version": SAELENS_LAYOUT, "metadata": metadata,
           "minibert": {name: getattr(config, name) for name in OURS}}
    (path / CFG).write_text(json.dumps(cfg, indent=2))
    save_file(arrays, str(path / WEIGHTS))
    as_umask_allows(path / WEIGHTS)  # safetensors writes it private (0600)
    return path


def load(path) -> tuple[TranscoderConfig, dict[str, np.ndarray]]:
    """(config, params in minibert's shapes) from a directory in SAELens 6's transcoder layout (written by save,
    or by SAELens' save_model for its transcoder, skip_transcoder, jumprelu_transcoder and
    jumprelu_skip_transcoder)."""
    path = directory_path(path, "transcoder")
    cfg = read_cfg(path, ("d_in", "d_sae", "d_out"), "transcoders.save")
    if cfg.get("architecture") not in READ:
        raise DataFileError(f"{path / CFG}: architecture {cfg.get('architecture')!r}; minibert reads the transcoders "
                            f"{', '.join(READ)}.")
    if cfg.get("normalize_activations", "none") != "none" or cfg.get("apply_b_dec_to_input", False):
        raise DataFileError(f"{path / CFG}: normalize_activations={cfg.get('normalize_activations')!r}, apply_b_dec_"
                            f"to_input={cfg.get('apply_b_dec_to_input')!r}; minibert reads 'none' and false.")
    architecture, skip = READ[cfg["architecture"]]
    ours = dict(cfg.get("minibert") or {})
    known = {field.name for field in dataclasses.fields(TranscoderConfig)}
    unknown = sorted(set(ours) - known)
    if unknown:
        raise DataFileError(f"{path / CFG}: its minibert section names {', '.join(unknown)}, which this minibert's "
                            f"TranscoderConfig does not have; load it with the minibert that wrote it.")
    if ours.get("architecture", architecture) == "batchtopk" and architecture == "jumprelu":
        architecture = "batchtopk"
    ours["architecture"] = architecture
    metadata = cfg.get("metadata") or {}
    hook_in, hook_out = metadata.get("hook_name"), metadata.get("hook_name_out")
    layer = ours.pop("layer", None)
    if layer is None:  # a file SAELens wrote: the block is in the hook's name
        layer = _layer_of(hook_out or hook_in, path)
    config = TranscoderConfig(d_in=cfg["d_in"], d_sae=cfg["d_sae"], d_out=cfg["d_out"], layer=layer, skip=skip,
                              hook_in=hook_in, hook_out=hook_out, model_name=metadata.get("model_name"), **ours)
    arrays = read_weights(path, "transcoder")
    for name, expected in _shapes(config).items():
        found = tuple(arrays[name].shape) if name in arrays else None
        if found != expected:
            raise DataFileError(f"{path / WEIGHTS}: {name} should be {expected} for its cfg.json; found "
                                f"{found or 'nothing'}.")
    params = {name: np.asarray(arrays[name], np.float32) for name in _shapes(config)}
    if skip:
        params["W_skip"] = np.ascontiguousarray(params["W_skip"].T)
    if architecture == "batchtopk":
        thresholds = params["threshold"]
        if not np.all(thresholds == thresholds[0]):
            raise DataFileError(f"{path / WEIGHTS}: a BatchTopK transcoder has one threshold, but these differ by "
                                f"latent; drop its minibert section's architecture to read it as a JumpReLU.")
        params["threshold"] = np.asarray(thresholds[0], np.float32)
    return config, params


def _layer_of(hook_name: str | None, path: Path) -> int:
    parts = (hook_name or "").split(".")
    if len(parts) > 1 and parts[0] == "blocks" and parts[1].isdigit():
        return int(parts[1])
    raise DataFileError(f"{path / CFG}: no block can be read from hook_name {hook_name!r} and the file has no minibert "
                        f"section with its layer; its metadata should name blocks.{{l}}.… hooks.")
