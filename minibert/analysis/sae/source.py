"""Activations to train an SAE on, streamed: texts (a list, a stream or a corpus file, read as the survey reads
them) are tokenized a chunk at a time and packed several to a row (the survey's packing: each document keeps
its own positions and attends only to itself, so its values are the ones it has alone), rows go through one
compiled forward per row length, the real tokens' values at one hook go into a bounded buffer that is
shuffled, and batches come out of it. The corpus is never held whole: only `buffer_tokens` activations at a
time (plus one forward batch).

With `cache=directory` the activations are also written there, one .npy file per forward batch; a later call
with the same model weights, hook, max_length and texts reads them back instead of running the model.
"""

from __future__ import annotations

import itertools
import json
import os
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from minibert.analysis.corpus import packing, reading
from minibert.analysis.corpus.result import weights_digest
from minibert.analysis.corpus.resume import TextsDigest
from minibert.analysis.corpus.step import packed_captures
from minibert.core.hooks import site_axes
from minibert.core.site_names import MLP_POST, RESID_POST, Z, in_block
from minibert.errors import AnalysisError, AnalysisWarning, DataFileError, MinibertError, is_whole, outside_minibert

CACHE_INFO = "activations.json"


def hook_width(model, hook_name: str) -> int:
    """The size of one token's vector at `hook_name` (heads × head dim for attn.hook_z: SAELens' hook_z)."""
    if hook_name not in model.hook_sites:
        examples = ", ".join(repr(in_block(3, site)) for site in (RESID_POST, MLP_POST, Z))
        raise AnalysisError(f"{hook_name!r} is not a hook of this model; e.g. {examples} (model.hook_names lists "
                            f"them).")
    axes = site_axes(hook_name)
    if axes[:2] != ["B", "T"] or "S" in axes:
        raise AnalysisError(f"{hook_name!r} has axes {axes}; an SAE reads one vector per token ([B, T, ...]).")
    shape = model.hook_sites[hook_name][0]
    return int(np.prod(shape[2:]))


CORPUS_SUFFIXES = (".txt", ".tsv", ".jsonl")


def _names_a_file(text: str) -> bool:
    """Whether a str passed as texts names a corpus file: it ends in a corpus suffix, or is an existing file."""
    if "\n" in text or len(text) > 4096:
        return False
    try:
        return Path(text).suffix in CORPUS_SUFFIXES or Path(text).is_file()
    except OSError:  # a name the file system refuses (too long, …) is a text
        return False


def text_rows(texts, pairs=None) -> tuple[Iterator[tuple[str, str | None]], bool]:
    """((text, second text or None) rows, whether there are pairs) of what the SAE helpers take, as training reads
    it: a corpus file (a pathlib.Path, or a str that ends in .txt/.tsv/.jsonl or names an existing file:
    reading.CorpusFile's formats), one text (any other str), a list or stream of texts with `pairs` (second
    texts, None for a text alone), or of (text, second text) tuples."""
    if isinstance(texts, Path) or (isinstance(texts, str) and _names_a_file(texts)):
        if pairs is not None:
            raise AnalysisError("a corpus file holds its own pairs (A<TAB>B in a .tsv); leave pairs out.")
        corpus = reading.CorpusFile(texts)
        return corpus.rows(), corpus.has_pairs
    if isinstance(texts, str):
        texts, pairs = [texts], None if pairs is None else [pairs]
    if pairs is not None:
        return zip(texts, pairs, strict=True), True
    rows = iter(texts)
    first = next(rows, None)
    if first is None:
        return iter(()), False
    as_row = (lambda row: tuple(row)) if isinstance(first, tuple) else (lambda text: (text, None))
    if isinstance(first, tuple) and len(first) != 2:
        raise AnalysisError(f"texts[0] is a tuple of {len(first)}; pass (text, second text) pairs or plain texts.")
    return (as_row(row) for row in itertools.chain([first], rows)), isinstance(first, tuple)


def text_batch(model, texts, pairs=None, max_length: int | None = None, *, cut: bool = False):
    """One padded Batch of every row text_rows reads (for held-out sets, checks and spliced fidelity), each text
    whole: a text longer than max_length tokens (None: the model's positions) is refused, never cut, since a score
    on part of a text is not the score asked for. cut=True (diffing's comparisons) cuts such texts to max_length
    instead and warns with how many."""
    rows, has_pairs = text_rows(texts, pairs)
    try:
        rows = list(rows)
    except ValueError as error:  # zip(strict=True): texts and pairs of different lengths
        if isinstance(error, MinibertError):  # a corpus line's own error, already named
            raise
        raise AnalysisError(f"texts and pairs have different lengths ({error}); pass one second text (or None) "
                            f"per text.") from None
    if not rows:
        raise AnalysisError("no texts given; pass a text, a list of texts, (text, pair) tuples or a corpus file.")
    first, second = [a for a, _ in rows], [b for _, b in rows] if has_pairs else None
    positions = model.config.max_tokens
    limit = positions if max_length is None else min(max_length, positions)
    batch, too_long = tokenized_within(model, first, second, limit)
    if not too_long:
        return batch
    fix = f"pass max_length= up to {positions}" if limit < positions else \
        f"split them (this model reads at most {positions} tokens)"
    counted = f"{too_long} of the {len(rows)} texts {'has' if too_long == 1 else 'have'} more than {limit} tokens " \
              f"([CLS] and [SEP] counted)"
    if not cut:
        raise AnalysisError(f"{counted}; held-out texts are read whole, never cut: {fix}, or pass shorter texts.")
    warnings.warn(f"{counted} and {'was' if too_long == 1 else 'were'} cut to their first {limit}; to read them "
                  f"whole, {fix}.", AnalysisWarning, stacklevel=outside_minibert())
    return batch


def tokenized_within(model, first: list[str], second: list[str] | None, limit: int):
    """(the texts tokenized to at most `limit` tokens, how many of them were longer and cut): tokenized with one
    token of room first, so that a row using it is a cut one, and again at `limit` only if one is."""
    batch = model.tokenize(first, second, max_length=limit + 1)
    cut = int(np.sum(np.asarray(batch.attention_mask).sum(1) > limit))
    return (model.tokenize(first, second, max_length=limit) if cut else batch), cut


def token_activations(model, texts, hook_name: str, max_length: int | None = None, special: bool = False, *,
                      pairs=None) -> np.ndarray:
    """[N, d] the hook's value at every real token of `texts` ([CLS]/[SEP] left out unless special), each text
    whole and padded in one batch (no packing): for held-out sets and checks. A text longer than max_length
    (None: the model's positions) is refused (text_batch). texts and pairs: as text_rows reads them (a text, a
    list, pairs, (text, pair) tuples or a corpus file: the rows an SAE was trained on)."""
    batch = text_batch(model, texts, pairs, max_length)
    _, cache = model.run_with_cache(batch, names=[hook_name])
    values = np.asarray(cache[hook_name], np.float32)
    values = values.reshape(*values.shape[:2], -1)
    keep = np.asarray(batch.attention_mask) > 0
    if not special:
        ids = np.asarray(batch.input_ids)
        keep &= ~np.isin(ids, [model.tokenizer.cls_token_id, model.tokenizer.sep_token_id])
    return values[keep]


def _packed_capture(model, state, arrays, *, hook_names: tuple[str, ...]):
    """[B, T, Σd] the hooks' values on packed rows, each flattened per token and laid side by side, every
    document attending only to itself (the survey's step)."""
    captured = packed_captures(model, state, arrays, list(hook_names))
    return jnp.concatenate([captured[name].reshape(*arrays["input_ids"].shape, -1) for name in hook_names], -1)


def forward_batches(models, rows, pairs: bool, hook_names: tuple[str, ...], max_length: int,
                    batch_tokens: int) -> Iterator[np.ndarray]:
    """[n, M, Σd] the real, non-special tokens' values at `hook_names` (side by side, one forward captures them
    all, so shuffling keeps a token's values together) in each of M models (sharing one tokenizer) of each packed
    forward batch, in the order the packer fills: the texts are read, tokenized and packed once, and every model
    runs the same packed rows (one pass of each model per batch)."""
    first = models[0]
    buckets = packing.checked_buckets(None, max_length, min(model.config.max_tokens for model in models))
    rows_per_batch = packing.batch_rows(buckets[-1], batch_tokens, 1)
    packer = packing.Packer(buckets, lambda size: rows_per_batch * buckets[-1] // size)
    captures = [model.jit(_packed_capture, static_argnames=("hook_names",)) for model in models]

    cut = reading.CutCount(max_length, first.config.max_tokens)

    def run(batches):
        for size, packed in batches:
            values = []
            for model, capture in zip(models, captures, strict=True):  # each its own positions and pad id
                arrays = packing.packed_rows(model, size, packed, rows_per_batch * buckets[-1] // size, "real")
                keep = (arrays["attention_mask"] > 0) & (arrays["is_cls"] == 0) & (arrays["is_sep"] == 0)
                value = np.asarray(capture(model.state, arrays, hook_names=hook_names), np.float32)
                values.append(value[keep])
            yield np.stack(values, axis=1)

    for chunk in reading.tokenized_chunks(first, rows, pairs, max_length, first=0):
        cut.add(chunk)
        packer.add(chunk)
        yield from run(packer.full_batches())
    yield from run(packer.flush())


class ActivationCache:
    """A directory of one .npy file per forward batch and a JSON record of what they were computed from; the
    record says complete (with the texts' digest) only once every batch is written."""

    def __init__(self, directory, settings: dict):
        self.directory, self.settings = Path(directory), settings
        self.info = self.directory / CACHE_INFO

    def complete(self) -> dict | None:
        """The record of a finished cache of the same settings; None where there is none or it was cut short.
        A finished cache of other settings is refused rather than overwritten."""
        record = self._own_record()
        if record is None or not record.get("complete"):
            return None
        if record.get("settings") != self.settings:
            raise DataFileError(f"{self.directory} caches activations of other settings ({record.get('settings')}); "
                                f"pass another cache directory, or delete this one.")
        return record

    def _own_record(self) -> dict | None:
        """This directory's cache record; None where the directory is new or empty. A directory holding anything
        else — files without our record, or an activations.json we did not write — is refused: writing the
        cache would replace a user's 000000.npy or activations.json."""
        if self.directory.exists() and not self.directory.is_dir():
            raise DataFileError(f"cache={self.directory} is a file; pass a directory for the activation cache.")
        if not self.info.is_file():
            if self.directory.is_dir() and any(self.directory.iterdir()):
                raise DataFileError(f"cache={self.directory} holds files but no activation cache ({CACHE_INFO}); "
                                    f"pass a new or empty directory, so nothing of yours is overwritten.")
            return None
        try:
            record = json.loads(self.info.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            record = None
        if not isinstance(record, dict) or "settings" not in record:
            raise DataFileError(f"{self.info} is not a minibert activation-cache record; pass a new or empty "
                                f"directory as cache, so nothing of yours is overwritten.")
        return record

    def read(self, record: dict, texts_digest: str) -> Iterator[np.ndarray]:
        if record["texts"] != texts_digest:
            raise DataFileError(f"{self.directory} caches the activations of other texts; pass the texts it was "
                                f"written from, another cache directory, or delete this one.")
        names = [self.directory / f"{index:06d}.npy" for index in range(record["batches"])]
        missing = [name.name for name in names if not name.is_file()]
        if missing:  # checked before the first batch: training does not stop half-way
            raise DataFileError(f"{self.directory} says it holds {len(names)} batches but {', '.join(missing[:3])} "
                                f"{'is' if len(missing) == 1 else 'are'} missing; delete the directory to rebuild "
                                f"the cache.")
        return (self._load(name) for name in names)

    @staticmethod
    def _load(name: Path) -> np.ndarray:
        try:
            return np.load(name)
        except (OSError, ValueError, EOFError) as error:
            raise DataFileError(f"{name} is not a whole cached batch ({error}); delete its directory to rebuild the "
                                f"cache.") from None

    def write(self, batches: Iterator[np.ndarray], digest: TextsDigest) -> Iterator[np.ndarray]:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._record({"settings": self.settings, "complete": False})
        count = 0
        for values in batches:
            temporary = self.directory / f"{count:06d}.tmp.npy"
            np.save(temporary, values)
            os.replace(temporary, self.directory / f"{count:06d}.npy")
            count += 1
            yield values
        self._record({"settings": self.settings, "complete": True, "batches": count, "texts": digest.hexdigest()})

    def _record(self, record: dict) -> None:
        temporary = self.info.with_suffix(".tmp")
        temporary.write_text(json.dumps(record, indent=1))
        os.replace(temporary, self.info)


def activations(model, texts: Iterable[str] | str | Path, hook_name: str, *, batch_size: int = 1024,
                batch_tokens: int | None = None, buffer_tokens: int = 32_768, max_length: int | None = None,
                seed: int = 0, cache: str | Path | None = None) -> ActivationStream:
    """Batches [batch_size, d] of shuffled token activations at `hook_name` ([CLS]/[SEP] left out).

    texts: a list or stream of strings or of (text, second text) tuples, or a corpus file (.txt one text per
    line, .tsv pairs, .jsonl; as corpus.survey reads it; see text_rows). Documents are packed into rows of
    `max_length` tokens (default 128, or the model's positions if fewer; longer documents truncated),
    `batch_tokens` tokens per forward (default: packing.default_batch_tokens of the device). The buffer fills to
    `buffer_tokens`, is shuffled, and gives out half of itself as batches before it refills, so tokens of one
    text spread over many batches. The last, partial batch is dropped. cache: a directory to write the
    activations to, or to read them from when it holds a finished cache of the same weights, hook, max_length
    and texts (the texts are then read and hashed, but not run); a directory holding anything else is refused.
    The stream's `.source` names the hook and weights it reads (Trainer.train checks it).
    """
    hook_width(model, hook_name)
    source = {"hook_name": hook_name, "weights": weights_digest(model)}
    batches = shuffled_batches(model, texts, (hook_name,), source, batch_size=batch_size,
                               batch_tokens=batch_tokens, buffer_tokens=buffer_tokens, max_length=max_length,
                               seed=seed, cache=cache)
    return ActivationStream(batches, source, batch_size)


def shuffled_batches(model, texts, hook_names: tuple[str, ...], cache_key: dict, *, batch_size: int,
                     batch_tokens: int | None, buffer_tokens: int, max_length: int | None, seed: int,
                     cache) -> Iterator[np.ndarray]:
    """activations' batches [batch_size, Σd] of the hooks `hook_names` side by side (one forward per batch
    captures them all), for sae.activations (one hook) and transcoders.activations (an MLP's input and output).
    cache_key: the weights digest and what names the hooks, for the cache's record (which adds max_length)."""
    check_counts(batch_size, buffer_tokens, batch_tokens, seed)
    if batch_tokens is None:
        batch_tokens = packing.default_batch_tokens(jax.devices()[0].platform)
    max_length = min(128, model.config.max_tokens) if max_length is None else max_length
    rows, pairs = text_rows(texts)
    digest = TextsDigest()
    rows = digest.through(rows)
    store = None
    if cache is not None:
        store = ActivationCache(cache, {**cache_key, "max_length": max_length})
        record = store.complete()
        if record is not None:
            for _ in rows:  # the texts' digest, without running the model
                pass
            return shuffled(store.read(record, digest.hexdigest()), batch_size, buffer_tokens, seed)
    forward = (values[:, 0] for values in forward_batches((model,), rows, pairs, tuple(hook_names), max_length,
                                                          batch_tokens))
    return shuffled(forward if store is None else store.write(forward, digest), batch_size, buffer_tokens, seed)


def check_counts(batch_size, buffer_tokens, batch_tokens, seed) -> None:
    """The streams' counts, checked when the stream is made (a generator would only fail when first iterated, with
    Python's own TypeError or ZeroDivisionError): whole numbers, the buffer at least two batches."""
    counts = {"batch_size": (batch_size, 1), "buffer_tokens": (buffer_tokens, 1), "seed": (seed, 0)}
    if batch_tokens is not None:
        counts["batch_tokens"] = (batch_tokens, 1)
    for name, (value, smallest) in counts.items():
        if not is_whole(value) or value < smallest:
            raise AnalysisError(f"{name}={value!r} must be a whole number ≥ {smallest}"
                                f"{' (or None: the default)' if name == 'batch_tokens' else ''}.")
    if buffer_tokens < 2 * batch_size:
        raise AnalysisError(f"buffer_tokens={buffer_tokens} must hold at least two batches ({2 * batch_size}).")


class ActivationStream:
    """activations' batches, and what they read: source = {"hook_name", "weights" (the model's weights digest)},
    which Trainer.train records and checks, so a resumed SAE does not train on another hook of the same width."""

    what = "activations"  # what a batch holds, in the empty stream's message

    def __init__(self, batches: Iterator[np.ndarray], source: dict, batch_size: int):
        self.batches, self.source, self.batch_size, self.given = batches, source, batch_size, 0

    def __iter__(self) -> ActivationStream:
        return self

    def __next__(self) -> np.ndarray:
        try:
            batch = next(self.batches)
        except StopIteration:
            if not self.given:  # an empty stream would train or score nothing, silently
                raise AnalysisError(f"the texts gave no batch of {self.what}: none were given, or they hold fewer "
                                    f"than batch_size={self.batch_size} tokens (the last, partial batch is dropped); "
                                    f"pass more text or a smaller batch_size.") from None
            raise
        self.given += 1
        return self.batch_of(batch)

    def batch_of(self, values: np.ndarray):
        """What the stream gives for one shuffled batch of its hooks' values side by side."""
        return values


def shuffled(chunks: Iterator[np.ndarray], batch_size: int, buffer_tokens: int, seed: int) -> Iterator[np.ndarray]:
    """Batches of batch_size rows from a bounded buffer of chunks' rows, shuffled each time it is drained."""
    rng = np.random.default_rng(seed)
    buffer: list[np.ndarray] = []
    held = 0

    def drain(keep: int):
        nonlocal buffer, held
        pool = np.concatenate(buffer)
        pool = pool[rng.permutation(len(pool))]
        out = (len(pool) - keep) // batch_size * batch_size
        buffer, held = [pool[out:]], len(pool) - out
        return [pool[i:i + batch_size] for i in range(0, out, batch_size)]

    for chunk in chunks:
        buffer.append(chunk)
        held += len(chunk)
        if held >= buffer_tokens:
            yield from drain(keep=buffer_tokens // 2)
    if buffer:
        yield from drain(keep=0)
