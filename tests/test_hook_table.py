"""The hook table in docs/ is generated from the code and says the true axes of every hook."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from minibert import BertConfig, Model
from minibert.app.cli import all_hook_names, main
from minibert.config import ARCHITECTURES
from minibert.hooks import site_doc

DOCS = Path(__file__).resolve().parent.parent / "docs" / "hooks.md"
# Distinct sizes so every axis letter maps to one number (hook_sites traces a 2 × 3 batch).
SIZES = {"B": 2, "T": 3, "S": 3, "H": 4, "K": 5, "D": 20, "F": 7, "V": 11, "C": 3, "1": 1, "2": 2}


def test_docs_table_is_what_the_code_generates(tmp_path):
    out = tmp_path / "hooks.md"
    main(["hooks", "--output", str(out)])
    assert DOCS.read_text() == out.read_text(), "docs/hooks.md is stale: run `minibert hooks --output docs/hooks.md`"


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_documented_axes_match_traced_shapes(architecture):
    cfg = BertConfig(vocab_size=11, hidden_size=20, num_hidden_layers=2, num_attention_heads=4, intermediate_size=7,
                     max_position_embeddings=8, architecture=architecture, id2label=("a", "b", "c"))
    documented = set(all_hook_names())
    for name, (shape, _) in Model(cfg).hook_sites.items():
        axes, _ = site_doc(name)
        options = [re.findall(r"\w", option) for option in axes.split(" or ")]
        assert any(tuple(SIZES[a] for a in option) == shape for option in options), (name, axes, shape)
        assert re.sub(r"^blocks\.\d+\.", "blocks.0.", name) in documented
