"""Save a Model as a Hugging Face directory: config.json, model.safetensors with transformers' key names, and
the tokenizer files, so that transformers' AutoModelFor… (and minibert.load) read it back.

The keys come from the same table that loads checkpoints (reading.key_table): each rule's converter is a
reshape, transpose or selection, so applying it to the index array 0 … n − 1 of the Hugging Face shape says
where every Hugging Face entry went; the inverse is that gather run backwards. No second table to keep in step.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from minibert.core.config import Config
from minibert.errors import DataFileError, refuse_unless_flag
from minibert.io.checkpoint.reading import key_table, sentence_transformers_layout
from minibert.io.files import as_umask_allows

TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json",
                   "special_tokens_map.json")
# Config fields that are not config.json keys of the same name
_NOT_KEYS = ("family", "architecture", "id2label", "settings", "source", "embedding_size")


def to_hf(value: np.ndarray, hf_shape: tuple[int, ...], converter, cfg: Config, key: str) -> np.ndarray:
    """The Hugging Face tensor that `converter` (a key-table rule) turns into minibert's `value`."""
    index = np.arange(int(np.prod(hf_shape)), dtype=np.int64).reshape(hf_shape)
    placed = np.asarray(converter(index, cfg)).ravel()
    if placed.size != index.size or not np.array_equal(np.sort(placed), index.ravel()):
        raise DataFileError(f"the key table's converter for {key!r} does not move each entry once; it cannot be "
                            f"inverted to save the model.")
    tensor = np.empty(index.size, np.float32)
    tensor[placed] = np.asarray(value, np.float32).ravel()
    return tensor.reshape(hf_shape)


def hf_tensors(cfg: Config, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """{Hugging Face key: tensor}; encoder keys carry the family's prefix (`bert.`) in head models, as
    save_pretrained writes them. Tied keys (the MLM decoder) are left out: transformers ties them on load."""
    table = key_table(cfg)
    bare = cfg.family.prefix + "Model"
    encoder = set(key_table(dataclasses.replace(cfg, architecture=bare)))
    prefix = "" if cfg.architecture == bare else cfg.family.key_prefix + "."
    return {(prefix + key if key in encoder else key): to_hf(params[path], shape, converter, cfg, key)
            for key, (path, shape, converter) in table.items()}


def hf_config(cfg: Config, original: dict) -> dict:
    """config.json: the original's keys (dropout, initializer_range, …) updated with the model's own values."""
    renamed = {ours: theirs for theirs, ours in cfg.family.renames}
    fixed = {name for name, _ in cfg.family.fixed}
    values = {renamed.get(f.name, f.name): getattr(cfg, f.name) for f in dataclasses.fields(cfg)
              if f.name not in _NOT_KEYS and f.name not in fixed}
    if cfg.embedding_size is not None:
        values["embedding_size"] = cfg.embedding_size
    labels = {str(i): name for i, name in enumerate(cfg.id2label)}
    # A setting left at a default of None is not written: transformers reads an absent key as its default, but
    # some of its code reads a written null as a value (DeBERTa's attention_head_size).
    settings = {key: value for key, value in cfg.settings if value is not None}
    return {**original, **values, **settings, "model_type": cfg.model_type,
            "architectures": [cfg.architecture], "id2label": labels,
            "label2id": {name: int(i) for i, name in labels.items()}}


def save(model, directory: str | Path, *, overwrite: bool = False) -> Path:
    """Write `model` to `directory` (created if needed) as a Hugging Face checkpoint. A directory that already
    holds a file of the names it writes (config.json, model.safetensors, the tokenizer's) is refused unless
    overwrite=True, and so is one holding other weights a loader would read before model.safetensors (a sharded
    index and its shards, pytorch_model.bin): overwrite=True removes those, so the folder loads as this model.
    Other files there are left alone."""
    directory, overwrite = Path(directory), refuse_unless_flag("overwrite", overwrite, DataFileError)
    if directory.exists() and not directory.is_dir():
        raise DataFileError(f"{directory} is a file; pass a directory to save the model in.")
    stale = _stale_weights(directory)
    held = [name for name in ("config.json", "model.safetensors", *TOKENIZER_FILES) if (directory / name).exists()]
    held += stale
    if held and not overwrite:
        raise DataFileError(f"{directory} already holds {', '.join(held)}; pass another directory, or "
                            f"overwrite=True to replace them.")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a parent that is a file, a read-only folder
        raise DataFileError(f"cannot create {directory} ({error.strerror}); pass a directory you can write.") \
            from None
    for name in stale:  # loaders read an index (or a .bin) before model.safetensors: the old weights would win
        (directory / name).unlink()
    cfg = model.config
    params = {name: np.asarray(value) for name, value in model.named_parameters().items()}
    save_file(hf_tensors(cfg, params), directory / "model.safetensors", metadata={"format": "pt"})
    as_umask_allows(directory / "model.safetensors")
    source = _source_dir(model)
    original = json.loads((source / "config.json").read_text()) if source and (source / "config.json").exists() \
        else {}
    (directory / "config.json").write_text(json.dumps(hf_config(cfg, original), indent=2) + "\n")
    copied = [name for name in TOKENIZER_FILES if source and (source / name).exists()]
    for name in copied:
        if (source / name).resolve() != (directory / name).resolve():
            shutil.copyfile(source / name, directory / name)
    if not copied and hasattr(model.tokenizer, "ids_to_tokens"):  # a WordPiece tokenizer built in memory
        vocab = model.tokenizer.ids_to_tokens
        (directory / "vocab.txt").write_text("".join(vocab[i] + "\n" for i in range(len(vocab))))
    return directory


WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def _stale_weights(directory: Path) -> list[str]:
    """The weight files in `directory` other than model.safetensors that minibert.load or transformers would read
    (a sharded index and the shards it names, pytorch_model.bin): a saved model.safetensors replaces them."""
    names = [name for name in (*WEIGHT_INDEXES, "pytorch_model.bin") if (directory / name).is_file()]
    for index in (index for index in WEIGHT_INDEXES if index in names):
        try:
            weight_map = json.loads((directory / index).read_text()).get("weight_map", {})
            shards = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else []
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):  # unreadable: the index alone goes
            continue
        # Only names inside the folder (as reading._shard_files checks): an index never removes a file elsewhere.
        names += [shard for shard in shards if isinstance(shard, str) and Path(shard).name == shard
                  and (directory / shard).is_file()]
    return sorted(set(names), key=names.index)


def _source_dir(model) -> Path | None:
    """The directory the model's config and tokenizer came from (through fine-tuning: the base model's)."""
    source = Path(model.source)
    if not source.is_dir():
        return None
    return sentence_transformers_layout(source)[0]
