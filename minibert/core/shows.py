"""What a family shows: the order in which a block runs its hook sites, and the step-through of one block (the
workbench walks it, one step per site, each with its label, its equation and the steps it is computed from).

BERT's (post-LN) are the defaults of Family.block_order and Family.steps; a family whose block runs otherwise
(ModernBERT's pre-LN block, DeBERTa's three score terms) declares its own in its module, from these pieces, so the
site table, the lens, the mixing maps, the views and the workbench read the family's record and never its name.
"""

from __future__ import annotations

from typing import NamedTuple

from minibert.core import site_names as site

# The order in which a block runs its sites, as groups: a per-block site is in the group of its first name part
# ("attn.hook_q" → "attn", "ln1.hook_scale" → "ln1") or else of its name; within a group, minibert.core.sites.SITES'
# order. A per-block site whose group a family's order leaves out does not exist in that family's blocks.
# Post-LN (BERT): ln1 after attention, ln2 on the block's output.
POST_LN_ORDER = (site.RESID_PRE, site.ATTN, site.ATTN_OUT, site.RESID_MID, site.LN1, site.MLP, site.MLP_OUT,
                 site.RESID_POST, site.LN2, site.NORMALIZED_RESID_POST)

# What of a site's [B, …] value (batch row 0) a step shows: the query token's row, its row for head h, head h's
# row of every key token s, or head h's row of a [H, T, S] map at the query.
QUERY, QUERY_HEAD, KEYS_HEAD, HEAD_ROW = "t", "t,h", ":,h", "h,t"


class Step(NamedTuple):
    """One step of the step-through. site: the hook it shows ("embed…", "hook_full_embed" and "ln_final…" as named,
    the rest within the block); shows: QUERY, QUERY_HEAD, KEYS_HEAD or HEAD_ROW; operands: the ids of the steps
    it is computed from ("a|b": a, or b where a is left out). label and equation may name {layer}, {next},
    {d_head}, {d_model}, {layer_sup}, {next_sup}. A step whose site a family or layer lacks (segments, position
    rows, ModernBERT's ln1 in layer 0) is left out, and so are its mentions as an operand."""

    id: str
    label: str
    equation: str
    site: str
    shows: str
    operands: tuple[str, ...]


def one_term(cfg) -> int:
    """m = 1: the scores are q·k/√K (Family.score_scale of every family without position terms)."""
    return 1


def step_table(*rows: tuple) -> tuple[Step, ...]:
    return tuple(Step(*row) for row in rows)


def replacing(table: tuple[Step, ...], step_id: str, replacements: tuple[Step, ...]) -> tuple[Step, ...]:
    """`table` with the step `step_id` replaced by `replacements` (a family that computes one step otherwise)."""
    at = next(i for i, step in enumerate(table) if step.id == step_id)
    return table[:at] + replacements + table[at + 1:]


# Post-LN BERT's block, which every family with BERT's block shows:
POST_LN_STEPS = step_table(
    ("word", "token embedding", "e_word = W_E[id_t]", site.EMBED, QUERY, ()),
    ("position", "position embedding", "e_pos = W_pos[t]", site.POS_EMBED, QUERY, ()),
    ("segment", "segment embedding", "e_seg = W_type[type_t]", site.TOKEN_TYPE_EMBED, QUERY, ()),
    ("embed_ln", "embedding LayerNorm", "h⁰ = LN(e_word + e_pos + e_seg)", site.FULL_EMBED, QUERY,
     ("word", "position", "segment")),
    ("x", "block {layer} input", "x = h{layer_sup} (the residual stream entering block {layer})", site.RESID_PRE,
     QUERY, ("embed_ln",)),
    ("q", "query", "q = x W_Q[h] + b_Q[h]", site.Q, QUERY_HEAD, ("x",)),
    ("k", "keys (every token s)", "k_s = x_s W_K[h] + b_K[h]", site.K, KEYS_HEAD, ("x",)),
    ("v", "values (every token s)", "v_s = x_s W_V[h] + b_V[h]", site.V, KEYS_HEAD, ("x",)),
    ("qk", "dot products", "q·k_s", site.QK, HEAD_ROW, ("q", "k")),
    ("scaled", "scaled and masked", "(q·k_s)/√{d_head} + mask_s (mask: 0 on real keys, −∞ on padding)",
     site.ATTN_SCORES, HEAD_ROW, ("qk",)),
    ("pattern", "softmax", "α_s = exp(score_s) / Σ_s' exp(score_s')", site.PATTERN, HEAD_ROW, ("scaled",)),
    ("z", "weighted values", "z = Σ_s α_s v_s", site.Z, QUERY_HEAD, ("pattern", "v")),
    ("concat", "concatenation of the heads", "[z_1 … z_H] (this head's slice at h·K … (h+1)·K − 1)", site.Z,
     QUERY, ("z",)),
    ("head_out", "this head through W_O", "z W_O[h]", site.RESULT, QUERY_HEAD, ("z",)),
    ("attn_out", "attention output", "a = Σ_h z_h W_O[h] + b_O", site.ATTN_OUT, QUERY, ("concat", "head_out")),
    ("resid_mid", "residual", "r = x + a", site.RESID_MID, QUERY, ("x", "attn_out")),
    ("ln1", "LayerNorm 1", "y = (r − μ)/σ · γ₁ + β₁  (μ, σ: the mean and standard deviation of r's {d_model} numbers)",
     site.layernorm(site.LN1, site.LN_OUT), QUERY, ("resid_mid",)),
    ("ffn_pre", "FFN in", "y W_in + b_in", site.MLP_PRE, QUERY, ("ln1",)),
    ("ffn_post", "activation", "act(y W_in + b_in)", site.MLP_POST, QUERY, ("ffn_pre",)),
    ("ffn_out", "FFN out", "m = act(…) W_out + b_out", site.MLP_OUT, QUERY, ("ffn_post",)),
    ("resid_post", "residual", "y + m", site.RESID_POST, QUERY, ("ln1", "ffn_out")),
    ("ln2", "LayerNorm 2 (the block's output)", "h{next_sup} = LN₂(y + m)",
     site.layernorm(site.LN2, site.LN_OUT), QUERY, ("resid_post",)),
)


def shared(*ids: str) -> tuple[Step, ...]:
    """BERT's steps `ids`, for a family whose block computes them as BERT's does."""
    by_id = {step.id: step for step in POST_LN_STEPS}
    return tuple(by_id[step_id] for step_id in ids)
