"""The name of every hook site, written once: the forward, the families' block orders and step-throughs, the site
table (core/sites.py) and every tool name a site by these constants, never by a literal of their own. They are
public: `from minibert.core.site_names import PATTERN`.

Per-block sites are named without their "blocks.{i}." prefix (`in_block(3, PATTERN)` is "blocks.3.attn.hook_pattern",
`every_block(PATTERN)` the glob of every block's). A layernorm's three sites are its prefix and one of
LAYERNORM_LEAVES (`layernorm(LN1, LN_SCALE)` is "ln1.hook_scale"). This module imports nothing: core/shows.py
stands on it, and core/sites.py, which stands on the Config, is built from it.
"""

from __future__ import annotations

# The embeddings.
EMBED = "embed.hook_embed"
POS_EMBED = "embed.hook_pos_embed"
TOKEN_TYPE_EMBED = "embed.hook_token_type_embed"
PROJECT = "embed.hook_project"
FULL_EMBED = "hook_full_embed"

# A block's sites, and the groups of Family.block_order that hold several (a group's module appends each of its
# sites' leaves to its own name: "blocks.3.attn" + "hook_q").
ATTN, MLP = "attn", "mlp"
RESID_PRE = "hook_resid_pre"
Q = "attn.hook_q"
K = "attn.hook_k"
V = "attn.hook_v"
ROT_Q = "attn.hook_rot_q"
ROT_K = "attn.hook_rot_k"
QK = "attn.hook_qk"
C2C = "attn.hook_c2c"
C2P = "attn.hook_c2p"
P2C = "attn.hook_p2c"
ATTN_SCORES = "attn.hook_attn_scores"
PATTERN = "attn.hook_pattern"
Z = "attn.hook_z"
RESULT = "attn.hook_result"
ATTN_OUT = "hook_attn_out"
RESID_MID = "hook_resid_mid"
MLP_PRE = "mlp.hook_pre"
MLP_PRE_LINEAR = "mlp.hook_pre_linear"
MLP_POST = "mlp.hook_post"
MLP_OUT = "hook_mlp_out"
RESID_POST = "hook_resid_post"
NORMALIZED_RESID_POST = "hook_normalized_resid_post"

# The heads.
POOLER_OUT = "pooler.hook_pooler_out"
UNEMBED_IN = "unembed.hook_in"  # the MLM head's layernorm output, TransformerLens' name
UNEMBED_OUT = "unembed.hook_out"
NSP_OUT = "nsp_head.hook_nsp_out"
CLASSIFIER_LOGITS = "classifier.hook_logits"
DISCRIMINATOR_LOGITS = "discriminator.hook_logits"

# The layernorms: each prefix names three sites, one per leaf.
LN_SCALE, LN_NORMALIZED, LN_OUT = LAYERNORM_LEAVES = ("hook_scale", "hook_normalized", "hook_out")
EMBED_LN = "embed.ln"
LN1, LN2 = "ln1", "ln2"  # groups of Family.block_order too
LN_FINAL = "ln_final"
POOLER_LN = "pooler.ln"
MLM_LN = "mlm_head.ln"
CLASSIFIER_LN = "classifier.ln"
LAYERNORMS = (EMBED_LN, LN1, LN2, LN_FINAL, POOLER_LN, MLM_LN, CLASSIFIER_LN)


def layernorm(prefix: str, leaf: str) -> str:
    """One of a layernorm's sites: layernorm(LN1, LN_SCALE) → "ln1.hook_scale"."""
    return f"{prefix}.{leaf}"


def in_block(layer: int | str, site: str) -> str:
    """A per-block site's name in block `layer`: in_block(3, PATTERN) → "blocks.3.attn.hook_pattern" (a message
    meaning any block may pass "i")."""
    return f"blocks.{layer}.{site}"


def every_block(site: str) -> str:
    """The glob of a per-block site in every block: every_block(PATTERN) → "blocks.*.attn.hook_pattern"."""
    return f"blocks.*.{site}"


def leaf(site: str) -> str:
    """A site's last part, what its group's module appends to its own name: leaf(Q) → "hook_q"."""
    return site.rsplit(".", 1)[-1]


def under(name: str, site: str) -> str:
    """`site`'s hook name in the forward's module `name`, which appends the site's leaf: under("blocks.3.attn", Q) →
    "blocks.3.attn.hook_q", under("blocks.3", RESID_PRE) → "blocks.3.hook_resid_pre"."""
    return f"{name}.{leaf(site)}"
