"""The small JSON files of a checkpoint directory (config.json, tokenizer_config.json, a sharded checkpoint's
index, sentence-transformers' module settings), read with a size limit and one clear error each; the
permissions every file minibert writes gets; and the one rule every writer follows for the file it creates
(output_path, write_output)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from minibert.errors import refuse_existing, refuse_unless_flag

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


# ---- the one rule every minibert writer follows for the file it is given -------------------------------------

def output_path(path, suffixes: tuple[str, ...], error: type[Exception], *, overwrite: bool = False,
                replace_hint: str = "pass overwrite=True to replace it", what: str = "path") -> Path:
    """`path` checked as the file a writer may create (pages, figures, graphs, notebooks, the command's --out):

    - a str or os.PathLike, not empty; `~` is expanded;
    - not a folder, even with overwrite=True;
    - ending in one of `suffixes` (case-insensitive; the first is the example in the message);
    - nothing there yet — a file, or a symbolic link, dangling or not (a link is never written through) —
      unless overwrite=True; then a link is replaced by the file, never the file it points to (write_output);
    - missing parent folders are created when the file is written (write_output), as `mkdir -p` would.

    `error` is the caller's error class; `replace_hint` how to replace a file (the command says --overwrite)."""
    if not isinstance(path, (str, os.PathLike)):
        raise error(f"{what} must be a str or pathlib.Path, such as 'out{suffixes[0]}'; got {type(path).__name__} "
                    f"{path!r}.")
    overwrite = refuse_unless_flag("overwrite", overwrite, error)
    if not str(os.fspath(path)).strip():
        raise error(f"the {what} is empty; pass a file name such as 'out{suffixes[0]}'.")
    path = Path(path).expanduser()
    if path.is_dir():
        raise error(f"{path} is a folder; pass a file path inside it, such as {path / ('out' + suffixes[0])}.")
    if path.suffix.lower() not in suffixes:
        names = ", ".join(suffixes[:-1]) + f" or {suffixes[-1]}" if len(suffixes) > 1 else suffixes[0]
        raise error(f"{path} must end in {names} (what is written follows the suffix); got "
                    f"{path.suffix or 'no suffix'!r}: for example {path.stem or 'out'}{suffixes[0]}.")
    refuse_existing(path, overwrite, error, replace_hint=replace_hint)
    return path


def write_output(path: Path, write: Callable[[Path], object], error: type[Exception]) -> Path:
    """Run write(path) for a path output_path checked: its missing folders created, a link there removed first
    (a new file replaces the link; its target is left alone), an OSError (permissions, a full disk, a file where
    a folder should be) one `error` naming the path."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        unlink_link(path)
        write(path)
    except OSError as failure:
        raise error(f"cannot write {path} ({failure.strerror or failure}); pass another path.") from None
    return path


def unlink_link(path: Path) -> None:
    """Remove a symbolic link at `path` (dangling or not) before a writer that was allowed to replace it
    (overwrite=True, errors.refuse_existing) writes its file there: the link goes, the file it pointed to stays."""
    if path.is_symlink():
        path.unlink()
