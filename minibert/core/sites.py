"""The hook sites: one typed table of every hook point — its name, the axes of its value, the equation of
what it holds and which models have it.

Behaviour reads the table (which axes `Model.run` cuts back after padding, which sites activation patching
accepts, which names TransformerLens' shorthand may build), and docs/hooks.md is generated from it
(`minibert hooks --output docs/hooks.md`, app/hooks_page.py); nothing is parsed out of documentation text.
Its names are core/site_names.py's constants; per-block sites are named without their "blocks.{i}." prefix.
Axis letters are model.py's: B batch, T query positions, S key positions, H heads, K head dim, D model dim,
E embedding width, F ffn dim, V vocabulary, C classes.
"""

from __future__ import annotations

import dataclasses

from minibert.core.config import Config
from minibert.core.site_names import (
    ATTN_OUT,
    ATTN_SCORES,
    C2C,
    C2P,
    CLASSIFIER_LN,
    CLASSIFIER_LOGITS,
    DISCRIMINATOR_LOGITS,
    EMBED,
    EMBED_LN,
    FULL_EMBED,
    LN1,
    LN2,
    LN_FINAL,
    LN_NORMALIZED,
    LN_OUT,
    LN_SCALE,
    MLM_LN,
    MLP_OUT,
    MLP_POST,
    MLP_PRE,
    MLP_PRE_LINEAR,
    NORMALIZED_RESID_POST,
    NSP_OUT,
    P2C,
    PATTERN,
    POOLER_LN,
    POOLER_OUT,
    POS_EMBED,
    PROJECT,
    QK,
    RESID_MID,
    RESID_POST,
    RESID_PRE,
    RESULT,
    ROT_K,
    ROT_Q,
    TOKEN_TYPE_EMBED,
    UNEMBED_IN,
    UNEMBED_OUT,
    K,
    Q,
    V,
    Z,
    every_block,
    in_block,
    layernorm,
)

# What a site needs to exist: a head part (config.Heads' fields), the segment table or the embedding projection,
# or a forward variation of the family (Family.positions / mlp / norm; its own head stage, Family.head).

# Head part → what a model needs for its sites, in docs/hooks.md and in hooks' unknown-name errors.
HEAD_PARTS = {"pooler": "a pooler", "mlm": "a masked-LM head", "nsp": "a next-sentence head",
              "classifier": "a classifier", "discriminator": "ELECTRA's discriminator"}
VARIATION_NEEDS = {  # need → (what exists on it, for docs/hooks.md; whether a config has it)
    "rotary": ("rotary families (ModernBERT)", lambda c: c.family.positions == "rotary"),
    "glu": ("gated-MLP families (ModernBERT)", lambda c: c.family.mlp == "glu"),
    "final_norm": ("families with a LayerNorm after the last block (ModernBERT)", lambda c: c.family.final_norm),
    "position_table": ("families with a position table (all but ModernBERT)", lambda c: c.family.positions == "table"),
    "pooler_norm": ("ModernBERT's sequence classifiers", lambda c: c.family.head is not None and c.heads.pooler),
    "token_norm": ("ModernBERT's token classifiers",
                   lambda c: c.family.head is not None and c.heads.classifier == "token"),
    "disentangled": ("disentangled-attention families (DeBERTa-v2/v3)", lambda c: bool(c.family.score_terms)),
}
# Needs that differ between the blocks of one model: need → (where the site exists, for docs/hooks.md; whether
# block `layer` of a config has it).
BLOCK_NEEDS = {
    "first_ln1": ("every block but ModernBERT's block 0 (its embeddings end with a LayerNorm)",
                  lambda c, layer: layer != 0 or c.family.first_ln1),
}
NEEDS = (*HEAD_PARTS, "token_types", "projection", *VARIATION_NEEDS, *BLOCK_NEEDS)


@dataclasses.dataclass(frozen=True)
class Site:
    """One hook site. `name` is the full hook name, or for a per-block site its name inside a block."""

    name: str
    axes: tuple[str, ...]  # the axis letters of its value, e.g. ("B", "H", "T", "S")
    equation: str  # what it holds
    per_block: bool = False  # one per encoder block: blocks.{i}.<name>
    needs: str | None = None  # one of NEEDS; None: every model has it
    other_axes: tuple[str, ...] | None = None  # a second form (classifier logits: per sequence or per token)

    def __post_init__(self):
        if self.needs not in (None, *NEEDS):
            raise ValueError(f"site {self.name}: needs must be one of {NEEDS} or None; got {self.needs!r}")

    @property
    def shapes(self) -> tuple[tuple[str, ...], ...]:
        return (self.axes,) if self.other_axes is None else (self.axes, self.other_axes)

    @property
    def axes_text(self) -> str:
        """"[B, T, H, K]", or both forms: "[B, C] or [B, T, C]"."""
        return " or ".join(f"[{', '.join(shape)}]" for shape in self.shapes)

    def exists_in(self, config: Config, layer: int | None = None) -> bool:
        """Whether a model with this config has the site (a per-block site: in block `layer`; None: in some). A
        per-block site exists where the family's block runs its group (Family.block_order)."""
        if self.per_block and block_group(self.name) not in config.family.block_order:
            return False
        if self.needs is None:
            return True
        if self.needs in BLOCK_NEEDS:
            return layer is None or BLOCK_NEEDS[self.needs][1](config, layer)
        if self.needs == "token_types":
            return config.family.token_types
        if self.needs == "projection":
            return config.has_projection
        if self.needs in VARIATION_NEEDS:
            return VARIATION_NEEDS[self.needs][1](config)
        return bool(getattr(config.heads, self.needs))


def _layernorm(prefix: str, width: str, *, per_block: bool = False, needs: str | None = None,
               out: str | None = None, rows: tuple[str, ...] = ("B", "T")) -> tuple[Site, ...]:
    """The three sites of one layernorm over `width`-wide vectors, one per `rows` (a pooled vector: ("B",));
    `out` names its output where that is not <prefix>.hook_out (the MLM head's, TransformerLens' unembed.hook_in)."""
    return (
        Site(layernorm(prefix, LN_SCALE), (*rows, "1"), "σ = sqrt(mean((x − μ)²) + eps)", per_block, needs),
        Site(layernorm(prefix, LN_NORMALIZED), (*rows, width),
             "(x − μ)/σ — before gain and bias (TransformerLens' meaning)", per_block, needs),
        Site(out or layernorm(prefix, LN_OUT), (*rows, width), "(x − μ)/σ · γ + β — the layernorm's output",
             per_block, needs),
    )


BTD, BTE, BTHK, BSHK, BHTS = ("B", "T", "D"), ("B", "T", "E"), ("B", "T", "H", "K"), ("B", "S", "H", "K"), \
    ("B", "H", "T", "S")

# In forward order: the embeddings, one post-LN block (Family.block_order orders others), then the heads in the
# order the head stage runs them (the pooler before the heads that read it).
SITES: tuple[Site, ...] = (
    Site(EMBED, BTE, "W_E[input_ids] — token embeddings (E = D unless the family projects)"),
    Site(POS_EMBED, BTE, "W_pos[positions] — absolute position embeddings: rows 0…T−1 (RoBERTa's from "
         "pad_token_id + 1), or the position_ids given", needs="position_table"),
    Site(TOKEN_TYPE_EMBED, BTE, "W_type[token_type_ids] — segment embeddings", needs="token_types"),
    *_layernorm(EMBED_LN, "E"),
    Site(PROJECT, BTD, "LayerNorm(embed + pos + token_type) W_proj + b_proj — E-wide embeddings "
         "projected to D", needs="projection"),
    Site(FULL_EMBED, BTD, "LayerNorm(embed + pos + token_type), projected to D where the family projects "
         f"(= {PROJECT}) — the residual stream entering block 0"),
    Site(RESID_PRE, BTD, "x — the block's input (previous block's output)", per_block=True),
    Site(Q, BTHK, "q = x W_Q + b_Q", per_block=True),
    Site(K, BSHK, "k = x W_K + b_K", per_block=True),
    Site(V, BSHK, "v = x W_V + b_V", per_block=True),
    Site(ROT_Q, BTHK, "q rotated by position t (rotary; the θ of the layer's kind) — what the scores "
         "use", per_block=True, needs="rotary"),
    Site(ROT_K, BSHK, "k rotated by position s (rotary)", per_block=True, needs="rotary"),
    Site(QK, BHTS, "q·k — raw dot products, before scaling and mask", per_block=True),
    # DeBERTa's scores are three terms (families/deberta_v2.py), each already divided by √(K·m), m = 1 + the
    # number of position terms; a term the config's pos_att_type omits is 0. Their sum is hook_attn_scores.
    Site(C2C, BHTS, "q_t·k_s/√(K·m) — content→content", per_block=True, needs="disentangled"),
    Site(C2P, BHTS, "q_t·(r W_K')[δ(t,s)]/√(K·m) — content→position, r the relative table",
         per_block=True, needs="disentangled"),
    Site(P2C, BHTS, "k_s·(r W_Q')[δ(t,s)]/√(K·m) — position→content", per_block=True,
         needs="disentangled"),
    Site(ATTN_SCORES, BHTS, "q·k/√K (DeBERTa: c2c + c2p + p2c), −inf at masked keys: padding, and a "
         "local layer's keys outside its window (TransformerLens' meaning)", per_block=True),
    Site(PATTERN, BHTS, "softmax over S of the scores — rows sum to 1 (a row whose keys are all masked: "
         "uniform, 1/S)", per_block=True),
    Site(Z, BTHK, "z = pattern · v — each head's mix of values", per_block=True),
    Site(RESULT, ("B", "T", "H", "D"), "z_h W_O[h] — each head's output, before summing heads and "
         "adding b_O", per_block=True),
    Site(ATTN_OUT, BTD, "Σ_h z_h W_O[h] + b_O", per_block=True),
    Site(RESID_MID, BTD, "x + attn_out", per_block=True),
    *_layernorm(LN1, "D", per_block=True, needs="first_ln1"),  # post-LN: after attention; pre-LN: before it
    Site(MLP_PRE, ("B", "T", "F"), "x W_in + b_in, x the normalised MLP input (ln1 post-LN, ln2 pre-LN; "
         "GeGLU: the half that goes through the activation)", per_block=True),
    Site(MLP_PRE_LINEAR, ("B", "T", "F"), "ln2 W_in[:, 1] (+ b) — GeGLU's linear half; post = act(pre) ⊙ "
         "pre_linear", per_block=True, needs="glu"),
    Site(MLP_POST, ("B", "T", "F"), "act(pre) (gelu, gelu_new or relu, per config)", per_block=True),
    Site(MLP_OUT, BTD, "post W_out + b_out", per_block=True),
    Site(RESID_POST, BTD, "ln1 + mlp_out (pre-LN: resid_mid + mlp_out, the block's output)", per_block=True),
    *_layernorm(LN2, "D", per_block=True),  # post-LN: on the block's output; pre-LN: before the MLP
    Site(NORMALIZED_RESID_POST, BTD, "LayerNorm(resid_post) — the block's output (post-LN)", per_block=True),
    *_layernorm(LN_FINAL, "D", needs="final_norm"),  # after the last block; its output is last_hidden_state
    *_layernorm(POOLER_LN, "D", needs="pooler_norm", rows=("B",)),  # on the pooled vector
    Site(POOLER_OUT, ("B", "D"), "tanh(h_[CLS] W + b) — pooler output (gelu for ELECTRA's and relu "
         "for DistilBERT's sequence classifiers)", needs="pooler"),
    *_layernorm(MLM_LN, "E", needs="mlm", out=UNEMBED_IN),
    Site(UNEMBED_OUT, ("B", "T", "V"), f"{UNEMBED_IN} W_Eᵀ + bias — masked-LM logits", needs="mlm"),
    Site(NSP_OUT, ("B", "2"), "pooled W + b — next-sentence logits", needs="nsp"),
    *_layernorm(CLASSIFIER_LN, "D", needs="token_norm"),
    Site(CLASSIFIER_LOGITS, ("B", "C"), "pooled W + b (sequence) or h W + b (token classification)",
         needs="classifier", other_axes=("B", "T", "C")),
    Site(DISCRIMINATOR_LOGITS, ("B", "T"), "act(h W + b) · w + c — ELECTRA's replaced-token logits",
         needs="discriminator"),
)
_BY_NAME = {site.name: site for site in SITES}


PATTERNS = every_block(PATTERN)  # every block's attention pattern, the glob most analyses capture


def inside_block(name: str) -> str | None:
    """"blocks.3.attn.hook_q" → "attn.hook_q"; None for a name outside the blocks."""
    parts = name.split(".", 2)
    return parts[2] if len(parts) == 3 and parts[0] == "blocks" and parts[1].isdigit() else None


def site(name: str) -> Site:
    """The table's entry of a hook name ("blocks.3.attn.hook_q", "pooler.hook_pooler_out"); KeyError if none."""
    inner = inside_block(name)
    entry = _BY_NAME.get(name if inner is None else inner)
    if entry is None or entry.per_block != (inner is not None):
        raise KeyError(f"hook {name!r} has no entry in minibert.core.sites.SITES; add one there.")
    return entry


def is_site_name(name: str) -> bool:
    """Whether `name` is a hook name of minibert's grammar (some model has it)."""
    try:
        site(name)
    except KeyError:
        return False
    return True


def site_doc(name: str) -> tuple[str, str]:
    """(axes, equation) of a hook name, e.g. "blocks.3.attn.hook_q" → ("[B, T, H, K]", "q = x W_Q + b_Q")."""
    entry = site(name)
    return entry.axes_text, entry.equation


def site_axes(name: str, ndim: int | None = None) -> list[str]:
    """The axis letters of a hook's value, e.g. ["B", "H", "T", "S"]; for a site with two forms (classifier
    logits per sequence or per token), the one with `ndim` axes (default: the first)."""
    shapes = site(name).shapes
    return list(next((shape for shape in shapes if len(shape) == ndim), shapes[0]))


def block_group(name: str) -> str:
    """The Family.block_order group of a per-block site: "attn.hook_q" → "attn", "hook_mlp_out" → "hook_mlp_out"."""
    return name.split(".")[0] if "." in name else name


def block_sites(config: Config, layer: int) -> list[Site]:
    """The sites of block `layer` of a model with this config, in the order the block runs them."""
    order = config.family.block_order
    present = [entry for entry in SITES if entry.per_block and entry.exists_in(config, layer)]
    return sorted(present, key=lambda entry: order.index(block_group(entry.name)))


def hook_names(config: Config) -> list[str]:
    """Every hook name of a model with this config, from the table, in the order its forward pass runs them: the
    embeddings, each block's sites block by block (block_sites), then the final norm and heads."""
    present = [entry for entry in SITES if entry.exists_in(config)]
    first_block = next(i for i, entry in enumerate(present) if entry.per_block)
    blocks = [in_block(i, entry.name) for i in range(config.num_hidden_layers) for entry in block_sites(config, i)]
    return ([entry.name for entry in present[:first_block]] + blocks
            + [entry.name for entry in present[first_block:] if not entry.per_block])


def all_hook_names() -> list[str]:
    """The hook points of every architecture minibert loads, one block standing for all (blocks.0.*)."""
    return [in_block(0, entry.name) if entry.per_block else entry.name for entry in SITES]
