"""The static key of a hook or metric function (minibert.core.contract): what it reads is keyed by value where it can
change in place (NumPy arrays, lists, dicts), so a program never runs an old value; the globals it loads are the
ones keyed, not every attribute name its code spells (`.at[...].set`)."""

from __future__ import annotations

import numpy as np
import pytest

from minibert import BertConfig, Model
from minibert.core.contract import StaticFn

Z = "blocks.0.attn.hook_z"
TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64)


def closing_over(value):
    return lambda z, ctx: z * value


@pytest.mark.parametrize("value, change", [
    (np.ones(4, np.float32), lambda v: v.__setitem__(slice(None), 5.0)),
    ([1.0, 2.0], lambda v: v.__setitem__(0, 5.0)),
    ({"h": 1}, lambda v: v.__setitem__("h", 9)),
    ([np.zeros(2)], lambda v: v[0].__setitem__(1, 3.0)),  # an array inside a list
])
def test_a_value_changed_in_place_changes_the_key(value, change):
    fn = closing_over(value)
    before = StaticFn(fn)
    change(value)
    assert StaticFn(fn) != before


def test_equal_arrays_give_equal_keys():
    """Two lambdas written alike over two arrays of the same bytes compute the same: one program."""
    assert StaticFn(closing_over(np.arange(3.0))) == StaticFn(closing_over(np.arange(3.0)))
    assert StaticFn(closing_over(np.arange(3.0))) != StaticFn(closing_over(np.arange(3.0, dtype=np.float32)))


HEAD = 1
set = "a notebook's own variable named like a method"  # noqa: A001 (the point of the test)


def zero_head(z, ctx):
    return z.at[:, :, HEAD].set(0.0)


def test_attribute_names_are_not_read_as_globals():
    """`.set` is an attribute, not the global `set`: changing that global keeps the key; changing HEAD, which the
    code loads, changes it."""
    global set, HEAD
    before = StaticFn(zero_head)
    set = "changed"
    assert StaticFn(zero_head) == before
    HEAD = 2
    try:
        assert StaticFn(zero_head) != before
    finally:
        HEAD = 1


def test_a_global_read_inside_a_nested_lambda_is_keyed():
    def outer(z, ctx):
        return (lambda v: v * HEAD)(z)

    global HEAD
    before = StaticFn(outer)
    HEAD = 3
    try:
        assert StaticFn(outer) != before
    finally:
        HEAD = 1


def test_a_hook_over_an_array_changed_in_place_runs_its_new_value():
    """The tester's case: `scale[1] = 0` after a run must zero head 1 in the next one, as a fresh run does."""
    model = Model(BertConfig(**TINY), seed=1)
    ids = np.random.default_rng(0).integers(5, 99, size=(2, 7))
    batch = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    scale = np.ones(4, np.float32)
    hook = closing_over(scale[:, None])  # [H, 1] over z's [B, T, H, K]

    model.run_with_hooks(batch, {Z: hook})
    scale[1] = 0.0
    changed = model.run_with_hooks(batch, {Z: hook}).last_hidden_state
    fresh = model.run_with_hooks(batch, {Z: closing_over(np.array([[1], [0], [1], [1]], np.float32))})
    assert np.array_equal(np.asarray(changed), np.asarray(fresh.last_hidden_state))  # the same program, same inputs
    assert model.programs.count == 2  # the program for all ones, then one for the new value (shared by fresh)
