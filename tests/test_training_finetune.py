"""finetune's options on a tiny model: trainable= freezes the rest, hooks= act in every step, the caller's model
is left intact, a base model gets a head initialised as transformers does."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import minibert
from minibert import training
from minibert.hooks import HookFn
from minibert.training import optim
from tests.conftest import make_hf_model

ROWS = [training.Example(f"w{i} w{i + 3} a b", None, i % 2) for i in range(16)]
QUICK = dict(num_labels=2, epochs=1, batch_size=8, learning_rate=1e-2, dropout=0.0, progress=False)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    directory = tmp_path_factory.mktemp("base")
    make_hf_model(directory, "BertModel", scale=0.1)
    return minibert.load(directory)


def _named(model):
    leaves = (np.asarray(x) for x in jax.tree_util.tree_leaves(model.state))
    return dict(zip(optim.parameter_names(model.state), leaves))


def _zero_head(z, ctx, head):
    return z.at[:, :, head].set(0.0)


@pytest.mark.slow
def test_trainable_and_hooks_and_the_callers_model(base):
    before = _named(base)
    frozen = training.finetune(base, ROWS, trainable="classifier.*", **QUICK)
    start = _named(training.with_head(base, "sequence-classification", ("LABEL_0", "LABEL_1")))
    after = _named(frozen.model)
    moved = {n for n in after if not np.array_equal(after[n], start[n])}
    assert moved == {"classifier.W", "classifier.b"}
    assert all(np.array_equal(v, _named(base)[n]) for n, v in before.items())  # the caller's model is intact
    assert frozen.new_parameters == ["classifier.W", "classifier.b"]
    assert np.std(start["classifier.W"]) == pytest.approx(0.02, rel=0.3)  # N(0, initializer_range), 32×2 draws
    assert not start["classifier.b"].any()

    # Head 1 of layer 0 ablated in every step: its query, key and value weights get no gradient, so with no
    # weight decay they stay as they were, bit for bit, while the other heads' move.
    ablated = training.finetune(base, ROWS, weight_decay=0.0,
                                hooks={"blocks.0.attn.hook_z": HookFn(_zero_head, head=np.int32(1))}, **QUICK)
    trained = _named(ablated.model)
    for part in ("W_Q", "W_K", "W_V"):
        name = f"blocks.0.attn.{part}"
        np.testing.assert_array_equal(trained[name][:, 1], start[name][:, 1])
        assert not np.array_equal(trained[name][:, 0], start[name][:, 0])


@pytest.mark.slow
def test_bf16_compute_keeps_fp32_master_weights(base):
    """compute_dtype=bfloat16: the master weights stay float32 (the gradient, taken through the cast to bf16, is
    float32 too, and so are Adam's moments); the first step's loss (same weights,
    same batch) is within bf16 rounding of the fp32 run's. Bound: the bf16 forward's logits are within
    δ = forward_rtol(u = 2^-8, one program) + 2^-8 (the weights' own rounding) of the scale max|logits|, and
    cross-entropy moves by at most 2·max|Δlogit| (its gradient in the logits has ℓ1 norm ≤ 2)."""
    import jax.numpy as jnp

    from tests.tolerances import U_BF16, forward_rtol

    settings = QUICK | {"epochs": 1}
    fp32 = training.finetune(base, ROWS, **settings)
    bf16 = training.finetune(base, ROWS, compute_dtype=jnp.bfloat16, **settings)
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(bf16.model.state))
    start = training.with_head(base, "sequence-classification", ("LABEL_0", "LABEL_1"))
    scale = float(np.abs(np.asarray(start([r.text for r in ROWS]).logits)).max())
    delta = forward_rtol(base.config, S=16, programs=1, u=U_BF16) + U_BF16
    assert abs(bf16.history.loss[0] - fp32.history.loss[0]) <= 2 * delta * scale
