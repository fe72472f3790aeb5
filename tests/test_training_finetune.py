"""finetune's options on a tiny model: trainable= freezes the rest, hooks= act in every step, the caller's model
is left intact, a base model gets a head initialised as transformers does."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest

import minibert
from minibert import training
from minibert.core.hooks import HookFn
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


@pytest.mark.slow
def test_accumulation_of_two_half_batches_is_one_whole_batch(base):
    """accumulate=2 with batches of 4 makes the updates of batches of 8: the same examples per update (the epoch's
    order does not depend on the batch size), every row full, so the mean of the two halves' mean losses is the
    whole batch's mean. The runs differ only in summation order: within the drift bound of two fp32 computations
    of the same steps (test_training_parity), key biases within their rounding-noise bound (see there)."""
    from tests.test_training_parity import KAPPA, _training_rtol

    rows = [training.Example(" ".join(f"w{(i * 7 + j) % 40}" for j in range(4)), None, i % 2) for i in range(32)]
    settings = QUICK | {"learning_rate": 1e-3}  # one length: one compiled program per run
    whole = training.finetune(base, rows, **(settings | {"batch_size": 8}))
    halves = training.finetune(base, rows, accumulate=2, **(settings | {"batch_size": 4}))
    assert len(halves.history.loss) == len(whole.history.loss) == 4
    assert halves.history.learning_rate == whole.history.learning_rate
    rtol = _training_rtol(base.config, 16, 4)
    np.testing.assert_allclose(halves.history.loss, whole.history.loss, rtol=rtol, atol=0)
    ours, theirs = _named(halves.model), _named(whole.model)
    noise_bound = 2 * KAPPA * sum(whole.history.learning_rate)
    for name, value in theirs.items():
        bound = noise_bound if name.endswith("attn.b_K") else rtol * np.abs(value).max()
        assert np.abs(ours[name] - value).max() <= bound, name
    moved = np.abs(ours["classifier.W"] - _named(training.with_head(base))["classifier.W"]).max()
    assert moved > 100 * rtol * np.abs(theirs["classifier.W"]).max()  # the comparison is not of unmoved weights


@pytest.mark.slow
def test_one_compiled_step_per_step_length(base, monkeypatch):
    """Every batch's length is one of the run's step lengths (data.step_lengths over its batches), and the step
    compiles once for each length the run meets, over every epoch: never once per batch."""
    import importlib

    from minibert.training import data as data_

    finetune_module = importlib.import_module("minibert.training.finetune")  # the attribute is the function

    programs = []
    original = finetune_module.compiled_step

    def recording(step, optimizer):
        programs.append(original(step, optimizer))
        return programs[-1]

    monkeypatch.setattr(finetune_module, "compiled_step", recording)
    # 4, 22 and 42 tokens, shuffled into batches of 4 whose longest rows differ
    rows = [training.Example(" ".join(["a"] * (2, 20, 40)[i % 3]), None, i % 2) for i in range(24)]
    result = training.finetune(base, rows, **(QUICK | {"epochs": 3, "batch_size": 4}))
    encoded = data_.encode(base, rows, "sequence-classification", ("LABEL_0", "LABEL_1"))
    orders = [data_.epoch_order(len(rows), epoch, 0, True) for epoch in range(3)]
    chosen = data_.step_lengths(data_.longest_rows(encoded, orders, 4), base.config.max_tokens)
    lengths = {batch["input_ids"].shape[1] for order in orders
               for batch in data_.batches(encoded, order, 4, "sequence-classification", chosen, pad_id=0)}
    assert lengths == set(result.step_lengths) == set(chosen)
    assert len(programs) == 1 and programs[0]._cache_size() == len(lengths) < len(result.history.loss) == 18
    assert len(lengths) > 1  # batches of different lengths met


@pytest.mark.slow
def test_evaluation_scores_are_the_trained_models(base):
    """history.eval's accuracy and macro-F1 equal what the returned model predicts on the held-out examples
    (scikit-learn's f1_score), and its loss their mean cross-entropy. The loss is compared within the forward's
    rounding: the two programs (evaluation in the step's batches, the model's own call) differ by at most
    forward_rtol relative to the logits' scale, and the cross-entropy moves by at most 2·max|Δlogit|."""
    from sklearn.metrics import f1_score

    from tests.tolerances import forward_rtol

    held_out = [training.Example(f"w{i} a w{(3 * i) % 11}", None, (i // 2) % 2) for i in range(13)]
    result = training.finetune(base, ROWS, eval_data=held_out, **(QUICK | {"epochs": 2}))
    assert [e["epoch"] for e in result.history.eval] == [1, 2]
    logits = np.asarray(result.model([r.text for r in held_out]).logits, np.float64)
    gold = np.array([r.label for r in held_out])
    predicted = logits.argmax(-1)
    last = result.history.eval[-1]
    assert last["accuracy"] == np.mean(predicted == gold)
    assert last["f1"] == pytest.approx(f1_score(gold, predicted, average="macro"), abs=1e-12)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    loss = -np.mean(log_probs[np.arange(len(gold)), gold])
    scale = np.abs(logits).max()
    assert abs(last["loss"] - loss) <= 2 * forward_rtol(base.config, S=16) * scale


@pytest.mark.slow
def test_readme_fine_tuning_snippet_runs_on_the_bundled_model(tmp_path, monkeypatch):
    """The README's Fine-tuning snippet, as printed, on the bundled MiniLM; transformers loads what it saved and
    gives the trained model's logits (the same weights in two programs: within forward_rtol of their scale)."""
    import re
    from pathlib import Path

    import torch
    import transformers

    from tests.tolerances import assert_close_to_scale, forward_rtol

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme[readme.index("### Fine-tuning"):]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(snippet, "README.md (Fine-tuning)", "exec"), namespace)
    result = namespace["result"]
    assert len(result.history.loss) == 3 and result.model.config.architecture == "BertForSequenceClassification"
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "out" / "finetuned").eval()
    batch = result.model.tokenize(["the food was great", "the service was slow"])
    with torch.no_grad():
        theirs = reloaded(**{k: torch.tensor(np.asarray(v), dtype=torch.long) for k, v in batch.to_dict().items()})
    rtol = forward_rtol(result.model.config, S=batch.input_ids.shape[1]) * 2
    assert_close_to_scale(result.model(batch).logits, theirs.logits.numpy(), rtol, "logits of the saved model")


@pytest.mark.parametrize(("setting", "message"), [
    ({"compute_dtype": "float16"}, "compute_dtype='float16': pass one of float32, bfloat16"),
    ({"compute_dtype": "nonsense"}, "compute_dtype='nonsense'"),
    ({"batch_size": 0}, "batch_size=0"),
    ({"accumulate": 1.5}, "accumulate=1.5"),
])
def test_settings_that_cannot_train_are_refused(base, setting, message):
    from minibert.errors import InputError

    with pytest.raises(InputError, match=message):
        training.finetune(base, ROWS, **(QUICK | setting))


@pytest.mark.slow  # fine-tunes a tiny model on three lengths
def test_finetune_compiles_one_step_per_chosen_length_and_says_so(tmp_path, capsys):
    """Texts of 3, 20 and 40 words (5, 22 and 42 tokens) in batches of their own: the step compiles once per length
    data.step_lengths chooses (8, 24, 48: each batch's longest row rounded up to a multiple of 8) — JAX's own trace
    events of the step function, counted apart from minibert — result.step_lengths names them, and the progress
    bar says it prepares the step for N-token rows, then whether it compiled it or loaded it from the persistent
    compilation cache. Docs-only tester (compile 3) item 6: a second run, all three programs in the cache, said
    "compiling" too: it says "loaded" now, read from JAX's cache events."""
    make_hf_model(tmp_path, "BertModel")
    model = minibert.load(tmp_path)
    rows = [training.Example(" ".join(["a"] * n), None, i % 2) for i, n in enumerate([3] * 4 + [20] * 4 + [40] * 4)]
    traces = []

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/jaxpr_trace_duration":
            traces.append(kwargs.get("fun_name"))

    def run():
        return training.finetune(model, rows, num_labels=2, epochs=1, batch_size=4, shuffle=False,
                                 learning_rate=1e-3, dropout=0.0)

    def said(shown: str) -> list[tuple[str, str, str]]:
        return re.findall(r"fine-tuning \(sequence-classification\): (compiled|loaded) the step for (\d+)-token rows"
                          r"( from the compilation cache)? in \d+\.\d s\n", shown)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        result = run()
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert result.step_lengths == (8, 24, 48)
    assert traces.count("train") == 3
    shown = capsys.readouterr().err
    assert all(f"preparing the step for {n}-token rows (compiling it, or loading it from the compilation cache)"
               in shown for n in (8, 24, 48))
    # compiled, unless an earlier test of this session compiled the same step (the cache is the session's)
    assert [n for _, n, _ in said(shown)] == ["8", "24", "48"]
    run()  # the same steps again, in new jit functions: each read from the persistent cache, none compiled
    assert said(capsys.readouterr().err) == [("loaded", n, " from the compilation cache") for n in ("8", "24", "48")]
