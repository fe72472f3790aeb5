"""Shared pieces of the benchmarks: timing, machine description, checkpoints and synthetic inputs."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@dataclasses.dataclass
class Settings:
    quick: bool
    repeats: int  # timed runs per case (median reported)
    warmup: int
    smoke: bool = False  # CI's check that a script runs: tiny inputs, one timed call, outputs checked

    @classmethod
    def make(cls, quick: bool, smoke: bool = False) -> Settings:
        """7 timed runs after 2 warm-ups; quick: 3 after 1; smoke (CI checks that a script runs): 1, no warm-up."""
        if smoke:
            return cls(True, repeats=1, warmup=0, smoke=True)
        return cls(quick, repeats=3 if quick else 7, warmup=1 if quick else 2)


QUICK = "3 timed runs per case instead of 7"  # --quick's help where it means Settings.make's quick


def command_line(doc: str, smoke: str, quick: str | None = QUICK) -> argparse.ArgumentParser:
    """A benchmark's options, described by its docstring's first line: --quick (fewer timed runs, as `quick` says;
    None: no such option) and --smoke (CI's check that the script runs, at the size `smoke` says)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    if quick is not None:
        parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--smoke", action="store_true", help=smoke)
    return parser


# ---- timing -----------------------------------------------------------------------------------------------

# Pause before each timed call. PyTorch's OpenMP workers (libgomp) spin-wait ~5 ms after every parallel
# region; without a pause they hold a core while the next interleaved case starts, which slowed a jax
# matmul of 1–5 ms right after a torch one by up to 1.7× (XLA's pool goes idle in ~0.1 ms).
SETTLE_S = 0.01


def time_samples(cases: Mapping[str, Callable[[], object]], settings: Settings) -> dict[str, list[float]]:
    """Seconds of every timed call of each case. Cases run interleaved (one call of each per round), so
    background load on a shared machine falls on all of them alike; each call must block until done."""
    for fn in cases.values():
        for _ in range(settings.warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(settings.repeats):
        for name, fn in cases.items():
            time.sleep(SETTLE_S)
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def time_round_robin(cases: Mapping[str, Callable[[], object]], settings: Settings) -> dict[str, float]:
    """Median seconds per call of each case (time_samples)."""
    return {name: statistics.median(t) for name, t in time_samples(cases, settings).items()}


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def block(tree):
    """Wait for every array of a pytree (jax arrays; torch and NumPy pass through)."""
    import jax

    return jax.block_until_ready(tree)


# ---- the machine ------------------------------------------------------------------------------------------

def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def machine() -> dict[str, str]:
    import flax
    import jax
    import torch
    import transformers

    return {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "cpu": cpu_model(),
        "cores": str(os.cpu_count()),
        "memory": f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
        "jax devices": ", ".join(sorted({d.device_kind for d in jax.devices()})),
        "versions": (f"python {platform.python_version()}, jax {jax.__version__}, flax {flax.__version__}, "
                     f"torch {torch.__version__} ({torch.get_num_threads()} threads), "
                     f"transformers {transformers.__version__}"),
    }


# ---- checkpoints ------------------------------------------------------------------------------------------

def bundled_dir() -> Path:
    from minibert.io import sources

    return sources.resolve()




def make_bert_base(directory: Path, seed: int = 0) -> Path:
    """A randomly initialised bert-base-uncased-shaped BertModel saved with transformers (fixed seed),
    with the bundled checkpoint's vocab (the same 30522 WordPiece vocabulary)."""
    import torch
    import transformers

    if (directory / "model.safetensors").exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(architectures=["BertModel"])
    transformers.BertModel(cfg).eval().save_pretrained(directory)
    for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        if (bundled_dir() / name).exists():
            shutil.copy(bundled_dir() / name, directory / name)
    return directory


def tiny_checkpoint(directory: Path) -> Path:
    """A small random BertModel for --smoke runs (bert-base's layout, a fraction of its size), saved with
    transformers (fixed seed) with the bundled vocabulary."""
    import torch
    import transformers

    if not (directory / "model.safetensors").exists():
        directory.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=128, architectures=["BertModel"])
        transformers.BertModel(cfg).eval().save_pretrained(directory)
        (directory / "vocab.txt").write_text((bundled_dir() / "vocab.txt").read_text())
    return directory


def scratch_dir() -> Path:
    """Where the benchmarks keep what they build (the random bert-base): reused across runs."""
    path = Path(os.environ.get("MINIBERT_BENCH_CACHE", Path(tempfile.gettempdir()) / "minibert-bench"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def hf_model(directory: Path, attn: str):
    """transformers' BertModel from `directory` with attention implementation "eager" or "sdpa"."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers.BertModel.from_pretrained(str(directory), attn_implementation=attn).eval()


# ---- inputs -----------------------------------------------------------------------------------------------

def random_ids(batch: int, length: int, vocab: int = 30522, seed: int = 0) -> dict[str, np.ndarray]:
    """Full-length rows `[CLS] … [SEP] … [SEP]` of ordinary word-piece ids, sentence B typed 1."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1996, vocab, size=(batch, length)).astype(np.int32)
    ids[:, 0], ids[:, length // 2], ids[:, -1] = 101, 102, 102
    types = np.zeros_like(ids)
    types[:, length // 2 + 1:] = 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": np.ones_like(ids)}


WORDS = ("the of and to in a is that for it as was with be by on not he i this are or his from at which but "
         "have an they you were her she there been one all we their has would when if so no will more out up "
         "into do any your what some can time could them than may other about these then its only first new "
         "two people like also after made over did many years before must through back where most much even "
         "way well down because each just those how too good very make world still see own work long day get "
         "life never under last might great old year off come since against go came right used take three "
         "small large house report court water city school music river church film team game party war story "
         "model head layer word token attention sentence language reader study paper result figure table").split()


def english_like_texts(n: int, seed: int = 0, min_tokens: int = 8,
                       max_tokens: int = 128) -> tuple[list[str], list[str]]:
    """n deterministic sentence pairs (A, B) of common English words and punctuation whose
    `[CLS] A [SEP] B [SEP]` segments run from about min_tokens to max_tokens word pieces."""
    rng = np.random.default_rng(seed)

    def sentence(words: int) -> str:
        out = []
        for i in range(words):
            out.append(WORDS[rng.integers(len(WORDS))])
            if i + 1 < words and rng.random() < 0.08:
                out[-1] += ","
        return " ".join(out).capitalize() + "."

    texts, pairs = [], []
    for _ in range(n):
        total = int(rng.integers(min_tokens, max_tokens + 1)) - 3  # [CLS], [SEP], [SEP]
        words = max(2, int(total / 1.12))  # ~1.12 word pieces per word with its punctuation
        a = max(1, int(words * rng.uniform(0.3, 0.7)))
        texts.append(sentence(a))
        pairs.append(sentence(max(1, words - a)))
    return texts, pairs


# ---- peers in other interpreters --------------------------------------------------------------------------

def transformer_lens_python() -> str | None:
    """An interpreter with TransformerLens (< 4, which still has HookedEncoder): $TRANSFORMER_LENS_PYTHON,
    else this interpreter if it has it, else /tmp/tlvenv/bin/python if it exists; None when none has it."""
    candidates = [os.environ.get("TRANSFORMER_LENS_PYTHON"), sys.executable, "/tmp/tlvenv/bin/python"]
    for python in filter(None, candidates):
        if not Path(python).exists():
            continue
        probe = subprocess.run([python, "-c", "from transformer_lens import HookedEncoder"],
                               capture_output=True, text=True)
        if probe.returncode == 0:
            return python
    return None


def fmt(x: float | None, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "—"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def check_times(times: Mapping[str, float]) -> None:
    """A smoke run's check of its timings: every case timed, each a finite positive number of seconds."""
    bad = {name: t for name, t in times.items() if not (np.isfinite(t) and t > 0)}
    assert times and not bad, f"timings not finite and positive: {bad or 'none measured'}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def report(text: str, out: Path | None) -> None:
    """A benchmark's report: appended to `out` (a RESULTS-style file) when given, else printed."""
    if out:
        with out.open("a") as f:
            f.write(text)
    else:
        print(text)
