"""SAEs on disk in SAELens' layout, so SAELens (`SAE.load_from_disk(path)`) reads minibert SAEs and back.

    path/cfg.json                  {"architecture": "topk" | "standard", "d_in", "d_sae", "k" (topk), "dtype",
                                    "device", "apply_b_dec_to_input": true, "normalize_activations": "none",
                                    "reshape_activations": "hook_z" for attn.hook_z else "none",
                                    "metadata": {"model_name", "hook_name", ...}}
    path/sae_weights.safetensors   W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_in], b_dec [d_in]

The mapping is one to one: minibert's parameters already carry SAELens' names, shapes and equations
(pre = (x − b_dec) W_enc + b_enc, so apply_b_dec_to_input is true). minibert's "relu" SAE is SAELens'
"standard"; a TopK SAE is saved with rescale_acts_by_decoder_norm false, its decoder rows being unit norm.
SAELens names hooks TransformerLens' way, and minibert's hook names are TransformerLens' (docs/hooks.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from minibert.analysis.sae.model import SAELENS_ARCHITECTURE, SAEConfig, as_numpy
from minibert.errors import DataFileError, DataFileMissing

CFG = "cfg.json"
WEIGHTS = "sae_weights.safetensors"
SHAPES = {"W_enc": ("d_in", "d_sae"), "b_enc": ("d_sae",), "W_dec": ("d_sae", "d_in"), "b_dec": ("d_in",)}


def save(path, config: SAEConfig, params) -> Path:
    """Write cfg.json and sae_weights.safetensors into the directory `path` (created if needed)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = {"architecture": SAELENS_ARCHITECTURE[config.architecture], "d_in": config.d_in, "d_sae": config.d_sae,
           "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": True, "normalize_activations": "none",
           "reshape_activations": "hook_z" if (config.hook_name or "").endswith("hook_z") else "none",
           "metadata": {"model_name": config.model_name, "hook_name": config.hook_name}}
    if config.architecture == "topk":
        cfg |= {"k": config.k, "rescale_acts_by_decoder_norm": False}
    cfg["minibert"] = {"k_aux": config.k_aux, "aux_coefficient": config.aux_coefficient,
                       "l1_coefficient": config.l1_coefficient, "l1_warmup": config.l1_warmup}
    (path / CFG).write_text(json.dumps(cfg, indent=2))
    save_file(as_numpy(params), str(path / WEIGHTS))
    return path


def load(path) -> tuple[SAEConfig, dict[str, np.ndarray]]:
    """(config, params) from a directory in SAELens' layout (written by save, or by SAELens' save_model)."""
    path = Path(path)
    if not (path / CFG).is_file() or not (path / WEIGHTS).is_file():
        raise DataFileMissing(f"{path} needs {CFG} and {WEIGHTS} (SAELens' layout); pass the directory save wrote.")
    cfg = json.loads((path / CFG).read_text())
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
    params = load_file(str(path / WEIGHTS))
    for name, axes in SHAPES.items():
        expected = tuple(getattr(config, axis) for axis in axes)
        if name not in params or params[name].shape != expected:
            raise DataFileError(f"{path / WEIGHTS}: {name} should be {expected} ({', '.join(axes)}); found "
                                f"{params[name].shape if name in params else 'nothing'}.")
    return config, {name: params[name].astype(np.float32) for name in SHAPES}
