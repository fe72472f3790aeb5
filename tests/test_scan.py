"""The scanned stack (encoder.Encoder.stack: blocks alike in shape as one jax.lax.scan) against the unrolled one
(Model(..., scan=False): one copy of the block per layer, the reference), for every family: every hook site's
captured value, writes at one layer's sites, gradients with respect to every per-layer site, dropout, the suffix
stage from a traced layer; and what the program holds (one block whatever the depth, only the layers asked
captured, no more programs than unrolled).

Tolerance: the two programs run the same operations in the same order, but XLA fuses and orders the reductions
of a loop body and of straight-line code on its own, so they are compared as two implementations of the forward
(tolerances.forward_rtol with programs=2: the embedding LayerNorm and every block's reductions, rounded
independently in each, relative to each value's scale); the heads' sites add one block's worth
(tolerances.head_rtol). Gradients run those roundings once forward and once backward (the transposed products
have as many terms), in each program: forward_rtol with programs=4.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_hook_table import tiny_config
from tolerances import assert_close_to_scale, forward_rtol, head_rtol

from minibert import Model
from minibert.core import encoder as encoder_module
from minibert.core.encoder import unrolled_stack
from minibert.core.hooks import HookFn, add_delta, layer_of
from minibert.families.registry import ARCHITECTURE_FAMILY, ARCHITECTURES

LAYERS = 3
T = 5
# One architecture with a masked-LM head per family (every family's blocks; the heads' own sites too).
FAMILY_ARCHITECTURES = {ARCHITECTURE_FAMILY[a]: a for a in ARCHITECTURES if a.endswith("ForMaskedLM")}


def random_models(architecture: str, layers: int = LAYERS, seed: int = 0) -> tuple[Model, Model]:
    """(scanned, unrolled) Models of a tiny config with the same random weights: gains near 1, every other weight
    N(0, 0.3²), so that no site is all zeros or ones and every layer computes something of its own."""
    cfg = tiny_config(architecture, layers)
    rng = np.random.default_rng(seed)
    parameters = {name: jnp.asarray((1.0 if name.endswith(".scale") else 0.0)
                                    + (0.2 if name.endswith(".scale") else 0.3) * rng.standard_normal(value.shape),
                                    value.dtype)
                  for name, value in Model(cfg).named_parameters().items()}
    return Model.from_parameters(cfg, parameters), Model.from_parameters(cfg, parameters, scan=False)


def batch(model: Model, seed: int = 1) -> dict:
    """Two rows of T tokens, the second padded after 3."""
    ids = np.random.default_rng(seed).integers(1, model.config.vocab_size, size=(2, T))
    mask = np.array([[1] * T, [1, 1, 1] + [0] * (T - 3)])
    return {"input_ids": np.where(mask == 1, ids, model.config.pad_token_id), "attention_mask": mask}


def rtol(model: Model, name: str, programs: int = 2) -> float:
    """The bound for one site's values (module docstring): the forward's, plus the head's stage past the blocks."""
    if layer_of(name) is None and not name.startswith(("embed.", "hook_full_embed")):
        return head_rtol(model.config, S=T, programs=programs)
    return forward_rtol(model.config, S=T, programs=programs)


def assert_same_values(got: dict, want: dict, model: Model, programs: int = 2) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        value, other = np.asarray(value), np.asarray(got[name])
        finite = np.isfinite(value)  # scores hold −inf at masked keys: at the same places in both
        np.testing.assert_array_equal(np.isfinite(other), finite, err_msg=name)
        assert_close_to_scale(other, value, rtol(model, name, programs), name, where=finite)


def per_layer_sites(model: Model, layer: int) -> list[str]:
    return [name for name in model.hook_names if layer_of(name) == layer]


@pytest.mark.parametrize("family", sorted(FAMILY_ARCHITECTURES))
def test_every_site_reads_alike(family):
    scanned, unrolled = random_models(FAMILY_ARCHITECTURES[family])
    out, cache = scanned.run_with_cache(batch(scanned))
    want_out, want = unrolled.run_with_cache(batch(unrolled))
    assert len(cache) == len(scanned.hook_names)
    assert_same_values(dict(cache), dict(want), scanned)
    assert_same_values({"logits": out.logits}, {"logits": want_out.logits}, scanned)


def _scaled(value, ctx, factor):
    """A write that every site shows downstream: value · factor (a traced argument)."""
    return (value * factor).astype(value.dtype)


@pytest.mark.parametrize("family", sorted(FAMILY_ARCHITECTURES))
def test_writes_act_on_their_own_layer_only(family):
    """Every site of layer 1 scaled (each by its own factor) while every site is captured: the captures, in
    every layer, are the unrolled stack's; layer 1's captured sites hold the written values, so the write ran
    there; layers 0 and 2 match the unrolled run, so it ran nowhere else."""
    scanned, unrolled = random_models(FAMILY_ARCHITECTURES[family])
    sites = per_layer_sites(scanned, 1)
    hooks = {name: HookFn(_scaled, factor=jnp.float32(1.0 + 0.05 * (k + 1))) for k, name in enumerate(sites)}
    out, cache = scanned.run(batch(scanned), names=None, hooks=hooks)
    want_out, want = unrolled.run(batch(unrolled), names=None, hooks=hooks)
    assert_same_values(dict(cache), dict(want), scanned)
    assert_same_values({"logits": out.logits}, {"logits": want_out.logits}, scanned)
    plain = scanned.run_with_cache(batch(scanned), names="blocks.*.hook_resid_pre")[1]
    for layer, changed in ((0, False), (2, True)):  # layer 0 reads what it read; the writes change layer 2's input
        name = f"blocks.{layer}.hook_resid_pre"
        moved = np.abs(np.asarray(cache[name]) - np.asarray(plain[name])).max()
        assert (moved > 0.01) == changed, (name, moved)
    name = "blocks.1.hook_resid_pre"  # captured after its write: the stream layer 1 was given, scaled
    factor = 1.0 + 0.05 * (sites.index(name) + 1)
    assert_close_to_scale(cache[name], factor * np.asarray(plain[name]), rtol(scanned, name), name)


def test_hooks_see_their_own_layer_and_name():
    """ctx.layer and ctx.name are the layer's own (Python values), as in the unrolled stack: a hook on every
    layer's resid_mid that adds its layer number moves each layer by its own amount."""
    scanned, unrolled = random_models(FAMILY_ARCHITECTURES["bert"])
    seen = []

    def add_layer(value, ctx):
        seen.append((ctx.name, ctx.layer, ctx.layer()))
        return value + ctx.layer

    names = "blocks.*.hook_resid_mid"
    _, cache = scanned.run(batch(scanned), names=names, hooks={names: add_layer})
    _, want = unrolled.run(batch(unrolled), names=names, hooks={names: add_layer})
    assert_same_values(dict(cache), dict(want), scanned)
    assert sorted(set(seen)) == [(f"blocks.{i}.hook_resid_mid", i, i) for i in range(LAYERS)]


def scan_backward(model: Model, data: dict, loss, names: list[str]) -> dict:
    """{name: ∂Σ loss/∂value} through the scanned stack's own backward (jax.grad of forward_fn, outside
    core.encoder.unrolled_stack), the way Model.grad differentiated before it unrolled the stack."""
    inputs = model.inputs(data)
    _, values = model.forward_fn(names)(model.state, inputs)

    def objective(deltas):
        out, _ = model.forward_fn((), {n: HookFn(add_delta, delta=d) for n, d in deltas.items()})(model.state, inputs)
        return loss(out).sum()

    zeros = {name: jnp.zeros_like(value) for name, value in values.items()}
    assert "scan" in str(jax.make_jaxpr(jax.grad(objective))(zeros))  # the scan's backward, not the unrolled one
    return jax.jit(jax.grad(objective))(zeros)


@pytest.mark.slow  # three gradient programs of every site per family
@pytest.mark.parametrize("family", sorted(FAMILY_ARCHITECTURES))
def test_gradients_wrt_every_site_alike(family):
    """Model.grad (the stack unrolled, core.encoder.unrolled_stack) of the scanned model, the scan's own backward, and
    the unrolled model's Model.grad give the same gradient at every per-layer site."""
    scanned, unrolled = random_models(FAMILY_ARCHITECTURES[family])
    direction = jnp.asarray(np.random.default_rng(2).standard_normal(scanned.config.vocab_size), jnp.float32)

    def loss(out):  # one value per row, reading every position's logits
        return (out.logits @ direction).sum(-1)

    names = [name for name in scanned.hook_names if layer_of(name) is not None]
    got_loss, got = scanned.grad(batch(scanned), loss, names)
    want_loss, want = unrolled.grad(batch(unrolled), loss, names)
    assert_close_to_scale(got_loss, want_loss, rtol(scanned, "logits"), "loss")
    assert_same_values(got, want, scanned, programs=4)
    assert_same_values(scan_backward(scanned, batch(scanned), loss, names), want, scanned, programs=4)
    for layer in range(LAYERS):  # every layer's stream matters to the loss: the comparison is not of zeros
        assert np.abs(np.asarray(want[f"blocks.{layer}.hook_resid_pre"])).max() > 0.01


def test_programs_that_differentiate_trace_the_stack_unrolled():
    """Within core.encoder.unrolled_stack (Model.grad, the gradient analyses, fine-tuning's step) a scanned model's
    forward holds one copy of the block per layer and no scan; outside it, the scan."""
    scanned, unrolled = random_models(FAMILY_ARCHITECTURES["bert"])
    with unrolled_stack():
        inside = _jaxpr(scanned)
    outside = _jaxpr(scanned)
    assert "scan" in outside and "scan" not in inside
    assert inside.count("dot_general") == _jaxpr(unrolled).count("dot_general") > outside.count("dot_general")
    assert not encoder_module._DIFFERENTIATED.get()  # the context resets on leaving


def test_dropout_draws_each_layers_own_masks():
    """forward_fn with dropout: each layer of the scan draws the masks its unrolled block draws (the key of the
    layer's own site names), so the two programs give the same training forward."""
    scanned, unrolled = random_models(FAMILY_ARCHITECTURES["bert"])
    rates = {"hidden": 0.3, "attention": 0.2}
    key = jax.random.key(3)
    inputs = scanned.inputs(batch(scanned))
    names = "blocks.*.hook_resid_post"
    out, cache = scanned.forward_fn(names, dropout=rates)(scanned.state, inputs, key)
    want_out, want = unrolled.forward_fn(names, dropout=rates)(unrolled.state, inputs, key)
    assert_same_values(cache, want, scanned)
    plain = scanned.forward_fn(names)(scanned.state, inputs)[1]
    name = "blocks.0.hook_resid_post"
    assert np.abs(np.asarray(cache[name]) - np.asarray(plain[name])).max() > 0.1  # dropout did drop


@pytest.mark.parametrize("family", ["bert", "albert"])
def test_suffix_from_a_traced_layer(family):
    """model.suffix with a traced start (one program for every start; blocks before it skipped) in both stacks,
    its value and its gradient with respect to the stream it starts from."""
    scanned, unrolled = random_models(FAMILY_ARCHITECTURES[family])
    inputs = scanned.inputs(batch(scanned))
    resid = scanned.run_with_cache(inputs, names="blocks.*.hook_resid_pre")[1]

    def suffix(model):
        def total(layer, stream):
            return model.suffix(model.state, layer, stream, inputs).logits.sum()
        return jax.jit(jax.value_and_grad(total, argnums=1))

    for layer in range(LAYERS):
        stream = resid[f"blocks.{layer}.hook_resid_pre"]
        got, got_grad = suffix(scanned)(jnp.int32(layer), stream)
        want, want_grad = suffix(unrolled)(jnp.int32(layer), stream)
        assert_close_to_scale(got, want, rtol(scanned, "logits"), f"suffix from {layer}")
        assert_close_to_scale(got_grad, want_grad, forward_rtol(scanned.config, S=T, programs=4), f"grad {layer}")


def _jaxpr(model: Model, names=(), hooks=None) -> str:
    inputs = model.inputs(batch(model))
    return str(jax.make_jaxpr(model.forward_fn(names, hooks))(model.state, inputs))


@pytest.mark.parametrize("family", ["bert", "albert", "deberta-v2"])
def test_the_program_holds_one_block_whatever_the_depth(family):
    """The traced program's matrix products (dot_general) do not grow with depth when scanned, and grow by one
    block's per layer unrolled."""
    architecture = FAMILY_ARCHITECTURES[family]
    products = {layers: [_jaxpr(model).count("dot_general") for model in random_models(architecture, layers)]
                for layers in (2, 5)}
    assert products[2][0] == products[5][0]
    per_block = (products[5][1] - products[2][1]) / 3
    assert per_block >= 6 and products[5][1] == products[2][1] + 3 * per_block


def test_only_the_layers_asked_are_captured():
    """A capture of block 1's pattern carries a buffer of one layer's patterns through the scan ([1, B, H, T, S]),
    not every layer's, and comes back under its own name only."""
    scanned, _ = random_models(FAMILY_ARCHITECTURES["bert"], layers=5)
    H = scanned.config.num_attention_heads
    _, cache = scanned.run_with_cache(batch(scanned), names="blocks.1.attn.hook_pattern")
    assert list(cache) == ["blocks.1.attn.hook_pattern"]
    program = _jaxpr(scanned, names="blocks.1.attn.hook_pattern")
    assert f"f32[1,2,{H},{T},{T}]" in program and f"f32[5,2,{H},{T},{T}]" not in program
    every = _jaxpr(scanned, names="blocks.*.attn.hook_pattern")
    assert f"f32[5,2,{H},{T},{T}]" in every


@pytest.mark.slow
def test_programs_counted_are_no_more_than_unrolled():
    """The same call sequence (plain, captures, a HookFn swept over heads, grads, offload) traces as many programs
    scanned as unrolled: the scan adds none (and the sweep over heads reuses its program in both)."""
    counts = []
    for model in random_models(FAMILY_ARCHITECTURES["bert"]):
        data = batch(model)
        model(data)
        model.run_with_cache(data, names="blocks.*.attn.hook_pattern")
        for head in range(2):
            model.run_with_hooks(data, {"blocks.1.attn.hook_z": HookFn(
                lambda value, ctx, head: value.at[:, :, head].set(0.0), head=jnp.int32(head))})
        model.grad(data, lambda out: out.logits.sum(axis=(1, 2)), "blocks.*.hook_resid_pre")
        model.run_with_cache(data, names="blocks.0.hook_resid_post", offload=True)
        counts.append(model.programs.traces)
    assert counts[0] == counts[1]


@pytest.mark.parametrize("architecture", list(FAMILY_ARCHITECTURES.values()), ids=list(FAMILY_ARCHITECTURES))
def test_hook_sites_of_a_scanned_model_are_the_unrolled_ones(architecture):
    """Model.hook_sites traces a scanned model's block once and names its sites for every layer of the run: the
    same names in the same (forward) order, with the same shapes and dtypes, as the unrolled trace of every layer."""
    scanned, unrolled = random_models(architecture)
    assert list(scanned.hook_sites.items()) == list(unrolled.hook_sites.items())
    assert sum(layer_of(name) == LAYERS - 1 for name in scanned.hook_sites) > 0
