"""Shared test helpers: tiny random Hugging Face BERT models saved to disk, and the bundled checkpoint."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The persistent compilation cache (minibert.runtime.cache) goes to a folder of this run, never the user's cache folder;
# subprocesses the tests start inherit it, and it goes when the run ends.
if "MINIBERT_CACHE_DIR" not in os.environ:
    os.environ["MINIBERT_CACHE_DIR"] = tempfile.mkdtemp(prefix="minibert-test-jax-cache-")
    atexit.register(shutil.rmtree, os.environ["MINIBERT_CACHE_DIR"], ignore_errors=True)

import numpy as np
import pytest

import minibert
from minibert.io import sources

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_vocab(directory, vocab_size: int) -> None:
    """A vocab.txt of `vocab_size` entries: specials, then letters and made-up wordpieces."""
    words = list("abcdefghijklmnopqrstuvwxyz.,!?") + [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
    words += [f"w{i}" for i in range(vocab_size)]
    (directory / "vocab.txt").write_text("\n".join((SPECIAL + words)[:vocab_size]) + "\n")
    (directory / "tokenizer_config.json").write_text('{"do_lower_case": true, "model_max_length": 512}')


def make_hf_model(directory, architecture: str = "BertModel", *, seed: int = 0, scale: float = 0.3,
                  safe_serialization: bool = True, dtype=None, **config):
    """Build a tiny random HF model, randomise every weight (LayerNorms too), save it; return the torch model."""
    import torch
    import transformers

    settings = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=37, max_position_embeddings=64, type_vocab_size=2)
    settings |= config
    cfg = transformers.BertConfig(**settings, architectures=[architecture])
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(scale * torch.randn_like(p))
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(directory)
    if not safe_serialization:  # transformers v5 writes safetensors only; make the legacy pickle by hand
        torch.save(model.state_dict(), directory / "pytorch_model.bin")
        (directory / "model.safetensors").unlink()
    write_vocab(directory, settings["vocab_size"])
    return model.float().eval() if dtype is not None else model


def random_batch(rng: np.random.Generator, batch: int, length: int, vocab_size: int, type_vocab_size: int = 2):
    """Ids with [CLS]=2 first, random lengths (padding), and a sentence-B segment where types allow."""
    ids = rng.integers(5, vocab_size, size=(batch, length))
    ids[:, 0] = 2
    lengths = rng.integers(2, length + 1, size=batch)
    lengths[0] = length
    mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int64)
    types = np.zeros_like(ids)
    for b, n in enumerate(lengths):
        split = n // 2
        types[b, split:n] = rng.integers(0, type_vocab_size)
    ids = np.where(mask == 1, ids, 0)
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}


# Tests marked by a fixture they use, wherever they live: a test that drives chromium is a browser test;
# the demo's tests share one run of `minibert demo` (a minute and more).
MARKERS_BY_FIXTURE = {"browser": pytest.mark.browser, "demo_log": pytest.mark.slow}


def pytest_collection_modifyitems(items):
    for item in items:
        for fixture, marker in MARKERS_BY_FIXTURE.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)


@pytest.fixture(scope="module")
def tiny_mlm(tmp_path_factory):
    """(minibert model, transformers model) of one tiny random BertForMaskedLM, per test module."""
    directory = tmp_path_factory.mktemp("tiny-mlm")
    hf_model = make_hf_model(directory, "BertForMaskedLM", scale=0.2)
    return minibert.load(directory), hf_model


@pytest.fixture(scope="session")
def bundled_dir():
    return sources.resolve()


@pytest.fixture(scope="session")
def bundled():
    return minibert.load()


class _CreatesFile:
    """Unpickling this object creates a file: the payload of a malicious pytorch_model.bin."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def malicious_bin(path, marker):
    """A pytorch_model.bin whose unpickling (without weights_only) creates `marker`; the test proves that it does."""
    import torch

    torch.save({"embeddings.word_embeddings.weight": torch.zeros(2, 2), "payload": _CreatesFile(marker)}, path)
    torch.load(path, weights_only=False)  # the payload is real: it runs when the file is unpickled unsafely
    assert marker.exists()
    marker.unlink()
    return path


# How long chromium's start or a page action (goto, click, a wait_for_* condition) may take before the test
# fails: a guard against a hang, not a speed limit. Playwright's own default of 30 s is too short for a 15 MB
# page inflating and drawing on a loaded 2-core CI machine; every wait still ends when its condition holds.
PAGE_HANG_GUARD_MS = 180_000


class Browser:
    """The launched chromium, whose pages wait for their conditions up to PAGE_HANG_GUARD_MS."""

    def __init__(self, launched):
        self.launched = launched

    def new_page(self, **options):
        page = self.launched.new_page(**options)
        page.set_default_timeout(PAGE_HANG_GUARD_MS)
        return page

    def __getattr__(self, name):  # everything else is Playwright's Browser
        return getattr(self.launched, name)


@pytest.fixture(scope="module")
def browser():
    """Headless Debian chromium driven by Playwright (the browser tests' one launch)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path="/usr/bin/chromium", timeout=PAGE_HANG_GUARD_MS,
                                     args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"])
        yield Browser(launched)
        launched.close()
