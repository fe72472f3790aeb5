"""Direct attribution (analysis.circuits.direct) and the frozen skip path under it, for a post-LN BERT and a pre-LN
ModernBERT: the parts against an independent gradient of the metric at the final point, each head's part against a
forward where only that head's output is removed along the frozen skip path."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_hf_model, random_batch
from test_families_modern import make_modernbert, padded_batch
from tolerances import dot_rtol, forward_rtol

import minibert
from minibert.analysis.circuits import direct_attribution
from minibert.analysis.circuits.frozen import point_names, readout_hooks, scale_names, skip_path, skip_weights
from minibert.core.hooks import HookFn

B, T = 3, 9


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-mlm")
    make_hf_model(directory, "BertForMaskedLM", scale=0.2)
    model = minibert.load(directory)
    return model, random_batch(np.random.default_rng(0), B, T, model.config.vocab_size)


@pytest.fixture(scope="module")
def modern(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-modern")
    make_modernbert(directory, "ForMaskedLM", scale=0.2)
    model = minibert.load(directory)
    return model, padded_batch(np.random.default_rng(1), B, T)


def readout_direction(model):
    return jnp.asarray(np.random.default_rng(2).normal(size=model.config.hidden_size), jnp.float32)


def linear_readout(model):
    """A metric linear in the final hidden state (after ln_final frozen, pre-LN): ⟨w, h[:, 0]⟩ per row."""
    w = readout_direction(model)
    return lambda out: out.last_hidden_state[:, 0] @ w


def logit_difference(out):
    return out.logits[:, 1, 7] - out.logits[:, 1, 9]


def cosine_to_first_row(out):
    pooled = out.last_hidden_state.mean(1)
    unit = pooled / jnp.linalg.norm(pooled, axis=-1, keepdims=True)
    return unit @ unit[0]


def decomposition_rtol(model, rows: int) -> float:
    """Error of Σ parts against ⟨g, h_F⟩ relative to the sum of their magnitudes: each part is a dot product
    over B·T·D terms, its carried vector went through up to 2L frozen layernorms (a mean and a division over D
    each) and g, h_F come from two other programs (forward_rtol, two programs)."""
    cfg = model.config
    return (dot_rtol(rows * T * cfg.hidden_size) + 2 * cfg.num_hidden_layers * dot_rtol(cfg.hidden_size)
            + forward_rtol(cfg, S=T))


def reference_linear(model, batch, metric) -> float:
    """⟨∂metric/∂h_F, h_F⟩ of the mean over rows: model.grad at the final point, ln_final frozen (pre-LN)."""
    final = point_names(model)["final"][0]
    rows = np.asarray(batch["input_ids"]).shape[0]
    _, grads = model.grad(batch, lambda out: metric(out).mean(), final, hooks=readout_hooks(model))
    _, cache = model.run_with_cache(batch, final)
    return float((np.asarray(grads[final]) * np.asarray(cache[final])).sum()), rows


@pytest.mark.parametrize("family", ["bert", "modern"])
@pytest.mark.parametrize("metric", [pytest.param("logits", marks=pytest.mark.slow),
                                    pytest.param("cosine", marks=pytest.mark.slow), "linear"])
def test_parts_sum_to_the_linearised_metric(request, family, metric):
    model, batch = request.getfixturevalue(family)
    fn = {"logits": logit_difference, "cosine": cosine_to_first_row, "linear": linear_readout(model)}[metric]
    result = direct_attribution(model, batch, fn)
    linear, rows = reference_linear(model, batch, fn)
    parts = np.concatenate([result.heads.ravel(), result.mlps, result.bias, [result.embed, result.constant]])
    magnitude = np.abs(parts).sum() + abs(linear)
    assert abs(parts.sum() - linear) <= decomposition_rtol(model, rows) * magnitude
    assert abs(result.linear - linear) <= decomposition_rtol(model, rows) * magnitude
    if family == "modern":
        assert result.constant == 0  # no layernorm on a pre-LN stream before ln_final
    # the metric itself, from the plain forward: another program's logits, within the same bound
    plain = float(np.asarray(fn(model(batch))).mean())
    assert abs(result.metric - plain) <= decomposition_rtol(model, rows) * magnitude


def _set(value, ctx, values):
    return values[ctx.layer]


def _set_scale(value, ctx, values):
    return values


def _removed_head(value, ctx, values, layer, head, heads):
    """The clean attention output, less head `head`'s output in block `layer`."""
    return values[ctx.layer] - jnp.where(ctx.layer == layer, heads[ctx.layer][:, :, head], 0.0)


@pytest.mark.parametrize("family", ["bert", "modern"])
def test_each_head_part_is_its_removal_along_the_frozen_skip_path(request, family):
    """Brute force: every layernorm on the stream holds the clean run's σ, every attention and MLP writes its
    clean output (so a later sublayer never sees the change), and block l's attention output loses head h's
    share: only the skip path carries the removal. With a metric linear in h_F the drop is DA exactly."""
    model, batch = request.getfixturevalue(family)
    metric = linear_readout(model)
    before = model.programs.traces
    result = direct_attribution(model, batch, metric)
    assert model.programs.traces - before <= 1  # one program (none new where an earlier test compiled it)
    norms = scale_names(model) + ([] if model.config.family.norm == "post" else ["ln_final.hook_scale"])
    sites = ["blocks.*.hook_attn_out", "blocks.*.hook_mlp_out", "blocks.*.attn.hook_result"]
    out, cache = model.run_with_cache(batch, norms + sites)
    attn, mlp, heads = (cache.stack(s.split(".", 2)[2]) for s in sites)
    frozen = {name: HookFn(_set_scale, values=cache[name]) for name in norms}
    clean = float(np.asarray(metric(out)).mean())
    L, H = result.heads.shape
    brute = np.zeros((L, H))
    for layer in range(L):
        for head in range(H):
            hooks = frozen | {"blocks.*.hook_mlp_out": HookFn(_set, values=mlp),
                              "blocks.*.hook_attn_out": HookFn(_removed_head, values=attn, layer=jnp.int32(layer),
                                                               head=jnp.int32(head), heads=heads)}
            brute[layer, head] = clean - float(np.asarray(metric(model.run_with_hooks(batch, hooks))).mean())
    scale = np.abs(brute).max()
    # Two programs' final states (forward_rtol, two programs) read by a dot over D, relative to the largest part
    rtol = forward_rtol(model.config, S=T) + dot_rtol(model.config.hidden_size)
    assert np.abs(result.heads - brute).max() <= rtol * max(scale, abs(clean))


def test_frozen_skip_path_rebuilds_the_final_state(bert):
    """Post-LN: carrying e, every attention output and every MLP output through the frozen LN1/LN2 maps with their
    β gives the model's last hidden state (the substrate against the model itself)."""
    model, batch = bert
    names = ["hook_full_embed", "blocks.*.hook_attn_out", "blocks.*.hook_mlp_out", *scale_names(model)]
    out, cache = model.run_with_cache(batch, names)
    skip = skip_path(model, dict(cache.items()), skip_weights(model))
    final = skip.carry(cache["hook_full_embed"], cache.stack("hook_attn_out"), cache.stack("hook_mlp_out"),
                       with_biases=True).final
    rtol = forward_rtol(model.config, S=T)  # the same roundings in another order: two programs
    np.testing.assert_array_less(np.abs(np.asarray(final) - np.asarray(out.last_hidden_state)).max(),
                                 rtol * np.abs(np.asarray(out.last_hidden_state)).max())
