"""A survey's result: per-head means, how they merge, how they are saved and read back."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import weakref
import zipfile
from collections.abc import Iterable
from pathlib import Path

import jax
import numpy as np

from minibert.analysis import heads
from minibert.errors import AnalysisError, DataFileError, DataFileMissing, refuse_existing
from minibert.io.files import unlink_link

# Settings that change the numbers: parts of a merge must agree on them. "weights" (the weights' hash) tells
# apart two checkpoints saved at the same path, which "model" (the path) cannot.
MERGE_KEYS = ("model", "weights", "max_length", "segment_ids", "sep_normalization")
_DIGESTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model → (state, sha256 of the weights)


@dataclasses.dataclass
class SurveyResult:
    """Per-head statistics averaged over documents ([L, H] each; layers and heads 0-indexed)."""

    mean: dict[str, np.ndarray]
    documents: int
    js_divergence: np.ndarray | None = None  # [L·H, L·H], summed over documents (docs/definitions.md)
    settings: dict = dataclasses.field(default_factory=dict)
    # batches, tokens_run (padded), real_tokens; for a corpus file also blank_lines (skipped) and truncated
    # (documents cut to max_length)
    counts: dict = dataclasses.field(default_factory=dict)

    def table(self, broad: str = "relative") -> list[dict]:
        """One row per head (heads.head_table); broad: how the "broad" label is judged (heads.behaviour_labels)."""
        return heads.head_table(self.mean, broad=broad)

    @property
    def sums(self) -> dict[str, np.ndarray]:
        """Each statistic summed over the documents ([L, H]): mean × documents, what merging adds."""
        return {name: value * self.documents for name, value in self.mean.items()}

    @classmethod
    def merge(cls, results: Iterable[SurveyResult]) -> SurveyResult:
        """The result of one survey over the union of the results' corpora (each process's reduce="local"
        result, Ray blocks, saved and loaded parts): documents and counts summed, means weighted by
        documents, Jensen–Shannon sums added. The parts must agree on the settings in MERGE_KEYS."""
        results = list(results)
        if not results or not all(isinstance(r, SurveyResult) for r in results):
            raise AnalysisError("merge takes a non-empty list of SurveyResult (e.g. each process's "
                                "survey(..., reduce='local')).")
        _check_mergeable(results)
        documents = sum(r.documents for r in results)
        if documents == 0:
            raise AnalysisError("the results to merge hold no documents; survey at least one text.")
        mean = {name: sum(r.sums[name] for r in results) / documents for name in results[0].mean}
        js = None if results[0].js_divergence is None else sum(r.js_divergence for r in results)
        counts = {key: sum(r.counts.get(key, 0) for r in results) for key in results[0].counts}
        return cls(mean, documents, js, _merged_settings([r.settings for r in results]), counts)

    def save(self, path: str | Path, broad: str = "relative", *, overwrite: bool = False) -> tuple[Path, Path]:
        """Write `path.npz` (arrays) and `path.json` (settings, documents, tidy per-head table, its "broad"
        labels judged by `broad` as in table()). A suffix .npz, .json or .csv on `path` is dropped; any other
        dot stays part of the name. Either file existing is refused, before anything is written, unless
        overwrite=True.
        A result every process of a reduce="global" run holds is written by process 0 only (the others
        return the same paths and write nothing)."""
        if self.settings.get("reduce") == "global" and self.settings.get("processes", 1) > 1 \
                and jax.process_index() != 0:
            return output_paths(path)  # not checked here: the folder may exist on process 0's host only
        npz, js = writable_output_paths(path)
        refuse_existing([npz, js], overwrite, DataFileError)
        for path in (npz, js):  # overwrite=True replaces a link with the file, never writing through it
            unlink_link(path)
        arrays = dict(self.mean)
        if self.js_divergence is not None:
            arrays["js_divergence"] = self.js_divergence
        np.savez_compressed(npz, **arrays)
        js.write_text(json.dumps({"documents": self.documents, "settings": self.settings, "counts": self.counts,
                                  "heads": self.table(broad)}, indent=1))
        return npz, js

    @classmethod
    def load(cls, path: str | Path) -> SurveyResult:
        """Read back what `save(path)` wrote; a missing, damaged or foreign file is a DataFileError naming it."""
        npz, js_path = output_paths(path)
        for file in (npz, js_path):
            if not file.is_file():
                raise DataFileMissing(f"{file} is not a file; pass the prefix SurveyResult.save wrote (it writes "
                                      f"PREFIX.npz and PREFIX.json).")
        try:
            with np.load(npz) as arrays:
                mean = {name: arrays[name] for name in arrays.files if name != "js_divergence"}
                js = arrays["js_divergence"] if "js_divergence" in arrays.files else None
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
            raise DataFileError(f"{npz} cannot be read as a saved survey ({_first_line(error)}); it is damaged or "
                                f"not one SurveyResult.save wrote: survey again.") from None
        try:
            info = json.loads(js_path.read_text(encoding="utf-8"))
            documents, settings, counts = info["documents"], info["settings"], info.get("counts", {})
        except (ValueError, KeyError, TypeError) as error:
            raise DataFileError(f"{js_path} is not a saved survey's description ({_first_line(error)}); pass the "
                                f"prefix SurveyResult.save wrote.") from None
        _check_loaded(npz, mean, js, documents, settings, counts)
        return cls(mean, documents, js, settings, counts)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:200]


def _check_loaded(npz: Path, mean: dict, js, documents, settings, counts) -> None:
    """What load read is a survey: every statistic, one [L, H] grid, a count of documents."""
    missing = [name for name in heads.STATISTICS if name not in mean]
    shapes = {np.shape(value) for value in mean.values()}
    if missing or len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise DataFileError(f"{npz} does not hold a survey's [L, H] statistics (missing {missing[:3]}, shapes "
                            f"{sorted(shapes)[:3]}); pass the prefix SurveyResult.save wrote.")
    layers, n_heads = next(iter(shapes))
    if js is not None and np.shape(js) != (layers * n_heads,) * 2:
        raise DataFileError(f"{npz}: js_divergence has shape {np.shape(js)}, not {(layers * n_heads,) * 2}; the "
                            f"file is damaged: survey again.")
    if not isinstance(documents, int) or documents < 0 or not isinstance(settings, dict) \
            or not isinstance(counts, dict):
        raise DataFileError(f"{npz.with_suffix('.json')}: documents, settings or counts have the wrong type; pass "
                            f"the prefix SurveyResult.save wrote.")


def _check_mergeable(results: list[SurveyResult]) -> None:
    """The parts of a merge measure the same thing: the same statistics and head grid, the same settings
    in MERGE_KEYS, and a Jensen–Shannon matrix in all or none."""
    first = results[0]
    for number, result in enumerate(results[1:], 1):
        if set(result.mean) != set(first.mean) or any(result.mean[k].shape != first.mean[k].shape for k in first.mean):
            raise AnalysisError(f"result {number} holds other statistics or another head grid than result 0; merge "
                                f"only surveys of the same model.")
        differ = [key for key in MERGE_KEYS if result.settings.get(key) != first.settings.get(key)]
        if differ:
            key = differ[0]
            raise AnalysisError(f"result {number} was surveyed with {key}={result.settings.get(key)!r} but result 0 "
                                f"with {key}={first.settings.get(key)!r}; merge only surveys run with the same "
                                f"{', '.join(MERGE_KEYS)}.")
        if (result.js_divergence is None) != (first.js_divergence is None):
            raise AnalysisError(f"result {number} and result 0 differ in js_divergence (one has the matrix); run "
                                f"every part with the same js_divergence setting.")


def _merged_settings(settings: list[dict]) -> dict:
    """Settings of a merged result: what every part shares, devices and processes added up, and None where
    the parts differ in how they ran (batching, say)."""
    merged = {key: value if all(s.get(key) == value for s in settings) else None
              for key, value in settings[0].items()}
    for key in ("devices", "processes"):
        if all(key in s for s in settings):
            merged[key] = sum(s[key] for s in settings)
    merged["reduce"] = "merged"
    return merged


def output_paths(path: str | Path) -> tuple[Path, Path]:
    """(prefix.npz, prefix.json) for a prefix, or for a path that already ends in .npz, .json or .csv."""
    given, path = str(path), Path(path)
    if path.name in ("", ".", ".."):  # "", ".", "/" or "..": a folder, no file name to add .npz to
        raise DataFileError(f"the output {given!r} names no file; pass a prefix such as results/survey (it "
                            f"writes results/survey.npz and results/survey.json).")
    prefix = path.with_suffix("") if path.suffix in (".npz", ".json", ".csv") else path
    return prefix.with_name(prefix.name + ".npz"), prefix.with_name(prefix.name + ".json")


def writable_output_paths(path: str | Path) -> tuple[Path, Path]:
    """output_paths, refused before any work when a folder stands at one of them or their folder is missing."""
    npz, js = output_paths(path)
    for file in (npz, js, js.with_suffix(".csv")):
        if file.is_dir():
            raise DataFileError(f"the output {file} is a folder; choose another file name (prefix).")
    if not npz.parent.is_dir():
        raise DataFileMissing(f"the folder {npz.parent} of the output {npz} does not exist; create it first or "
                              f"choose another prefix.")
    return npz, js


def weights_digest(model) -> str:
    """sha256 of every weight (16 hex digits), computed once per model and weights: what processes, resume
    files and merges compare, since a path can hold other weights on another host or at another time."""
    known = _DIGESTS.get(model)
    if known is None or known[0] is not model.state:
        digest = hashlib.sha256()
        for leaf in jax.tree_util.tree_leaves(model.state):
            digest.update(np.ascontiguousarray(leaf).tobytes())
        known = _DIGESTS[model] = (model.state, digest.hexdigest()[:16])
    return known[1]
