"""Fine-tuning in minibert against transformers + torch.optim.AdamW: the same initial weights, the same batches
in the same order, dropout 0, the same schedule and clipping; the loss at every step and the final weights agree,
and transformers loads minibert's saved directory and gives minibert's logits."""

from __future__ import annotations

import json
import math

import jax
import numpy as np
import pytest
import torch
import transformers

import minibert
from minibert import training
from minibert.io.checkpoint import hf_tensors
from minibert.training import data as data_
from minibert.training import optim
from tests.conftest import make_hf_model
from tests.tolerances import LAMBDA, U32, assert_close_to_scale, block_roundings, forward_rtol

SETTINGS = dict(epochs=3, batch_size=8, learning_rate=1e-3, weight_decay=0.01, warmup=0.1, schedule="linear",
                max_grad_norm=1.0, dropout=0.0, seed=0)


def _texts(rng, n):
    words = [f"w{i}" for i in range(60)] + list("abcdefgh")
    return [" ".join(rng.choice(words, size=rng.integers(3, 12))) for _ in range(n)]


def _torch_run(hf, model, rows, task, names, settings):
    """transformers' Trainer loop by hand on minibert's batches (rows of weight 0 dropped): per-step losses.
    One torch thread: on a busy 2-core machine torch's spinning worker threads make these small steps 10× slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _torch_loop(hf, model, rows, task, names, settings)
    finally:
        torch.set_num_threads(threads)


def _torch_loop(hf, model, rows, task, names, settings):
    decay = set(transformers.Trainer.get_decay_parameter_names(None, hf))
    params = dict(hf.named_parameters())
    groups = [{"params": [p for n, p in params.items() if n in decay], "weight_decay": settings["weight_decay"]},
              {"params": [p for n, p in params.items() if n not in decay], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=settings["learning_rate"], betas=(0.9, 0.999), eps=1e-8)
    encoded = data_.encode(model, rows, task, names)
    per_epoch = data_.steps_per_epoch(len(encoded), settings["batch_size"])
    total = settings["epochs"] * per_epoch
    scheduler = transformers.get_linear_schedule_with_warmup(opt, optim.warmup_steps(settings["warmup"], total), total)
    mask_id = int(model.tokenize([model.tokenizer.mask_token]).input_ids[0, 1])
    losses = []
    hf.train()
    orders = [data_.epoch_order(len(encoded), epoch, settings["seed"], True) for epoch in range(settings["epochs"])]
    # finetune's batch lengths: masked-LM's masks are drawn over the padded batch, so the same lengths, the same masks
    lengths = data_.step_lengths(data_.longest_rows(encoded, orders, settings["batch_size"]), model.config.max_tokens)
    for epoch, order in enumerate(orders):
        for batch in data_.batches(encoded, order, settings["batch_size"], task, lengths,
                                   pad_id=0, mask_id=mask_id, vocab_size=model.config.vocab_size,
                                   mask_seed=(settings["seed"], epoch)):
            real = batch["weight"] > 0
            tensors = {k: torch.tensor(batch[k][real], dtype=torch.long)
                       for k in ("input_ids", "token_type_ids", "attention_mask", "labels")}
            loss = hf(**tensors).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(hf.parameters(), settings["max_grad_norm"])
            opt.step()
            scheduler.step()
            opt.zero_grad()
            losses.append(loss.item())
    hf.eval()
    return np.array(losses)


def _training_rtol(cfg, S: int, steps: int) -> float:
    """How far two fp32 implementations' training runs can drift apart, relative to the scale compared.

    One step's loss and gradient are a forward and a backward pass: the backward runs each reduction of the
    forward again, transposed, twice (for the input and the weight), so about 3× the forward's roundings
    (tests/tolerances.block_roundings per stage, L + 1 stages), and two implementations compared double it:
    δ = λ·√(2·3·(L+1)·N_block)·u. Adam's update m̂/(√v̂ + ε) is invariant to the gradient's scale, so a
    relative error δ in the gradient moves an update by about δ relative; the two runs' parameters then differ
    by up to δ·(what they moved), and that difference feeds the next steps' gradients. Over T steps with
    errors adding (not cancelling) the drift is T·δ relative to the scale of what moved.
    """
    D, F, K = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    stages = cfg.num_hidden_layers + 1
    delta = LAMBDA * math.sqrt(2 * 3 * stages * block_roundings(D, F, K, S)) * U32
    return steps * delta


# Parameters whose gradient is zero in exact arithmetic: a key bias adds q·b_K to every score of a query's row,
# which softmax ignores. Each implementation's gradient there is rounding noise, which Adam's normalised update
# turns into steps of up to κ·lr_t either way (κ = (1−β₁)/√((1−β₂)(1−β₁²/β₂)) ≈ 7.3 bounds |m̂|/√v̂ by
# Cauchy–Schwarz over the running sums); the two runs can differ by twice that, summed over steps.
NOISE_ONLY = ("attention.self.key.bias",)
KAPPA = 0.1 / math.sqrt(0.001 * (1 - 0.81 / 0.999))


def _assert_same_training(result, hf, losses, rtol):
    ours = np.array(result.history.loss)
    assert ours.shape == losses.shape
    np.testing.assert_allclose(ours, losses, rtol=rtol, atol=0)
    trained = dict(zip(optim.parameter_names(result.model.state),
                       (np.asarray(x) for x in jax.tree_util.tree_leaves(result.model.state))))
    theirs = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    noise_bound = 2 * KAPPA * sum(result.history.learning_rate)
    for key, value in hf_tensors(result.model.config, trained).items():
        err = np.abs(value - theirs[key]).max()
        if key.endswith(NOISE_ONLY):
            assert err <= noise_bound, f"{key}: {err:.2e} > {noise_bound:.1e}"
            continue
        scale = np.abs(theirs[key]).max()
        assert err <= rtol * scale, f"{key}: {err:.2e} > {rtol:.1e} × {scale:.2e}"


def _fine_tune_both(hf, model, rows, task, num_labels=None, settings=SETTINGS):
    result = training.finetune(model, rows, task=task, num_labels=num_labels, progress=False, **settings)
    names = data_.label_names(rows, task, num_labels)
    losses = _torch_run(hf, model, rows, task, names, settings)
    assert len(losses) >= 20 and result.new_parameters == []
    _assert_same_training(result, hf, losses, _training_rtol(model.config, 16, len(losses)))
    return result


def _assert_transformers_reads(result, directory, auto_class, texts):
    result.model.save(directory)
    reloaded = getattr(transformers, auto_class).from_pretrained(directory).eval()
    batch = result.model.tokenize(texts)
    with torch.no_grad():
        theirs = reloaded(**{k: torch.tensor(np.asarray(v), dtype=torch.long) for k, v in batch.to_dict().items()})
    # The same weights in two programs: forward_rtol bounds the hidden states; logits are one more product.
    rtol = forward_rtol(result.model.config, S=batch.input_ids.shape[1]) * 2
    assert_close_to_scale(result.model(batch).logits, theirs.logits.numpy(), rtol, "logits of the saved model")


@pytest.mark.slow
def test_sequence_classification_matches_transformers_and_saves_for_it(tmp_path):
    hf = make_hf_model(tmp_path, "BertForSequenceClassification", num_labels=3, scale=0.1,
                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    rng = np.random.default_rng(0)
    rows = [training.Example(t, None, int(rng.integers(0, 3))) for t in _texts(rng, 60)]
    result = _fine_tune_both(hf, minibert.load(tmp_path), rows, "sequence-classification", 3)
    _assert_transformers_reads(result, tmp_path / "saved", "AutoModelForSequenceClassification", _texts(rng, 4))


@pytest.mark.slow
def test_token_classification_matches_transformers(tmp_path):
    hf = make_hf_model(tmp_path, "BertForTokenClassification", num_labels=4, scale=0.1,
                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    rng = np.random.default_rng(1)
    rows = [training.Example(t, None, [int(x) for x in rng.integers(0, 4, len(t.split()))]) for t in _texts(rng, 60)]
    result = _fine_tune_both(hf, minibert.load(tmp_path), rows, "token-classification", 4)
    _assert_transformers_reads(result, tmp_path / "saved", "AutoModelForTokenClassification", _texts(rng, 4))


@pytest.mark.slow
def test_masked_lm_matches_transformers(tmp_path):
    hf = make_hf_model(tmp_path, "BertForMaskedLM", scale=0.1, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0)
    rng = np.random.default_rng(2)
    rows = [training.Example(t) for t in _texts(rng, 60)]
    result = _fine_tune_both(hf, minibert.load(tmp_path), rows, "masked-lm")
    _assert_transformers_reads(result, tmp_path / "saved", "AutoModelForMaskedLM", _texts(rng, 4))


@pytest.mark.slow
def test_bundled_minilm_with_a_new_classifier_matches_transformers(tmp_path):
    """The bundled MiniLM (a BertModel) gets a new classifier; saved, transformers starts from the same weights."""
    start = training.with_head(minibert.load(), "sequence-classification", ("neg", "pos"), seed=0)
    start.save(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"hidden_dropout_prob": 0.0,
                                                               "attention_probs_dropout_prob": 0.0}))
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path)
    rng = np.random.default_rng(3)
    sentences = ["the food was great", "the service was slow", "i loved the room", "the staff were rude",
                 "a wonderful view", "terrible noise all night", "the breakfast was fresh", "cold coffee again"]
    rows = [training.Example(str(rng.choice(sentences)) + " " + str(rng.choice(sentences)), None,
                             ["neg", "pos"][int(rng.integers(0, 2))]) for _ in range(20)]
    settings = SETTINGS | {"epochs": 4, "batch_size": 4, "learning_rate": 5e-5}  # 20 steps of 4 short rows
    _fine_tune_both(hf, start, rows, "sequence-classification", 2, settings)
