"""The site table (minibert.core.sites) says the true axes of every hook and which models have it, and docs/hooks.md
is generated from it."""

from __future__ import annotations

import re
from pathlib import Path

import jax.numpy as jnp
import pytest

from minibert import Model
from minibert.app.cli import main
from minibert.core.config import Config
from minibert.core.sites import SITES, Site, all_hook_names, hook_names, site, site_axes, site_doc
from minibert.families.registry import ARCHITECTURE_FAMILY, ARCHITECTURES, FAMILIES, config_for

DOCS = Path(__file__).resolve().parent.parent / "docs" / "hooks.md"
# Distinct sizes so every axis letter maps to one number (hook_sites traces a 2 × 3 batch); E is D's 24
# unless the family projects the embeddings. K is even: rotary families rotate pairs of dimensions.
SIZES = {"B": 2, "T": 3, "S": 3, "H": 4, "K": 6, "D": 24, "E": 24, "F": 7, "V": 11, "C": 3, "1": 1, "2": 2}
PROJECTED_E = 9


def tiny_config(architecture: str, layers: int = 2) -> Config:
    """A tiny config of any registered architecture at SIZES (projected embeddings where the family has them)."""
    projects = FAMILIES[ARCHITECTURE_FAMILY[architecture]].projection is not None
    return config_for(architecture, vocab_size=SIZES["V"], hidden_size=SIZES["D"], num_hidden_layers=layers,
                      num_attention_heads=SIZES["H"], intermediate_size=SIZES["F"], max_position_embeddings=8,
                      id2label=("a", "b", "c"), embedding_size=PROJECTED_E if projects else None)


def test_docs_table_is_what_the_code_generates(tmp_path):
    out = tmp_path / "hooks.md"
    main(["hooks", "--output", str(out)])
    assert DOCS.read_text() == out.read_text(), "docs/hooks.md is stale: run `minibert hooks --output docs/hooks.md`"


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_documented_axes_match_traced_shapes(architecture):
    cfg = tiny_config(architecture)
    sizes = SIZES | {"E": cfg.embed_dim}
    documented = set(all_hook_names())
    for name, (shape, _) in Model(cfg).hook_sites.items():
        axes, _ = site_doc(name)
        options = [re.findall(r"\w", option) for option in axes.split(" or ")]
        assert any(tuple(sizes[a] for a in option) == shape for option in options), (name, axes, shape)
        assert re.sub(r"^blocks\.\d+\.", "blocks.0.", name) in documented


def test_documented_names_keep_every_models_forward_order():
    """all_hook_names merges the architectures' lists: each model's encoder names appear in its own order
    (embed.hook_project, which BERT lacks, between the embedding layernorm and hook_full_embed), heads
    after every encoder name (the heads read the last block; their order among themselves differs by class:
    BertForPreTraining runs the pooler before the MLM head)."""
    documented = all_hook_names()
    heads = ("pooler.", "mlm_head.", "unembed.", "nsp_head.", "classifier.", "discriminator.")
    encoder = [n for n in documented if not n.startswith(heads)]
    assert documented[:len(encoder)] == encoder
    for architecture in ARCHITECTURES:
        if tiny_config(architecture).family.norm != "post":
            continue  # a pre-LN block runs ln1 and ln2 elsewhere (sites.BLOCK_ORDER; checked below)
        names = [n for n in Model(tiny_config(architecture, 1)).hook_names if not n.startswith(heads)]
        assert sorted(names, key=documented.index) == names, architecture
    assert documented.index("embed.ln.hook_out") + 1 == documented.index("embed.hook_project")
    assert documented.index("embed.hook_project") + 1 == documented.index("hook_full_embed")


class CallOrder:
    """Hooks that watch every site (so attention takes its explicit path) and write down each call, in order."""

    def __init__(self):
        self.names: list[str] = []

    def __call__(self, name, value):
        self.names.append(name)
        return value

    def active(self, name):
        return True


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_table_lists_each_models_sites_in_the_order_its_forward_runs_them(architecture):
    """For every registered family and head, sites.hook_names(config) is the list of hook calls of a real
    forward pass (eager, every site watched), in the same order: ModernBERT's pre-LN blocks (ln1 before
    attention and none in block 0, ln2 before the MLP, ln_final), its rotary and GeGLU sites, BERT's post-LN
    ones, and every head."""
    cfg = tiny_config(architecture, layers=3)
    model = Model(cfg)
    calls = CallOrder()
    ids = jnp.ones((SIZES["B"], SIZES["T"]), jnp.int32)
    model.module(ids, jnp.zeros_like(ids), ids, calls)
    assert hook_names(cfg) == calls.names
    assert model.hook_names == calls.names  # what run_with_hooks and the analyses resolve names against


def test_sites_with_two_forms_pick_by_rank_and_unknown_names_are_named():
    assert site_axes("classifier.hook_logits") == ["B", "C"]
    assert site_axes("classifier.hook_logits", 3) == ["B", "T", "C"]
    assert site_axes("blocks.4.attn.hook_pattern") == ["B", "H", "T", "S"]
    assert site("blocks.1.ln2.hook_scale").axes == ("B", "T", "1")
    for unknown in ("blocks.0.hook_nothing", "attn.hook_q", "blocks.0.hook_full_embed", "mlm_head.ln.hook_out"):
        with pytest.raises(KeyError, match="no entry in minibert.core.sites.SITES"):
            site(unknown)
    with pytest.raises(ValueError, match="needs must be one of"):
        Site("x.hook_y", ("B",), "y", needs="a pooler")
    assert len({entry.name for entry in SITES}) == len(SITES)
