"""Transcoders: a planted sparse map recovered, the JumpReLU pseudo-derivatives and the batch top-k by hand, every
architecture trains, resume = the uninterrupted run, SAELens 6 reads our files and computes the same latents
and outputs, the MLP sites and splicing on every family, the pair stream, and the refusals."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import write_vocab
from references import reference_library
from tolerances import U32, assert_close_to_scale, dot_rtol, head_rtol, sum_rtol

import minibert
from minibert.analysis import transcoders as tc
from minibert.analysis.corpus.result import weights_digest
from minibert.analysis.transcoders.training import batch_top_k, heaviside, jumprelu, losses
from minibert.errors import AnalysisError, AnalysisWarning, DataFileError
from minibert.io.config_json import read_config
from minibert.io.tokenizer import Tokenizer

D_IN, D_OUT, S = 12, 10, 24  # the planted-free tests' widths


def _config(architecture="topk", skip=False, **settings):
    return tc.TranscoderConfig(d_in=D_IN, d_sae=S, d_out=D_OUT, layer=0, architecture=architecture, k=3, skip=skip,
                               **settings)


def _pairs(rng, n):
    """x Gaussian, y a fixed non-linear map of it (a ReLU layer): something for every architecture to learn."""
    x = rng.normal(size=(n, D_IN))
    y = np.maximum(x @ _MAP, 0) + 0.5 * x[:, :D_OUT]
    return x.astype(np.float32), y.astype(np.float32)


_MAP = np.random.default_rng(7).normal(size=(D_IN, D_OUT)) / 2


# ---- the maths ---------------------------------------------------------------------------------------------------

def test_jumprelu_pseudo_derivatives_by_hand():
    """Rajamanoharan et al. (2024) eq. 11–12 with the rectangle kernel, ε = 0.25, θ = 0.5 (band [0.375, 0.625]):
    ∂/∂pre = H(pre − θ); ∂JumpReLU/∂θ = −(θ/ε)·#in band = −2 per token in the band; ∂H/∂θ = −(1/ε) = −4 per token.
    Every value is a power of two's multiple: exact in float32."""
    pre = jnp.array([[0.40625, 0.59375, 0.875], [0.125, 0.5625, 0.5]], jnp.float32)  # [N=2, S=3]
    theta = jnp.array([0.5, 0.5, 0.5], jnp.float32)
    value = jumprelu(pre, theta, 0.25)
    np.testing.assert_array_equal(value, [[0, 0.59375, 0.875], [0, 0.5625, 0]])
    d_pre, d_theta = jax.grad(lambda p, t: jnp.sum(jumprelu(p, t, 0.25)), argnums=(0, 1))(pre, theta)
    np.testing.assert_array_equal(d_pre, [[0, 1, 1], [0, 1, 0]])
    in_band = np.array([1 + 0, 1 + 1, 0 + 1])  # per latent: tokens with |pre − θ| ≤ ε/2 (0.5 itself is in)
    np.testing.assert_array_equal(d_theta, -2.0 * in_band)
    d_pre, d_theta = jax.grad(lambda p, t: jnp.sum(heaviside(p, t, 0.25)), argnums=(0, 1))(pre, theta)
    np.testing.assert_array_equal(d_pre, 0)
    np.testing.assert_array_equal(d_theta, -4.0 * in_band)


def test_batch_top_k_keeps_the_batchs_largest():
    """k = 1 over N = 3 rows keeps the 3 largest of all 12 entries, wherever they are (two in one row)."""
    pre = jnp.array([[5.0, 1, 0, -1], [4, 6, 0.5, 0], [-2, 0.25, 0.1, 0.2]])
    np.testing.assert_array_equal(batch_top_k(pre, 1), [[5, 0, 0, 0], [4, 6, 0, 0], [0, 0, 0, 0]])


def test_batchtopk_threshold_is_the_moving_average_of_the_smallest_kept():
    """After one step from θ = 0: θ = r · min(the batch top-k activations of the initial parameters), r = 0.01."""
    rng = np.random.default_rng(0)
    config = _config("batchtopk")
    trainer = tc.Trainer(config, learning_rate=1e-2)
    x, y = _pairs(rng, 128)
    pre = x.astype(np.float64) @ np.asarray(trainer.params["W_enc"], np.float64)
    kept = np.sort(np.maximum(pre, 0).ravel())[::-1][:config.k * 128]
    trainer.step(x, y)
    # θ is r·(one float32 pre-activation), which differs from the float64 one by a dot's rounding
    assert float(trainer.params["threshold"]) == pytest.approx(0.01 * kept.min(), rel=dot_rtol(D_IN) + U32)
    assert trainer.params["threshold"].shape == ()


def test_losses_by_hand():
    """A skip transcoder's mse = mean ‖y − (f W_dec + b_dec + x W_skip)‖², and relu's L1 = mean Σ f_i ‖W_dec,i‖,
    computed in NumPy (float64) from the same parameters."""
    rng = np.random.default_rng(1)
    config = _config("relu", skip=True)
    params = {name: jnp.asarray(rng.normal(size=value.shape), jnp.float32)
              for name, value in tc.init_params(config).items()}
    x, y = _pairs(rng, 8)
    parts, latents = losses(config, params, x, y, jnp.zeros(S, bool), 0)
    p = {name: np.asarray(value, np.float64) for name, value in params.items()}
    f = np.maximum(x @ p["W_enc"] + p["b_enc"], 0)
    y_hat = f @ p["W_dec"] + p["b_dec"] + x @ p["W_skip"]
    np.testing.assert_allclose(latents, f, rtol=1e-5, atol=1e-5 * np.abs(f).max())
    mse = np.mean(np.sum((y - y_hat) ** 2, -1))
    l1 = np.mean(np.sum(f * np.linalg.norm(p["W_dec"], axis=-1), -1))
    # float32 sums over D_IN, S and D_OUT terms, each relative to its result's scale (dot_rtol, generous by λ)
    assert float(parts["mse"]) == pytest.approx(mse, rel=dot_rtol(D_IN + S + D_OUT) * 10)
    assert float(parts["l1"]) == pytest.approx(l1, rel=dot_rtol(D_IN + S) * 10)
    assert float(parts["total"]) == pytest.approx(mse + config.l1_coefficient * l1, rel=dot_rtol(D_IN + S + D_OUT) * 10)


# ---- training ----------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_planted_transcoder_recovers_its_atoms():
    """y = Σ_i f_i(x) w_i with f_i = 3·ReLU(e_i·x − 1.5): 48 known unit atoms w_i (the map's dictionary) in 24
    dimensions, about 3 active per token, from x in 32. A BatchTopK transcoder (k = 4) finds ≥ 90% of the atoms
    as decoder rows with cosine ≥ 0.9 (the planted check of Gao et al. and Sharkey et al., for a map)."""
    rng = np.random.default_rng(0)
    encoders = rng.normal(size=(32, 48))
    encoders /= np.linalg.norm(encoders, axis=0)
    atoms = rng.normal(size=(48, 24))
    atoms /= np.linalg.norm(atoms, axis=1, keepdims=True)
    trainer = tc.Trainer(tc.TranscoderConfig(d_in=32, d_sae=64, d_out=24, layer=0, architecture="batchtopk", k=4,
                                             k_aux=16), learning_rate=1e-2, warmup=10, dead_tokens=256 * 20, seed=1)
    for _ in range(600):
        x = rng.normal(size=(256, 32))
        y = (3 * np.maximum(x @ encoders - 1.5, 0)) @ atoms
        trainer.step(x.astype(np.float32), y.astype(np.float32))
    cosines = atoms @ np.asarray(trainer.params["W_dec"]).T
    assert (cosines.max(1) >= 0.9).mean() >= 0.9


@pytest.mark.parametrize("architecture,skip", [("topk", False), ("batchtopk", False), ("jumprelu", True),
                                               ("relu", True)])
def test_every_architecture_trains(architecture, skip):
    """60 steps on a fixed map: the reconstruction loss falls by more than half, every decoder row stays unit
    norm, JumpReLU thresholds stay ≥ 0, and the sparsity term of each architecture is reported."""
    rng = np.random.default_rng(2)
    settings = {"relu": dict(l1_coefficient=0.01),
                "jumprelu": dict(l0_coefficient=0.01, threshold_init=0.1, bandwidth=0.1)}.get(architecture, {})
    config = _config(architecture, skip, **settings)  # batchtopk's as the threshold test's: one compiled step
    trainer = tc.Trainer(config, learning_rate=1e-2)
    history = [trainer.step(*_pairs(rng, 128)) for _ in range(60)]
    first, last = np.mean([h["mse"] for h in history[:3]]), np.mean([h["mse"] for h in history[-3:]])
    assert last < 0.5 * first
    expected = {"topk": "aux", "batchtopk": "aux", "jumprelu": "l0", "relu": "l1"}[architecture]
    assert set(history[-1]) == {"total", "mse", expected}
    np.testing.assert_allclose(np.linalg.norm(trainer.params["W_dec"], axis=-1), 1, rtol=dot_rtol(D_OUT))
    if architecture == "jumprelu":
        assert np.all(np.asarray(trainer.params["threshold"]) >= 0)
        assert not np.allclose(trainer.params["threshold"], 0.1)  # the pseudo-derivative moved it
    if skip:
        assert np.abs(np.asarray(trainer.params["W_skip"])).max() > 0  # the skip learned the linear part


def test_resume_is_the_uninterrupted_run(tmp_path):
    """BatchTopK with AuxK active (64 latents, 1 kept per token on average: some dead after 32 tokens) and its
    moving-average θ: 3 steps, save, resume, 3 steps gives the losses and parameters of 6 steps in one run, bit
    for bit."""
    rng = np.random.default_rng(3)
    batches = [_pairs(rng, 16) for _ in range(6)]
    config = tc.TranscoderConfig(d_in=D_IN, d_sae=64, d_out=D_OUT, layer=0, architecture="batchtopk", k=1)
    whole = tc.Trainer(config, learning_rate=1e-2, dead_tokens=32)
    expected = [whole.step(x, y) for x, y in batches]
    first = tc.Trainer(config, learning_rate=1e-2, dead_tokens=32)
    got = [first.step(x, y) for x, y in batches[:3]]
    resumed = tc.Trainer.resume(first.save(tmp_path / "run.npz"))
    got += [resumed.step(x, y) for x, y in batches[3:]]
    assert got == expected
    assert any(h["aux"] > 0 for h in expected)  # AuxK took part
    for name, value in whole.params.items():
        np.testing.assert_array_equal(resumed.params[name], value, err_msg=name)
    assert resumed.config == whole.config and resumed.steps == 6


def test_nan_pairs_are_refused_and_nothing_changes():
    rng = np.random.default_rng(4)
    trainer = tc.Trainer(_config())
    x, y = _pairs(rng, 16)
    y[5, 2] = np.nan
    before = {name: np.asarray(value) for name, value in trainer.params.items()}
    with pytest.raises(AnalysisError, match=r"y holds 1 non-finite .* row 5.*Drop those rows"):
        trainer.step(x, y)
    for name, value in trainer.params.items():
        np.testing.assert_array_equal(value, before[name])
    with pytest.raises(AnalysisError, match=r"x \[N, 12\] and y \[N, 10\]"):
        trainer.step(x, y[:, :4])


# ---- SAELens 6 ---------------------------------------------------------------------------------------------------

def _random_params(config, rng):
    """Random parameters with b_enc spread so that some latents fire and some do not, thresholds ≥ 0."""
    params = {name: rng.normal(size=np.shape(value)).astype(np.float32)
              for name, value in tc.init_params(config).items()}
    if "threshold" in params:
        params["threshold"] = np.abs(params["threshold"]).astype(np.float32)
    return params


SAELENS_CASES = [("relu", False, "transcoder"), ("relu", True, "skip_transcoder"),
                 ("jumprelu", False, "jumprelu_transcoder"), ("jumprelu", True, "jumprelu_skip_transcoder"),
                 ("batchtopk", False, "jumprelu_transcoder")]


@pytest.mark.slow  # importing sae_lens (TransformerLens, datasets, …) alone takes ~10 s
def test_saelens_loads_our_files_and_computes_the_same(tmp_path):
    """SAE.load_from_disk reads each architecture SAELens 6 has, and its encode and forward (float32, torch) equal
    ours on the same x to the rounding of two float32 programs; our load gives back the same parameters."""
    reference_library("sae_lens")
    import torch
    from sae_lens import SAE

    rng = np.random.default_rng(5)
    x = rng.normal(size=(20, D_IN)).astype(np.float32)
    for architecture, skip, name in SAELENS_CASES:
        config = _config(architecture, skip, model_name="tiny", hook_in="blocks.0.ln1.hook_out",
                         hook_out="blocks.0.hook_mlp_out")
        params = _random_params(config, rng)
        path = tc.save(tmp_path / f"{architecture}-{skip}", config, params)
        theirs = SAE.load_from_disk(path)
        assert type(theirs).__name__.lower().replace("skip", "skip_").endswith(name.replace("_", "")) or \
            theirs.cfg.architecture() == name
        assert theirs.cfg.metadata.hook_name == "blocks.0.ln1.hook_out"
        assert theirs.cfg.metadata.hook_name_out == "blocks.0.hook_mlp_out"
        with torch.no_grad():
            latents = theirs.encode(torch.from_numpy(x)).numpy()
            y_hat = theirs(torch.from_numpy(x)).numpy()
        ours = {k: jnp.asarray(v) for k, v in params.items()}
        # pre: a D_IN-term dot; ŷ: an S-term dot of latents plus, for a skip, a D_IN-term one (dot_rtol each)
        assert_close_to_scale(tc.encode(config, ours, x), latents, dot_rtol(D_IN), f"{name} latents")
        assert_close_to_scale(tc.forward(config, ours, x), y_hat, dot_rtol(D_IN) + dot_rtol(S + D_IN), f"{name} ŷ")
        loaded_config, loaded = tc.load(path)
        assert loaded_config == config
        for key, value in params.items():
            np.testing.assert_array_equal(loaded[key], value, err_msg=f"{name} {key}")


def test_topk_transcoders_round_trip_in_our_own_architecture_name(tmp_path):
    """SAELens 6 has no TopK transcoder: the file says "topk_transcoder" (SAELens refuses it, rather than reading
    a ReLU transcoder), and minibert reads it back whole."""
    rng = np.random.default_rng(6)
    config = _config("topk", True, hook_in="blocks.0.ln1.hook_out", hook_out="blocks.0.hook_mlp_out")
    params = _random_params(config, rng)
    path = tc.save(tmp_path / "tc", config, params)
    cfg = json.loads((path / "cfg.json").read_text())
    assert cfg["architecture"] == "topk_skip_transcoder" and cfg["apply_b_dec_to_input"] is False
    loaded_config, loaded = tc.load(path)
    assert loaded_config == config
    for key, value in params.items():
        np.testing.assert_array_equal(loaded[key], value)
    with pytest.raises(DataFileError, match="already holds cfg.json and sae_weights.safetensors"):
        tc.save(path, config, params)
    cfg["minibert"]["flavour"] = 1
    (path / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(DataFileError, match="flavour"):
        tc.load(path)


def test_a_file_saelens_wrote_loads(tmp_path):
    """A directory as SAELens' save_model writes a skip transcoder (no minibert section; W_skip [d_out, d_in]):
    the layer comes from the hook name, W_skip is transposed into ours."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(8)
    arrays = {"W_enc": rng.normal(size=(D_IN, S)), "b_enc": rng.normal(size=S), "W_dec": rng.normal(size=(S, D_OUT)),
              "b_dec": rng.normal(size=D_OUT), "W_skip": rng.normal(size=(D_OUT, D_IN))}
    arrays = {k: v.astype(np.float32) for k, v in arrays.items()}
    (tmp_path / "cfg.json").write_text(json.dumps({
        "architecture": "skip_transcoder", "d_in": D_IN, "d_sae": S, "d_out": D_OUT, "dtype": "float32",
        "device": "cpu", "apply_b_dec_to_input": False, "normalize_activations": "none",
        "metadata": {"sae_lens_version": "6.54.12", "hook_name": "blocks.4.ln1.hook_out",
                     "hook_name_out": "blocks.4.hook_mlp_out"}}))
    save_file(arrays, str(tmp_path / "sae_weights.safetensors"))
    config, params = tc.load(tmp_path)
    assert (config.layer, config.architecture, config.skip) == (4, "relu", True)
    np.testing.assert_array_equal(params["W_skip"], arrays["W_skip"].T)


# ---- on models: sites, the stream, splicing ----------------------------------------------------------------------

FAMILY_SETTINGS = {  # tiny configs as the families' config.json name them (d 24, 2 blocks, 4 heads, F 20)
    "bert": dict(type_vocab_size=2), "roberta": dict(type_vocab_size=1, pad_token_id=1),
    "electra": dict(embedding_size=10, type_vocab_size=2), "albert": dict(embedding_size=10, type_vocab_size=2),
    "deberta-v2": dict(relative_attention=True, position_buckets=4, max_relative_positions=8, share_att_key=True,
                       pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", position_biased_input=False,
                       type_vocab_size=0),
    "modernbert": dict(local_attention=4, global_attn_every_n_layers=2, pad_token_id=0),
}
PREFIX = {"bert": "Bert", "roberta": "Roberta", "electra": "Electra", "albert": "Albert", "deberta-v2": "DebertaV2",
          "modernbert": "ModernBert", "distilbert": "DistilBert"}
VOCAB = 80
TEXTS = ["the cat sat on the mat.", "a dog ran far away, fast!", "we saw it. then we left.", "w1 w2 w3 w4 w5 w6"]


def tiny(model_type: str, directory, head: str = "ForMaskedLM", seed: int = 0) -> minibert.Model:
    """A tiny random model of the family, built in memory (weights N(0, 0.3²), LayerNorm gains 1 + N(0, 0.2²))."""
    sizes = dict(dim=24, n_layers=2, n_heads=4, hidden_dim=20) if model_type == "distilbert" else dict(
        hidden_size=24, num_hidden_layers=2, num_attention_heads=4, intermediate_size=20)
    cfg = read_config(sizes | FAMILY_SETTINGS.get(model_type, {}) | {
        "vocab_size": VOCAB, "max_position_embeddings": 64, "model_type": model_type, "num_labels": 3,
        "architectures": [PREFIX[model_type] + head]})
    directory.mkdir(parents=True, exist_ok=True)
    write_vocab(directory, VOCAB)
    tokenizer = Tokenizer.from_dir(directory, segments=cfg.family.token_types)
    shapes = minibert.Model(cfg, tokenizer=tokenizer)
    rng = np.random.default_rng(seed)
    gain = lambda name: name.endswith(".scale")  # noqa: E731 (LayerNorm gains)
    redrawn = {name: jnp.asarray((1.0 if gain(name) else 0.0) + (0.2 if gain(name) else 0.3) * rng.standard_normal(
        value.shape), value.dtype) for name, value in shapes.named_parameters().items()}
    return minibert.Model.from_parameters(cfg, redrawn, tokenizer)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """One tiny random BertForMaskedLM for the tests of this module that do not change it."""
    return tiny("bert", tmp_path_factory.mktemp("bert"))


@pytest.fixture(scope="module")
def other_bert(tmp_path_factory):
    """The same architecture with other weights (seed 1)."""
    return tiny("bert", tmp_path_factory.mktemp("other"), seed=1)


def _fitted(model, layer, seed=0):
    """A ReLU skip transcoder whose skip is the ridge-regression linear map x → y on TEXTS' tokens (so it is
    close), latents random: a transcoder with known, non-trivial outputs, without training. Ridge, not plain
    least squares: a LayerNorm without bias (ModernBERT) puts x in a hyperplane, where least squares would
    blow the rounding of x up along the normal."""
    x, y = tc.token_pairs(model, TEXTS, layer)
    config = tc.TranscoderConfig(d_in=x.shape[1], d_sae=16, d_out=y.shape[1], layer=layer, architecture="relu",
                                 skip=True, hook_in=tc.sites(model, layer)[0], hook_out=tc.sites(model, layer)[1],
                                 weights=weights_digest(model))
    rng = np.random.default_rng(seed)
    params = {name: 0.1 * rng.normal(size=np.shape(value)).astype(np.float32)
              for name, value in tc.init_params(config).items()}
    x64 = x.astype(np.float64)
    gram = x64.T @ x64
    ridge = 1e-2 * np.trace(gram) / len(gram)
    params["W_skip"] = np.linalg.solve(gram + ridge * np.eye(len(gram)), x64.T @ y).astype(np.float32)
    return config, params


@pytest.mark.slow
@pytest.mark.parametrize("model_type", list(PREFIX))
def test_sites_and_splicing_on_every_family(tmp_path, model_type):
    """sites: post-LN families' MLP reads ln1's output, ModernBERT's (pre-LN) ln2's; the MLP's output is a function
    of that hook alone, token by token (the rows' hook_in rolled by two rows gives the rows' hook_mlp_out rolled
    alike, at every position, to two programs' rounding). Spliced: in the spliced run hook_mlp_out is the
    transcoder's ŷ of that run's own hook_in. The clean run is token_pairs' (_fitted), so it compiles once."""
    model = tiny(model_type, tmp_path)
    hook_in, hook_out = tc.sites(model, 1)
    assert hook_in == f"blocks.1.{'ln2' if model_type == 'modernbert' else 'ln1'}.hook_out"
    assert hook_out == "blocks.1.hook_mlp_out"
    config, params = _fitted(model, 1)
    batch = model.tokenize(TEXTS)
    _, clean = model.run_with_cache(batch, names=[hook_in, hook_out])
    rolled = jnp.roll(jnp.asarray(clean[hook_in]), 2, axis=0)
    _, patched = model.run(batch, names=[hook_in, hook_out], hooks={hook_in: minibert.HookFn(
        lambda value, ctx, new: new.astype(value.dtype), new=rolled)})
    rtol = head_rtol(model.config, S=batch.input_ids.shape[1])
    assert_close_to_scale(patched[hook_out], np.roll(clean[hook_out], 2, axis=0), rtol, "MLP output of rolled input")

    _, spliced = model.run(batch, names=[hook_in, hook_out], hooks=tc.splice_hooks(model, config, params, batch))
    expected = tc.forward(config, {k: jnp.asarray(v) for k, v in params.items()}, spliced[hook_in])
    real = np.asarray(batch.attention_mask) > 0  # padding's values are no token's (ModernBERT's differ by run)
    assert_close_to_scale(spliced[hook_out], expected, rtol, "ŷ of the spliced run's own MLP input", where=real)


def test_spliced_masked_lm_scores(bert):
    """spliced_fidelity on a masked-LM head; a transcoder writing 0 is the zero ablation: spliced CE = ablated CE,
    loss recovered 0, and the clean run is the same in both."""
    model = bert
    config, params = _fitted(model, 1)
    scores = tc.spliced_fidelity(model, config, params, TEXTS)
    assert set(scores) >= {"ce_clean", "ce_spliced", "ce_ablated", "loss_recovered", "kl"}
    zero = tc.spliced_fidelity(model, config, {k: np.zeros_like(v) for k, v in params.items()}, TEXTS)
    # the two runs write the same zeros at the same site, then run the same blocks: two programs' rounding
    rtol = head_rtol(model.config, S=24)
    assert zero["ce_spliced"] == pytest.approx(zero["ce_ablated"], rel=rtol)
    assert zero["ce_clean"] == scores["ce_clean"] and abs(zero["loss_recovered"]) < 1e-3
    assert scores["ce_spliced"] != zero["ce_spliced"]


@pytest.mark.slow
def test_classifier_and_headless_splicing(tmp_path):
    """A sequence classifier is scored by CE against the clean predictions (which the clean run matches: accuracy
    1); a bare encoder by the sentence cosine to the clean run, spliced and with the MLP output zeroed (the latter
    against run_with_hooks writing 0 there, mean-pooled by hand), and loss recovered with 1 − cosine as the loss:
    higher for the fitted transcoder (its least-squares skip is close to y) than for one writing 0, which is the
    zero ablation itself (loss recovered 0)."""
    classifier = tiny("bert", tmp_path / "cls", "ForSequenceClassification")
    config, params = _fitted(classifier, 0)
    scores = tc.spliced_fidelity(classifier, config, params, TEXTS)
    assert scores["accuracy_clean"] == 1.0 and np.isfinite(scores["loss_recovered"])
    bare = tiny("bert", tmp_path / "bare", "Model")
    config, params = _fitted(bare, 0)
    fitted = tc.spliced_fidelity(bare, config, params, TEXTS)
    zero = tc.spliced_fidelity(bare, config, {k: np.zeros_like(v) for k, v in params.items()}, TEXTS)
    assert set(fitted) == {"cosine", "cosine_ablated", "loss_recovered"}
    assert 0 < zero["cosine"] < fitted["cosine"] <= 1 + 1e-6
    batch = bare.tokenize(TEXTS)
    mask = np.asarray(batch.attention_mask, np.float64)[..., None]

    def pooled(hooks):
        hidden = np.asarray(bare.run_with_hooks(batch, hooks=hooks).last_hidden_state, np.float64)
        return (hidden * mask).sum(1) / mask.sum(1)

    a, b = pooled({}), pooled({config.hook_out: lambda value, ctx: value * 0})
    ablated = np.mean((a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)))
    # ours pools float32 states in float32: a sum over the row's tokens and a dot and two norms of D values round
    tol = 2 * sum_rtol(batch.input_ids.shape[1]) + 3 * dot_rtol(a.shape[-1])
    assert fitted["cosine_ablated"] == pytest.approx(ablated, abs=tol)
    assert fitted["cosine_ablated"] < fitted["cosine"]
    # (c − a)/(1 − a) moves by |c − 1|/(1 − a)² per unit of a
    assert fitted["loss_recovered"] == pytest.approx((fitted["cosine"] - ablated) / (1 - ablated),
                                                     abs=tol * (1 - fitted["cosine"]) / (1 - ablated) ** 2 + 1e-7)
    # the zero transcoder writes what the zero ablation writes: the two runs differ by two programs' rounding
    assert zero["cosine"] == pytest.approx(zero["cosine_ablated"], abs=2 * tol)
    assert abs(zero["loss_recovered"]) <= 2 * tol / (1 - zero["cosine_ablated"])


def test_pair_stream_is_the_models_own_pairs_and_trainers_check_it(bert, other_bert, tmp_path):
    """Every streamed (x, y) is a real, non-special token's (MLP input, MLP output) of the texts (as token_pairs
    computes them in a padded batch, to two programs' rounding); the stream names weights, layer and hooks; a
    trainer for another layer, or one resumed on another model's pairs, refuses the stream; evaluate's FVU is the
    definition's."""
    model = bert
    x_all, y_all = tc.token_pairs(model, TEXTS, 1)
    stream = tc.activations(model, TEXTS, 1, batch_size=8, buffer_tokens=16, max_length=32)
    assert stream.source == {"weights": weights_digest(model), "layer": 1, "hook_in": "blocks.1.ln1.hook_out",
                             "hook_out": "blocks.1.hook_mlp_out", "model": "<memory>"}
    batches = list(stream)
    assert len(batches) == len(x_all) // 8  # the last partial batch dropped
    rtol = head_rtol(model.config, S=32)
    for x, y in batches:
        for row_x, row_y in zip(x, y, strict=True):
            match = np.argmin(np.abs(x_all - row_x).max(1))
            assert_close_to_scale(row_x, x_all[match], rtol, "x")
            assert_close_to_scale(row_y, y_all[match], rtol, "y of the same token")

    wrong_layer = tc.Trainer(tc.TranscoderConfig(d_in=24, d_sae=16, d_out=24, layer=0, k=4))
    with pytest.raises(AnalysisError, match=r"layer 1 but the transcoder is for layer 0.*layer=0"):
        wrong_layer.train(tc.activations(model, TEXTS, 1, batch_size=8, buffer_tokens=16))
    trainer = tc.Trainer(tc.TranscoderConfig(d_in=24, d_sae=16, d_out=24, layer=1, k=4))
    trainer.train(tc.activations(model, TEXTS, 1, batch_size=8, buffer_tokens=16), steps=2, progress=True)
    assert trainer.config.weights == weights_digest(model) and trainer.config.hook_in == "blocks.1.ln1.hook_out"
    assert trainer.config.model_name == "<memory>"  # model.source names the model where the config does not
    resumed = tc.Trainer.resume(trainer.save(tmp_path / "run.npz"))
    other = other_bert
    with pytest.raises(AnalysisError, match="weights"):
        resumed.train(tc.activations(other, TEXTS, 1, batch_size=8, buffer_tokens=16), steps=1)

    scores = tc.evaluate(trainer.config, trainer.params, x_all, y_all)
    p = {k: np.asarray(v, np.float64) for k, v in trainer.params.items()}
    pre = x_all @ p["W_enc"] + p["b_enc"]
    f = np.where(pre >= np.sort(pre, 1)[:, [-4]], np.maximum(pre, 0), 0)
    fvu = np.sum((y_all - f @ p["W_dec"] - p["b_dec"]) ** 2) / np.sum((y_all - y_all.mean(0)) ** 2)
    assert scores["fvu"] == pytest.approx(fvu, rel=1e-4)  # float32 against float64: dots of ≤ 24 terms, summed
    assert scores["l0"] <= 4


def test_a_transcoder_for_another_model_or_site_is_refused(bert, other_bert):
    """One error each, naming the fix: another model's weights (other_weights=True to mean it), another family's
    site (ModernBERT's ln2 for a BERT), other widths, a layer the model lacks."""
    model = bert
    config, params = _fitted(model, 1)
    other = other_bert
    with pytest.raises(AnalysisError, match="other_weights=True"):
        tc.spliced_fidelity(other, config, params, TEXTS)
    assert np.isfinite(tc.spliced_fidelity(other, config, params, TEXTS, other_weights=True)["ce_spliced"])
    import dataclasses

    moved = dataclasses.replace(config, hook_in="blocks.1.ln2.hook_out", weights=None)
    with pytest.raises(AnalysisError, match="another family.*trained on this model"):
        tc.spliced_fidelity(model, moved, params, TEXTS)
    wide = dataclasses.replace(config, d_in=32, weights=None)
    with pytest.raises(AnalysisError, match="24 → 24 wide vectors, the transcoder 32 → 24"):
        tc.checked_site(model, wide)
    with pytest.raises(AnalysisError, match=r"blocks are 0 … 1"):
        tc.sites(model, 2)
    with pytest.raises(AnalysisError, match="pick one of relu, topk, batchtopk, jumprelu"):
        tc.TranscoderConfig(d_in=4, d_sae=8, d_out=4, layer=0, architecture="gated")
    x, y = tc.token_pairs(model, TEXTS, 1)
    x[3, 0] = np.inf
    with pytest.raises(AnalysisError, match="x holds 1 non-finite .* row 3"):
        tc.evaluate(config, params, x, y)


def test_feature_browser_shows_a_transcoders_latents(bert):
    """viz.features on a transcoder reads its MLP input: each latent's peak and firing count are those of
    transcoders.encode over every real token of the texts (special tokens included, as the browser shows them)."""
    from minibert.viz.features import feature_browser

    config, params = _fitted(bert, 1)
    browser = feature_browser(bert, config, params, TEXTS, batch_size=2)
    batch = bert.tokenize(TEXTS)
    _, cache = bert.run_with_cache(batch, names=[config.hook_in])
    x = np.asarray(cache[config.hook_in])[np.asarray(batch.attention_mask) > 0]
    latents = np.asarray(tc.encode(config, {k: jnp.asarray(v) for k, v in params.items()}, x))
    assert browser.data["hook"] == "blocks.1.ln1.hook_out" and browser.data["tokens_seen"] == len(latents)
    assert "block 1" in browser.title
    assert [latent["fires"] for latent in browser.data["latents"]] == list((latents > 0).sum(0))
    # x from two programs (batches of 2 texts and of 4: head_rtol of the forward, with a stage for the encoder's
    # dot), the page's maxima rounded to 6 significant digits
    assert_close_to_scale([latent["max"] for latent in browser.data["latents"]], latents.max(0),
                          head_rtol(bert.config, S=32) + 1e-6, "latent maxima")


# ---- what a first-time user's mistakes get (a docs-only tester's findings) --------------------------------------

def test_a_config_of_numpy_numbers_holds_python_numbers_and_saves(tmp_path):
    config = tc.TranscoderConfig(d_in=np.int64(D_IN), d_sae=np.int64(S), d_out=np.int32(D_OUT), layer=np.int64(0),
                                 k=np.int64(3), k_aux=np.int64(2), sparsity_warmup=np.int64(1),
                                 bandwidth=np.float32(0.5))
    assert all(type(getattr(config, name)) is int
               for name in ("d_in", "d_sae", "d_out", "layer", "k", "k_aux", "sparsity_warmup"))
    assert type(config.bandwidth) is float and config.bandwidth == 0.5  # 0.5 is exact in float32
    trainer = tc.Trainer(config)
    trainer.save(tmp_path / "run.npz")
    assert tc.Trainer.resume(tmp_path / "run.npz").config == config
    tc.save(tmp_path / "saved", config, trainer.params)
    assert tc.load(tmp_path / "saved")[0] == config


def test_nan_parameters_are_refused_by_save_and_evaluate_naming_the_array_and_index(tmp_path):
    """A tester's finding: save wrote, and evaluate scored, a transcoder whose weights are NaN (a diverged run)."""
    config = _config("relu")
    params = {name: np.asarray(value).copy() for name, value in tc.init_params(config).items()}
    params["b_enc"][2] = np.nan
    with pytest.raises(AnalysisError, match=r"transcoders.save: params\['b_enc'\] is not finite at index \(2,\) "
                                            r"\(value nan; 1 such entry\)"):
        tc.save(tmp_path / "saved", config, params)
    assert not (tmp_path / "saved").exists()
    x = np.ones((4, D_IN), np.float32)
    with pytest.raises(AnalysisError, match=r"evaluate: the transcoder: params\['b_enc'\] is not finite at index"):
        tc.evaluate(config, params, x, np.ones((4, D_OUT), np.float32))


def test_pairs_of_another_layer_are_refused_naming_both_layers_and_no_other_weights():
    """A tester's finding: "… for layer 2 (layer 2); …, or other_weights=True" for pairs of another layer, which
    other_weights never lets through. The check on a source record as token_pairs makes it (source_of's keys)."""
    from minibert.analysis.transcoders.source import check_source

    config = tc.TranscoderConfig(d_in=D_IN, d_sae=S, d_out=D_OUT, layer=2, architecture="relu", weights="ab12")
    source = {"layer": 0, "hook_in": "blocks.0.ln1.hook_out", "hook_out": "blocks.0.hook_mlp_out", "weights": "cd34"}
    with pytest.raises(AnalysisError, match=r"^these pairs are of layer 0 but the transcoder is for layer 2; pass "
                                            r"the pairs of layer 2\.$"):
        check_source(config, source, "pass the pairs of layer 2.", weights_fix=", or other_weights=True.")
    with pytest.raises(AnalysisError, match=r"weights 'cd34' .* for weights 'ab12' \(layer 2\); pass the pairs of "
                                            r"layer 2, or other_weights=True\.$"):
        check_source(config, source | {"layer": 2}, "pass the pairs of layer 2.",
                     weights_fix=", or other_weights=True.")


def test_load_of_a_non_path_is_refused():
    with pytest.raises(DataFileError, match="path"):
        tc.load(3)


@pytest.mark.parametrize("batch_size", ["16", 16.0, 0])
def test_activations_refuse_a_batch_size_that_is_no_whole_number(bert, batch_size):
    with pytest.raises(AnalysisError, match=f"batch_size={batch_size!r} must be a whole number ≥ 1"):
        tc.activations(bert, ["a text"], 0, batch_size=batch_size)


# ---- what the pairs carry, and what a score says about them ------------------------------------------------------

@pytest.mark.slow  # ~10 s or more on the shared 2-core machine
def test_pairs_carry_their_site_and_evaluate_and_training_check_it(bert, other_bert, tmp_path):
    """token_pairs and each streamed batch carry the block, hooks and weights they were read at: evaluate refuses
    pairs of another block (even for a config that names only its layer) or of other weights (unless
    other_weights=True), and scores kept pairs as it scores the arrays; a trainer fed a list of kept batches (a
    multi-pass run) records the stream's source as train() on the stream does, and refuses other kept batches
    after a resume."""
    config, params = _fitted(bert, 1)
    held_out = tc.token_pairs(bert, TEXTS, 1)
    assert held_out.source == tc.source_of(bert, 1)
    x, y = held_out
    assert tc.evaluate(config, params, held_out)["fvu"] == tc.evaluate(config, params, x, y)["fvu"]
    bare = tc.TranscoderConfig(d_in=24, d_sae=16, d_out=24, layer=1, architecture="relu", skip=True)
    for named in (config, bare):
        with pytest.raises(AnalysisError, match=r"^these pairs are of layer 0 but the transcoder is for layer 1; pass "
                                                r"transcoders.token_pairs\(model, texts, 1\) of the model it was "
                                                r"trained on\.$"):
            tc.evaluate(named, params, tc.token_pairs(bert, TEXTS, 0))
    theirs = tc.token_pairs(other_bert, TEXTS, 1)
    with pytest.raises(AnalysisError, match="weights .*or other_weights=True to score it on these weights "
                                            r"\(other_weights is for other weights only"):
        tc.evaluate(config, params, theirs)
    assert np.isfinite(tc.evaluate(config, params, theirs, other_weights=True)["fvu"])
    with pytest.raises(AnalysisError, match="token_pairs gives, or x and y"):
        tc.evaluate(config, params, x)

    stream = tc.activations(bert, TEXTS, 1, batch_size=8, buffer_tokens=16)
    kept = list(stream)  # read once, trained on for several passes
    assert all(batch.source == stream.source for batch in kept)
    trainer = tc.Trainer(tc.TranscoderConfig(d_in=24, d_sae=16, d_out=24, layer=1, k=4))
    for _ in range(2):
        trainer.train(kept)
    assert trainer.steps == 2 * len(kept) and trainer.source == stream.source
    assert trainer.config.hook_in == "blocks.1.ln1.hook_out" and trainer.config.weights == weights_digest(bert)
    resumed = tc.Trainer.resume(trainer.save(tmp_path / "run.npz"))
    with pytest.raises(AnalysisError, match="weights"):
        resumed.train(list(tc.activations(other_bert, TEXTS, 1, batch_size=8, buffer_tokens=16)))
    wrong_layer = tc.Trainer(tc.TranscoderConfig(d_in=24, d_sae=16, d_out=24, layer=0, k=4))
    with pytest.raises(AnalysisError, match=r"layer 1 but the transcoder is for layer 0"):
        wrong_layer.step(kept[0])
    assert wrong_layer.steps == 0


@pytest.mark.slow  # ~10 s or more on the shared 2-core machine
def test_long_texts_are_refused_by_held_out_sets_and_counted_by_streams(bert):
    """One rule: a held-out set (token_pairs, and so spliced_fidelity's text_batch) reads each text whole or
    refuses it, naming how many are too long and the fix; a training stream cuts them to max_length and warns
    once with the count. A 12-word text is 14 tokens with [CLS] and [SEP]; the model has 64 positions."""
    long = " ".join(["w1"] * 12)
    assert tc.token_pairs(bert, [long, "w3 w4"], 0)[0].shape[0] == 12 + 2  # whole
    with pytest.raises(AnalysisError, match=r"1 of the 2 texts has more than 8 tokens .*never cut: pass "
                                            r"max_length= up to 64"):
        tc.token_pairs(bert, [long, "w3 w4"], 0, max_length=8)
    with pytest.raises(AnalysisError, match=r"more than 64 tokens .*split them \(this model reads at most 64"):
        tc.token_pairs(bert, [" ".join(["w1"] * 70)], 0)
    with pytest.warns(AnalysisWarning, match=r"1 of the first 2 texts had more than max_length=8 tokens .*once per "
                                         r"stream.*up to this model's 64 positions") as caught:
        batches = list(tc.activations(bert, [long, "w3 w4"], 0, batch_size=2, buffer_tokens=4, max_length=8))
    assert len(caught) == 1 and len(batches) == (6 + 2) // 2  # 8 − [CLS], [SEP] of the cut text, and w3 w4


@pytest.mark.slow  # ~10 s or more on the shared 2-core machine
def test_threshold_architectures_warn_once_while_uncalibrated():
    """BatchTopK at θ = 0 (its start) fires every positive pre-activation: about half of 24 latents per token,
    above 2·k = 6, so evaluate warns, once for that config; JumpReLU at θ = 0 fires above a quarter of its latents;
    the same BatchTopK with θ raised to the k-th largest pre-activation's level does not warn."""
    import warnings

    rng = np.random.default_rng(8)
    x, y = _pairs(rng, 64)
    for architecture in ("batchtopk", "jumprelu"):
        config = _config(architecture, l0_coefficient=0.5)  # a config no other test warned for
        params = tc.init_params(config, seed=1)
        with pytest.warns(AnalysisWarning, match=rf"this {architecture} transcoder is not sparse yet.*"
                                             rf"{'2·k = 6' if architecture == 'batchtopk' else 'more than 25%'}"):
            first = tc.evaluate(config, params, x, y)
        assert first["l0"] > 6  # 2·k = 6 for BatchTopK, and a quarter of 24 latents for JumpReLU
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            tc.evaluate(config, params, x, y)  # once per config
    config = _config("batchtopk", l0_coefficient=0.25)
    params = tc.init_params(config, seed=1)
    pre = np.asarray(tc.pre_activations(params, x))
    params["threshold"] = jnp.asarray(np.quantile(pre, 1 - 3 / S), jnp.float32)  # ~k = 3 above it per token
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tc.evaluate(config, params, x, y)["l0"] <= 6


def test_saved_weights_have_a_plain_new_files_permissions(tmp_path):
    """transcoders.save and sae.save write sae_weights.safetensors (which safetensors writes 0600) and cfg.json
    with 0666 less the umask, as Model.save and Trainer.save do."""
    import os

    from minibert.analysis import sae

    previous = os.umask(0o027)
    try:
        config = _config("relu")
        written = [tc.save(tmp_path / "tc", config, tc.init_params(config))]
        sae_config = sae.SAEConfig(d_in=D_IN, d_sae=S, architecture="relu")
        written.append(sae.save(tmp_path / "sae", sae_config, sae.init_params(sae_config)))
    finally:
        os.umask(previous)
    for directory in written:
        for name in ("cfg.json", "sae_weights.safetensors"):
            assert (directory / name).stat().st_mode & 0o777 == 0o640, (directory, name)


def test_reference_libraries_are_hard_imports_in_ci(monkeypatch):
    """tests/references.py: outside CI a missing reference library skips; with CI=true it fails."""
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        reference_library("no_such_reference_library")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(ModuleNotFoundError):
        reference_library("no_such_reference_library")
