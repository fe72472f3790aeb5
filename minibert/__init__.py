"""minibert: a transparent BERT encoder in JAX/Flax with hooks on every intermediate.

    import minibert
    model = minibert.load()                       # bundled all-MiniLM-L6-v2
    batch = model.tokenize(["I made the mistake."])
    out, cache = model.run_with_cache(batch, names="blocks.*.attn.hook_pattern")
    cache.stack("hook_pattern")                   # [L, B, H, T, S]
"""

from minibert.api import InputError, Model, load
from minibert.checkpoint import CheckpointError, convert_bin_to_safetensors
from minibert.config import BertConfig, ConfigError
from minibert.hooks import Cache, HookContext, HookError, HookFn
from minibert.model import Output
from minibert.tokenizer import Batch, Tokenizer, TokenizerError

__all__ = [
    "Batch", "BertConfig", "Cache", "CheckpointError", "ConfigError", "HookContext", "HookError", "HookFn",
    "InputError", "Model", "Output", "Tokenizer", "TokenizerError", "convert_bin_to_safetensors", "load",
]
__version__ = "0.1.0"
