"""Corpus surveys on a Ray cluster: a map over blocks of lines plus a sum of a few kilobytes.

    from minibert.analysis import corpus_ray
    result = corpus_ray.survey_ray("corpus.txt", model=None, actors=8)   # a SurveyResult

Ray Data reads the file in blocks (`ray.data.read_text`); a pool of actors, each holding one loaded
model (and its compiled programs) for its whole life, surveys one batch of lines at a time with
`corpus.survey(..., reduce="local")`; the driver merges the per-batch results with
`SurveyResult.merge`. Nothing runs in lockstep: a worker that dies is restarted and its batches run
again (Ray Data's defaults for actor pools: max_restarts=-1, max_task_retries=-1), so a fleet where
machines fail finishes anyway. Connect to a cluster with `ray.init(address=...)` before calling
(docs/scale_out.md); without it, Ray starts a local one. Needs the `ray` extra:
`pip install "minibert[ray]"`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from minibert.analysis.corpus import CorpusFile, SurveyResult
from minibert.analysis.heads import STATISTICS
from minibert.errors import AnalysisError, DataFileError


def survey_ray(path: str | Path, model: str | None = None, *, pairs: bool = False, actors: int | None = None,
               cpus_per_actor: float = 1, block_documents: int = 4096, **settings) -> SurveyResult:
    """Clark et al. head statistics over the corpus file `path` (read_corpus formats), on Ray actors.

    model: what minibert.load takes (a name or a directory every worker can reach; default: bundled).
    actors: how many actors survey at once (default: as many as Ray has room for, up to the CPUs / cpus_per_actor).
    cpus_per_actor: CPUs Ray reserves for each actor; its XLA uses that many threads.
    block_documents: lines each actor call surveys; each call returns one mergeable result.
    settings: corpus.survey's keywords (max_length, batch_tokens, js_divergence, strict, …). Blank lines
    are skipped and counted in result.counts["blank_lines"] (strict=True refuses them), as survey does.
    """
    try:
        import ray
        import ray.data
    except ImportError:
        raise AnalysisError('survey_ray needs Ray; install it with pip install "minibert[ray]" (or "ray[data]").') \
            from None
    corpus = CorpusFile(path, pairs)  # checks the file and its format here, before any worker starts
    if not ray.is_initialized():
        ray.init()
    threads = max(1, int(cpus_per_actor))
    lines = ray.data.read_text(str(Path(path).resolve()), drop_empty_lines=False)  # blank lines are counted
    parts = lines.map_batches(
        BlockSurvey, batch_size=block_documents, batch_format="numpy", num_cpus=cpus_per_actor,
        concurrency=(1, actors) if actors else None,
        fn_constructor_kwargs=dict(model=model, corpus=corpus, settings=settings),
        runtime_env={"env_vars": {"XLA_FLAGS": f"--xla_cpu_multi_thread_eigen={str(threads > 1).lower()} "
                                               f"intra_op_parallelism_threads={threads}"}})
    blocks = [_result(row) for row in parts.iter_rows()]
    merged = SurveyResult.merge(block for block in blocks if block.documents)
    merged.counts["blank_lines"] = sum(block.counts.get("blank_lines", 0) for block in blocks)
    return merged


class BlockSurvey:
    """A Ray Data actor: loads the model once, then surveys batches of lines into one-row result tables."""

    def __init__(self, model: str | None, corpus: CorpusFile, settings: dict):
        import minibert
        from minibert.analysis import corpus as survey_module

        self.model, self.corpus, self.settings = minibert.load(model), corpus, settings
        self.survey = survey_module.survey

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        lines = [str(line) for line in batch["text"]]
        rows = [self.corpus.parse(line) for line in lines if line.strip()]
        blank = len(lines) - len(rows)
        if blank and self.settings.get("strict"):
            raise DataFileError(f"{self.corpus.path}: a block of lines holds {blank} blank line(s); remove blank "
                                f"lines, or survey with strict=False to skip and count them.")
        if rows:
            second = [b for _, b in rows] if self.corpus.has_pairs else None
            result = self.survey(self.model, [a for a, _ in rows], second, progress=False, reduce="local",
                                 **self.settings)
        else:  # only blank lines: a result of no documents, in the same columns, that carries their count
            result = self._empty()
        result.counts["blank_lines"] = blank
        return _row(result)

    def _empty(self) -> SurveyResult:
        cfg = self.model.config
        L, H = cfg.num_hidden_layers, cfg.num_attention_heads
        js = np.zeros((L * H, L * H)) if self.settings.get("js_divergence") else None
        return SurveyResult({name: np.zeros((L, H)) for name in STATISTICS}, 0, js)


def _row(result: SurveyResult) -> dict[str, np.ndarray]:
    """One result as a one-row table (arrays for the numbers, JSON for settings and counts)."""
    row = {f"mean.{name}": value[None] for name, value in result.mean.items()}
    if result.js_divergence is not None:
        row["js_divergence"] = result.js_divergence[None]
    row["documents"] = np.array([result.documents])
    row["info"] = np.array([json.dumps({"settings": result.settings, "counts": result.counts})])
    return row


def _result(row: dict) -> SurveyResult:
    info = json.loads(str(row["info"]))
    mean = {name[len("mean."):]: np.asarray(value) for name, value in row.items() if name.startswith("mean.")}
    js = np.asarray(row["js_divergence"]) if "js_divergence" in row else None
    return SurveyResult(mean, int(row["documents"]), js, info["settings"], info["counts"])
