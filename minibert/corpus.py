"""The corpus runner: stream texts (or pairs) through the model and accumulate head statistics on the device.

    result = minibert.corpus.survey(model, texts, pairs=None, batch_size=32, max_length=128)
    result.mean["to_sep"]       # [L, H], averaged over documents
    result.save("survey")       # survey.npz + survey.json

Length bucketing keeps the number of compiled shapes small (one per bucket) and padding low.
Each batch runs one jitted step — forward, statistics, masked sum into running totals — so
patterns never leave the device. With several local devices the batch axis is sharded over
them (`jax.sharding`); across hosts, call `jax.distributed.initialize()` first and every
process feeds its share of the corpus into the same global batches.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from minibert.analysis import heads


@dataclasses.dataclass
class SurveyResult:
    """Per-head statistics averaged over documents ([L, H] each; layers and heads 0-indexed)."""

    mean: dict[str, np.ndarray]
    documents: int
    js_divergence: np.ndarray | None = None  # [L·H, L·H], summed over documents (ANALYSIS.md)
    settings: dict = dataclasses.field(default_factory=dict)

    def table(self) -> list[dict]:
        return heads.head_table(self.mean)

    def save(self, path: str | Path) -> tuple[Path, Path]:
        """Write `path.npz` (arrays) and `path.json` (settings, documents, tidy per-head table)."""
        path = Path(path)
        arrays = {k: v for k, v in self.mean.items()}
        if self.js_divergence is not None:
            arrays["js_divergence"] = self.js_divergence
        npz, js = path.with_suffix(".npz"), path.with_suffix(".json")
        np.savez_compressed(npz, **arrays)
        js.write_text(json.dumps({"documents": self.documents, "settings": self.settings,
                                  "heads": _jsonable(self.table())}, indent=1))
        return npz, js


def _jsonable(rows):
    return [{k: (v.item() if isinstance(v, np.generic) else v) for k, v in row.items()} for row in rows]


def read_corpus(path: str | Path) -> tuple[list[str], list[str] | None]:
    """Texts from a file: one per line (.txt), `A<TAB>B` pairs (.tsv), or JSON lines with "text" or
    "text_a"/"text_b". Blank lines are skipped."""
    path = Path(path)
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"{path} holds no text; put one text per line (or A<TAB>B pairs in a .tsv).")
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in lines]
        if "text_a" in rows[0]:
            return [r["text_a"] for r in rows], [r["text_b"] for r in rows]
        return [r["text"] for r in rows], None
    if path.suffix == ".tsv":
        split = [line.split("\t") for line in lines]
        bad = [i + 1 for i, parts in enumerate(split) if len(parts) != 2]
        if bad:
            raise ValueError(f"{path}: lines {bad[:5]} do not have exactly two tab-separated texts.")
        return [a for a, _ in split], [b for _, b in split]
    return lines, None


def default_buckets(max_length: int) -> tuple[int, ...]:
    """Powers of two from 16 up to max_length: at most ~2× padding, log-many compiled shapes."""
    buckets, size = [], 16
    while size < max_length:
        buckets.append(size)
        size *= 2
    return (*buckets, max_length)


def _batches(lengths: np.ndarray, buckets: Sequence[int], batch_size: int):
    """(bucket length, row indices) for each batch: rows sorted by length, grouped by bucket."""
    order = np.argsort(lengths, kind="stable")
    bucket_of = np.searchsorted(np.asarray(buckets), lengths[order])
    for b, size in enumerate(buckets):
        rows = order[bucket_of == b]
        for start in range(0, len(rows), batch_size):
            yield size, rows[start:start + batch_size]


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="doc", desc="survey", file=sys.stderr)


def survey(model, texts: Sequence[str], pairs: Sequence[str] | None = None, *, batch_size: int = 32,
           max_length: int = 128, buckets: Sequence[int] | None = None, segment_ids: str = "real",
           js_divergence: bool = False, progress: bool = True, devices: Sequence | None = None) -> SurveyResult:
    """Clark et al. head statistics over a corpus (ANALYSIS.md), averaged per document.

    segment_ids: "real" (sentence B gets type 1) or "zeros" (Clark et al.'s extraction script).
    js_divergence: also accumulate the Jensen–Shannon matrix between heads.
    devices: the local devices to shard each batch over (default: all). batch_size must divide evenly.
    """
    if segment_ids not in ("real", "zeros"):
        raise ValueError(f"segment_ids must be 'real' or 'zeros', not {segment_ids!r}.")
    devices = list(devices or jax.local_devices())
    if batch_size % len(devices):
        raise ValueError(f"batch_size {batch_size} must be a multiple of the {len(devices)} devices it is sharded over.")
    tokenized = model.tokenize(list(texts), list(pairs) if pairs is not None else None, max_length=max_length)
    lengths = tokenized.attention_mask.sum(1)
    buckets = tuple(sorted(buckets or default_buckets(int(lengths.max()))))
    if lengths.max() > buckets[-1]:
        raise ValueError(f"the longest text has {lengths.max()} tokens but the largest bucket is {buckets[-1]}.")
    mesh = Mesh(np.array(devices), ("data",))
    rows_sharding = NamedSharding(mesh, PartitionSpec("data"))
    state = jax.device_put(model.state, NamedSharding(mesh, PartitionSpec()))
    step = _survey_step(model, js_divergence)
    totals = None
    bar = _progress(len(lengths), progress)
    for size, rows in _batches(lengths, buckets, batch_size):
        arrays = _padded_rows(tokenized, model, rows, size, batch_size, segment_ids)
        arrays = {k: jax.device_put(v, rows_sharding) for k, v in arrays.items()}
        totals = step(state, totals, arrays) if totals is not None else step(state, _zeros(model, js_divergence), arrays)
        if bar is not None:
            bar.update(len(rows))
    if bar is not None:
        bar.close()
    totals = jax.tree_util.tree_map(np.asarray, totals)
    documents = int(totals.pop("documents"))
    js = totals.pop("js_divergence", None)
    mean = {k: v / documents for k, v in totals.items()}
    settings = dict(batch_size=batch_size, max_length=max_length, buckets=list(buckets), segment_ids=segment_ids,
                    devices=len(devices), model=model.source)
    return SurveyResult(mean, documents, js, settings)


def _padded_rows(tokenized, model, rows, size, batch_size, segment_ids) -> dict[str, np.ndarray]:
    """The batch's rows cut to the bucket length, padded to batch_size with empty documents."""
    pad = batch_size - len(rows)

    def take(array, fill=0):
        part = array[rows, :size]
        part = np.pad(part, ((0, 0), (0, max(0, size - part.shape[1]))), constant_values=fill)
        return np.pad(part, ((0, pad), (0, 0)), constant_values=fill)

    ids, mask = take(tokenized.input_ids), take(tokenized.attention_mask)
    types = take(tokenized.token_type_ids) if segment_ids == "real" else np.zeros_like(ids)
    tok = model.tokenizer
    masks = heads.token_masks_from_ids(ids, mask, cls_id=tok.cls_token_id, sep_id=tok.sep_token_id,
                                       punct_ids=[tok.vocab[p] for p in (".", ",") if p in tok.vocab])
    doc_mask = (np.arange(batch_size) < len(rows)).astype(np.float32)
    # An empty padding document still needs one real token so its softmax rows stay finite.
    mask[len(rows):, 0] = 1
    return dict(input_ids=ids, token_type_ids=types, attention_mask=mask, doc_mask=doc_mask, **masks)


def _zeros(model, js: bool):
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    zeros = {name: jnp.zeros((L, H), jnp.float32) for name in heads.STATISTICS}
    zeros["documents"] = jnp.zeros((), jnp.float32)
    if js:
        zeros["js_divergence"] = jnp.zeros((L * H, L * H), jnp.float32)
    return zeros


def _survey_step(model, js: bool) -> Callable:
    forward = model.forward_fn(names="blocks.*.attn.hook_pattern")
    L = model.config.num_hidden_layers

    @jax.jit
    def step(state, totals, arrays):
        inputs = (arrays["input_ids"], arrays["token_type_ids"], arrays["attention_mask"])
        _, captured = forward(state, inputs)
        pattern = jnp.stack([captured[f"blocks.{i}.attn.hook_pattern"] for i in range(L)])  # [L, B, H, T, S]
        doc_mask = arrays["doc_mask"]
        stats = heads.head_statistics(pattern, arrays["attention_mask"], arrays["is_cls"], arrays["is_sep"],
                                      arrays["is_punct"])  # each [B, L, H]
        new = {name: totals[name] + jnp.einsum("BLH,B->LH", stats[name], doc_mask) for name in heads.STATISTICS}
        new["documents"] = totals["documents"] + doc_mask.sum()
        if js:
            new["js_divergence"] = totals["js_divergence"] + heads.js_divergence_batch(
                pattern, arrays["attention_mask"], doc_mask)
        return new

    return step
