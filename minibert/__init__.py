"""minibert: a transparent BERT encoder in JAX/Flax with hooks on every intermediate.

    import minibert
    model = minibert.load()                       # bundled all-MiniLM-L6-v2
    batch = model.tokenize(["I made the mistake."])
    out, cache = model.run_with_cache(batch, names="blocks.*.attn.hook_pattern")
    cache.stack("hook_pattern")                   # [L, B, H, T, S]

Layers: app (cli, demo) → analysis, viz → api → model, hooks → config, errors. Imports point down only.
"""

import importlib
from typing import TYPE_CHECKING

# Where each public name lives. They are imported when first used (PEP 562), not by `import minibert`: JAX's
# import takes seconds, and the `minibert` command must be able to handle Ctrl-C before it starts
# (minibert.app.launch); `from minibert import Model` and `minibert.load` read the same as ever.
_EXPORTS = {
    "BertConfig": "minibert.core.config", "Config": "minibert.core.config", "Output": "minibert.core.encoder",
    **dict.fromkeys(("Cache", "HookContext", "HookFn", "RecompileWarning", "any_length", "get_act_name"),
                    "minibert.core.hooks"),
    **dict.fromkeys(("CheckpointError", "ConfigError", "HookError", "InputError", "MinibertError", "SourceError",
                     "TokenizerError"), "minibert.errors"),
    "convert_bin_to_safetensors": "minibert.io.checkpoint", "Batch": "minibert.io.tokenizer",
    "Tokenizer": "minibert.io.tokenizer", "Model": "minibert.runtime.model", "load": "minibert.runtime.model",
}

if TYPE_CHECKING:  # what type checkers and editors read
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


def __getattr__(name: str):
    """A public name, imported from its module on first use; else a subpackage (minibert.analysis)."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as error:
        if error.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


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
