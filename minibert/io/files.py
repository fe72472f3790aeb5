"""The small JSON files of a checkpoint directory (config.json, tokenizer_config.json, a sharded checkpoint's
index, sentence-transformers' module settings), read with a size limit and one clear error each; and the
permissions every file minibert writes gets."""

from __future__ import annotations

import json
import os
from pathlib import Path

MAX_CONFIG_BYTES = 10_000_000  # a config.json is a few kilobytes; refuse to read a device or a huge file


def read_json_object(path: Path, needed_for: str, error: type[Exception]) -> dict:
    """A JSON file holding an object, read with a size limit; `error` names the file and the problem."""
    if not path.exists():
        raise error(f"{path} does not exist; {needed_for}.")
    if not path.is_file():
        raise error(f"{path} is not a regular file; {needed_for}.")
    with open(path, "rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise error(f"{path} is larger than {MAX_CONFIG_BYTES:,} bytes; a JSON settings file is a few kilobytes.")
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"{path} is not valid JSON ({e}).") from None
    if not isinstance(value, dict):
        raise error(f"{path} holds a JSON {type(value).__name__}; it must hold an object {{...}}.")
    return value


def as_umask_allows(path: Path) -> None:
    """Give `path` the permissions a plain new file gets (0666 less the umask), as open() would: safetensors and
    tempfile.mkstemp write private files (0600), which another user of a shared checkpoint or SAE could not read."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)
