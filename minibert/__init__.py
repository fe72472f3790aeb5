"""minibert: a transparent BERT encoder in JAX/Flax with hooks on every intermediate.

    import minibert
    model = minibert.load()                       # bundled all-MiniLM-L6-v2
    batch = model.tokenize(["I made the mistake."])
    out, cache = model.run_with_cache(batch, names="blocks.*.attn.hook_pattern")
    cache.stack("hook_pattern")                   # [L, B, H, T, S]

Layers: app (cli, demo) → analysis, viz → api → model, hooks → config, errors. Imports point down only.
"""

from minibert.core.config import BertConfig, Config
from minibert.core.encoder import Output
from minibert.core.hooks import Cache, HookContext, HookFn, RecompileWarning, any_length, get_act_name
from minibert.errors import (
    CheckpointError,
    ConfigError,
    HookError,
    InputError,
    MinibertError,
    SourceError,
    TokenizerError,
)
from minibert.io.checkpoint import convert_bin_to_safetensors
from minibert.io.tokenizer import Batch, Tokenizer
from minibert.runtime.model import Model, load

__all__ = [
    "Batch",
    "BertConfig",
    "Cache",
    "Config",
    "CheckpointError",
    "ConfigError",
    "HookContext",
    "HookError",
    "HookFn",
    "InputError",
    "MinibertError",
    "Model",
    "Output",
    "RecompileWarning",
    "SourceError",
    "Tokenizer",
    "TokenizerError",
    "any_length",
    "convert_bin_to_safetensors",
    "get_act_name",
    "load",
]
__version__ = "0.4.0"  # the one version string: pyproject.toml reads it (tool.setuptools.dynamic)
