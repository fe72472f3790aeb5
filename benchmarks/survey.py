"""The corpus survey (Clark et al. head statistics over many segments) against the seeds' pipeline, and
how many programs a mixed-length workload compiles."""

from __future__ import annotations

import numpy as np

import minibert
from minibert import corpus
from minibert.analysis import heads

from harness import Settings, block, bundled_dir, hf_model, markdown_table, random_ids, timed


# ---- the seeds' pipeline: transformers eager with output_attentions, NumPy statistics per document ----------

def document_statistics(att: np.ndarray, ids: np.ndarray, cls_id: int, sep_id: int, punct_ids) -> dict:
    """ANALYSIS.md's statistics of one document: att [L, H, n, n] over its n real tokens, ids [n]."""
    n = att.shape[-1]
    sep, cls, punct = ids == sep_id, ids == cls_id, np.isin(ids, punct_ids)
    to = lambda columns, rows=slice(None): att[:, :, rows][..., columns].sum((-1, -2))
    p = 0.9999 * att + 0.0001 / n
    row_entropy = -(p * np.log(p)).sum(-1)  # [L, H, n]
    return {
        "self": np.trace(att, axis1=-2, axis2=-1) / n,
        "next": np.trace(att, offset=1, axis1=-2, axis2=-1) / n,
        "prev": np.trace(att, offset=-1, axis1=-2, axis2=-1) / n,
        "to_cls": to(cls) / n,
        "to_sep": to(sep) / n,
        "to_punct": to(punct) / n,
        "sep_to_sep": to(sep, sep) / sep.sum(),
        "rest_to_sep": to(sep, ~sep) / (n - sep.sum()),
        "entropy": row_entropy.mean(-1),
        "cls_entropy": row_entropy[..., 0],
        "uniform_entropy": np.full(att.shape[:2], np.log(n)),
    }


def seeds_pipeline(tokenizer, model, texts, pairs, batch_size: int = 32, max_length: int = 128) -> tuple[dict, dict]:
    """Batches of 32 in corpus order, padded to their longest, through transformers (`model`, eager
    attention) with output_attentions; statistics per document in NumPy; averaged over documents.
    Returns ({statistic: [L, H]}, {"tokenize" | "forward" | "statistics": seconds, "padded_tokens": n})."""
    import time

    import torch

    vocab = tokenizer.get_vocab()
    punct_ids = [vocab[p] for p in (".", ",")]
    totals, documents = None, 0
    spent = dict(tokenize=0.0, forward=0.0, statistics=0.0, padded_tokens=0)
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            t0 = time.perf_counter()
            enc = tokenizer(texts[start:start + batch_size], pairs[start:start + batch_size], padding=True,
                            truncation=True, max_length=max_length, return_tensors="pt")
            t1 = time.perf_counter()
            att = torch.stack(model(**enc, output_attentions=True).attentions).numpy()  # [L, B, H, T, T]
            t2 = time.perf_counter()
            for b, n in enumerate(enc["attention_mask"].sum(1).tolist()):
                stats = document_statistics(att[:, b, :, :n, :n], enc["input_ids"][b, :n].numpy(),
                                            tokenizer.cls_token_id, tokenizer.sep_token_id, punct_ids)
                totals = stats if totals is None else {k: totals[k] + v for k, v in stats.items()}
                documents += 1
            t3 = time.perf_counter()
            spent["tokenize"] += t1 - t0
            spent["forward"] += t2 - t1
            spent["statistics"] += t3 - t2
            spent["padded_tokens"] += int(enc["input_ids"].numel())
    return {k: v / documents for k, v in totals.items()}, spent


def survey_padded_tokens(lengths: np.ndarray, buckets, batch_size: int = 32) -> int:
    """Tokens corpus.survey runs: every batch is batch_size rows of its bucket's length."""
    return sum(size * batch_size for size, _ in corpus._batches(lengths, buckets, batch_size))


def survey(settings: Settings, texts, pairs) -> tuple[str, dict]:
    directory = bundled_dir()
    model = minibert.load()
    result, cold = timed(lambda: corpus.survey(model, texts, pairs, progress=False))
    traces = model.traces
    _, again = timed(lambda: corpus.survey(model, texts, pairs, progress=False))
    fine = tuple(range(16, 129, 16))
    _, fine_time = timed(lambda: corpus.survey(model, texts, pairs, buckets=fine, progress=False))
    import transformers

    tokenizer, hf = transformers.BertTokenizerFast.from_pretrained(str(directory)), hf_model(directory, "eager")
    (reference, spent), seeds = timed(lambda: seeds_pipeline(tokenizer, hf, texts, pairs))
    error = max(float(np.abs(result.mean[k] - reference[k]).max()) for k in heads.STATISTICS)
    lengths = np.asarray(model.tokenize(texts, pairs, max_length=128).attention_mask.sum(1))
    padded = {"default": survey_padded_tokens(lengths, corpus.default_buckets(128)),
              "fine": survey_padded_tokens(lengths, fine)}
    met = lambda ratio: "yes" if ratio >= 3 else "**no**"
    rows = [
        ["seeds' pipeline: transformers eager + output_attentions, batches of 32 in corpus order, NumPy per "
         "document", f"{seeds:.1f} s", f"{len(texts) / seeds:.0f}", f"{spent['padded_tokens']:,}", "1.00×", "", ""],
        [f"minibert.corpus.survey(model, texts, pairs), first call ({traces} programs compiled)", f"{cold:.1f} s",
         f"{len(texts) / cold:.0f}", f"{padded['default']:,}", f"{seeds / cold:.2f}×", "≥ 3×", met(seeds / cold)],
        ["the same call again (compiles again: each call builds a new jitted step)", f"{again:.1f} s",
         f"{len(texts) / again:.0f}", f"{padded['default']:,}", f"{seeds / again:.2f}×", "≥ 3×", met(seeds / again)],
        [f"survey with buckets every 16 tokens {fine}", f"{fine_time:.1f} s", f"{len(texts) / fine_time:.0f}",
         f"{padded['fine']:,}", f"{seeds / fine_time:.2f}×", "—", "—"],
    ]
    real = int(lengths.sum())
    text = (f"{len(texts)} sentence pairs `[CLS] A [SEP] B [SEP]`, {lengths.min()}–{lengths.max()} tokens "
            f"(mean {lengths.mean():.0f}; {real:,} real tokens), all-MiniLM-L6-v2, all {len(heads.STATISTICS)} "
            f"Clark statistics for every head. Largest difference between the two pipelines' [L, H] means: "
            f"{error:.1e}. Models are loaded before timing. The seeds' pipeline spent {spent['forward']:.1f} s in the forward, "
            f"{spent['statistics']:.1f} s in NumPy statistics and {spent['tokenize']:.1f} s tokenizing.\n\n"
            + markdown_table(["pipeline", "time", "segments/s", "tokens run (padded)", "speed-up", "target", "met"],
                             rows))
    return text, {"seeds_s": seeds, "seeds_split": spent, "survey_first_s": cold, "survey_again_s": again,
                  "survey_fine_buckets_s": fine_time, "padded_tokens": padded, "real_tokens": real,
                  "max_abs_diff": error, "traces_first_call": traces}


# ---- compilation over mixed lengths ----------------------------------------------------------------------

def compile_counts(settings: Settings, texts, pairs) -> tuple[str, dict]:
    rows, out = [], {}
    model = minibert.load()
    _, first = timed(lambda: corpus.survey(model, texts, pairs, progress=False))
    _, again = timed(lambda: corpus.survey(model, texts, pairs, progress=False))
    rows.append([f"corpus.survey, {len(texts)} segments (length buckets {corpus.default_buckets(128)})",
                 str(model.traces), f"{first:.1f} s", f"{again:.1f} s", f"{first - again:.1f} s"])
    out["survey"] = {"traces": model.traces, "first_s": first, "again_s": again}

    rng = np.random.default_rng(0)
    lengths = rng.choice(np.arange(8, 129), size=8 if settings.quick else 24, replace=False)
    batches = [random_ids(8, int(T), seed=i) for i, T in enumerate(lengths)]
    for label, pad in (("model.run, 8 rows each, lengths as they come", False),
                       ("model.run, the same batches padded up to a power of two", True)):
        model = minibert.load()
        prepared = [padded_to_bucket(b) if pad else b for b in batches]
        run_all = lambda: [block(model.run(b)[0]) for b in prepared]
        _, first = timed(run_all)
        _, again = timed(run_all)
        rows.append([f"{label} ({len(batches)} lengths {lengths.min()}–{lengths.max()})", str(model.traces),
                     f"{first:.1f} s", f"{again:.1f} s", f"{first - again:.1f} s"])
        out[label] = {"traces": model.traces, "first_s": first, "again_s": again}
    header = ["workload", "programs traced (model.traces)", "first pass", "second pass", "compile time (difference)"]
    return markdown_table(header, rows), out


def padded_to_bucket(batch: dict) -> dict:
    T = batch["input_ids"].shape[1]
    size = next(s for s in corpus.default_buckets(128) if s >= T)
    return {k: np.pad(v, ((0, 0), (0, size - T))) for k, v in batch.items()}
