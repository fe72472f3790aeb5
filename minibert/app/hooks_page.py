"""docs/hooks.md, written from the site table and the family registry (`minibert hooks --output docs/hooks.md`):
which models have which sites, the axis letters, and the table of every site. The table itself (core/sites.py)
knows no family; which families lack a site is read here, off the registry."""

from __future__ import annotations

import textwrap

from minibert.core.site_names import NORMALIZED_RESID_POST, PROJECT, RESID_POST, TOKEN_TYPE_EMBED
from minibert.core.sites import (
    BLOCK_NEEDS,
    HEAD_PARTS,
    VARIATION_NEEDS,
    Site,
    all_hook_names,
    block_group,
    inside_block,
    site,
)
from minibert.families.registry import ARCHITECTURES, FAMILIES, architectures_with


def hook_table(names: list[str], n_layers: int | str) -> str:
    """The Markdown table of the hook points `names` (block 0 stands for every block)."""
    rows = ["| hook name | axes | what it holds | exists on |", "| --- | --- | --- | --- |"]
    for name in names:
        inner = inside_block(name)
        if inner is not None and not name.startswith("blocks.0."):
            continue
        entry = site(name)
        shown = f"blocks.{{i}}.{inner}" if inner is not None else name
        rows.append(f"| `{shown}` | {entry.axes_text} | {entry.equation} | {_exists_on(entry)} |")
    return "\n".join(rows) + f"\n\n`{{i}}` runs over the {n_layers} blocks (0-indexed).\n"


def _exists_on(entry: Site) -> str:
    """Which models have the site: its need's description, less the families whose blocks do not run its group."""
    lacking = [f.name for f in FAMILIES.values() if entry.per_block and block_group(entry.name) not in f.block_order]
    if not lacking:
        return _needs_text(entry.needs)
    if entry.needs is None:
        return f"every family but {', '.join(lacking)}"
    return f"{_needs_text(entry.needs)}, not {', '.join(lacking)}"


def _needs_text(needs: str | None) -> str:
    if needs is None:
        return "every model"
    if needs == "token_types":
        return "families with segments"
    if needs == "projection":
        return "ELECTRA, ALBERT (projected embeddings)"
    if needs in VARIATION_NEEDS:
        return VARIATION_NEEDS[needs][0]
    if needs in BLOCK_NEEDS:
        return BLOCK_NEEDS[needs][0]
    return HEAD_PARTS[needs]


def hooks_page() -> str:
    """docs/hooks.md: what `minibert hooks --output docs/hooks.md` writes — which models have which sites (read
    off the family and architecture tables), the axis letters, and the table of every site."""
    def on(part: str) -> str:
        return ", ".join(architectures_with(part))

    segments = ", ".join(f.name for f in FAMILIES.values() if f.token_types)
    projecting = ", ".join(f.name + (" (when embedding_size ≠ hidden_size)" if f.projection == "when_sizes_differ"
                                     else "") for f in FAMILIES.values() if f.projection)
    paragraphs = [
        f"Generated from the code (`minibert.core.sites.SITES`) by `minibert hooks --output docs/hooks.md`: every hook "
        f"point of every architecture minibert loads (families: {', '.join(f.name for f in FAMILIES.values())}; "
        f"{len(ARCHITECTURES)} architectures). `model.hook_names` lists one model's.",
        f"`pooler.*` exists on {on('pooler')}; `mlm_head.*` and `unembed.*` on {on('mlm')}; "
        f"`nsp_head.*` on {on('nsp')}; `discriminator.*` on {on('discriminator')}; `classifier.*` on "
        f"{on('classifier')}. `{TOKEN_TYPE_EMBED}` exists in {segments}; `{PROJECT}` in "
        f"{projecting}.",
        f"The table lists a post-LN block (BERT) in its order. A pre-LN block (ModernBERT) runs ln1 before attention "
        f"and ln2 before the MLP, has no {NORMALIZED_RESID_POST} (its blocks end at {RESID_POST}), and "
        f"ln_final follows the last block; `model.hook_names` gives each model's own order.",
        "Axis letters: B batch, T query positions, S key positions, H heads, K head dim, D model dim, "
        "E embedding width (= D unless the family projects), F ffn dim, V vocabulary, C classes.",
        "The head hooks carry TransformerLens' names (CHANGELOG.md lists the names they had before 0.3).",
    ]
    wrapped = (textwrap.fill(text, 100, break_on_hyphens=False) for text in paragraphs)
    return "# Hook points\n\n" + "".join(text + "\n\n" for text in wrapped) + hook_table(all_hook_names(), "L")
