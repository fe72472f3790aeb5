"""Hugging Face checkpoints in and out: reading.py turns safetensors (or an opted-in pytorch_model.bin, or a
sentence-transformers folder) into minibert parameters through each family's strict key table; writing.py runs the
same table backwards to save a Model as a directory transformers reads. The model and the api stand on this
package; it stands on config, the families and the files it reads.
"""

from minibert.io.checkpoint.reading import (
    IGNORED,
    POOLING_MODES,
    SENTENCE_MODULES,
    TRANSFORMER_SETTINGS,
    check_config,
    convert,
    convert_bin_to_safetensors,
    key_table,
    read_pytorch_bin,
    read_safetensors,
    sentence_transformers_layout,
)
from minibert.io.checkpoint.writing import hf_config, hf_tensors, save

__all__ = ["IGNORED", "POOLING_MODES", "SENTENCE_MODULES", "TRANSFORMER_SETTINGS", "check_config", "convert",
           "convert_bin_to_safetensors", "hf_config", "hf_tensors", "key_table", "read_pytorch_bin",
           "read_safetensors", "save", "sentence_transformers_layout"]
