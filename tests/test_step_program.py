"""finetune's compiled step as a program: where bf16 casts sit (counted in the lowered HLO against the model's
structure), the [CLS]-only last block of a sequence classifier (the same losses and weights as the whole block),
and losses read one step late (no host sync on the step just dispatched)."""

from __future__ import annotations

import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import minibert
from minibert import training
from minibert.core.hooks import writers_for
from minibert.runtime.weights import by_name
from minibert.training import optim
from minibert.training.finetune import LateLosses, TrainingStep, compiled_step, compute_parameters, task_loss
from tests.conftest import make_hf_model, random_batch
from tests.tolerances import U32, head_rtol

LABELS = ("LABEL_0", "LABEL_1")


def classifier(tmp_path, layers: int = 2):
    make_hf_model(tmp_path, "BertModel", num_hidden_layers=layers)
    return training.with_head(minibert.load(tmp_path), "sequence-classification", LABELS)


def batch_of(model, B: int = 4, T: int = 16, seed: int = 0) -> dict:
    rows = random_batch(np.random.default_rng(seed), B, T, model.config.vocab_size)
    return {k: jnp.asarray(v, jnp.int32) for k, v in rows.items()} | {
        "labels": jnp.arange(B, dtype=jnp.int32) % 2, "weight": jnp.ones(B, jnp.float32)}


def step_for(model, dtype=jnp.float32, hooks=None) -> tuple[TrainingStep, list]:
    leaves, writer_def = jax.tree_util.tree_flatten(writers_for(hooks, model.hook_names, model.config.architecture))
    return TrainingStep(model, "sequence-classification", {}, writer_def, jnp.dtype(dtype)), leaves


def lowered_converts(model, dtype) -> list[str]:
    """The stablehlo.convert lines of finetune's step for `model` (4 × 16 rows), lowered."""
    params = model.params  # the step's one form of parameters
    optimizer = optim.adamw(1e-3, mask=optim.decay_mask(params))
    step, leaves = step_for(model, dtype)
    lowered = compiled_step(step, optimizer).trace(params, {}, optimizer.init(params), batch_of(model),
                                                    jax.random.key(0), leaves).lower()
    return [line for line in lowered.as_text().splitlines() if "stablehlo.convert" in line]


@pytest.mark.slow
def test_bf16_step_converts_are_bounded_by_the_models_structure(tmp_path):
    """The bf16 step converts, per layer, at most: each matmul weight and bias once to bf16 and its gradient once
    back (2 per parameter); each of the block's 2 LayerNorms its input to float32 and its output back, forward and
    backward (2·2·2); attention's pattern [B, H, T, S] and its row sums' quotient [B, H, T, K] to float32 and back,
    forward and backward (2·2·2). On top of the float32 step's converts (the loss's): the logits to float32 and
    their gradient (2), the head's matmul parameters (2 each) and the embedded stream (2: the tables stay float32).
    Before compute_parameters kept tables and LayerNorm parameters float32 the layer made 56."""
    models = {layers: classifier(tmp_path / str(layers), layers) for layers in (1, 2)}
    fp32 = len(lowered_converts(models[1], jnp.float32))
    counts = {layers: lowered_converts(model, jnp.bfloat16) for layers, model in models.items()}
    names = models[1].named_parameters()
    matmul_params = [n for n in compute_parameters(names, jnp.bfloat16) if n.startswith("blocks.0.")
                     and n.rsplit(".", 1)[-1] not in ("scale", "bias")]
    per_layer = 2 * len(matmul_params) + 2 * 2 * 2 + 2 * 2 * 2
    head_params = [n for n in names if n.startswith(("pooler.", "classifier."))]
    assert len(counts[2]) - len(counts[1]) <= per_layer
    assert len(counts[1]) <= fp32 + 2 + 2 * len(head_params) + 2 + per_layer
    V, E = names["embed.word"].shape
    assert not any(re.search(rf"tensor<{V}x{E}x", line) for line in counts[2])  # no bf16 copy of the table


def test_compute_parameters_keeps_tables_and_layernorm_float32():
    flat = {n: jnp.ones((2, 2)) for n in ("embed.word", "embed.position", "embed.token_type", "embed.ln.scale",
                                           "blocks.0.ln1.bias", "blocks.0.attn.W_Q", "blocks.0.attn.b_Q",
                                           "classifier.W", "mlm.decoder_bias")}
    cast = compute_parameters(flat, jnp.bfloat16)
    kept = {n for n, p in cast.items() if p.dtype == jnp.float32}
    assert kept == {"embed.word", "embed.position", "embed.token_type", "embed.ln.scale", "blocks.0.ln1.bias"}
    assert all(p.dtype == jnp.float32 for p in compute_parameters(flat, jnp.float32).values())


def test_first_token_only_where_nothing_reads_other_positions(tmp_path):
    model = classifier(tmp_path)
    assert step_for(model)[0].first_token_only({})
    assert step_for(model)[0].first_token_only({"blocks.0.hook_resid_post": ()})  # earlier blocks: any position
    assert not step_for(model)[0].first_token_only({"blocks.1.attn.hook_z": ()})
    token = training.with_head(model, "token-classification", LABELS)
    assert not token.module.first_token_suffices and model.module.first_token_suffices


@pytest.mark.slow
def test_first_token_last_block_gives_the_whole_blocks_losses_and_weights(tmp_path):
    """Three steps of finetune's compiled step (the last block at [CLS] alone) against a reference step written
    here on the whole forward (forward_fn, every position of every block), from the same weights and batches.
    SGD, so a weight's change is lr·Σ gradients: the two differ by rounding only. Bound: the logits are within
    head_rtol (two programs) of their scale, the loss by twice that (cross-entropy's gradient in the logits has
    ℓ1 norm ≤ 2); a gradient is a backward pass through the same chain, whose reductions are twice the forward's,
    so 2·head_rtol of the gradients' scale, and the weight changes likewise of theirs, plus the rounding of each
    stored weight (u·|w| per step, on both sides: b_K's gradient is 0 up to rounding, its change is that alone);
    step i starts from weights that already differ by the earlier steps' errors, so the bounds grow with the
    steps taken."""
    model = classifier(tmp_path)
    T = 16
    lr = 0.1
    optimizer = optax.sgd(lr)
    step, leaves = step_for(model)
    assert step.first_token_only({})
    fast = compiled_step(step, optimizer)
    forward = model.forward_fn()

    @jax.jit
    def reference(params, batch):
        def loss(p):
            inputs = minibert.runtime.model.Inputs(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
            return task_loss(forward(model.state_from(p), inputs)[0].logits, batch, "sequence-classification")

        value, grads = jax.value_and_grad(loss)(params)
        return jax.tree.map(lambda p, g: p - lr * g, params, grads), value

    start = model.named_parameters()
    ours = jax.tree.map(lambda p: jnp.array(p, copy=True), model.params)  # the step's form: the nested params dict
    theirs, state = dict(start), optimizer.init(ours)
    rtol = head_rtol(model.config, T)
    for i in range(3):
        batch = batch_of(model, T=T, seed=i)
        ours, state, our_loss = fast(ours, {}, state, batch, jax.random.key(0), leaves)
        theirs, their_loss = reference(theirs, batch)
        logits = forward(model.state_from(theirs), minibert.runtime.model.Inputs(
            batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]))[0].logits
        assert abs(float(our_loss) - float(their_loss)) <= 2 * rtol * float(jnp.abs(logits).max()) * (i + 1)
    ours = by_name(ours)
    for name, p in start.items():
        ours_moved, theirs_moved = np.asarray(ours[name]) - p, np.asarray(theirs[name]) - p
        stored = 3 * 2 * U32 * np.abs(np.asarray(theirs[name])).max()  # each step rounds both weights once
        assert np.abs(ours_moved - theirs_moved).max() <= 3 * 2 * rtol * np.abs(theirs_moved).max() + stored, name


class Loss:
    """A device scalar's stand-in that logs when it is read."""

    def __init__(self, value, log):
        self.value, self.log = value, log

    def __float__(self):
        self.log.append(("read", self.value))
        return float(self.value)


def test_losses_are_read_one_update_late_and_all_recorded():
    log, recorded = [], []
    late = LateLosses(lambda update, loss, tokens: recorded.append((update, loss, tokens)))
    for update in range(3):
        log.append(("dispatched", update))
        late.add(update, [Loss(update, log), Loss(update + 0.5, log)], tokens=10 + update)
    late.flush()
    assert recorded == [(0, 0.25, 10), (1, 1.25, 11), (2, 2.25, 12)]  # every update, its micro-batches' mean
    # update n's losses are read only after update n + 1 was dispatched (the last at the flush)
    reads = [i for i, event in enumerate(log) if event[0] == "read"]
    for update in range(2):
        first_read = next(i for i in reads if log[i][1] == update)
        assert first_read > log.index(("dispatched", update + 1))


@pytest.mark.slow
def test_bf16_on_a_cpu_warns_with_the_reason(tmp_path):
    make_hf_model(tmp_path, "BertModel")
    rows = [training.Example(f"w{i} a b", None, i % 2) for i in range(4)]
    with pytest.warns(UserWarning, match="XLA:CPU has no bf16 matmul kernels"):
        training.finetune(minibert.load(tmp_path), rows, num_labels=2, epochs=1, batch_size=4,
                          compute_dtype=jnp.bfloat16, progress=False)


@pytest.mark.slow
def test_a_fine_tuning_run_converts_its_parameters_and_hooks_outside_the_steps_traces(tmp_path, monkeypatch):
    """Counted in training.finetune (a tiny classifier, 2 epochs of 2 batches at 2 step lengths, eval data at 2
    lengths, one HookFn: 2 traces of the step and 2 of the evaluation): inside a trace the parameters meet one form,
    the nested params dict the forward takes (no dotted name read, no State made from names, no pure dict made
    from a State), the hooks are unflattened once (the forward's HookPoints) and never keyed or flattened again,
    and the module is merged once. Over the whole run the hooks are keyed and flattened once. Before (9cf202e^):
    each trace made the State from the flat dotted dict (4 state_from, 4 × 1 read of the names), keyed and
    flattened the hooks again (5 keys and 5 flattens in all) and unflattened them twice (8)."""
    import importlib

    from flax import nnx

    from minibert.core import contract, hooks
    from minibert.runtime import weights
    from minibert.training import resume

    finetune_module = importlib.import_module("minibert.training.finetune")
    counts, tracing = collections.Counter(), []

    def counted(owner, name, label, when=lambda *args: True):
        original = getattr(owner, name)

        def call(*args, **kwargs):
            result = original(*args, **kwargs)
            if when(*args, result):
                counts["trace" if tracing else "run", label] += 1
            return result

        monkeypatch.setattr(owner, name, call)

    def has_hooks(*values):
        return any(isinstance(leaf, hooks.HookFn) for value in values if not isinstance(value, jax.tree_util.PyTreeDef)
                   for leaf in jax.tree_util.tree_leaves(value, is_leaf=lambda x: isinstance(x, hooks.HookFn)))

    for owner in (weights, optim):
        counted(owner, "parameter_names", "names read")
    for owner in (weights, resume):
        counted(owner, "by_name", "named from a tree")
        counted(owner, "shaped_as", "a tree made from names")
    counted(nnx, "to_pure_dict", "a pure dict made from a State")
    counted(nnx, "merge", "module merged")
    counted(contract, "behaviour_key", "hook keyed")
    counted(jax.tree_util, "tree_flatten", "hooks flattened", has_hooks)
    counted(jax.tree_util, "tree_unflatten", "hooks unflattened", lambda *args: has_hooks(args[-1]))
    logits = finetune_module.TrainingStep.logits

    def traced_logits(self, *args):
        tracing.append(True)
        try:
            return logits(self, *args)
        finally:
            tracing.pop()

    monkeypatch.setattr(finetune_module.TrainingStep, "logits", traced_logits)
    make_hf_model(tmp_path, "BertModel", scale=0.1)
    base = minibert.load(tmp_path)
    rows = [training.Example(" ".join(["a"] * (3 if i < 4 else 20)), None, i % 2) for i in range(8)]
    hook = {"blocks.0.attn.hook_z": hooks.HookFn(lambda z, ctx, factor: z * factor, factor=np.float32(0.5))}
    counts.clear()
    result = training.finetune(base, rows, num_labels=2, epochs=2, batch_size=4, shuffle=False, learning_rate=1e-3,
                               dropout=0.0, progress=False, eval_data=rows[:6], hooks=hook)
    assert len(result.step_lengths) == 2 and len(result.history.eval) == 2
    in_traces = {label: n for (when, label), n in counts.items() if when == "trace"}
    # merged once per trace, and once per TrainingStep (the step's, the evaluation's) at its first: first_token_suffices
    assert in_traces == {"hooks unflattened": 4, "module merged": 4 + 2}, in_traces
    assert counts["run", "hook keyed"] == 1 and counts["run", "hooks flattened"] == 1, counts
