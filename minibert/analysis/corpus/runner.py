"""The survey: its settings checked, the corpus read a chunk at a time, packed batches through the jitted
step, the totals kept in a resume file, the result. (Named runner, not survey, so that the function
`corpus.survey` is not shadowed by a module of the same name.)"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import jax
import numpy as np

from minibert.analysis import heads
from minibert.analysis.corpus import distributed, packing, reading
from minibert.analysis.corpus.result import SurveyResult, weights_digest
from minibert.analysis.corpus.resume import ResumeFile, TextsDigest
from minibert.analysis.corpus.step import survey_step, zeros
from minibert.errors import AnalysisError

_RUNS = itertools.count()  # surveys started in this process: names each run's handshake keys


def survey(model, texts: Iterable[str] | Path, pairs: Iterable[str | None] | bool | None = None, *,
           batch_tokens: int | None = None, batch_size: int | None = None, max_length: int = 128,
           buckets: Sequence[int] | None = None, pack: bool = True, segment_ids: str = "real",
           js_divergence: bool = False, progress: bool = True, devices: Sequence | None = None,
           sep_normalization: str = "clark", reduce: str = "global", resume: str | Path | None = None,
           every: int = 100_000, timeout: float = 60.0, strict: bool = False) -> SurveyResult:
    """Clark et al. head statistics over a corpus (docs/definitions.md), each averaged over documents.

    texts: a pathlib.Path to a corpus file in read_corpus's formats (pairs=True reads a .txt as A<TAB>B),
      streamed; with several processes each reads and tokenizes only its share. Or lists / iterables of
      strings, streamed a chunk at a time; with several processes, each process's own share. pairs then
      holds one item per text, as tokenize takes them: the second text, or None for a text that stands
      alone, so one survey may mix single texts and pairs (pairs=[None, "B", ...]). Segments longer than
      max_length tokens are truncated (longest first) and counted (result.counts["truncated"]); a file's
      blank lines are skipped and counted (result.counts["blank_lines"]).
    strict: refuse, naming it, a blank line or a document longer than max_length instead of counting it.
    batch_tokens: tokens per batch (default: default_batch_tokens of the devices' platform); rows of
      length T run batch_tokens // T at a time (rounded down to a multiple of the device count). With
      several processes: per process. A batch whose attention patterns cannot fit the devices' memory
      is refused before any work.
    batch_size: rows per batch for every row length instead (a multiple of the device count).
    buckets: the row lengths (default: default_buckets(max_length)); one compiled program each.
    pack: several documents per row (True), or one (False).
    segment_ids: "real" (sentence B gets type 1) or "zeros" (Clark et al.'s extraction script).
    js_divergence: also accumulate the Jensen–Shannon matrix between heads (much more work per batch).
    sep_normalization: "clark" (sep_to_sep / 2, rest_to_sep / (n − 2), the paper's; default) or "count".
    devices: the local devices to shard each batch over (default: all of them).
    reduce: "global" — with several processes (minibert.app.distributed.initialize()) they run in
      lockstep and each returns the result of the whole corpus; "local" — this process's share alone,
      no communication: add the processes' results up with SurveyResult.merge.
    resume: a file for the running totals and the position, rewritten atomically every `every`
      documents (per process) and at the end; a survey that finds it resumes there (same settings,
      weights, corpus — every byte of a corpus file, every text read so far of lists — and process
      count, else an error naming what differs). With reduce="global" process 0 writes it and every
      process reads it (put it on a disk they share); with "local" and several processes each process
      keeps its own (the file name plus ".process<i>").
    timeout: seconds a process waits at each chunk for the others before it stops with a
      DistributedError naming the missing ones; keep it below initialize()'s heartbeat_timeout.
    """
    plan = Plan.checked(model, batch_tokens, batch_size, max_length, buckets, pack, segment_ids, js_divergence,
                        devices, sep_normalization, reduce, every, timeout)
    share = distributed.process_share() if isinstance(texts, Path) else None
    source = reading.Source(texts, pairs, share, strict)
    run_id = plan.run_id(model, source, resume is not None)
    saved = ResumeFile.open(resume, reduce, run_id, zeros(model, js_divergence))
    return _Survey(model, plan, source, saved, strict, progress).run()


@dataclasses.dataclass
class Plan:
    """A survey's checked settings: how batches are shaped and where they run."""

    batch_tokens: int
    batch_size: int | None
    max_length: int
    buckets: tuple[int, ...]
    pack: bool
    segment_ids: str
    js_divergence: bool
    devices: list
    sep_normalization: str
    reduce: str
    every: int
    timeout: float

    @classmethod
    def checked(cls, model, batch_tokens, batch_size, max_length, buckets, pack, segment_ids, js_divergence,
                devices, sep_normalization, reduce, every, timeout) -> Plan:
        heads.check_segment_ids(segment_ids)
        heads.check_sep_normalization(sep_normalization)
        if reduce not in ("global", "local"):
            raise AnalysisError(f"reduce must be 'global' (every process gets the whole corpus's result) or 'local' "
                                f"(this process's share, to merge later), not {reduce!r}.")
        for name, value in (("batch_tokens", batch_tokens), ("batch_size", batch_size), ("max_length", max_length),
                            ("every", every)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))):
                raise AnalysisError(f"{name} must be a whole number (an int); got {value!r}.")
        if not every >= 1 or not timeout > 0:
            raise AnalysisError(f"every (documents between resume saves) must be at least 1 and timeout (seconds) "
                                f"positive; got every={every}, timeout={timeout}.")
        devices = distributed.checked_devices(devices, reduce)
        batch_tokens = packing.default_batch_tokens(devices[0].platform) if batch_tokens is None else batch_tokens
        if batch_size is not None and (batch_size < 1 or batch_size % len(devices)):
            suggestion = len(devices) * max(1, batch_size // len(devices))
            raise AnalysisError(f"batch_size {batch_size} must be a positive multiple of the {len(devices)} devices "
                                f"each batch is sharded over; try batch_size={suggestion}.")
        if batch_tokens < 1:
            raise AnalysisError(f"batch_tokens must be positive (tokens per batch, e.g. 2048); got {batch_tokens}.")
        buckets = packing.checked_buckets(buckets, max_length, model.config.max_tokens)
        plan = cls(batch_tokens, batch_size, max_length, buckets, pack, segment_ids, js_divergence, devices,
                   sep_normalization, reduce, every, timeout)
        packing.check_batch_fits(model.config, plan.rows, buckets, devices, batch_tokens, batch_size)
        return plan

    @property
    def distributed(self) -> bool:
        return self.reduce == "global" and jax.process_count() > 1

    def rows(self, size: int) -> int:
        """Rows per batch for rows of `size` tokens."""
        return self.batch_size or packing.batch_rows(size, self.batch_tokens, len(self.devices))

    def settings(self, model) -> dict:
        """What the result records: the settings that shaped it and the model (its path and its weights' hash)."""
        return dict(batch_tokens=None if self.batch_size else self.batch_tokens, batch_size=self.batch_size,
                    max_length=self.max_length, buckets=list(self.buckets), pack=self.pack,
                    segment_ids=self.segment_ids, sep_normalization=self.sep_normalization, devices=len(self.devices),
                    model=model.source, weights=weights_digest(model))

    def run_id(self, model, source: reading.Source, resuming: bool) -> dict:
        """What processes and resume files compare: the settings, the weights' hash (the model's path may
        differ by host) and the corpus file's fingerprint."""
        settings = {k: v for k, v in self.settings(model).items() if k not in ("model", "weights")}
        run_id = dict(settings, js_divergence=self.js_divergence, reduce=self.reduce, processes=jax.process_count(),
                      chunk=reading.CHUNK, every=-(-self.every // reading.CHUNK) * reading.CHUNK,
                      corpus=source.fingerprint)
        if self.distributed or resuming:
            run_id["weights"] = weights_digest(model)
        return run_id


class _Survey:
    """One survey run: the packer, the running totals on the device, the counts, and the batch in flight."""

    def __init__(self, model, plan: Plan, source: reading.Source, saved: ResumeFile, strict: bool, progress: bool):
        self.model, self.plan, self.source, self.saved, self.strict = model, plan, source, saved, strict
        self.mesh, replicated, self.by_rows = distributed.mesh_over(plan.devices, plan.distributed)
        self.state = distributed.placed_state(model, self.mesh)
        self.step = survey_step(model, plan.js_divergence, plan.sep_normalization)
        self.totals = distributed.replicated(saved.totals or zeros(model, plan.js_divergence), replicated)
        self.packer = packing.Packer(plan.buckets, plan.rows, plan.pack)
        self.packer.used = set(saved.used)
        show = progress and (not plan.distributed or jax.process_index() == 0)
        self.bar = _progress(source.total, show)
        self.in_flight: tuple | None = None  # (totals after the last batch sent, its documents)
        self.counts = dict(batches=0, tokens_run=0, real_tokens=0, truncated=0)
        self.texts = TextsDigest()
        self.tag = f"minibert/survey/{next(_RUNS)}"

    def run(self) -> SurveyResult:
        with distributed.named_peer_failures(self.plan.distributed):
            chunks = self._chunks()
            self._loop(chunks)
            if self.plan.distributed:
                self.counts = distributed.summed_over_processes(self.counts)
            self._finish_bar()
            totals = {name: np.asarray(value, np.float64) for name, value in self.totals.items()}
        return self._result(totals)

    def _chunks(self):
        """Tokenized chunks after the resume position; with several processes in lockstep, the first chunk's
        texts are read before the processes compare their settings."""
        skip = self.saved.chunks * reading.CHUNK
        if self.source.file is not None:  # the file's fingerprint covers every byte it has
            documents = self.source.rows(skip)
        else:
            documents = self.saved.skipped(self.source.rows(0), self.texts)
        if self.plan.distributed:
            first = list(itertools.islice(documents, reading.CHUNK))
            documents = itertools.chain(first, documents)
            distributed.check_processes_agree(self.saved.run_id, self.saved.chunks,
                                              first if self.source.fingerprint is None else None)
        return reading.tokenized_chunks(self.model, documents, self.source.pairs, self.plan.max_length, skip,
                                        self.strict)

    def _loop(self, chunks) -> None:
        """Chunk by chunk: pack, agree with the other processes, run the full batches, save every `every`."""
        plan, every = self.plan, self.saved.run_id["every"]
        for index in itertools.count(self.saved.chunks):
            chunk = next(chunks, None)
            if chunk is not None:
                self._add(chunk, index)
            if plan.distributed:
                distributed.await_peers(self.tag, index, plan.timeout)
            batches, more = distributed.agreed(self.packer.full_batches(), plan.buckets, more=chunk is not None)
            self._run(batches)
            if not more:
                break
            if self.saved.path is not None and (index + 1) * reading.CHUNK % every == 0:
                self._keep(index + 1)
        if self.saved.path is not None:
            self._keep(index + 1)
        else:
            self._run(distributed.agreed(self.packer.flush(), plan.buckets, more=False)[0])

    def _add(self, chunk: reading.Tokenized, index: int) -> None:
        lengths = chunk.attention_mask.sum(1)
        if lengths.max() > self.plan.buckets[-1]:
            raise AnalysisError(f"document {index * reading.CHUNK + int(lengths.argmax())} has {lengths.max()} tokens "
                                f"but the largest bucket is {self.plan.buckets[-1]}; add a bucket of "
                                f"{self.plan.max_length} (max_length).")
        self.counts["truncated"] += chunk.truncated
        self.packer.add(chunk)

    def _run(self, batches) -> None:
        """Each batch through the jitted step, one in flight while the host prepares the next."""
        for size, packed in batches:
            local = packing.packed_rows(self.model, size, packed, self.plan.rows(size), self.plan.segment_ids)
            documents = int(local["documents"].max(1).sum())
            self.counts["batches"] += 1
            self.counts["tokens_run"] += local["input_ids"].size
            self.counts["real_tokens"] += int(local["attention_mask"].sum())
            self.totals = self.step(self.state, self.totals,
                                    {k: jax.make_array_from_process_local_data(self.by_rows, v)
                                     for k, v in local.items()})
            if self.in_flight is not None:
                jax.block_until_ready(self.in_flight[0])
                if self.bar is not None:
                    self.bar.update(self.in_flight[1])
            self.in_flight = (self.totals, documents)

    def _keep(self, chunks: int) -> None:
        """Run what the packer holds and save the totals: the position is then a whole number of chunks."""
        self._run(distributed.agreed(self.packer.flush(), self.plan.buckets, more=False)[0])
        host = {name: np.asarray(value) for name, value in self.totals.items()}
        everywhere = distributed.summed_over_processes(self.counts) if self.plan.distributed else self.counts
        if not self.plan.distributed or jax.process_index() == 0:
            counts = {k: v + self.saved.counts.get(k, 0) for k, v in everywhere.items()}
            texts = None if self.source.file is not None else self.texts.hexdigest()
            self.saved.save(chunks, host, self.packer.used, counts, texts)

    def _finish_bar(self) -> None:
        if self.bar is not None:
            if self.in_flight is not None:
                self.bar.update(self.in_flight[1])
            self.bar.close()

    def _result(self, totals: dict) -> SurveyResult:
        plan = self.plan
        counts = {key: value + self.saved.counts.get(key, 0) for key, value in self.counts.items()}
        if self.source.file is not None:  # each process scanned the whole file: count its blank lines once
            alone = plan.distributed or self.source.share is None or self.source.share[0] == 0
            counts["blank_lines"] = self.source.blank_lines if alone else 0
        documents = int(round(float(totals.pop("documents"))))
        if documents == 0 and (plan.reduce == "global" or jax.process_count() == 1):
            raise AnalysisError("survey got no texts; pass a non-empty list (or iterable) of strings, or a file.")
        js = totals.pop("js_divergence", None)
        settings = dict(plan.settings(self.model), devices=self.mesh.size,
                        processes=jax.process_count() if plan.distributed else 1, reduce=plan.reduce)
        mean = {name: totals[name] / max(documents, 1) for name in heads.STATISTICS}
        return SurveyResult(mean, documents, js, settings, counts)


def _progress(total: int | None, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="doc", desc="survey", file=sys.stderr)

