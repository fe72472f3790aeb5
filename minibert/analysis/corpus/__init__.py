"""The corpus runner: stream texts (or pairs) through the model and accumulate head statistics on the device.

    result = minibert.analysis.corpus.survey(model, texts, pairs=None)      # lists, or iterables of str
    result = minibert.analysis.corpus.survey(model, Path("corpus.tsv"))     # a file, streamed
    result.mean["to_sep"]       # [L, H], averaged over documents (layers and heads 0-indexed)
    result.counts               # batches, tokens, documents cut to max_length, a file's blank lines
    result.save("survey")       # survey.npz + survey.json

How a corpus runs:
- Texts are tokenized a chunk at a time (CHUNK documents), so an iterable corpus streams in bounded
  memory, and the host tokenizes the next chunk while the device runs a batch.
- Documents are packed into rows of a few fixed lengths (default_buckets: 128 for segments up to 128
  tokens; 128, 256, 512, … for longer ones), several to a row, first fit and longest first, so rows
  carry little padding and only one program per row length is compiled. Packed documents stay apart:
  explicit position ids restart at each document, and a hook lets each token attend only to its own
  document (the softmax gives every other key exactly 0), so each document's patterns are the ones it
  has alone. pack=False puts one document per row instead (then use several buckets).
- A batch is `batch_tokens // row length` rows (rounded down to a multiple of the device count): 2048
  tokens on a CPU, where bigger batches fall out of the caches. The jitted step is cached per model,
  so a second survey on the same model compiles nothing.
- Each batch is one jitted step — forward, the statistics of heads.layer_statistics layer by layer
  (per-token weights make a row's sum the sum of its documents' statistics), sums into running totals —
  so attention patterns never leave the device. XLA drops what the statistics do not read (the last
  layer's values, output projection and FFN, the pooler).
- SurveyResult.counts says how many batches ran and how many tokens they held, padding included, and
  how many blank lines a corpus file had (skipped) and how many documents were cut to max_length
  (strict=True refuses both instead).
- Each row length compiles one program (benchmarks/RESULTS.md says how long); minibert's persistent compilation
  cache, on by default (docs/compiled.md), keeps the programs for the next process.

Scale-out (docs/scale_out.md): the batch axis is sharded over the local devices (`jax.sharding`, one mesh
axis "data"). Several processes (each started with minibert.app.distributed.initialize(), i.e.
jax.distributed) run in one of two ways:
- reduce="global" (default): every process calls `survey(model, path)` with the same corpus file and reads
  and tokenizes only its share (every `jax.process_count()`-th text, streamed); the processes run in
  lockstep, one global batch at a time (`jax.make_array_from_process_local_data`), agree before each
  chunk on how many batches of each row length to run (a process with fewer documents runs empty
  ones), and all return the statistics of the whole corpus. At the start they check that they run the
  same settings, weights and corpus, and a process that stops answering ends the run with a
  DistributedError naming it after `timeout` seconds.
- reduce="local": no communication; each process returns the result of its own share, and
  `SurveyResult.merge` adds them up (the same engine a Ray fleet uses: corpus_ray.survey_ray).
resume=path keeps the running totals and the position (rewritten atomically every `every` documents);
a survey started again with the same resume file goes on there, with totals identical to an
uninterrupted run.

One module per concern: reading (corpus files, lists, tokenizing a chunk at a time), packing (rows and
batches), step (the jitted step), distributed (several processes), resume (resume files), result
(SurveyResult: merge, save, load) and runner (survey itself).
"""

from __future__ import annotations

from minibert.analysis.corpus.packing import batch_rows, default_batch_tokens, default_buckets
from minibert.analysis.corpus.reading import CHUNK, CorpusFile, read_corpus
from minibert.analysis.corpus.result import MERGE_KEYS, SurveyResult, output_paths
from minibert.analysis.corpus.runner import survey

__all__ = [
    # surveying
    "survey",
    "SurveyResult",
    "MERGE_KEYS",
    "output_paths",
    # reading a corpus
    "read_corpus",
    "CorpusFile",
    "CHUNK",
    # batching
    "default_buckets",
    "default_batch_tokens",
    "batch_rows",
]
