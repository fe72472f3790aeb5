"""The package's shape (docs/architecture.md): one version string, the 0.2 names 0.4 removed are gone (CHANGELOG.md
lists each), and each "where do I add…" of docs/architecture.md tried by adding a toy one here."""

from __future__ import annotations

import importlib
import inspect
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest

import minibert
from minibert.config import Config

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=12,
            max_position_embeddings=16)


# ---- one version string -----------------------------------------------------------------------------------------

def test_the_version_is_written_once():
    """pyproject.toml reads minibert.__version__ (setuptools' dynamic version, read statically as a build reads it),
    `minibert --version` prints it, and CHANGELOG.md has its section."""
    from setuptools.config import expand

    from minibert.app import cli

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "minibert.__version__"}
    assert expand.read_attr("minibert.__version__", root_dir=ROOT) == minibert.__version__
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args(["--version"])
    assert exit_.value.code == 0
    assert f"## {minibert.__version__}\n" in (ROOT / "CHANGELOG.md").read_text()


def test_the_cli_prints_the_version(capsys):
    from minibert.app import cli

    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert capsys.readouterr().out == f"minibert {minibert.__version__}\n"


# ---- the 0.2 names are gone (CHANGELOG.md, 0.4.0) ---------------------------------------------------------------

REMOVED_ATTRIBUTES = [  # (module, old name as CHANGELOG.md writes it)
    ("minibert.config", "FAMILY_VALUES"), ("minibert.config", "FIELDS_WITHOUT"),
    ("minibert.checkpoint", "LAYER_KEYS"), ("minibert.checkpoint", "HEAD_KEYS"), ("minibert.sources", "HUB_FILES"),
    ("minibert.analysis.embeddings", "attention_to_word"), ("minibert.analysis.embeddings", "word_positions"),
    ("minibert.analysis.interventions", "SWEEP_BUDGET_BYTES"), ("minibert.analysis.interventions", "item_bytes"),
    ("minibert.analysis.mixing", "MEMORY_BUDGET"), ("minibert.analysis.mixing", "chunk_size"),
    ("minibert.analysis.corpus", "initialize"),
]
OLD_HOOKS = ["mlm.ln.hook_scale", "mlm.ln.hook_normalized", "mlm.ln.hook_out", "mlm.hook_logits", "pooler.hook_out",
             "nsp.hook_logits"]


def _removed_table() -> str:
    text = (ROOT / "CHANGELOG.md").read_text()
    return text[text.index("### Removed"):text.index("### Moved")]


@pytest.mark.parametrize("module, name", REMOVED_ATTRIBUTES)
def test_a_removed_name_is_gone_and_listed(module, name):
    assert not hasattr(importlib.import_module(module), name)
    assert re.search(rf"\b{name}\b", _removed_table()), f"CHANGELOG.md's removed table does not list {name}"


def test_the_old_hook_names_are_unknown_and_listed():
    from minibert.hooks import HookError, resolve_names
    from minibert.sites import all_hook_names

    model = minibert.Model(Config(**TINY, architecture="BertForPreTraining"))
    for old in OLD_HOOKS:
        assert old not in all_hook_names() and f"`{old}`" in _removed_table().replace("hook `", "`")
        with pytest.raises(HookError, match="no hook point matches"):
            resolve_names(old, model.hook_names, model.config.architecture)


def test_the_removed_keywords_methods_and_cli_alias_are_gone():
    from minibert.analysis import corpus, heads
    from minibert.app import cli
    from minibert.viz._html import View
    from minibert.viz.features import FeatureBrowser

    assert importlib.util.find_spec("minibert.deprecation") is None
    assert "checkpoint" not in inspect.signature(corpus.survey).parameters
    for statistics in (heads.layer_statistics, heads.head_statistics, heads.js_divergence_batch):
        assert "attention_mask" not in inspect.signature(statistics).parameters
    assert not hasattr(View, "document") and not hasattr(FeatureBrowser, "document")
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args(["stats", "corpus.txt", "--checkpoint", "run.resume"])
    assert exit_.value.code == 2
    table = _removed_table()
    assert all(old in table for old in ("checkpoint=PATH", "--checkpoint", "attention_mask=", "View.document()"))


def test_inputs_are_not_a_tuple():
    inputs = minibert.Model(Config(**TINY)).inputs({"input_ids": np.array([[2, 5, 3]])})
    with pytest.raises(TypeError):
        ids, types, mask = inputs
    with pytest.raises(TypeError):
        inputs[2]  # noqa: B018
    assert re.search(r"model\.inputs\(batch\)\[2\]", _removed_table())
