"""Checks on the plain arrays that views and figures take; each error names the argument and the fix.

Axis letters as everywhere in minibert: L layers, H heads, T query positions, S key positions,
K head dim. One document at a time, real tokens only (no padding).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from minibert.core.site_names import K, Q, in_block
from minibert.errors import VizError


def token_list(tokens: Sequence[str]) -> list[str]:
    if isinstance(tokens, str):
        raise VizError("tokens must be a list of strings, one per position (e.g. batch.tokens[0]); got one string.")
    tokens = [str(t) for t in tokens]
    if not tokens:
        raise VizError("tokens is empty; pass the document's tokens, e.g. batch.tokens[0] "
                       "(['[CLS]', 'hello', '[SEP]'] for BERT, ['<s>', 'hello', '</s>'] for RoBERTa).")
    return tokens


def _drop_batch(array: np.ndarray, name: str, axis: int) -> np.ndarray:
    """Stacked per-layer captures carry a batch axis of size B at `axis`; accept B == 1."""
    if array.shape[axis] != 1:
        raise VizError(f"{name} has shape {array.shape}, with a batch axis of size {array.shape[axis]} at position "
                       f"{axis}; views show one document at a time: pass {name}[:, b] for document b.")
    return np.squeeze(array, axis)


def _as_float(value, name: str) -> np.ndarray:
    try:
        if isinstance(value, str):  # np.asarray("0.5", float) would read a number out of the text
            raise TypeError
        if isinstance(value, (list, tuple)):  # per-layer outputs, e.g. transformers' `attentions`
            value = np.stack([np.asarray(v) for v in value])
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise VizError(f"{name} must be a numeric array (NumPy, JAX or nested lists of numbers); got "
                       f"{type(value).__name__} {str(value)[:40]!r}.") from None
    if not np.all(np.isfinite(array)):
        raise VizError(f"{name} contains NaN or infinite values; views and figures need finite numbers.")
    return array


def _fit_tokens(n_positions: int, n_tokens: int, name: str) -> None:
    if n_positions == n_tokens:
        return
    hint = (f"drop padding first: {name}[..., :{n_tokens}, :{n_tokens}] keeps the real tokens"
            if n_positions > n_tokens else "pass the tokens of the same document")
    raise VizError(f"{name} covers {n_positions} positions but there are {n_tokens} tokens; {hint}.")


def attention_array(tokens: list[str], attention) -> np.ndarray:
    """`attention[L, H, T, S]` (or `[L, 1, H, T, S]`, or a list of L `[1, H, T, S]`) as float64 [L, H, T, S]."""
    a = _as_float(attention, "attention")
    if a.ndim == 5:
        a = _drop_batch(a, "attention", 1)
    if a.ndim != 4:
        raise VizError(f"attention must be [L, H, T, S] (layers, heads, query, key) for one document; "
                       f"got shape {a.shape}.")
    if a.shape[2] != a.shape[3]:
        raise VizError(f"attention must be square over tokens ([L, H, T, S] with T == S); got shape {a.shape}.")
    _fit_tokens(a.shape[2], len(tokens), "attention")
    return a


def head_vectors(name: str, value, attention: np.ndarray) -> np.ndarray:
    """Per-head query or key vectors `[L, T, H, K]` (or `[L, 1, T, H, K]`), matching attention's L, H and T."""
    v = _as_float(value, name)
    if v.ndim == 5:
        v = _drop_batch(v, name, 1)
    n_layers, n_heads, n_tokens, _ = attention.shape
    if v.ndim != 4 or v.shape[:3] != (n_layers, n_tokens, n_heads):
        site = in_block("i", {"q": Q, "k": K}[name])
        raise VizError(f"{name} must be [L, T, H, K] = [{n_layers}, {n_tokens}, {n_heads}, K] to match attention "
                       f"{attention.shape} (e.g. cache[{site!r}][b] stacked over layers); "
                       f"got shape {v.shape}.")
    return v


def index(name: str, value, size: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise VizError(f"{name} must be an int (0-indexed); got {value!r}.")
    if not 0 <= value < size:
        raise VizError(f"{name}={value} is out of range: there are {size} {what} (0-indexed: 0..{size - 1}).")
    return int(value)


def layers_and_heads(tokens, attention, layers, heads) -> tuple[list[str], np.ndarray, list[int], list[int]]:
    """(tokens, attention [L, H, T, S], the chosen layers, the chosen heads), checked; None chooses all."""
    tokens = token_list(tokens)
    a = attention_array(tokens, attention)
    return tokens, a, indices("layers", layers, a.shape[0], "layers"), indices("heads", heads, a.shape[1], "heads")


def indices(name: str, values, size: int, what: str) -> list[int]:
    """None means all; an int means that one; otherwise a non-empty list, in the given order, no repeats."""
    if values is None:
        return list(range(size))
    if isinstance(values, (int, np.integer)):
        values = [values]
    chosen = [index(name, v, size, what) for v in values]
    if not chosen or len(set(chosen)) != len(chosen):
        raise VizError(f"{name} must list distinct {what} (0-indexed); got {list(values)!r}.")
    return chosen


def sentence_b(start, n_tokens: int) -> int | None:
    if start is None:
        return None
    if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or not 0 < start < n_tokens:
        raise VizError(f"sentence_b_start must be the index of sentence B's first token, between 1 and "
                       f"{n_tokens - 1}, or None for a single sentence; got {start!r}.")
    return int(start)


def theme(value: str) -> str:
    if value not in ("light", "dark"):
        raise VizError(f"theme must be 'light' or 'dark'; got {value!r}.")
    return value


def number(name: str, value, *, positive: bool = False) -> float:
    """A finite real number (not a bool), > 0 where `positive`: a colour scale's end or centre."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or \
            not np.isfinite(value) or (positive and value <= 0):
        wanted = "a finite number > 0" if positive else "a finite number"
        raise VizError(f"{name} must be {wanted}; got {value!r}.")
    return float(value)


def matrix(name: str, value, ndim: int, shape_hint: str) -> np.ndarray:
    """A finite float array with `ndim` axes, e.g. a per-head statistic [L, H]."""
    array = _as_float(value, name)
    if array.ndim != ndim or array.size == 0:
        raise VizError(f"{name} must be a non-empty {shape_hint} array; got shape {array.shape}.")
    return array
