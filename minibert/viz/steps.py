"""The step-through's values: one head's computation for one query token, read from a workbench run's captures.

    step_through(run, layer, head, query, d_head, model)   # [{id, label, equation, values, shape, from, …}, …]

Each step is a row of the family's table (Family.steps): its hook's numbers (the query's row, the head's part),
the steps it is computed from, the views that draw it, and — where its values are dot products — the operands the
page needs to show every term of one value on hover (`dot_products`). Numbers are rounded to what float32 holds
(`rounded`), so the answer is about half as long as float64's. Workbench.step (viz/workbench.py) answers with it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from minibert.core.shows import HEAD_ROW, KEYS_HEAD, QUERY, QUERY_HEAD
from minibert.core.site_names import ATTN_SCORES, FULL_EMBED, PATTERN, QK, ROT_K, ROT_Q, K, Q, V
from minibert.viz import views

SIGNIFICANT = 8  # digits of each number a step sends: float32 holds ~7.2, so rounding to 8 moves a hook's value by
# at most 5e-8 (relative), under one float32 step, and halves the characters of float64's 17: the step's JSON is
# encoded and parsed in about half the time (RESULTS.md, "Live workbench")


def rounded(value) -> np.ndarray:
    """float64 `value` rounded to SIGNIFICANT significant digits (zeros and non-finite values as they are)."""
    x = np.asarray(value, np.float64)
    with np.errstate(all="ignore"):  # log10(0) = −inf, inf·0: those entries are put back below
        places = SIGNIFICANT - 1 - np.floor(np.log10(np.abs(x)))  # decimal places kept
        # Powers of ten up to 1e22 are exact doubles, so m / 10^p is the double nearest to the decimal m·10^−p and
        # prints as it: scale up by 10^p, or down by 10^−p, never by an inexact 10^−p.
        up, down = 10.0 ** np.maximum(places, 0), 10.0 ** np.maximum(-places, 0)
        kept = np.round(x * up / down) * down / up
    return np.where(np.isfinite(kept), kept, x)


SHOWN = 8  # values the page shows of a vector (the rest behind "…"), and whose dot-product operands a step sends


def _vector(value: np.ndarray) -> list[float | None]:
    """The values as JSON numbers; −∞ (a masked score) as null, which JSON has no number for."""
    flat = rounded(value).ravel()
    return [None if v == -np.inf else v for v in flat.tolist()]


def _score_step(model, d_head: int) -> tuple[str, tuple[float, str]]:
    """(the step whose values are q·k over a divisor, (that divisor, as written)): the scores q·k/√K, or the first
    of a family's score terms (DeBERTa's c2c), divided by √(K·m) (Family.score_terms, score_scale)."""
    family = model.config.family
    site = family.score_terms[0] if family.score_terms else ATTN_SCORES
    m = family.score_scale(model.config)
    step_id = next(step.id for step in family.steps if step.site == site)
    return step_id, (float(np.sqrt(d_head * m)), f"√{d_head}" if m == 1 else f"√({d_head}·{m})")


# The views that draw a step's values (the page links the step to them): the pattern is every view's; the neuron view
# draws q and k (rotated where the family rotates them) and recomputes q·k, the scores and the softmax from them.
DRAWN_IN = {PATTERN: ("neuron", "head", "model"),
            **{site: ("neuron",) for site in (Q, K, ROT_Q, ROT_K, QK, ATTN_SCORES, *views.TERM_SITES)}}
_MODEL_SITES = ("embed.", FULL_EMBED, "ln_final.")  # hooks outside the blocks
_AFTER_BLOCKS = "ln_final."  # shown with the last block only


def hook_name(site: str, layer: int) -> str:
    """A step's hook's full name: the embedding's and the final LayerNorm's as they are, a block's in block `layer`."""
    return site if site.startswith(_MODEL_SITES) else f"blocks.{layer}.{site}"


def _picked(value: np.ndarray, pick: str, query: int, head: int) -> np.ndarray:
    """The part of a captured value a step shows: the query's row, its head's, every key's for the head, or the
    head's row of a [H, T, S] map; "concat" flattens the query's [H, K] row to H·K."""
    if pick == QUERY:
        return value[query].reshape(-1)
    return {QUERY_HEAD: lambda: value[query, head], KEYS_HEAD: lambda: value[:, head],
            HEAD_ROW: lambda: value[head, query]}[pick]()


def _start(value: np.ndarray, pick: str, head: int) -> int:
    """Where this head's part begins in the values a step shows: h·K in the query's row of every head's [H, K]
    (the concatenation of the heads), else 0."""
    return head * value.shape[-1] if pick == QUERY and value.ndim == 3 else 0


_SUPERSCRIPTS = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def _superscript(n: int) -> str:
    """12 → "¹²": a layer number written as the equations write it (h⁰, h¹…)."""
    return str(n).translate(_SUPERSCRIPTS)


def _first_shown(operand: str, shown) -> str | None:
    """An operand "a|b": a where it is shown, else b; None where none is."""
    return next((choice for choice in operand.split("|") if choice in shown), None)


def step_through(run, layer: int, head: int, query: int, d_head: int, model) -> list[dict]:
    """The walk through block `layer` for head `head` and query token `query` (its family's table in
    Family.steps), each step {id, label, equation, values (the hook's numbers; null where −∞: a masked score),
    shape, from (the ids of its operands)}; a step whose values are dot products also has `dot` (see
    `dot_products`)."""
    cfg = model.config
    fields = {"layer": layer, "next": layer + 1, "d_head": d_head, "d_model": cfg.hidden_size,
              "layer_sup": _superscript(layer), "next_sup": _superscript(layer + 1)}
    last = layer == cfg.num_hidden_layers - 1
    walk, shown = [], set()
    for step_id, label, equation, site, pick, operands in cfg.family.steps:
        name = hook_name(site, layer)
        if name not in run.captures or (site.startswith(_AFTER_BLOCKS) and not last):
            continue
        values = _picked(run.captures[name], pick, query, head)
        sources = [_first_shown(operand, shown) for operand in operands]
        walk.append({"id": step_id, "label": label.format(**fields), "equation": equation.format(**fields),
                     "shape": list(values.shape), "values": _vector(values),
                     "from": [source for source in sources if source is not None],
                     "per_key": pick in (KEYS_HEAD, HEAD_ROW),  # one value (row) per key token s
                     "site": name, "start": _start(run.captures[name], pick, head),
                     "views": list(DRAWN_IN.get(site, ()))})
        shown.add(step_id)
    dots = dot_products(run, layer, head, d_head, model.weights.layer(layer),
                        {step.id: step.operands for step in cfg.family.steps}, score=_score_step(model, d_head))
    for step in walk:
        dot = dots.get(step["id"])
        left = dot and _first_shown(dot["left"], shown)
        if left:
            step["dot"] = {**dot, "left": left}
    return walk


def dot_products(run, layer: int, head: int, d_head: int, weights, operands: Mapping,
                 score: tuple[str, tuple[float, str]]) -> dict[str, dict]:
    """The operands of the steps whose values are dot products: {step id: {left: the step whose values are the
    left vector ("a|b" as in Family.steps), right: [n, len(left)] one vector per value j < n, right_name, bias: [n] or
    None, divisor}}, so that value j = (left · right[j] + bias[j]) / divisor. n is every value of a per-key row
    (the scores), else the SHOWN values the page shows. weights: block `layer`'s by role (model.weights.layer(i),
    fused ones already apart); a family without a bias goes without, a gated MLP shows its gate and its linear
    half. score: the step whose values are q·k_s / divisor (`_score_step`); operands: {step id: its operands} of
    the family's steps (what q and the FFN read). DeBERTa's position terms read the relative table: shown without
    operands."""
    def captured(site: str):
        return run.captures.get(hook_name(site, layer))

    def weight(role: str):
        value = weights.read(role)
        return None if value is None else np.asarray(value)  # one block's, before dot() widens it to float64

    def dot(left: str, right_name: str, right, bias=None, divisor: tuple[float, str] = (1.0, ""), n: int = SHOWN,
            over: str = "i") -> dict:
        return {"left": left, "right_name": right_name, "right": rounded(np.asarray(right)[:n]).tolist(),
                "bias": None if bias is None else rounded(np.asarray(bias)[:n]).tolist(), "divisor": divisor[0],
                "divisor_text": divisor[1], "over": over}

    dots = {}
    rotated = captured(ROT_K) is not None  # the scores use the rotated q and k
    keys, values = captured(ROT_K if rotated else K), captured(V)
    query, key = ("rot_q", "k̃_s") if rotated else ("q", "k_s")
    if keys is not None:  # score_s = q·k_s (then / √K; the mask adds 0 on the keys in reach)
        score_id, divisor = score
        dots["qk"] = dot(query, key, keys[:, head], n=len(keys))
        dots[score_id] = dot(query, key, keys[:, head], divisor=divisor, n=len(keys))
    if values is not None:  # z_i = Σ_s α_s v_s,i: a sum over the key tokens s
        dots["z"] = dot("pattern", "v_s,i", values[:, head].T, over="s")
    w_q, b_q = weight("q"), weight("b_q")  # [D, H, K], [H, K]
    if w_q is not None and "q" in operands:
        dots["q"] = dot(operands["q"][0], "W_Q[:, h, j]", w_q[:, head].T, None if b_q is None else b_q[head])
    w_o = weight("o")
    if w_o is not None:  # [H, K, D]: (z W_O[h])_j = z · W_O[h, :, j]
        dots["head_out"] = dot("z", "W_O[h, :, j]", w_o[head].T)
    ffn_in = operands.get("ffn_pre", ("",))[0]  # the step the FFN reads
    w_in, b_in, w_gate = weight("w_in"), weight("b_in"), weight("w_gate")  # [D, F], [F], [D, F]
    if w_gate is not None:  # a gated MLP: the activated half (mlp.hook_pre), then the linear half
        dots["ffn_pre"] = dot(ffn_in, weights.written("w_gate", ":", "j"), w_gate.T, weight("b_gate"))
        dots["ffn_linear"] = dot(ffn_in, weights.written("w_in", ":", "j"), w_in.T, b_in)
    elif w_in is not None:
        dots["ffn_pre"] = dot(ffn_in, weights.written("w_in", ":", "j"), w_in.T, b_in)
    w_out = weight("w_out")
    if w_out is not None:  # [F, D]
        dots["ffn_out"] = dot("ffn_post", "W_out[:, j]", w_out.T, weight("b_out"))
    return dots
