"""Every method on every family: each public analysis, survey, view, sweep, patching method, fine-tuning step and
probe runs once on a tiny ModernBERT (pre-LN, rotary, local windows, GeGLU), a tiny DeBERTa-v3 (disentangled
attention over relative-position buckets) and, as the control, a tiny BERT, and gives the value its definition
says — checked against a loop of hooked forward passes, the model's own captures, or a hand-written update.

The models are built here, in memory, with every weight redrawn (N(0, 0.3²); LayerNorm gains 1 + N(0, 0.2²)) so
that patterns are far from uniform; ModernBERT's local layer (block 1) sees ±2 tokens, fewer than a text has.
Tolerances: tests/tolerances.py's forward_rtol — two programs (a sweep and a loop of runs) each round every
reduction of the forward pass once; the head adds one stage (rtols below).
"""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import write_vocab
from tolerances import U32, assert_close_to_scale, forward_rtol

import minibert
from minibert import HookFn, analysis, training, viz
from minibert.analysis import corpus, probes
from minibert.core.sites import PATTERNS
from minibert.io.config_json import read_config
from minibert.io.tokenizer import Tokenizer
from minibert.runtime.model import Inputs

VOCAB = 80
L = 2
SIZES = dict(vocab_size=VOCAB, hidden_size=24, num_hidden_layers=L, num_attention_heads=4, intermediate_size=20,
             max_position_embeddings=64)
FAMILY_SETTINGS = {
    "bert": dict(type_vocab_size=2),
    "modernbert": dict(local_attention=4, global_attn_every_n_layers=2, pad_token_id=0),  # block 1 sees ±2 tokens
    "deberta-v2": dict(relative_attention=True, position_buckets=4, max_relative_positions=8, share_att_key=True,
                       pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", position_biased_input=False,
                       type_vocab_size=0),  # v3's layout; texts longer than the position buckets
}
PREFIX = {"bert": "Bert", "modernbert": "ModernBert", "deberta-v2": "DebertaV2"}
TEXTS = ["the cat sat on the mat.", "a dog ran far away, fast!", "we saw it. then we left."]
OTHER = ["a cat sat on a mat .", "the dog ran far off, fast!", "they saw us. so we left."]


def redrawn(model: minibert.Model, seed: int) -> dict:
    """The model's named parameters redrawn: N(0, 0.3²), LayerNorm gains 1 + N(0, 0.2²)."""
    rng = np.random.default_rng(seed)
    gain = lambda name: name.endswith(".scale")  # noqa: E731 (LayerNorm gains; biases and weights otherwise)
    return {name: jnp.asarray((1.0 if gain(name) else 0.0) + (0.2 if gain(name) else 0.3) * rng.standard_normal(
        value.shape), value.dtype) for name, value in model.named_parameters().items()}


def tiny(model_type: str, directory, architecture: str = "ForMaskedLM", seed: int = 0) -> minibert.Model:
    """A tiny random model of the family, with a WordPiece vocabulary (the methods do not depend on it)."""
    cfg = read_config(SIZES | FAMILY_SETTINGS[model_type] | {"model_type": model_type, "num_labels": 3,
                                                                  "architectures": [PREFIX[model_type] + architecture]})
    write_vocab(directory, VOCAB)
    tokenizer = Tokenizer.from_dir(directory, segments=cfg.family.token_types)
    shapes = minibert.Model(cfg, tokenizer=tokenizer)
    return minibert.Model.from_parameters(cfg, redrawn(shapes, seed), tokenizer)


@pytest.fixture(scope="module", params=list(PREFIX))
def model(request, tmp_path_factory):
    return tiny(request.param, tmp_path_factory.mktemp(request.param))


def rtols(model, length: int) -> tuple[float, float]:
    """(encoder, head): forward_rtol of two programs over the blocks, and over one stage more for the head."""
    head = dataclasses.replace(model.config, num_hidden_layers=model.config.num_hidden_layers + 1)
    return forward_rtol(model.config, S=length), forward_rtol(head, S=length)


def metric(out):
    return out.logits[:, 2, 7]  # one masked-LM logit per row


def zero_head(z, ctx, head):
    return z.at[:, :, head].set(0.0)


# ---- head statistics, surveys, views ---------------------------------------------------------------------------


def test_head_statistics_read_the_models_patterns(model):
    """attention_statistics' "self" and "prev" are each document's mean of A[t, t] and A[t, t−1] over its
    tokens (docs/definitions.md), read here off the patterns the model's forward captures."""
    stats = analysis.attention_statistics(model, TEXTS)
    batch = model.tokenize(TEXTS)
    _, cache = model.run_with_cache(batch, names=PATTERNS)
    pattern = np.asarray(cache.stack("hook_pattern"), np.float64)  # [L, B, H, T, S]
    n = batch.attention_mask.sum(1)
    own = np.mean([np.diagonal(pattern[:, b, :, :n[b], :n[b]], axis1=-2, axis2=-1).sum(-1) / n[b]
                   for b in range(len(TEXTS))], axis=0)
    previous = np.mean([np.diagonal(pattern[:, b, :, :n[b], :n[b]], offset=-1, axis1=-2, axis2=-1).sum(-1) / n[b]
                        for b in range(len(TEXTS))], axis=0)
    tol, _ = rtols(model, batch.input_ids.shape[1])  # pattern entries ≤ 1: absolute
    np.testing.assert_allclose(stats["self"], own, rtol=0, atol=tol)
    np.testing.assert_allclose(stats["prev"], previous, rtol=0, atol=tol)


def test_survey_packs_documents_to_the_same_statistics(model):
    """The corpus survey packs several documents into a row (ModernBERT's rotary positions then run on from the
    row's start: attention depends only on t − s, so nothing changes) and gives attention_statistics' values."""
    result = corpus.survey(model, TEXTS * 2, max_length=32, progress=False)
    stats = analysis.attention_statistics(model, TEXTS)
    assert result.documents == 6 and result.counts["batches"] >= 1
    tol, _ = rtols(model, 32)
    for name in ("self", "prev", "to_cls", "to_sep", "entropy"):
        np.testing.assert_allclose(result.mean[name], stats[name], rtol=0, atol=tol * (np.log(32) if
                                                                                         name == "entropy" else 1))


def test_views_show_the_models_attention_and_the_q_k_its_scores_use(model):
    """document() keeps the captured pattern of the real tokens; its q and k are the ones the scores use (rotated
    in ModernBERT), so the neuron view's softmax(q·k/√K) is the pattern where every key is seen (global layers)."""
    doc = viz.document(model, TEXTS[1])
    batch = model.tokenize([TEXTS[1]])
    _, cache = model.run_with_cache(batch, names=PATTERNS)
    tol, _ = rtols(model, batch.input_ids.shape[1])  # another capture set, another compiled program
    np.testing.assert_allclose(doc.attention, np.asarray(cache.stack("hook_pattern"))[:, 0], rtol=0, atol=tol)
    assert (doc.head_view().kind, doc.model_view().kind) == ("head", "model")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the view warns where softmax(q·k/√K) is not the pattern
        doc.neuron_view(layers=[0])  # block 0 is global in ModernBERT


# ---- sweeps, patching, gradients, logit lens, compare -----------------------------------------------------------


def test_ablation_sweep_equals_a_loop_of_ablated_runs(model):
    batch = model.tokenize(TEXTS)
    grid = analysis.ablation_sweep(model, batch, metric)  # [L, H], mean over rows
    _, head_tol = rtols(model, batch.input_ids.shape[1])
    for layer, head in [(0, 1), (1, 3)]:
        hooks = {f"blocks.{layer}.attn.hook_z": HookFn(zero_head, head=jnp.int32(head))}
        expected = float(np.mean(metric(model.run_with_hooks(batch, hooks))))
        assert abs(grid[layer, head] - expected) <= head_tol * np.abs(grid).max(), (layer, head)


def test_patching_the_clean_run_into_itself_gives_the_clean_metric(model):
    clean = model.tokenize(TEXTS)
    expected = float(np.mean(metric(model(clean))))
    _, head_tol = rtols(model, clean.input_ids.shape[1])
    grid = analysis.patch_activations(model, clean, clean, metric, site="attn.hook_z", per="head")  # [L, H]
    np.testing.assert_allclose(grid, expected, rtol=0, atol=head_tol * abs(expected))


def test_attribution_patching_is_the_gradient_times_the_difference(model):
    """(a_clean − a_corrupt) · ∂metric/∂a on the corrupted run, summed over D and rows, written out with
    model.grad and run_with_cache."""
    clean, corrupted = model.tokenize(TEXTS), model.tokenize(OTHER, max_length=clean_length(model))
    names = "blocks.*.hook_attn_out"
    grid = analysis.attribution_patching(model, clean, corrupted, metric, site="hook_attn_out")  # [L, T]
    _, grads = model.grad(corrupted, lambda out: metric(out).mean(), names=names)
    _, clean_cache = model.run_with_cache(clean, names=names)
    _, corrupt_cache = model.run_with_cache(corrupted, names=names)
    difference = np.asarray(clean_cache.stack("hook_attn_out")) - np.asarray(corrupt_cache.stack("hook_attn_out"))
    gradient = np.stack([grads[f"blocks.{layer}.hook_attn_out"] for layer in range(L)])
    expected = np.einsum("LBTD,LBTD->LT", difference, gradient)
    _, head_tol = rtols(model, clean.input_ids.shape[1])
    assert_close_to_scale(grid, expected, 2 * head_tol, "attribution patching")  # forward and backward


def clean_length(model) -> int:
    return model.tokenize(TEXTS).input_ids.shape[1]


def test_attention_gradients_are_the_models_pattern_gradients(model):
    batch = model.tokenize(TEXTS)
    loss = lambda out: out.logits[:, 1].sum()  # noqa: E731
    ours = analysis.attention_gradients(model, batch, loss)  # [L, B, H, T, S]
    _, grads = model.grad(batch, loss, names=PATTERNS)
    _, head_tol = rtols(model, batch.input_ids.shape[1])
    expected = np.stack([grads[f"blocks.{layer}.attn.hook_pattern"] for layer in range(L)])
    assert_close_to_scale(ours, expected, 2 * head_tol, "∂loss/∂pattern")


def test_logit_lens_ends_at_the_models_logits_and_starts_at_the_embeddings(model):
    batch = model.tokenize(TEXTS)
    lens = analysis.logit_lens(model, batch)  # [L + 1, B, T, V]
    out, cache = model.run_with_cache(batch, names="hook_full_embed")
    _, head_tol = rtols(model, batch.input_ids.shape[1])
    real = batch.attention_mask > 0
    assert_close_to_scale(lens[-1], out.logits, head_tol, "last stream", where=real)
    first = model.head(model.state, cache["hook_full_embed"]).logits  # the head stage on the embeddings
    assert_close_to_scale(lens[0], first, head_tol, "embedding stream", where=real)


def test_compare_finds_a_model_identical_to_itself(model, tmp_path):
    same = analysis.compare_models(model, model, TEXTS)
    length = clean_length(model)
    np.testing.assert_allclose(same.similarity, 1.0, rtol=0, atol=length * length * U32)  # one sum of T·S terms
    np.testing.assert_allclose(same.js_divergence, 0.0, rtol=0, atol=length * U32)
    other = tiny(model.config.model_type, tmp_path, seed=1)
    assert (analysis.compare_models(model, other, TEXTS).similarity < 1 - 1e-3).all()  # other weights, other maps


def test_scaled_attention_is_the_pattern_reweighted(model):
    """scale_attention(keys, w) in the last block (ModernBERT's local one): its pattern is A·w / Σ_s A·w, w = factor
    at the keys and 1 elsewhere, from the unhooked pattern (the block's inputs are unchanged); factor 0 blocks them."""
    batch = model.tokenize(TEXTS)
    T = batch.input_ids.shape[1]
    keys = np.isin(np.arange(T), [1, 3])  # ±2 windows keep a free key for every query
    _, cache = model.run_with_cache(batch, names=PATTERNS)
    A = np.asarray(cache.stack("hook_pattern"), np.float64)[L - 1]  # [B, H, T, S]
    rows = np.broadcast_to((batch.attention_mask > 0)[:, None, :, None], A.shape)
    tol, _ = rtols(model, T)
    for factor in (0.25, 0.0):
        hooks = analysis.scale_attention(keys, factor, L, layers=[L - 1])
        _, scaled = model.run(batch, names=PATTERNS, hooks=hooks)
        weighted = A * np.where(keys, factor, 1.0)
        expected = weighted / weighted.sum(-1, keepdims=True)
        assert_close_to_scale(scaled.stack("hook_pattern")[L - 1], expected, tol, f"factor {factor}", where=rows)
    blocked = model.run(batch, names=PATTERNS, hooks=analysis.block_attention(keys, L, layers=[L - 1]))[1]
    np.testing.assert_array_equal(np.asarray(blocked.stack("hook_pattern"))[L - 1][..., keys], 0.0)


@pytest.mark.slow  # four masked-LM runs, two with the SAE hook: 5–16 s on the shared two cores
def test_an_identity_sae_spliced_in_changes_nothing(model):
    """sae.spliced_fidelity on the model's masked-LM loss: ce_clean is mlm_loss_fn on the masked batch's plain run;
    an SAE that reconstructs exactly (ReLU, W_enc = [I, −I], W_dec = [I; −I]: relu(x) − relu(−x) = x) leaves it
    unchanged, and one that reconstructs relu(x) does not (a decoder at half scale would not show in a post-LN
    model: the LayerNorm after hook_resid_mid undoes a scale)."""
    from minibert.analysis import sae

    D, name = model.config.hidden_size, f"blocks.{L - 1}.hook_resid_mid"
    eye = np.eye(D, dtype=np.float32)
    identity = {"W_enc": np.concatenate([eye, -eye], 1), "b_enc": np.zeros(2 * D, np.float32),
                "W_dec": np.concatenate([eye, -eye], 0), "b_dec": np.zeros(D, np.float32)}
    config = sae.SAEConfig(d_in=D, d_sae=2 * D, architecture="relu", hook_name=name)
    fidelity = sae.spliced_fidelity(model, config, identity, TEXTS, seed=3)
    masked, labels = analysis.mask_tokens(model, model.tokenize(TEXTS), seed=3)
    plain = float(analysis.mlm_loss_fn(labels)(model(masked)))
    _, head_tol = rtols(model, clean_length(model))
    assert abs(fidelity["ce_clean"] - plain) <= head_tol * abs(plain)
    assert abs(fidelity["ce_increase"]) <= 2 * head_tol * abs(plain)
    rectified = dict(identity, W_dec=np.concatenate([eye, 0 * eye], 0))
    assert abs(sae.spliced_fidelity(model, config, rectified, TEXTS, seed=3)["ce_increase"]) > 100 * head_tol * plain


# ---- context mixing ----------------------------------------------------------------------------------------------


def test_attention_norms_are_the_norms_of_the_moved_vectors(model):
    """Kobayashi et al.: ‖f_h(x_s)‖ with f = v W_O (the attention sublayer's own input, whatever normalised it)."""
    batch = model.tokenize(TEXTS)
    norms = analysis.attention_norms(model, batch)
    _, cache = model.run_with_cache(batch, names="blocks.*.attn.hook_v")
    v, W_O = np.asarray(cache.stack("hook_v"), np.float64), np.asarray(model.layer_weights("attn.W_O"), np.float64)
    f_norm = np.linalg.norm(np.einsum("LBSHK,LHKD->LBHSD", v, W_O), axis=-1)
    tol, _ = rtols(model, batch.input_ids.shape[1])
    assert_close_to_scale(norms["f_norm"], f_norm, tol, "‖f(x)‖")


def test_value_zeroing_is_the_distance_a_zeroed_value_makes(model):
    """Mohebbi et al.: 1 − cos between block l's output with token s's value zeroed and without, brute force."""
    batch = model.tokenize(TEXTS[:1])
    C = analysis.value_zeroing(model, batch, normalize=False)  # [L, B, T, S]
    output = {"post": "hook_normalized_resid_post", "pre": "hook_resid_post"}[model.config.family.norm]
    layer, key = 1, 3  # ModernBERT's local block
    name = f"blocks.{layer}.{output}"
    _, cache = model.run_with_cache(batch, names=name)
    zero_value = lambda v, ctx: v.at[:, key].set(0.0)  # noqa: E731
    _, zeroed = model.run(batch, names=name, hooks={f"blocks.{layer}.attn.hook_v": zero_value})
    a, b = np.asarray(zeroed[name][0], np.float64), np.asarray(cache[name][0], np.float64)
    expected = 1 - (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)  # [T]
    tol, _ = rtols(model, batch.input_ids.shape[1])
    np.testing.assert_allclose(C[layer, 0, :, key], expected, rtol=0, atol=2 * tol)  # cos of unit-scale vectors


@pytest.mark.parametrize("model", ["modernbert"], indirect=True)  # BERT's ALTI: tests/test_analysis_mixing.py
def test_alti_splits_a_pre_ln_attention_sub_block_into_token_terms(model):
    """Pre-LN: y_t = resid_mid_t = Σ_s z_ts (no b_O in this model) with z_ts = Σ_h α^h_ts v^h_s W_O^h + [t = s] x_s;
    C[t, s] ∝ max(0, ‖y_t‖₁ − ‖y_t − z_ts‖₁), written out in float64 from the captures."""
    batch = model.tokenize(TEXTS[:1])
    C = analysis.alti(model, batch)  # [L, B, T, S]
    names = ["blocks.*.hook_resid_pre", "blocks.*.attn.hook_v", PATTERNS, "blocks.*.hook_resid_mid"]
    _, cache = model.run_with_cache(batch, names=names)
    W_O = np.asarray(model.layer_weights("attn.W_O"), np.float64)
    tol, _ = rtols(model, batch.input_ids.shape[1])
    for layer in range(L):
        x, v, pattern, y = (np.asarray(cache[f"blocks.{layer}.{site}"][0], np.float64)
                            for site in ("hook_resid_pre", "attn.hook_v", "attn.hook_pattern", "hook_resid_mid"))
        z = np.einsum("HTS,SHK,HKD->TSD", pattern, v, W_O[layer]) + np.eye(len(x))[:, :, None] * x[None]
        assert_close_to_scale(z.sum(1), y, tol, "Σ_s z_ts = resid_mid")
        c = np.maximum(0, np.abs(y).sum(-1)[:, None] - np.abs(y[:, None] - z).sum(-1))  # [T, S]
        # c's rounding: tol of ‖y_t‖₁ in each of its two norms; normalising divides it by the row's sum.
        bound = 2 * tol * np.abs(y).sum(-1) / c.sum(-1)
        assert (np.abs(C[layer, 0] - c / c.sum(-1, keepdims=True)) <= bound[:, None]).all(), layer


# ---- fine-tuning and probes -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_one_finetuning_step_is_a_hand_written_adam_step(model):
    """finetune for one step (one batch, constant rate, no decay, clipping or dropout) moves each parameter by
    −lr · g/(|g| + ε): Adam's first step (m̂ = g, v̂ = g²), g the gradient of the mean cross-entropy of the
    sequence classifier's logits, written here with forward_fn and jax.grad."""
    rows = [(text, label) for text, label in zip(TEXTS, (0, 1, 0))]
    lr, eps = 1e-3, 1e-8  # eps: optim.adamw's (torch's)
    result = training.finetune(model, training.examples(rows), epochs=1, batch_size=len(rows), learning_rate=lr,
                               weight_decay=0.0, warmup=0, schedule="constant", max_grad_norm=None, dropout=0.0,
                               shuffle=False, progress=False)
    start = training.with_head(model, "sequence-classification", result.model.config.id2label)
    batch = model.tokenize(TEXTS)
    inputs = Inputs(*(jnp.asarray(a) for a in (batch.input_ids, batch.token_type_ids, batch.attention_mask)))
    forward = start.forward_fn()

    def loss(flat):
        logits = forward(start.state_from(flat), inputs)[0].logits
        return -jax.nn.log_softmax(logits, -1)[jnp.arange(3), jnp.array([0, 1, 0])].mean()

    before = start.named_parameters()
    grads = {name: np.asarray(g, np.float64) for name, g in jax.grad(loss)(before).items()}
    after = result.model.named_parameters()
    assert set(after) == set(before)
    # g's rounding error e: two programs, each a forward and a backward pass, relative to the scale of g. Where
    # |g| > 2e, g/(|g| + ε) moves by at most 2e/(|g| + ε); anywhere, by at most 2. BERT's key bias b_K has the
    # gradient 0 in exact arithmetic (softmax ignores a shift shared by a query's keys): its g is rounding noise,
    # of the scale of the other gradients'.
    rtol = forward_rtol(start.config, S=batch.input_ids.shape[1], programs=4)
    largest = max(np.abs(g).max() for g in grads.values())
    tight = []
    for name, g in grads.items():
        p = np.asarray(before[name], np.float64)
        e = rtol * (largest if name.endswith("attn.b_K") else np.abs(g).max())
        bound = lr * np.minimum(2.0, 2 * e / (np.abs(g) + eps)) + 2 * U32 * np.abs(p)
        expected = p - lr * g / (np.abs(g) + eps)
        assert (np.abs(np.asarray(after[name], np.float64) - expected) <= bound).all(), name
        tight.append(bound <= 0.1 * lr)
    assert np.mean(np.concatenate([t.ravel() for t in tight])) > 0.5  # most entries checked to a tenth of a step


def test_probe_features_are_the_captured_activations(model):
    features = probes.sentence_features(model, TEXTS, site="hook_resid_post", pool="cls")  # [L, N, D]
    _, cache = model.run_with_cache(model.tokenize(TEXTS), names="blocks.*.hook_resid_post")
    tol, _ = rtols(model, clean_length(model))
    assert_close_to_scale(features.values, np.asarray(cache.stack("hook_resid_post"))[:, :, 0], tol, "features")


@pytest.mark.slow
@pytest.mark.parametrize("model", ["modernbert", "deberta-v2"], indirect=True)  # BERT's own tests check BERT
def test_every_remaining_method_runs(model):
    """Methods without a cheap closed form run on the modern families and give finite values of the documented
    shapes."""
    batch = model.tokenize(TEXTS)
    H, B, T = 4, 3, batch.input_ids.shape[1]
    loss = lambda out: out.logits[:, 1, 3]  # noqa: E731
    sentences = analysis.read_conllu(analysis.sample_treebank())[:4]
    shapes = {
        "head_importance": (analysis.head_importance(model, [batch], lambda out: loss(out).mean()), (L, H)),
        "attention_attribution": (analysis.attention_attribution(model, batch, loss, steps=2), (L, B, H, T, T)),
        "logit_contributions": (analysis.logit_contributions(model, batch, batch.input_ids), (L + 1, B, T)),
        "mean_z": (analysis.mean_z(model, batch), (L, H, model.config.head_dim)),
        "sentence_vectors": (analysis.sentence_vectors(model, TEXTS), (B, model.config.hidden_size)),
        "mlm_loss": (np.asarray(analysis.mlm_loss(model, batch)), ()),
        "alti": (analysis.alti(model, batch), (L, B, T, T)),  # DeBERTa's: post-LN, BERT's decomposition
        "attention_to_word": (analysis.attention_to_word(model, TEXTS, "[CLS]"), (B, L)),
        "dependency_accuracy": (analysis.dependency_accuracy(model, sentences).accuracy["dependent→head"]["all"],
                                (L, H)),
        "relation_accuracy": (analysis.relation_accuracy(model, [analysis.RelationExample(TEXTS[0], "cat", "mat")])
                              .accuracy, (L, H)),
    }
    # Methods that read captured patterns or their gradients (arrays, not the model): family-agnostic once the
    # pattern and its gradient are the model's, which the tests above check on every family; any array of the
    # gradient's shape stands for it here.
    _, cache = model.run_with_cache(batch, names=PATTERNS)
    patterns = np.asarray(cache.stack("hook_pattern"))  # [L, B, H, T, S]
    grad = np.random.default_rng(0).normal(size=patterns.shape)
    groups = analysis.word_groups(batch.word_ids[0], batch.sequence_ids[0], batch.attention_mask[0])
    targets = analysis.token_targets(model, batch)
    shapes |= {
        "attention_rollout": (analysis.attention_rollout(patterns), (L, B, T, T)),
        "mixing_matrices": (analysis.mixing_matrices(patterns), (L, B, T, T)),
        "attention_flow": (analysis.attention_flow(patterns[:, 0]), (L, T, T)),
        "word_attention": (analysis.word_attention(patterns[:, 0], groups), (L, H, len(groups), len(groups))),
        "js_divergence": (analysis.js_divergence([patterns[:, b] for b in range(B)]), (L * H, L * H)),
        "gradient_times_attention": (analysis.gradient_times_attention(grad, patterns), (L, B, H, T, T)),
        "gradient_by_target": (analysis.gradient_by_target(grad, targets, batch.attention_mask)["cls"], (L, H)),
    }
    for name, (value, shape) in shapes.items():
        value = np.asarray(value)
        assert np.isfinite(value).all(), name
        assert value.shape == shape, (name, value.shape)
