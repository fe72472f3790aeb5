"""SAEs on disk in SAELens' layout, so SAELens (`SAE.load_from_disk(path)`) reads minibert SAEs and back.

    path/cfg.json                  {"architecture": "topk" | "standard", "d_in", "d_sae", "k" (topk), "dtype",
                                    "device", "apply_b_dec_to_input": true, "normalize_activations": "none",
                                    "reshape_activations": "hook_z" for attn.hook_z else "none",
                                    "sae_lens_version": "6.0.0",
                                    "metadata": {"sae_lens_version", "model_name", "hook_name", ...}}

SAELens reads a cfg.json without sae_lens_version (or older than 6.0) as a pre-6 file and rebuilds its
metadata from top-level keys, losing hook_name and model_name: we write the 6.0 layout and say so, at the top
level and in metadata (where SAELens 6's own save_model puts it).
    path/sae_weights.safetensors   W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_in], b_dec [d_in]

The mapping is one to one: minibert's parameters already carry SAELens' names, shapes and equations
(pre = (x − b_dec) W_enc + b_enc, so apply_b_dec_to_input is true). minibert's "relu" SAE is SAELens'
"standard"; a TopK SAE is saved with rescale_acts_by_decoder_norm false, its decoder rows being unit norm.
SAELens names hooks TransformerLens' way, and minibert's hook names are TransformerLens' (docs/hooks.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from minibert.analysis.sae.model import SAELENS_ARCHITECTURE, SAEConfig, as_numpy
from minibert.errors import DataFileError, DataFileMissing, refuse_unless_flag
from minibert.io.files import as_umask_allows

CFG = "cfg.json"
WEIGHTS = "sae_weights.safetensors"
SAELENS_LAYOUT = "6.0.0"  # the cfg.json layout written: SAELens >= 6 reads hook_name, model_name from metadata
SHAPES = {"W_enc": ("d_in", "d_sae"), "b_enc": ("d_sae",), "W_dec": ("d_sae", "d_in"), "b_dec": ("d_in",)}


def _checked_params(config: SAEConfig, params, where: str) -> dict[str, np.ndarray]:
    """The four arrays in SAELens' names with the shapes the config says (SHAPES), float32."""
    for name, axes in SHAPES.items():
        expected = tuple(getattr(config, axis) for axis in axes)
        found = tuple(np.shape(params[name])) if name in params else None
        if found != expected:
            raise DataFileError(f"{where}: {name} should be {expected} ({', '.join(axes)}) for this config; found "
                                f"{found or 'nothing'}.")
    return as_numpy({name: params[name] for name in SHAPES})


def save(path, config: SAEConfig, params, *, overwrite: bool = False) -> Path:
    """Write cfg.json and sae_weights.safetensors into the directory `path` (created if needed). A directory that
    already holds either file (another SAE) is refused unless overwrite=True; parameters whose shapes differ
    from the config's are refused (the cfg would describe other weights)."""
    arrays = _checked_params(config, params, "sae.save")
    path = writable_directory(path, overwrite, "SAE")
    cfg = {"architecture": SAELENS_ARCHITECTURE[config.architecture], "d_in": config.d_in, "d_sae": config.d_sae,
           "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": True, "normalize_activations": "none",
           "reshape_activations": "hook_z" if (config.hook_name or "").endswith("hook_z") else "none",
           "sae_lens_version": SAELENS_LAYOUT,
           "metadata": {"sae_lens_version": SAELENS_LAYOUT, "sae_lens_training_version": SAELENS_LAYOUT,
                        "model_name": config.model_name, "hook_name": config.hook_name, "hook_head_index": None}}
    if config.architecture == "topk":
        cfg |= {"k": config.k, "rescale_acts_by_decoder_norm": False}
    cfg["minibert"] = {"k_aux": config.k_aux, "aux_coefficient": config.aux_coefficient,
                       "l1_coefficient": config.l1_coefficient, "l1_warmup": config.l1_warmup}
    (path / CFG).write_text(json.dumps(cfg, indent=2))
    save_file(arrays, str(path / WEIGHTS))
    as_umask_allows(path / WEIGHTS)  # safetensors writes it private (0600)
    return path


def directory_path(path, what: str) -> Path:
    """`path` as a Path, or a DataFileError naming what a directory of the `what` is given as."""
    if not isinstance(path, str | os.PathLike):
        raise DataFileError(f"a {what} directory's path is a str or pathlib.Path, such as 'my-{what}'; got "
                            f"{type(path).__name__} {path!r}.")
    return Path(path)


def writable_directory(path, overwrite: bool, what: str) -> Path:
    """`path` made a directory to write cfg.json and the weights into; one already holding either is refused
    unless overwrite=True (nothing of the user's is replaced unasked)."""
    path, overwrite = directory_path(path, what), refuse_unless_flag("overwrite", overwrite, DataFileError)
    if path.exists() and not path.is_dir():
        raise DataFileError(f"{path} is a file; pass a directory to save the {what} into.")
    held = [name for name in (CFG, WEIGHTS) if (path / name).exists()]
    if held and not overwrite:
        raise DataFileError(f"{path} already holds {' and '.join(held)} (another {what}); pass another directory, or "
                            f"overwrite=True to replace it.")
    path.mkdir(parents=True, exist_ok=True)
    return path


def read_cfg(path: Path, sizes: tuple[str, ...], writer: str) -> dict:
    """A SAELens directory's cfg.json, with whole-number `sizes`; writer names what writes such a directory."""
    if not (path / CFG).is_file() or not (path / WEIGHTS).is_file():
        raise DataFileMissing(f"{path} needs {CFG} and {WEIGHTS} (SAELens' layout); pass the directory {writer} "
                              f"wrote.")
    try:
        cfg = json.loads((path / CFG).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        message = f"{path / CFG} is not JSON ({error}); pass a directory {writer} or SAELens wrote."
        raise DataFileError(message) from None
    if not isinstance(cfg, dict) or not all(isinstance(cfg.get(key), int) for key in sizes):
        raise DataFileError(f"{path / CFG} needs whole-number {', '.join(sizes)} (SAELens' cfg.json).")
    return cfg


def read_weights(path: Path, what: str) -> dict[str, np.ndarray]:
    try:
        return load_file(str(path / WEIGHTS))
    except (SafetensorError, OSError, ValueError) as error:
        raise DataFileError(f"{path / WEIGHTS} cannot be read ({error}); it may be cut short. Save the {what} "
                            f"again.") from None


def load(path) -> tuple[SAEConfig, dict[str, np.ndarray]]:
    """(config, params) from a directory in SAELens' layout (written by save, or by SAELens' save_model)."""
    path = directory_path(path, "SAE")
    cfg = read_cfg(path, ("d_in", "d_sae"), "sae.save")
    ours = {saelens: mine for mine, saelens in SAELENS_ARCHITECTURE.items()}
    if cfg.get("architecture") not in ours:
        raise DataFileError(f"{path / CFG}: architecture {cfg.get('architecture')!r}; minibert reads "
                            f"{', '.join(ours)}.")
    if cfg.get("normalize_activations", "none") != "none" or not cfg.get("apply_b_dec_to_input", True):
        raise DataFileError(f"{path / CFG}: normalize_activations={cfg.get('normalize_activations')!r}, apply_b_dec_"
                            f"to_input={cfg.get('apply_b_dec_to_input')!r}; minibert reads 'none' and true.")
    metadata = cfg.get("metadata") or {}
    config = SAEConfig(d_in=cfg["d_in"], d_sae=cfg["d_sae"], architecture=ours[cfg["architecture"]],
                       k=cfg.get("k", 32), hook_name=metadata.get("hook_name"),
                       model_name=metadata.get("model_name"), **cfg.get("minibert", {}))
    return config, _checked_params(config, read_weights(path, "SAE"), str(path / WEIGHTS))
