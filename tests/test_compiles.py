"""How many programs a Model compiles (its trace counter, model.programs.traces) for given call sequences, as
docs/compiled.md's policy says: a fresh but identical lambda reuses its program, hooks that do not read the row
length share the length buckets with plain calls, one warning when a hook's code keeps compiling, the resident
programs stay under model.programs.limit; and hooks that return something other than an array are refused."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerances import assert_close_to_scale, forward_rtol, sum_rtol

import minibert
from minibert import BertConfig, Model
from minibert.analysis.circuits import direct_attribution
from minibert.core import hooks
from minibert.runtime import cache, device, programs
from minibert.runtime.accounting import flops_per_token
from minibert.runtime.buckets import COARSE, FINE, INTERACTIVE, bucket_length, length_buckets

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64)
Z = "blocks.0.attn.hook_z"


@pytest.fixture
def model():
    return Model(BertConfig(**TINY), seed=1)


def batch(length: int, rows: int = 2) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(length).integers(5, 99, size=(rows, length))
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


class Scaler:
    def __init__(self, factor):
        self.factor = factor

    def hook(self, z, ctx):
        return z * self.factor


def test_fresh_identical_lambdas_share_one_program(model):
    """40 lambdas written anew (as in a loop or a re-run notebook cell) compile once; a lambda reading another
    value, or a bound method of another object, compiles its own program and gives its own result."""
    inputs = batch(7)
    before = model.programs.traces
    runs = [model.run_with_hooks(inputs, {Z: lambda z, ctx: z * 0.5}).last_hidden_state for _ in range(40)]
    assert model.programs.traces == before + 1
    first = runs[0]
    np.testing.assert_array_equal(runs[-1], first)
    factor = 0.25
    other = model.run_with_hooks(inputs, {Z: lambda z, ctx: z * factor}).last_hidden_state
    assert model.programs.traces == before + 2 and not np.array_equal(other, first)
    halves = model.run_with_hooks(inputs, {Z: Scaler(0.5).hook}).last_hidden_state
    quarters = model.run_with_hooks(inputs, {Z: Scaler(0.25).hook}).last_hidden_state
    np.testing.assert_array_equal(halves, first)  # the same computation as the first lambda, its own program
    np.testing.assert_array_equal(quarters, other)


def _zero_head_1(z, ctx):
    return z.at[:, :, 1].set(0.0)


def _mean_over_positions(z, ctx):
    return z - z.mean(1, keepdims=True)


def _last_position_doubled(z, ctx):
    return z.at[:, -1].multiply(2.0)


@pytest.mark.slow  # eight compilations
def test_hooks_that_do_not_read_the_length_share_the_length_buckets(model):
    """An unmarked hook that works position by position runs on rows padded to the bucket length: six lengths
    compile one program per bucket they fall in, and give the exact-length run's values (two fp32 programs of
    the whole forward: tolerances.forward_rtol, at the padded length). A hook that reads the row length (a mean
    over positions) fails the probe and compiles one program per length, with the exact-length values."""
    lengths = (5, 17, 30, 33, 40, 60)  # 5 rows: buckets 32, 32, 32, 64, 64, 64 (buckets.INTERACTIVE: 32, 64, …)
    before = model.programs.traces
    padded = [model.run_with_hooks(batch(n, rows=5), {Z: _zero_head_1}).last_hidden_state for n in lengths]
    assert model.programs.traces - before == len({model.programs.padded_length(n, 5) for n in lengths}) == 2
    for n, got in zip(lengths, padded):
        exact = exact_forward(model, batch(n, rows=5), {Z: _zero_head_1})
        assert got.shape == exact.shape == (5, n, 32)
        rtol = forward_rtol(model.config, S=model.programs.padded_length(n, 5))
        assert_close_to_scale(got, exact, rtol, f"length {n}")
    before = model.programs.traces  # 2 rows (at most buckets.FEW_ROWS): every length runs at 64, one more program
    for n in lengths:
        model.run_with_hooks(batch(n), {Z: _zero_head_1})
    assert model.programs.traces - before == len({model.programs.padded_length(n, 2) for n in lengths}) == 1
    exact = [exact_forward(model, batch(n), {Z: _mean_over_positions}) for n in lengths[:3]]
    before = model.programs.traces
    for n, want in zip(lengths[:3], exact):
        got = model.run_with_hooks(batch(n), {Z: _mean_over_positions}).last_hidden_state
        assert_close_to_scale(got, want, forward_rtol(model.config, S=n), f"mean over positions, length {n}")
    assert model.programs.traces - before == 3


def exact_forward(model, batch, hooks):
    """The forward at the batch's own length, through forward_fn (its own program, never padded)."""
    return jax.jit(model.forward_fn(hooks=hooks))(model.state, model.inputs(batch))[0].last_hidden_state


@pytest.mark.parametrize("hook, padded", [(_zero_head_1, True), (_mean_over_positions, False),
                                          (_last_position_doubled, False),
                                          (lambda z, ctx: z * jnp.ones(z.shape[1])[None, :, None, None], True),
                                          (lambda z, ctx: jnp.roll(z, 1, axis=1), False)],
                         ids=["head zeroed", "mean", "last position", "shaped by T, per position", "roll"])
def test_the_probe_pads_exactly_the_hooks_whose_positions_do_not_read_the_length(model, hook, padded):
    """buckets.pads_safely: a hook at hook_z runs padded (one program for lengths 17 and 20, both in bucket 32)
    exactly when its first positions do not depend on how many follow."""
    before = model.programs.traces
    for n in (17, 20):
        model.run_with_hooks(batch(n), {Z: hook})
    assert model.programs.traces - before == (1 if padded else 2)


def test_swapping_the_head_a_hook_zeroes_reuses_the_program(model):
    """The head as a traced argument (HookFn): twelve ablations at lengths of one bucket, one program."""
    before = model.programs.traces
    for head, n in zip(range(4), (17, 18, 20, 24)):
        model.run_with_hooks(batch(n), {Z: minibert.HookFn(_zero_head, head=jnp.int32(head))})
    assert model.programs.traces - before == 1


def test_hooks_at_sites_without_positions_are_bucketed(model):
    """The pooler's [B, D] has no T axis: a hook there cannot see the row length, so it needs no mark."""
    model = Model(BertConfig(**TINY, architecture="BertForPreTraining"), seed=1)
    before = model.programs.traces
    for n in (33, 34):  # one bucket, 64
        model.run_with_hooks(batch(n), {"pooler.hook_pooler_out": lambda pooled, ctx: pooled * 2})
    assert model.programs.traces - before == 1


class Walk:
    """A hook function that counts its own runs (its body is traced, never run on values: each run is a trace),
    and the static keys (contract.behaviour_key) computed of it."""

    def __init__(self, monkeypatch):
        self.runs = self.keys = 0
        key = minibert.core.contract.behaviour_key
        monkeypatch.setattr(minibert.core.contract, "behaviour_key", self._counted(key))

    def _counted(self, key):
        def counted(fn):
            self.keys += fn == self.hook  # a bound method: equal, not the same object
            return key(fn)
        return counted

    def hook(self, z, ctx, factor=0.5):
        self.runs += 1
        return z * factor

    def call(self, run) -> tuple[int, int]:
        """(runs of the hook's body, keys of it) during run()."""
        self.runs = self.keys = 0
        run()
        return self.runs, self.keys


def test_a_hook_is_keyed_once_per_call_and_traced_once_per_program(model, monkeypatch):
    """A plain hook: its key is computed once per call, cold or warm (the flattening, the padding probe and the
    compile count read the call's key); its body runs 3 times on a call that pads it (the probe's two lengths,
    buckets.PROBE_LENGTHS, and the program's trace), once where the program is new and the probe is not needed
    (rows at a bucket's length; the verdict known; a capture, whose shape trace runs no hook; Model.grad), and
    never on a warm repeat."""
    walk = Walk(monkeypatch)
    hooks = {Z: walk.hook}
    loss = lambda out: out.last_hidden_state[:, 0, 0]  # noqa: E731
    padded, exact = batch(7), batch(64, rows=3)  # 7 → bucket 64 (2 rows: at least 64); 64: a bucket's length
    calls = [(lambda: model.run_with_hooks(padded, hooks), (3, 1)), (lambda: model.run_with_hooks(padded, hooks),
                                                                     (0, 1)),
             (lambda: model.run_with_hooks(exact, hooks), (1, 1)), (lambda: model.run_with_hooks(exact, hooks), (0, 1)),
             (lambda: model.run(batch(9), names="blocks.*.attn.hook_pattern", hooks=hooks), (1, 1)),
             (lambda: model.grad(padded, loss, Z, hooks), (1, 1)), (lambda: model.grad(padded, loss, Z, hooks),
                                                                    (0, 1))]
    before = model.programs.traces
    assert [walk.call(run) for run, _ in calls] == [counts for _, counts in calls]
    assert model.programs.traces - before == 4  # the padded run, the exact one, the capture, the gradient


def test_a_hookfn_is_keyed_once_per_call(model, monkeypatch):
    """A HookFn's function, as a plain hook: keyed once per call, run 3 times cold (the probe, the trace), 0 warm."""
    walk = Walk(monkeypatch)
    hooks = {Z: minibert.HookFn(walk.hook, factor=jnp.float32(0.5))}
    assert [walk.call(lambda: model.run_with_hooks(batch(7), hooks)) for _ in range(2)] == [(3, 1), (0, 1)]


class Puts:
    """jax.device_put, counted: the arrays of each call, and those it copied (on a CPU it adopts a contiguous NumPy
    buffer aligned for XLA: the device array's buffer is then the NumPy array's own)."""

    def __init__(self, monkeypatch):
        self.calls, self.copied, put = [], [], jax.device_put

        def counted(x, *args, **kwargs):
            moved = put(x, *args, **kwargs)
            pairs = list(zip(jax.tree.leaves(x), jax.tree.leaves(moved)))
            self.calls.append(len(pairs))
            self.copied += [host.shape for host, device in pairs if device.unsafe_buffer_pointer() != host.ctypes.data]
            return moved

        monkeypatch.setattr(jax, "device_put", counted)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="on an accelerator the cut stays on the device")
def test_a_padded_batch_crosses_in_one_call_and_its_cuts_come_back_uncopied(model, monkeypatch):
    """A warm run_with_cache of every pattern, padded 7 → 64: the ids, types and mask move in one device_put, the
    output and the two layers' patterns, cut on the host, in one more, and on a CPU neither copies an array (the
    pad and the cut write buffers the device arrays adopt); the values are the jax.Arrays they were."""
    padded, names = batch(7), "blocks.*.attn.hook_pattern"
    model.run_with_cache(padded, names=names)
    puts = Puts(monkeypatch)
    out, cache = model.run_with_cache(padded, names=names)
    assert (puts.calls, puts.copied) == ([3, 3], [])
    values = [out.last_hidden_state, *(cache[name] for name in cache)]
    assert all(isinstance(v, jax.Array) and not v.committed for v in values)  # as a device_put leaves them
    assert [v.shape[-1] for v in values] == [32, 7, 7]


def test_a_users_arrays_are_never_the_memory_a_device_array_adopts(model):
    """On a CPU jax.device_put adopts an aligned host buffer without copying it, so minibert moves copies of its
    own: ids the user changes after the call (here in a buffer device_put would adopt as it is) leave the Inputs
    and the output as they were, at a bucket's exact length (no pad copies them) and padded alike."""
    for length in (32, 7):  # 32: a bucket's length, nothing padded; 7: padded to 64
        given = batch(length)
        ids = device.host_buffer(given["input_ids"].shape, np.int32)
        ids[:] = given["input_ids"]
        user = {**given, "input_ids": ids}
        inputs = model.inputs(user)
        out = model(user)
        ids[:] = 0  # the user reuses their buffer
        assert np.array_equal(np.asarray(inputs.input_ids), given["input_ids"])
        assert np.array_equal(np.asarray(out.last_hidden_state), np.asarray(model(given).last_hidden_state))


def test_one_warning_when_a_hooks_code_keeps_compiling(model, monkeypatch):
    """Lambdas closing over the head compile one program per head: one RecompileWarning when the count reaches
    RECOMPILE_WARNING_AT (3 here, 8 by default), naming HookFn as the fix; none for the HookFn sweep after."""
    monkeypatch.setattr(hooks, "RECOMPILE_WARNING_AT", 3)
    inputs = batch(5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for head in range(4):
            model.run_with_hooks(inputs, {Z: lambda z, ctx, head=head: z.at[:, :, head].set(0.0)})
        for head in range(4):
            model.run_with_hooks(inputs, {Z: minibert.HookFn(_zero_head, head=jnp.int32(head))})
    recompiles = [w for w in caught if issubclass(w.category, minibert.RecompileWarning)]
    assert len(recompiles) == 1
    assert "compiled 3 programs" in str(recompiles[0].message) and "HookFn(fn, head=" in str(recompiles[0].message)
    assert recompiles[0].filename == __file__  # the line that called run_with_hooks, not one of minibert's or JAX's


def test_a_loss_that_keeps_compiling_is_named_and_a_fixed_hook_beside_it_is_not(model, monkeypatch):
    """Model.grad with a loss closing over a changing number and a hook that never changes: the warning names the
    loss, at the caller's line, and the hook's count stays at its one version."""
    monkeypatch.setattr(hooks, "RECOMPILE_WARNING_AT", 3)
    fixed = lambda z, ctx: z * 1.0  # noqa: E731
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(4):
            model.grad(batch(5), lambda out, k=k: out.last_hidden_state.sum() * k, Z, hooks={Z: fixed})
    recompiles = [w for w in caught if issubclass(w.category, minibert.RecompileWarning)]
    assert [str(w.message).split(" (")[0] for w in recompiles] == ["model.grad's loss '<lambda>'"]
    assert "a loss of one value per row" in str(recompiles[0].message) and recompiles[0].filename == __file__


def test_a_hook_moved_from_layer_to_layer_does_not_warn(model, monkeypatch):
    """One HookFn at both layers' hook_z and two buckets: four programs, two per site, so no RecompileWarning at
    a threshold of 3 (the warning is about one site compiling again and again: new closed-over values, lengths)."""
    monkeypatch.setattr(hooks, "RECOMPILE_WARNING_AT", 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (5, 40):
            for layer in range(2):
                model.run_with_hooks(batch(n), {f"blocks.{layer}.attn.hook_z": minibert.HookFn(_zero_head,
                                                                                            head=jnp.int32(1))})
    assert not [w for w in caught if issubclass(w.category, minibert.RecompileWarning)]


def _zero_head_in_layer(z, ctx, head, layer):
    """Zero `head` where this is block `layer` (both traced): one hook for every layer's site."""
    return jnp.where(ctx.layer == layer, _zero_head(z, ctx, head), z)


def test_a_hook_at_every_layer_with_a_traced_layer_moves_without_compiling(model):
    """docs/compiled.md's recipe for moving a hook between layers: the hook at every layer's site (a glob), the
    layer it acts in a HookFn array. Both layers and two heads run one program, and each run equals the hook placed
    at that layer alone (another program: two fp32 programs, tolerances.forward_rtol)."""
    inputs = batch(9)
    before = model.programs.traces
    moved = {(layer, head): model.run_with_hooks(inputs, {"blocks.*.attn.hook_z": minibert.HookFn(
        _zero_head_in_layer, head=jnp.int32(head), layer=jnp.int32(layer))}).last_hidden_state
        for layer in range(2) for head in (1, 3)}
    assert model.programs.traces - before == 1
    for (layer, head), got in moved.items():
        placed = model.run_with_hooks(inputs, {f"blocks.{layer}.attn.hook_z": minibert.HookFn(
            _zero_head, head=jnp.int32(head))}).last_hidden_state
        assert_close_to_scale(got, placed, forward_rtol(model.config, S=model.programs.padded_length(9, 2)),
                              f"layer {layer}, head {head}")


def _zero_head(z, ctx, head):
    return jnp.where(jnp.arange(z.shape[2])[None, None, :, None] == head, 0.0, z)


@pytest.mark.parametrize("returned", ["zeros", {"z": 0}], ids=["str", "dict"])
def test_a_hook_returning_a_string_or_a_dict_is_refused(model, returned):
    with pytest.raises(minibert.HookError, match=f"returned a {type(returned).__name__}; a hook returns"):
        model.run_with_hooks(batch(4), {Z: lambda z, ctx: returned})


def test_fine_buckets_pad_no_length_by_more_than_a_sixteenth():
    """buckets.FINE (issue 19, E), for throughput: a row of T tokens runs a program of at most T·(1 + 1/16) tokens
    (the coarse rule ran 147 as 192), and at most 16 programs per doubling of length serve every T."""
    buckets = length_buckets(512, *FINE)
    assert all(bucket_length(T, buckets) <= T * (1 + 1 / 16) for T in range(1, 513))
    assert bucket_length(147, buckets) == 152
    for low in (32, 64, 128, 256):
        assert len([b for b in buckets if low <= b < 2 * low]) == 16


def test_interactive_buckets_are_few_and_pad_by_at_most_twice():
    """buckets.INTERACTIVE, Model.run's default: 32, 64, 128, 256, 512 — one program per doubling, so texts of 1 to
    128 tokens touch 3; past 32 tokens a row pads to under twice its length; a batch of at most buckets.FEW_ROWS
    rows starts at 64 (model.programs.padded_length), so a single text of 1 to 128 tokens touches 2. buckets.COARSE
    (16, 24, 32, 48, …), two per doubling, pads by under half its length, touching 6 lengths for texts of 1 to 96
    tokens."""
    model = Model(BertConfig(**TINY | {"max_position_embeddings": 512}))
    assert model.programs.length_buckets == length_buckets(512, *INTERACTIVE) == (32, 64, 128, 256, 512)
    assert len({bucket_length(T, model.programs.length_buckets) for T in range(1, 129)}) == 3
    assert all(bucket_length(T, model.programs.length_buckets) < T * 2 for T in range(33, 513))
    # A batch of at most FEW_ROWS rows starts at 64 (run pads it there): texts of 1 to 128 tokens touch 2 lengths.
    assert [model.programs.padded_length(T, rows) for T in (1, 32, 33, 64, 65) for rows in (1, 4, 5)] == [
        64, 64, 32, 64, 64, 32, 64, 64, 64, 64, 64, 64, 128, 128, 128]
    assert len({model.programs.padded_length(T, 1) for T in range(1, 129)}) == 2
    model.programs.bucket_rule = COARSE  # another rule is run as it says, whatever the rows
    assert model.programs.padded_length(1, 1) == 16 and model.programs.padded_length(17, 1) == 24
    tiny = Model(BertConfig(**TINY | {"max_position_embeddings": 40}))  # fewer positions than 64: its last bucket
    assert [tiny.programs.padded_length(T, 1) for T in (1, 33, 40)] == [40, 40, 40]
    assert model.programs.padded_length(np.int64(17), np.int64(1)) == 24


@pytest.mark.parametrize("length, rows, which", [
    (0, 1, "length"), (-1, 1, "length"), (513, 1, "length"), (10**6, 1, "length"), (10.5, 1, "length"),
    (float("nan"), 1, "length"), (True, 1, "length"), ("10", 1, "length"), (None, 1, "length"),
    (5, 0, "rows"), (10, 2.5, "rows"), (10, "4", "rows")])
def test_padded_length_refuses_what_is_not_a_batch_shape(length, rows, which):
    """A docs-only tester's (0, 1) and (10.5, 1) came back as 64, (513, 1) as a bare StopIteration, ("10", 1) as
    a TypeError: each is one InputError naming the argument and the range it takes."""
    model = Model(BertConfig(**TINY | {"max_position_embeddings": 512}))
    with pytest.raises(minibert.InputError, match=f"padded_length: {which}=.*pass a whole number"):
        model.programs.padded_length(length, rows)
    coarse = length_buckets(512, *COARSE)
    assert coarse[:8] == (16, 24, 32, 48, 64, 96, 128, 192)
    assert len({bucket_length(T, coarse) for T in range(1, 97)}) == 6
    assert all(bucket_length(T, coarse) < T * 1.5 for T in range(17, 513))


@pytest.mark.parametrize("width, ffn", [(384, 1536), (768, 3072)], ids=["MiniLM", "bert-base"])
def test_no_length_does_a_tenth_more_work_than_its_exact_program(width, ffn):
    """Issue 19 E's rule in work rather than time (no load moves it): a FINE bucket's forward matmul FLOPs
    (accounting.flops_per_token: linear layers per token, attention per token and key) over the exact length's,
    for every T up to 512 positions. Linear work grows by at most 1/16, attention's by (17/16)² − 1; at these
    widths attention is under a quarter of the work, so the bound is near 6.5%. The coarse rule (16, 24, 32,
    48, …) does 1.57× the work at 257 (and runs a 1-token row as 16)."""
    config = BertConfig(vocab_size=99, hidden_size=width, num_hidden_layers=2, num_attention_heads=width // 64,
                        intermediate_size=ffn, max_position_embeddings=512)
    buckets = length_buckets(512, *FINE)
    work = lambda T, n: n * flops_per_token(config, n) / (T * flops_per_token(config, T))  # noqa: E731
    worst = max(work(T, bucket_length(T, buckets)) for T in range(1, 513))
    assert worst <= 1.07, worst
    assert work(257, bucket_length(257, length_buckets(512, *COARSE))) > 1.5


def test_grad_is_one_program_per_length_and_loss(model):
    """Model.grad (loss, shifts and their gradient) is one compiled program per exact length, loss function and
    hooks: a length again reuses it, a new loss or length adds one."""
    loss = lambda out: out.last_hidden_state.sum()  # noqa: E731
    before = (model.programs.traces, model.programs.count)
    for n in (5, 6, 6, 7):
        model.grad(batch(n), loss, Z)
    model.grad(batch(7), lambda out: out.pooler_output.sum(), Z)
    assert (model.programs.traces - before[0], model.programs.count - before[1]) == (3 + 1, 3 + 1)


def test_minibert_own_hooks_never_warn(model, monkeypatch):
    """Model.grad's shifts (hooks.add_delta, a HookFn already) compile once per length: that is no user's
    hook to rewrite, so no RecompileWarning however many lengths it serves."""
    monkeypatch.setattr(hooks, "RECOMPILE_WARNING_AT", 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (3, 4, 5):
            model.grad(batch(n), lambda out: out.last_hidden_state.sum(), Z)
    assert not [w for w in caught if issubclass(w.category, minibert.RecompileWarning)]


@pytest.mark.slow  # four compilations of a tiny model, sixty calls
def test_a_long_session_of_random_lengths_compiles_the_policys_count_and_no_more(model):
    """benchmarks/session.py's long session in small: 60 calls of random lengths 1-64 mixing plain calls, pattern
    captures and a HookFn zeroing a random head at a random layer's hook_z. buckets.INTERACTIVE runs a single row
    of this 64-position model at 64 tokens whatever its length, so the policy's count is 1 × (plain + patterns + 2
    sites) = 4 programs,
    all resident under the cap of 32: every program is traced once, and calls past the warm-up trace none."""
    rng = np.random.default_rng(0)
    before, calls_after_warmup = model.programs.traces, 0
    for call in range(60):
        ids = {"input_ids": rng.integers(5, 99, size=(1, int(rng.integers(1, 65))))}
        traces = model.programs.traces
        if call % 3 == 0:
            model(ids)
        elif call % 3 == 1:
            model.run_with_cache(ids, names="blocks.*.attn.hook_pattern")
        else:
            hook = minibert.HookFn(_zero_head, head=jnp.int32(rng.integers(4)))
            model.run_with_hooks(ids, {f"blocks.{rng.integers(2)}.attn.hook_z": hook})
        calls_after_warmup = 0 if model.programs.traces > traces else calls_after_warmup + 1
    assert model.programs.traces - before == model.programs.count == 1 * (1 + 1 + 2)
    assert calls_after_warmup > 0


# ---- captures of a scanned run: one stacked buffer per site, split outside the program -----------------------------

def test_a_scanned_run_returns_each_captured_site_as_one_stacked_buffer(model):
    """Model.run's program returns a site captured at every layer of the scan as one [L, ...] buffer
    (hooks.stacked_name), split into the per-layer names outside the program (slicing L outputs inside it made its
    compile grow with depth): forward_fn(stacked=True), the same program, captures that buffer alone; a site at one
    layer keeps its own name. run_with_cache's values are the buffer's slices cut to the real length (the same
    computation at the bucket's length and at the exact one: two fp32 programs, tolerances.forward_rtol)."""
    names = "blocks.*.attn.hook_pattern"
    inputs = model.inputs(batch(7))
    shapes = jax.eval_shape(model.forward_fn(names, stacked=True), model.state, inputs)[1]
    assert {name: shape.shape for name, shape in shapes.items()} == {"blocks.0,1.attn.hook_pattern": (2, 2, 4, 7, 7)}
    one = jax.eval_shape(model.forward_fn("blocks.1.attn.hook_z", stacked=True), model.state, inputs)[1]
    assert list(one) == ["blocks.1.attn.hook_z"]
    _, stacked = jax.jit(model.forward_fn(names, stacked=True))(model.state, inputs)
    _, cache = model.run_with_cache(inputs, names=names)
    assert list(cache) == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    for layer in range(2):
        assert_close_to_scale(cache[f"blocks.{layer}.attn.hook_pattern"],
                              stacked["blocks.0,1.attn.hook_pattern"][layer],
                              forward_rtol(model.config, S=model.programs.padded_length(7, 2)), f"layer {layer}")


def test_unstacked_splits_each_buffer_into_its_layers_values():
    """device.unstacked by hand: the buffer of layers 0, 2 and 5 gives its three slots under their own names, other
    captures pass as they are, and a buffer's shape gives one layer's shape."""
    buffer = np.arange(24.0, dtype=np.float32).reshape(3, 2, 4)
    got = device.unstacked({"blocks.0,2,5.hook_resid_post": device.on_device(buffer), "embed.hook_embed": "as is"})
    assert list(got) == ["blocks.0.hook_resid_post", "blocks.2.hook_resid_post", "blocks.5.hook_resid_post",
                         "embed.hook_embed"]
    for slot, layer in enumerate((0, 2, 5)):
        np.testing.assert_array_equal(got[f"blocks.{layer}.hook_resid_post"], buffer[slot])
    assert got["embed.hook_embed"] == "as is"
    shape = device.unstacked({"blocks.3,4.hook_resid_post": jax.ShapeDtypeStruct((2, 5, 8), jnp.float32)})
    assert shape["blocks.4.hook_resid_post"].shape == (5, 8)
    assert hooks.stacked_name("blocks.*.attn.hook_z", (0, 2, 5)) == "blocks.0,2,5.attn.hook_z"


# ---- resident programs: at most model.programs.limit, least recently used out --------------------------------------

def test_the_resident_programs_stay_under_the_program_limit(model):
    """Five buckets' programs through a model that keeps three: never more than three resident; the two least
    recently used went, so running their lengths again compiles again, while the most recent runs as it is."""
    model.programs.limit = 3
    model.programs.bucket_rule = COARSE  # five lengths, five buckets
    lengths = (10, 20, 30, 40, 60)  # buckets 16, 24, 32, 48, 64
    for n in lengths:
        model(batch(n))
        assert model.programs.count <= 3
    assert model.programs.count == 3
    before = model.programs.traces
    model(batch(60))  # the most recent: resident
    assert model.programs.traces == before
    model(batch(10))  # the oldest: dropped, compiled again (and now the most recent)
    assert model.programs.traces == before + 1 and model.programs.count == 3
    model(batch(40))  # used before 60 and 10, so still resident
    assert model.programs.traces == before + 1


def test_programs_clear_drops_every_program(model):
    model(batch(10))
    model.run_with_cache(batch(10), names="blocks.*.attn.hook_pattern")
    assert model.programs.count == 2
    model.programs.clear()
    assert model.programs.count == 0
    before = model.programs.traces
    model(batch(10))
    assert model.programs.traces == before + 1 and model.programs.count == 1


def _scaled(model, state, x, *, k):
    return x * k


def compile_lines(capsys, what: str) -> list[str]:
    """The lines programs.say_compiling wrote to stderr for `what` since the last read."""
    said = re.compile(rf"minibert: compiling( \(or loading from the compilation cache\))? {re.escape(what)} "
                      rf"\(first use for these shapes\) …")
    return [line for line in capsys.readouterr().err.splitlines() if said.fullmatch(line)]


def test_a_named_program_says_when_it_compiles_and_not_when_it_is_reused(model, capsys, monkeypatch):
    """Issue 40: a cold EAP-IG spent 20 of its 37 s compiling without a word. A program Model.jit made with a name
    says so each time a call compiles it (new shapes, new static arguments), never when the call reuses it; one
    without a name, and every program under MINIBERT_QUIET_COMPILES=1, says nothing."""
    monkeypatch.delenv(programs.QUIET, raising=False)
    program = model.jit(_scaled, static_argnames=("k",), what="the scaling")
    said = []
    for x, k in [(np.ones(3), 2.0), (np.ones(3), 2.0), (np.ones(4), 2.0), (np.ones(3), 3.0), (np.ones(4), 2.0)]:
        program(model.state, x, k=k)
        said.append(len(compile_lines(capsys, "the scaling")))
    assert said == [1, 0, 1, 1, 0]
    monkeypatch.setenv(programs.QUIET, "1")
    program(model.state, np.ones(5), k=2.0)
    assert compile_lines(capsys, "the scaling") == [] and model.programs.traces  # it compiled, silently
    monkeypatch.setenv(programs.QUIET, "0")
    model.jit(lambda model, state, x: x + 1)(model.state, np.ones(6))
    assert capsys.readouterr().err == ""  # an unnamed program (the forward's) never speaks


def test_an_analysis_says_it_compiles_on_its_first_call_only(model, capsys, monkeypatch):
    monkeypatch.delenv(programs.QUIET, raising=False)

    def first_feature(out):
        return out.last_hidden_state[:, 0, 0]

    for _ in range(2):
        direct_attribution(model, batch(6), first_feature)
    assert len(compile_lines(capsys, "direct attribution")) == 1


def test_the_program_limit_must_be_a_positive_count(model):
    with pytest.raises(minibert.InputError, match="programs.limit=0: pass a whole number"):
        model.programs.limit = 0
    with pytest.raises(minibert.InputError, match="programs.limit=True: pass a whole number"):
        model.programs.limit = True
    model.programs.limit = np.int64(3)  # a NumPy whole number is a whole number
    assert model.programs.limit == 3 and type(model.programs.limit) is int


@pytest.mark.parametrize("rule", [(0, 1), (-1, 1), (32, 0), (16, 2.5), "fine", None, (8, 100), (1, 2, 3), (True, 1)])
def test_a_bucket_rule_that_cannot_be_is_refused_when_set(model, rule):
    """A tester's (0, 1) made length_buckets loop for ever at the next call; (32, 0) divided by zero, (8, 100)
    made 377 buckets: each is refused at once, naming the rules to choose from, and the model keeps its rule."""
    with pytest.raises(minibert.InputError, match=r"bucket_rule=.*pass \(smallest, per_octave\).*INTERACTIVE"):
        model.programs.bucket_rule = rule
    assert model.programs.bucket_rule == INTERACTIVE
    model.programs.bucket_rule = [np.int64(16), 2]  # a list of NumPy whole numbers is a rule
    assert model.programs.bucket_rule == COARSE
    assert model.programs.length_buckets == length_buckets(TINY["max_position_embeddings"], *COARSE)


# ---- the persistent compilation cache (minibert.runtime.cache) ------------------------------------------------------

SESSION = """
import collections, json, sys
import jax.monitoring
events = collections.Counter()
jax.monitoring.register_event_listener(lambda event, **kwargs: events.update([event]))
import jax, minibert
model = minibert.Model(minibert.BertConfig(**{tiny!r}), seed=1)
for n in (4, 20, 40):  # batches of 5 rows: more than buckets.FEW_ROWS, so lengths 4, 20 run at 32 and 40 at 64
    ids = {{"input_ids": [[5] * n] * 5}}
    model(ids)
    model.run_with_cache(ids, names="blocks.*.attn.hook_pattern")
    model.run_with_hooks(ids, {{"blocks.1.attn.hook_z": lambda z, ctx: z.at[:, :, 2].set(0.0)}})
print(json.dumps({{"dir": jax.config.jax_compilation_cache_dir, "traces": model.programs.traces,
                  "hits": events["/jax/compilation_cache/cache_hits"],
                  "misses": events["/jax/compilation_cache/cache_misses"]}}))
"""


def run_session(env: dict) -> dict:
    """SESSION in a fresh Python process with `env` (over this one's): what it reports."""
    done = subprocess.run([sys.executable, "-c", SESSION.format(tiny=TINY)], capture_output=True, text=True,
                          env=os.environ | env, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def cache_entries(directory: Path) -> set[str]:
    return {path.name for path in directory.glob("*-cache")}


@pytest.mark.slow  # three Python processes, each compiling a model's programs or loading them
def test_a_second_process_loads_every_program_from_the_persistent_cache(tmp_path):
    """A session of plain calls, captures and hooks on 5-row batches of two buckets (32, 64), in a fresh process with
    an empty cache folder: every program XLA compiles is written there. The same session in a second process
    traces as many programs and loads every one (cache hits, no miss), adding no entry; with
    MINIBERT_COMPILATION_CACHE=0 nothing is read or written."""
    folder = tmp_path / "cache"
    first = run_session({"MINIBERT_CACHE_DIR": str(folder)})
    entries = cache_entries(folder)
    assert first["dir"] == str(folder) and first["hits"] == 0 and first["misses"] == len(entries) > 0
    assert first["traces"] == 6  # plain, patterns, hook × buckets 32 and 64 (lengths 4, 20 → 32; 40 → 64)
    second = run_session({"MINIBERT_CACHE_DIR": str(folder)})
    assert second["traces"] == first["traces"] and second["misses"] == 0 and second["hits"] == first["misses"]
    assert cache_entries(folder) == entries
    off = run_session({"MINIBERT_CACHE_DIR": str(folder), "MINIBERT_COMPILATION_CACHE": "0"})
    assert off["dir"] is None and off["hits"] == off["misses"] == 0


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    """MINIBERT_CACHE_DIR, else XDG_CACHE_HOME/minibert/jax, else ~/.cache/minibert/jax; off with 0."""
    for name in ("MINIBERT_CACHE_DIR", "XDG_CACHE_HOME", "MINIBERT_COMPILATION_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache.cache_directory() == tmp_path / ".cache" / "minibert" / "jax"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_directory() == tmp_path / "xdg" / "minibert" / "jax"
    monkeypatch.setenv("MINIBERT_CACHE_DIR", str(tmp_path / "mine"))
    assert cache.cache_directory() == tmp_path / "mine"
    for off in ("0", "off", "false"):
        monkeypatch.setenv("MINIBERT_COMPILATION_CACHE", off)
        assert cache.cache_directory() is None


# ---- where the persistent cache lives, set in the environment when the first Model is built (runtime.cache) --

PROBE = """
import json, os, sys, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import jax, minibert, numpy as np
    from minibert.runtime import cache
    THRESHOLDS = ("jax_persistent_cache_min_compile_time_secs", "jax_persistent_cache_min_entry_size_bytes")
    before = [getattr(jax.config, name) for name in THRESHOLDS]
    minibert.Model(minibert.BertConfig(vocab_size=8, hidden_size=4, num_hidden_layers=1, num_attention_heads=1))
os.chdir(sys.argv[1])
value = jax.jit(lambda x: x * 2.0 + 1.0)(np.float32(3.0))
folder = cache.cache_directory()
print(json.dumps({"folder": folder and str(folder), "jax": jax.config.jax_compilation_cache_dir,
                  "on": jax.config.jax_enable_compilation_cache, "value": float(value),
                  "thresholds_kept": before == [getattr(jax.config, name) for name in THRESHOLDS],
                  "warnings": [str(w.message) for w in caught if w.category is cache.CacheWarning],
                  "where": [f"{w.filename}:{w.lineno}" for w in caught if w.category is cache.CacheWarning]}))
"""
CACHE_SETTINGS = ("MINIBERT_CACHE_DIR", "MINIBERT_COMPILATION_CACHE", "XDG_CACHE_HOME", "JAX_COMPILATION_CACHE_DIR",
                  "JAX_ENABLE_COMPILATION_CACHE")


def probe_cache(tmp_path: Path, env: dict, cwd: Path | None = None, later: Path | None = None) -> dict:
    """PROBE in a fresh process started in `cwd` (tmp_path by default) with HOME=tmp_path/home and only the cache
    settings in `env`; it compiles one small program after moving to `later` (else staying) and reports the
    folder minibert names, JAX's setting, the program's value (7.0) and minibert's CacheWarnings."""
    base = {name: value for name, value in os.environ.items() if name not in CACHE_SETTINGS}
    done = subprocess.run([sys.executable, "-c", PROBE, str(later or cwd or tmp_path)], capture_output=True,
                          text=True, env=base | {"HOME": str(tmp_path / "home")} | env, cwd=cwd or tmp_path,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["value"] == 7.0  # 3 * 2 + 1, exact in float32: the cache never changes a result
    return report


@pytest.mark.slow  # four Python processes
def test_a_jax_cache_of_your_own_is_left_as_you_set_it(tmp_path):
    """A cache folder set in JAX yourself (JAX_COMPILATION_CACHE_DIR) stays yours: the first Model changes none of
    JAX's settings — MINIBERT_CACHE_DIR does not move it (that folder is not even made), JAX's thresholds stay
    JAX's, MINIBERT_COMPILATION_CACHE=0 does not switch it off — and cache_directory() names it. JAX's cache
    switched off by you stays off and minibert names no folder. Without a JAX setting, minibert's folder gets even
    a program that compiles in milliseconds (its zero thresholds)."""
    own, mine = tmp_path / "own", tmp_path / "mine"
    alone = probe_cache(tmp_path, {"JAX_COMPILATION_CACHE_DIR": str(own)})
    assert alone["folder"] == alone["jax"] == str(own) and alone["on"] and alone["thresholds_kept"]
    both = probe_cache(tmp_path, {"JAX_COMPILATION_CACHE_DIR": str(own), "MINIBERT_CACHE_DIR": str(mine)})
    assert both["folder"] == both["jax"] == str(own) and both["thresholds_kept"] and not mine.exists()
    off = probe_cache(tmp_path, {"JAX_COMPILATION_CACHE_DIR": str(own), "MINIBERT_COMPILATION_CACHE": "0"})
    assert off["folder"] == off["jax"] == str(own) and off["on"] and off["thresholds_kept"]
    disabled = probe_cache(tmp_path, {"JAX_ENABLE_COMPILATION_CACHE": "false", "MINIBERT_CACHE_DIR": str(mine)})
    assert disabled["folder"] is None and not disabled["on"] and not mine.exists() and disabled["thresholds_kept"]
    minibert_own = probe_cache(tmp_path, {"MINIBERT_CACHE_DIR": str(mine)})
    assert minibert_own["folder"] == minibert_own["jax"] == str(mine) and not minibert_own["thresholds_kept"]
    assert cache_entries(mine)


@pytest.mark.slow  # four Python processes
def test_a_cache_folder_setting_is_made_absolute_once_with_its_variables_expanded(tmp_path):
    """A relative MINIBERT_CACHE_DIR is resolved against the working directory when the first Model is built: a
    program compiled after os.chdir still goes there. $VARIABLES and ~ are expanded; a variable that is not set
    keeps the cache off with one warning (no folder named '$...' is made). A relative XDG_CACHE_HOME is ignored
    (the XDG spec)."""
    first, later = tmp_path / "a", tmp_path / "b"
    first.mkdir(), later.mkdir()
    relative = probe_cache(tmp_path, {"MINIBERT_CACHE_DIR": "rel"}, cwd=first, later=later)
    assert relative["folder"] == relative["jax"] == str(first / "rel") and cache_entries(first / "rel")
    assert not (later / "rel").exists()
    expanded = probe_cache(tmp_path, {"MINIBERT_CACHE_DIR": "$HOME/x"})
    assert expanded["folder"] == str(tmp_path / "home" / "x") and cache_entries(tmp_path / "home" / "x")
    unset = probe_cache(tmp_path, {"MINIBERT_CACHE_DIR": "$MINIBERT_TEST_UNSET/x"}, cwd=first)
    assert unset["folder"] is None and unset["jax"] is None and len(unset["warnings"]) == 1
    assert "MINIBERT_CACHE_DIR='$MINIBERT_TEST_UNSET/x'" in unset["warnings"][0] and not list(first.glob("$*"))
    xdg = probe_cache(tmp_path, {"XDG_CACHE_HOME": "relxdg"}, cwd=first)
    assert xdg["folder"] == str(tmp_path / "home" / ".cache" / "minibert" / "jax") and not (first / "relxdg").exists()


@pytest.mark.parametrize("off", ["0", "false", "OFF", " no ", "n", "none", "Disabled"])
def test_the_obvious_off_words_turn_the_cache_off(monkeypatch, off):
    monkeypatch.setenv("MINIBERT_COMPILATION_CACHE", off)
    assert cache.switched_off() and cache.cache_directory() is None


@pytest.mark.slow  # two Python processes
def test_a_switch_value_neither_on_nor_off_keeps_the_cache_on_with_one_warning(tmp_path):
    """'maybe' keeps the cache on and says so once, naming the variable and the accepted words, at the line that
    built the first Model (PROBE's line 9), not a line of minibert's; 'yes' says nothing."""
    maybe = probe_cache(tmp_path, {"MINIBERT_COMPILATION_CACHE": "maybe", "MINIBERT_CACHE_DIR": str(tmp_path / "c")})
    assert maybe["folder"] == str(tmp_path / "c") and maybe["on"] and len(maybe["warnings"]) == 1
    assert maybe["where"] == ["<string>:9"] and PROBE.splitlines()[8].lstrip().startswith("minibert.Model(")
    assert all(word in maybe["warnings"][0] for word in ("MINIBERT_COMPILATION_CACHE='maybe'", "'off'", "'on'"))
    assert probe_cache(tmp_path, {"MINIBERT_COMPILATION_CACHE": "yes"})["warnings"] == []


@pytest.mark.slow  # two Python processes
def test_a_cache_folder_that_cannot_be_written_turns_the_cache_off_with_one_warning(tmp_path):
    """MINIBERT_CACHE_DIR naming a file, or a folder under a file: the computation runs (probe_cache checks its
    value), the cache is off in the process, one warning names the folder, the variable and the fix, and the
    file is left as it was."""
    blocker = tmp_path / "a_file"
    blocker.write_text("mine")
    for folder in (blocker, blocker / "under"):
        report = probe_cache(tmp_path, {"MINIBERT_CACHE_DIR": str(folder)})
        assert report["folder"] is None and report["jax"] is None and len(report["warnings"]) == 1
        assert all(part in report["warnings"][0] for part in (repr(str(folder)), "MINIBERT_CACHE_DIR", "Fix:"))
        assert blocker.read_text() == "mine"


def test_a_row_of_padding_only_gives_what_its_exact_length_run_gives(model):
    """A row whose attention_mask is all 0 (a batch built by hand, a text emptied by a filter) has no real key:
    at its exact length its pattern rows spread over its T positions, at a bucket length they would spread over
    the bucket's, summing to T/bucket over the first T. Run pads nothing then: its pattern rows sum to 1 (softmax
    rows of 4 terms: tolerances.sum_rtol(4)) and its hidden states and pattern are the exact run's (two programs
    of the whole forward: forward_rtol at 4 positions)."""
    inputs = {"input_ids": np.array([[2, 5, 6, 3], [2, 7, 8, 3]]), "attention_mask": np.array([[1, 1, 1, 1],
                                                                                            [0, 0, 0, 0]])}
    pattern = "blocks.0.attn.hook_pattern"
    out, cache = model.run_with_cache(inputs, names=[pattern])
    np.testing.assert_allclose(np.asarray(cache[pattern]).sum(-1), 1.0, rtol=sum_rtol(4))
    exact_out, exact_cache = jax.jit(model.forward_fn(names=[pattern]))(model.state, model.inputs(inputs))
    assert_close_to_scale(out.last_hidden_state, exact_out.last_hidden_state, forward_rtol(model.config, S=4),
                          "hidden states")
    assert_close_to_scale(cache[pattern], exact_cache[pattern], forward_rtol(model.config, S=4), "pattern")


def test_a_patch_cached_at_the_probes_short_length_runs_exact(model):
    """Issue 40: replacing blocks.0.hook_resid_post of a 5-token text with its own cached value was refused ("must
    return the shape … (1, 64, 32)"): 5 is the probe's short length, so the probe's two results matched and the call
    was padded. The probe asks the hook to keep the long value's shape; the call runs exact and gives the plain run
    (the patch is the value itself: the same program's arithmetic, compared at forward_rtol for two programs)."""
    inputs = batch(5, rows=1)
    site = "blocks.0.hook_resid_post"
    plain, cache = model.run_with_cache(inputs, names=[site])
    cached = cache[site]
    patched = model.run_with_hooks(inputs, {site: lambda value, ctx: cached})
    assert_close_to_scale(patched.last_hidden_state, plain.last_hidden_state, forward_rtol(model.config, S=64),
                          "patched with its own value")
