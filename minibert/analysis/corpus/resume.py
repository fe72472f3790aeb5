"""Resume files: a survey's running totals and position, saved atomically so that a survey started again
with the same file goes on where the last one stopped, with totals identical to an uninterrupted run."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import jax
import numpy as np

from minibert.errors import DataFileError, DataFileMissing

INFO_KEYS = ("run_id", "chunks", "used", "counts")


class TextsDigest:
    """A running sha256 of the texts a survey has read: lists and streams have no file to fingerprint, so a
    resumed survey compares the texts it skips with the ones the saved totals came from."""

    def __init__(self):
        self._hash = hashlib.sha256()

    def through(self, rows: Iterator) -> Iterator:
        for row in rows:
            self._hash.update(json.dumps(row).encode())
            yield row

    def hexdigest(self) -> str:
        return self._hash.hexdigest()[:32]


@dataclasses.dataclass
class ResumeFile:
    """A survey's saved position: whole chunks done, the running totals, the row lengths already compiled
    (the packer's flush depends on them), the counts so far and, for texts given as lists or streams, a
    hash of the texts read. One .npz, replaced atomically."""

    path: Path | None
    run_id: dict
    chunks: int = 0
    totals: dict | None = None
    used: tuple = ()
    counts: dict = dataclasses.field(default_factory=dict)
    texts: str | None = None  # TextsDigest of the texts read up to `chunks`

    @classmethod
    def open(cls, resume, reduce: str, run_id: dict, zeros: dict) -> ResumeFile:
        """The resume file at `resume` if there is one (checked against this run and against `zeros`, the
        totals' names and shapes), else an empty one; its folder must exist."""
        if resume is None:
            return cls(None, run_id)
        path = Path(resume)
        if reduce == "local" and jax.process_count() > 1:
            path = path.with_name(f"{path.name}.process{jax.process_index()}")
        if path.is_dir():
            raise DataFileError(f"the resume file {path} is a folder; pass a file name, e.g. {path / 'survey.resume'}.")
        if not path.parent.is_dir():
            raise DataFileMissing(f"the folder {path.parent} of the resume file {path} does not exist; create it "
                                  f"first.")
        if not path.exists():
            return cls(path, run_id)
        info, totals = _read(path)
        _check_info(path, info, run_id)
        _check_totals(path, totals, zeros)
        return cls(path, run_id, info["chunks"], totals, tuple(info["used"]), info["counts"], info.get("texts"))

    def skipped(self, rows: Iterator, digest: TextsDigest) -> Iterator:
        """`rows` after this file's position, the skipped ones checked against the texts the totals came from."""
        done = self.chunks * self.run_id["chunk"]
        for _, _ in zip(range(done), digest.through(rows)):
            pass
        if self.texts is not None and digest.hexdigest() != self.texts:
            raise DataFileError(f"resume file {self.path}: the first {done} texts differ from the ones its totals "
                                f"came from; pass the same texts to resume, or delete the file to start afresh.")
        return digest.through(rows)

    def save(self, chunks: int, totals: dict, used, counts: dict, texts: str | None) -> None:
        info = json.dumps(dict(run_id=self.run_id, chunks=chunks, used=sorted(used), counts=counts, texts=texts),
                          default=str)
        # A temporary file of its own: two surveys writing next to the same path never write into one file.
        handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as file:
                np.savez(file, info=np.array(info), **{f"total.{name}": value for name, value in totals.items()})
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self.path)  # readers see the old file or the new one, never half of one
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


def _read(path: Path) -> tuple[dict, dict]:
    try:
        with np.load(path) as stored:
            info = json.loads(str(stored["info"]))
            totals = {name[len("total."):]: stored[name] for name in stored.files if name.startswith("total.")}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as error:
        text = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise DataFileError(f"resume file {path} cannot be read ({text}): it is empty, truncated or not a resume "
                            f"file; delete it to start the survey afresh.") from None
    return info, totals


def _check_info(path: Path, info, run_id: dict) -> None:
    """The saved description has every key, of the right type, and belongs to this very survey."""
    if not isinstance(info, dict) or any(key not in info for key in INFO_KEYS) \
            or not isinstance(info["run_id"], dict) or not isinstance(info["chunks"], int) or info["chunks"] < 0 \
            or not isinstance(info["used"], list) or not isinstance(info["counts"], dict):
        missing = [key for key in INFO_KEYS if not isinstance(info, dict) or key not in info]
        raise DataFileError(f"resume file {path} is damaged (missing or malformed: {missing or 'a value'}); delete "
                            f"it to start the survey afresh.")
    saved_id = info["run_id"]
    here = json.loads(json.dumps(run_id, default=str))
    differ = [key for key in sorted(set(saved_id) | set(here)) if saved_id.get(key) != here.get(key)]
    if differ:
        key = differ[0]
        raise DataFileError(f"resume file {path} belongs to another survey: its {key} is {saved_id.get(key)!r}, "
                            f"this run's is {here.get(key)!r}; run with the same settings, weights and corpus "
                            f"to resume, or delete the file to start afresh.")


def _check_totals(path: Path, totals: dict, zeros: dict) -> None:
    wrong = [name for name in sorted(set(zeros) | set(totals))
             if name not in totals or name not in zeros or np.shape(totals[name]) != np.shape(zeros[name])]
    if wrong:
        name = wrong[0]
        raise DataFileError(f"resume file {path} is damaged: its total {name!r} has shape "
                            f"{np.shape(totals[name]) if name in totals else 'none (missing)'}, this survey's "
                            f"{np.shape(zeros[name]) if name in zeros else 'none (not a statistic)'}; delete it to "
                            f"start the survey afresh.")
