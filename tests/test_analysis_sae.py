"""Sparse autoencoders: a planted dictionary recovered, per-step losses against a PyTorch trainer of the same
algorithm, exact splicing of an identity SAE, SAELens' file layout, resuming, the activation stream."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import numpy as np
import pytest
from safetensors.numpy import save_file
from tolerances import U32, assert_close_to_scale, dot_rtol, forward_rtol, head_rtol, sum_rtol

from minibert.analysis import sae
from minibert.analysis.corpus.result import weights_digest
from minibert.analysis.gradients import mask_tokens
from minibert.errors import AnalysisError, DataFileError, DivergedError

D, S = 16, 32  # the planted-free tests' widths


def _planted(rng, atoms, n, k, noise=0.01):
    """n points, each a k-sparse positive combination of unit atoms [S, D] plus Gaussian noise (generated)."""
    support = np.argsort(rng.random((n, len(atoms))), axis=1)[:, :k]
    codes = np.zeros((n, len(atoms)))
    np.put_along_axis(codes, support, rng.uniform(1, 3, (n, k)), axis=1)
    return (codes @ atoms + noise * rng.normal(size=(n, atoms.shape[1]))).astype(np.float32)


@pytest.mark.slow
def test_topk_sae_recovers_a_planted_dictionary():
    """48 random unit atoms in 32 dimensions, 3 active per point: ≥ 90% of atoms have a decoder row with
    cosine > 0.9 (Gao et al.'s and Sharkey et al.'s synthetic check)."""
    rng = np.random.default_rng(0)
    atoms = rng.normal(size=(48, 32))
    atoms /= np.linalg.norm(atoms, axis=1, keepdims=True)
    trainer = sae.Trainer(sae.SAEConfig(d_in=32, d_sae=64, k=3, k_aux=16), learning_rate=5e-3, warmup=10,
                          dead_tokens=256 * 20, seed=1)
    for _ in range(400):
        trainer.step(_planted(rng, atoms, 256, 3))
    cosines = atoms @ np.asarray(trainer.params["W_dec"]).T
    assert (cosines.max(1) > 0.9).mean() >= 0.9


def _torch_losses(config, params, batches, learning_rate, warmup, dead_tokens):
    """The same algorithm in PyTorch (float64): Adam with linear warm-up, decoder rows renormalised after each
    step, dead latents = not fired over the last dead_tokens tokens, AuxK or decoder-norm-weighted L1."""
    import torch

    p = {name: torch.tensor(np.asarray(value), dtype=torch.float64, requires_grad=True)
         for name, value in params.items()}
    optimizer = torch.optim.Adam(list(p.values()), lr=learning_rate)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: step / warmup if step < warmup else 1.0)
    since_fired = torch.zeros(config.d_sae, dtype=torch.int64)

    def top_k(values, k):
        kept, index = torch.topk(values, k, dim=-1)
        return torch.zeros_like(values).scatter(-1, index, kept).relu()

    history = []
    for step, batch in enumerate(batches):
        x = torch.tensor(batch, dtype=torch.float64)
        pre = (x - p["b_dec"]) @ p["W_enc"] + p["b_enc"]
        latents = top_k(pre, config.k) if config.architecture == "topk" else pre.relu()
        error = x - (latents @ p["W_dec"] + p["b_dec"])
        mse = (error**2).sum(-1).mean()
        dead = since_fired >= dead_tokens
        if config.architecture == "topk":
            aux = torch.zeros((), dtype=torch.float64)
            if dead.any():
                z = top_k(torch.where(dead, pre, torch.tensor(-torch.inf, dtype=torch.float64)), config.aux_k)
                aux = ((error.detach() - z @ p["W_dec"]) ** 2).sum(-1).mean()
            total = mse + config.aux_coefficient * aux
        else:
            ramp = min(1.0, (step + 1) / config.l1_warmup) if config.l1_warmup else 1.0
            total = mse + config.l1_coefficient * ramp * (latents * p["W_dec"].norm(dim=-1)).sum(-1).mean()
        history.append(total.item())
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        schedule.step()
        with torch.no_grad():
            p["W_dec"] /= p["W_dec"].norm(dim=-1, keepdim=True)
        fired = (latents > 0).any(0)
        since_fired = torch.where(fired, 0, since_fired + len(x))
    return history


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["topk", "relu"])
def test_per_step_losses_match_a_pytorch_trainer(architecture):
    """Same initial parameters and batches. Tolerance: one step's loss rounds the encoder's dot products (length
    D), the decoder's (length S), the squared error's sum over D and the mean over N tokens: dot_rtol(D) +
    dot_rtol(S) + sum_rtol(D) + sum_rtol(N) relative; parameters that rounding moved move the next loss by at
    most as much again, so step t allows (t + 1) times it."""
    rng = np.random.default_rng(1)
    config = sae.SAEConfig(d_in=D, d_sae=S, architecture=architecture, k=4, k_aux=6, l1_coefficient=0.1,
                           l1_warmup=3)
    batches = [rng.normal(size=(64, D)).astype(np.float32) for _ in range(8)]
    params = sae.init_params(config, seed=2)
    params["b_enc"] = params["b_enc"].at[:8].set(-1.0)  # 8 latents rarely in the top k: dead after 2 batches
    trainer = sae.Trainer(config, learning_rate=1e-2, warmup=3, dead_tokens=128, params=params)
    reference = _torch_losses(config, trainer.params, batches, 1e-2, 3, 128)
    steps = [trainer.step(x) for x in batches]
    ours = [step["total"] for step in steps]
    if architecture == "topk":
        assert any(step["aux"] > 0 for step in steps)  # AuxK took part
    base = dot_rtol(D) + dot_rtol(S) + sum_rtol(D) + sum_rtol(64)
    for step, (a, b) in enumerate(zip(ours, reference)):
        assert abs(a - b) <= (step + 1) * base * abs(b), (step, a, b)


def _identity_sae(d, architecture):
    """W_enc = [I, −I], W_dec = [I; −I]: ReLU(x) − ReLU(−x) = x exactly (one non-zero term per sum)."""
    eye = np.eye(d, dtype=np.float32)
    config = sae.SAEConfig(d_in=d, d_sae=2 * d, architecture=architecture, k=d)
    params = {"W_enc": np.concatenate([eye, -eye], 1), "b_enc": np.zeros(2 * d, np.float32),
              "W_dec": np.concatenate([eye, -eye], 0), "b_dec": np.zeros(d, np.float32)}
    return config, params


@pytest.mark.slow
@pytest.mark.parametrize(("architecture", "hook"), [("topk", "blocks.0.hook_resid_post"),
                                                    ("relu", "blocks.0.hook_resid_post"),
                                                    ("topk", "blocks.1.attn.hook_z"),  # per-head z, [B, T, H, K]
                                                    ("relu", "blocks.0.mlp.hook_post")])
def test_identity_sae_spliced_in_changes_nothing(tiny_mlm, architecture, hook):
    """At the residual stream, the MLP's output and the heads' z (flattened per token to H·K, as SAELens'
    hook_z, and back): the identity SAE's reconstruction is exact, so the spliced run computes the clean run's
    values — but it is another compiled program, and XLA may fuse and order its reductions differently on
    another CPU. Bound: each run's logits are within head_rtol × max|logit| of the exact ones (two programs);
    a cross-entropy term log Σ exp z − z_y moves by at most 2·max|δz|, and each loss's mean over n masked
    positions rounds by sum_rtol(n) of itself."""
    model = tiny_mlm[0]
    texts = ["ab cd ef", "g h i j k"]
    config, params = _identity_sae(sae.hook_width(model, hook), architecture)
    fidelity = sae.spliced_fidelity(model, config, params, texts, hook)
    masked, labels = mask_tokens(model, model.tokenize(texts), seed=0)  # spliced_fidelity's default seed
    logits = np.asarray(model.run_with_hooks(masked).logits)
    n = int((labels != -100).sum())
    bound = 2 * head_rtol(model.config, S=labels.shape[1]) * np.abs(logits).max() + \
        2 * sum_rtol(n) * fidelity["ce_clean"]
    assert abs(fidelity["ce_increase"]) <= bound and fidelity["ce_clean"] > 0
    x = sae.token_activations(model, ["ab cd ef"], hook)
    assert x.shape[1] == config.d_in
    metrics = sae.evaluate(config, params, x)
    assert metrics["fvu"] == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("mode", [None, "cls", ("max", "mean")])
def test_sentence_fidelity_pools_as_the_checkpoint_says(tmp_path, mode):
    """A model without a masked-LM head: the cosine of sentence vectors with and without the SAE, pooled by the
    checkpoint's Pooling mode (None: the mean; a list: concatenated), against the definition on run_with_hooks'
    outputs in float64; the identity SAE gives cosine 1 up to the rounding of one dot product and two norms."""
    from conftest import make_hf_model

    import minibert

    make_hf_model(tmp_path, "BertModel")
    model = minibert.load(tmp_path)
    model.pooling = None if mode is None else {"mode": mode, "normalize": True}
    texts = ["ab cd ef", "g h i j k"]
    hook = "blocks.0.hook_resid_post"
    config = sae.SAEConfig(d_in=model.config.hidden_size, d_sae=24, architecture="relu", hook_name=hook)
    params = sae.init_params(config, seed=6)
    batch = model.tokenize(texts)
    mask = np.asarray(batch.attention_mask, np.float64)[..., None]
    clean = np.asarray(model.run_with_hooks(batch).last_hidden_state, np.float64)
    spliced = np.asarray(model.run_with_hooks(batch, hooks=sae.splice_hook(config, params)).last_hidden_state,
                         np.float64)

    def pooled(hidden, name):
        if name == "cls":
            return hidden[:, 0]
        if name == "max":
            return np.where(mask > 0, hidden, -np.inf).max(1)
        return (hidden * mask).sum(1) / mask.sum(1)

    names = ["mean"] if mode is None else [mode] if isinstance(mode, str) else list(mode)
    a = np.concatenate([pooled(clean, name) for name in names], -1)
    b = np.concatenate([pooled(spliced, name) for name in names], -1)
    expected = np.mean((a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)))
    fidelity = sae.spliced_fidelity(model, config, params, texts)
    # ours pools the same float32 hidden states in float32: the pooling's sum over T tokens (both sides) and one dot
    # product and two norms of length D' round, relative to a cosine of at most 1
    assert abs(fidelity["cosine"] - expected) <= 2 * sum_rtol(mask.shape[1]) + 3 * dot_rtol(a.shape[-1])
    assert expected < 1 - 1e-3  # the random SAE changes the vectors: the comparison means something
    identity_config, identity = _identity_sae(model.config.hidden_size, "relu")
    identity_config = sae.SAEConfig(**{**identity_config.__dict__, "hook_name": hook})
    assert abs(sae.spliced_fidelity(model, identity_config, identity, texts)["cosine"] - 1) <= 3 * dot_rtol(a.shape[-1])


def test_evaluate_by_hand():
    config = sae.SAEConfig(d_in=2, d_sae=3, architecture="relu")
    params = {"W_enc": np.array([[1.0, 0, 0], [0, 1, 0]]), "b_enc": np.array([0.0, 0, -1]),
              "W_dec": np.array([[1.0, 0], [0, 1], [1, 1]]), "b_dec": np.zeros(2)}
    x = np.array([[1.0, 0], [0, 2], [-1, 0], [0, 0]])
    metrics = sae.evaluate(config, params, x)  # latents: [1,0,0], [0,2,0], [0,0,0], [0,0,0]
    assert metrics["l0"] == 0.5
    np.testing.assert_allclose(metrics["frequency"], [0.25, 0.25, 0.0])
    assert metrics["dead"] == pytest.approx(1 / 3) and metrics["dense"] == pytest.approx(2 / 3)
    # errors: only x = [−1, 0] is not reconstructed (1); Σ‖x − mean‖² = 0 + 1.5·… computed from its definition
    mean = x.mean(0)
    # every latent, error, mean and square here is a small dyadic number, exact in float32: only the division rounds
    assert metrics["fvu"] == pytest.approx(1.0 / ((x - mean) ** 2).sum(), rel=U32)


def test_save_load_round_trip_in_saelens_layout(tmp_path):
    config = sae.SAEConfig(d_in=D, d_sae=S, k=5, hook_name="blocks.2.attn.hook_z", model_name="tiny")
    params = {name: np.asarray(value) for name, value in sae.init_params(config, seed=3).items()}
    params["b_enc"] = np.random.default_rng(3).normal(size=S).astype(np.float32)
    sae.save(tmp_path / "sae", config, params)
    cfg = json.loads((tmp_path / "sae" / "cfg.json").read_text())
    assert (cfg["architecture"], cfg["d_in"], cfg["d_sae"], cfg["k"], cfg["reshape_activations"]) == (
        "topk", D, S, 5, "hook_z")
    assert cfg["metadata"]["hook_name"] == "blocks.2.attn.hook_z"
    loaded_config, loaded = sae.load(tmp_path / "sae")
    assert loaded_config == config
    for name in params:
        np.testing.assert_array_equal(loaded[name], params[name])
    assert loaded["W_enc"].shape == (D, S) and loaded["W_dec"].shape == (S, D)
    params["W_dec"] = params["W_dec"].T.copy()
    with pytest.raises(DataFileError, match="W_dec should be"):  # the cfg would describe other weights
        sae.save(tmp_path / "bad", config, params)
    save_file({**params, "W_dec": params["W_dec"]}, str(tmp_path / "sae" / "sae_weights.safetensors"))
    with pytest.raises(DataFileError, match="W_dec should be"):
        sae.load(tmp_path / "sae")


def test_saved_cfg_is_saelens_6_layout(tmp_path):
    """SAELens (>= 6) treats a cfg.json without sae_lens_version, or older than 6.0, as a pre-6 file and rebuilds
    its metadata from top-level keys, dropping hook_name and model_name. Its check, as in sae_lens/loading/
    pretrained_sae_loaders.py: the top-level version, else metadata's, compared with packaging's Version."""
    from packaging.version import Version

    config = sae.SAEConfig(d_in=D, d_sae=S, k=5, hook_name="blocks.2.hook_resid_post", model_name="tiny")
    sae.save(tmp_path, config, sae.init_params(config))
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    version = cfg.get("sae_lens_version") or cfg["metadata"].get("sae_lens_version")
    assert version and Version(version) >= Version("6.0.0-rc.0")
    assert cfg["metadata"]["sae_lens_version"] == version  # where SAELens 6's own save_model writes it
    assert (cfg["metadata"]["hook_name"], cfg["metadata"]["model_name"]) == ("blocks.2.hook_resid_post", "tiny")


def test_save_and_load_refuse_what_would_lose_or_misread_an_sae(tmp_path):
    """sae.save into a directory holding another SAE replaced it; a cfg whose d_sae does not match the weights was
    written; a non-JSON cfg or cut-short weights raised raw JSON/safetensors errors."""
    config = sae.SAEConfig(d_in=D, d_sae=S, k=5)
    params = sae.init_params(config, seed=1)
    sae.save(tmp_path / "first", config, params)
    before = {name: (tmp_path / "first" / name).read_bytes() for name in ("cfg.json", "sae_weights.safetensors")}
    other = sae.SAEConfig(d_in=D, d_sae=2 * S, k=5)
    with pytest.raises(DataFileError, match="already holds cfg.json and sae_weights.safetensors"):
        sae.save(tmp_path / "first", other, sae.init_params(other))
    with pytest.raises(DataFileError, match=r"overwrite='False': pass True or False"):  # a truthy string
        sae.save(tmp_path / "first", other, sae.init_params(other), overwrite="False")
    assert {name: (tmp_path / "first" / name).read_bytes() for name in before} == before
    sae.save(tmp_path / "first", other, sae.init_params(other), overwrite=True)
    assert sae.load(tmp_path / "first")[0].d_sae == 2 * S
    with pytest.raises(DataFileError, match=r"W_enc should be \(16, 64\)"):  # d_sae 64 in the cfg, 32 latents
        sae.save(tmp_path / "mismatch", dataclasses.replace(config, d_sae=2 * S), params)
    assert not (tmp_path / "mismatch").exists()
    (tmp_path / "first" / "cfg.json").write_text("{not json")
    with pytest.raises(DataFileError, match="is not JSON"):
        sae.load(tmp_path / "first")
    sae.save(tmp_path / "cut", config, params)
    weights = tmp_path / "cut" / "sae_weights.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(DataFileError, match="cannot be read"):
        sae.load(tmp_path / "cut")


def test_bad_settings_and_non_finite_batches_are_refused():
    """k=2.5 and k_aux=-1 were accepted and failed at the first step; a negative learning rate (gradient ascent),
    inf or NaN trained; one NaN activation put NaN into every parameter (152 of them in the report)."""
    for options in (dict(k=2.5), dict(k_aux=-1), dict(k=0), dict(k=True), dict(l1_warmup=-1),
                    dict(l1_coefficient=float("nan")), dict(aux_coefficient=-1.0)):
        with pytest.raises(AnalysisError, match="SAEConfig"):
            sae.SAEConfig(d_in=D, d_sae=S, **options)
    config = sae.SAEConfig(d_in=D, d_sae=S, k=4)
    for rate in (-1e-3, 0.0, float("inf"), float("nan")):
        with pytest.raises(AnalysisError, match="learning_rate"):
            sae.Trainer(config, learning_rate=rate)
    with pytest.raises(AnalysisError, match="warmup"):
        sae.Trainer(config, warmup=-1)
    trainer = sae.Trainer(config, learning_rate=1e-2)
    before = {name: np.asarray(value).copy() for name, value in trainer.params.items()}
    x = np.random.default_rng(0).normal(size=(8, D)).astype(np.float32)
    x[5, 3] = np.nan
    with pytest.raises(AnalysisError, match="1 non-finite activations.*row 5"):
        trainer.step(x)
    assert trainer.steps == 0
    for name, value in trainer.params.items():
        np.testing.assert_array_equal(value, before[name])  # untouched: the step never ran
    huge = np.full((8, D), 1e30, np.float32)  # finite activations whose squared error overflows float32
    with pytest.raises(DivergedError, match="SAE step 0: the loss is not finite"):
        trainer.step(huge)
    for name, value in trainer.params.items():
        np.testing.assert_array_equal(value, before[name])  # the update was not applied


def test_trainer_save_writes_the_path_it_returns_and_resume_refuses_foreign_files(tmp_path):
    """Trainer.save("run") returned run but wrote run.npz; Trainer.resume of another file or a cut-short one
    raised raw numpy/zipfile errors."""
    trainer = sae.Trainer(sae.SAEConfig(d_in=D, d_sae=S, k=4))
    path = trainer.save(tmp_path / "run")
    assert path == tmp_path / "run" and path.is_file() and not (tmp_path / "run.npz").exists()
    assert sae.Trainer.resume(path).config == trainer.config
    (tmp_path / "notes.txt").write_text("my notes")
    cut = tmp_path / "cut.npz"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    for bad in (tmp_path / "notes.txt", cut):
        with pytest.raises(DataFileError, match="is not a whole SAE checkpoint"):
            sae.Trainer.resume(bad)


def test_resumed_training_takes_the_same_steps(tmp_path):
    rng = np.random.default_rng(4)
    batches = [rng.normal(size=(32, D)).astype(np.float32) for _ in range(4)]
    config = sae.SAEConfig(d_in=D, d_sae=S, k=4)
    straight = sae.Trainer(config, learning_rate=1e-2, warmup=2, dead_tokens=64)
    for x in batches:
        straight.step(x)
    first = sae.Trainer(config, learning_rate=1e-2, warmup=2, dead_tokens=64)
    for x in batches[:2]:
        first.step(x)
    resumed = sae.Trainer.resume(first.save(tmp_path / "run.npz"))
    for x in batches[2:]:
        resumed.step(x)
    assert resumed.steps == 4
    for name in straight.params:
        np.testing.assert_array_equal(resumed.params[name], straight.params[name])
    np.testing.assert_array_equal(resumed.since_fired, straight.since_fired)


STREAM_TEXTS = [" ".join("abcdefgh"[(i + j) % 8] for j in range(3 + i % 5)) for i in range(24)]  # generated, distinct


def _stream(model, texts, **options):
    return list(sae.activations(model, texts, "blocks.1.mlp.hook_post", batch_size=16, buffer_tokens=48,
                                batch_tokens=64, **options))


@pytest.mark.slow
def test_activation_stream_gives_every_real_token_once(tiny_mlm):
    """Packed rows (here ~7 texts to a row of the tiny model's 64 positions) give each real, non-special token's
    value as the text has it run alone, once each (the last partial batch dropped). Streamed rows are matched to
    the texts' own rows by nearest distance; tolerance: the two programs' forward rounding (forward_rtol) of the
    values' scale."""
    model = tiny_mlm[0]
    batches = _stream(model, iter(STREAM_TEXTS))
    expected = np.concatenate([sae.token_activations(model, [text], "blocks.1.mlp.hook_post")
                               for text in STREAM_TEXTS])
    got = np.concatenate(batches)
    assert all(len(b) == 16 for b in batches) and len(got) == len(expected) // 16 * 16
    nearest = ((got[:, None] - expected[None]) ** 2).sum(-1).argmin(1)
    assert len(set(nearest.tolist())) == len(got)  # one to one
    assert_close_to_scale(got, expected[nearest], forward_rtol(model.config, S=64))


@pytest.mark.slow
def test_activation_stream_reads_corpus_files_and_caches_to_disk(tiny_mlm, tmp_path, monkeypatch):
    """A .txt corpus streams as the same texts in a list do; a finished cache gives the same batches back without
    running the model, and refuses other texts or settings; a cache cut short is rewritten."""
    model = tiny_mlm[0]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(STREAM_TEXTS) + "\n", encoding="utf-8")
    listed = _stream(model, STREAM_TEXTS)
    for got, expected in zip(_stream(model, corpus), listed, strict=True):
        np.testing.assert_array_equal(got, expected)
    cut = sae.activations(model, STREAM_TEXTS, "blocks.1.mlp.hook_post", batch_size=16, buffer_tokens=48,
                          batch_tokens=64, cache=tmp_path / "cache")
    next(cut)  # stopped after one batch: the cache is unfinished, so the next call writes it again
    written = _stream(model, STREAM_TEXTS, cache=tmp_path / "cache")

    def not_run(*args, **kwargs):
        raise AssertionError("the model ran although the cache holds these activations")

    monkeypatch.setattr(sae.source, "forward_batches", not_run)
    read = _stream(model, iter(STREAM_TEXTS), cache=tmp_path / "cache")
    for batches in (written, read):
        for got, expected in zip(batches, listed, strict=True):
            np.testing.assert_array_equal(got, expected)
    with pytest.raises(DataFileError, match="other texts"):
        _stream(model, STREAM_TEXTS[1:], cache=tmp_path / "cache")
    with pytest.raises(DataFileError, match="other settings"):
        list(sae.activations(model, STREAM_TEXTS, "blocks.0.mlp.hook_post", batch_size=16, buffer_tokens=48,
                             cache=tmp_path / "cache"))


def test_sae_errors_name_the_problem(tiny_mlm):
    with pytest.raises(AnalysisError, match="architecture"):
        sae.SAEConfig(d_in=4, d_sae=8, architecture="gated")
    with pytest.raises(AnalysisError, match="one vector per token"):
        sae.hook_width(tiny_mlm[0], "blocks.0.attn.hook_pattern")
    with pytest.raises(AnalysisError, match=r"\[N, 16\]"):
        sae.Trainer(sae.SAEConfig(d_in=D, d_sae=S)).step(np.zeros((3, 5)))


@pytest.mark.slow
def test_sae_benchmark_smoke(capsys, monkeypatch, tmp_path):
    """benchmarks/sae.py --smoke runs both pipelines over the same tokens (the timings themselves are not checked)."""
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    monkeypatch.setenv("MINIBERT_BENCH_CACHE", str(tmp_path / "cache"))
    import sae as benchmark

    assert benchmark.main(["--smoke"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| minibert") or
            line.startswith("| transformers")]
    assert len(rows) == 2 and rows[0].split("|")[2] == rows[1].split("|")[2]  # the same tokens trained on
    sys.modules.pop("sae", None)


@pytest.mark.slow
def test_a_resumed_trainer_refuses_another_hooks_activations(tiny_mlm, tmp_path):
    """Two hooks of the same width: the trainer records the stream it trained on (hook and weights) and, once
    resumed, refuses the other one instead of training on it silently."""
    model = tiny_mlm[0]
    config = sae.SAEConfig(d_in=sae.hook_width(model, "blocks.0.hook_resid_post"), d_sae=S, k=4,
                           hook_name="blocks.0.hook_resid_post")

    def stream(hook):
        return sae.activations(model, STREAM_TEXTS, hook, batch_size=16, buffer_tokens=48, batch_tokens=64)

    trainer = sae.Trainer(config, learning_rate=1e-3)
    trainer.train(stream("blocks.0.hook_resid_post"), steps=1)
    resumed = sae.Trainer.resume(trainer.save(tmp_path / "run.npz"))
    assert resumed.source == {"hook_name": "blocks.0.hook_resid_post", "weights": weights_digest(model)}
    with pytest.raises(AnalysisError, match="'blocks.1.hook_resid_post''s but the SAE reads"):
        resumed.train(stream("blocks.1.hook_resid_post"), steps=1)
    unnamed = sae.Trainer.resume(sae.Trainer(dataclasses.replace(config, hook_name=None)).save(tmp_path / "u.npz"))
    unnamed.train(stream("blocks.0.hook_resid_post"), steps=1)
    again = sae.Trainer.resume(unnamed.save(tmp_path / "u.npz"))
    with pytest.raises(AnalysisError, match="resume on the same hook"):
        again.train(stream("blocks.1.hook_resid_post"), steps=1)
    assert again.steps == 1


@pytest.mark.slow
def test_the_activation_cache_keeps_a_users_files_and_names_a_missing_batch(tiny_mlm, tmp_path):
    """cache= a directory of the user's own 000000.npy and activations.json overwrote them; a finished cache with
    a .npy deleted raised a raw FileNotFoundError half-way through training."""
    model = tiny_mlm[0]
    mine = tmp_path / "mine"
    mine.mkdir()
    np.save(mine / "000000.npy", np.arange(3))
    (mine / "activations.json").write_text('{"my": "notes"}')
    with pytest.raises(DataFileError, match="not a minibert activation-cache record"):
        _stream(model, STREAM_TEXTS, cache=mine)
    (mine / "activations.json").unlink()
    with pytest.raises(DataFileError, match="holds files but no activation cache"):
        _stream(model, STREAM_TEXTS, cache=mine)
    np.testing.assert_array_equal(np.load(mine / "000000.npy"), np.arange(3))
    _stream(model, STREAM_TEXTS, cache=tmp_path / "cache")
    (tmp_path / "cache" / "000001.npy").unlink()
    with pytest.raises(DataFileError, match="000001.npy is missing; delete the directory"):
        _stream(model, STREAM_TEXTS, cache=tmp_path / "cache")


@pytest.mark.slow
def test_sae_helpers_take_one_text_pairs_and_files_and_refuse_the_wrong_width(tiny_mlm, tmp_path):
    """token_activations read a str as one text (not one text per character), (text, pair) tuples and pairs= as
    the tokenizer pairs them, and a .tsv corpus file as training reads it; the wrong width is named."""
    model = tiny_mlm[0]
    hook = "blocks.1.mlp.hook_post"
    one = sae.token_activations(model, "ab cd ef", hook)
    np.testing.assert_array_equal(one, sae.token_activations(model, ["ab cd ef"], hook))  # the same program
    corpus = tmp_path / "pairs.tsv"
    corpus.write_text("ab cd\tef\ng h\ti j k\n", encoding="utf-8")
    batch = model.tokenize(["ab cd", "g h"], ["ef", "i j k"])
    _, cache = model.run_with_cache(batch, names=[hook])
    ids = np.asarray(batch.input_ids)
    keep = (np.asarray(batch.attention_mask) > 0) & ~np.isin(ids, [model.tokenizer.cls_token_id,
                                                                    model.tokenizer.sep_token_id])
    expected = np.asarray(cache[hook]).reshape(*ids.shape, -1)[keep]
    for texts, pairs in ((["ab cd", "g h"], ["ef", "i j k"]), ([("ab cd", "ef"), ("g h", "i j k")], None),
                         (corpus, None), (str(corpus), None)):
        np.testing.assert_array_equal(sae.token_activations(model, texts, hook, pairs=pairs), expected)
    with pytest.raises(AnalysisError, match="texts and pairs have different lengths"):
        sae.token_activations(model, ["ab", "cd"], hook, pairs=["ef"])
    config = sae.SAEConfig(d_in=7, d_sae=S, k=4, hook_name=hook)
    params = sae.init_params(config)
    width = sae.hook_width(model, hook)
    with pytest.raises(AnalysisError, match=rf"\[N, 7\] with N ≥ 1; got shape \({len(one)}, {width}\)"):
        sae.evaluate(config, params, one)
    with pytest.raises(AnalysisError, match=f"gives {width}-wide vectors but the SAE reads d_in=7"):
        sae.spliced_fidelity(model, config, params, ["ab cd ef"])


@pytest.mark.slow
def test_spliced_fidelity_on_a_classifier_against_transformers(tmp_path):
    """A sequence classifier: clean, spliced and zero-ablated runs recomputed in transformers (a forward pre-hook
    on block 0's second LayerNorm replaces its input, minibert's blocks.0.hook_resid_post, by the SAE's numpy
    reconstruction or by 0), cross-entropy, KL and accuracy in float64. Tolerance: each program's logits are
    within δ = head_rtol × max|logit| of exact; a CE moves by ≤ 2δ, KL(p‖q) = Σ p(log p − log q) by ≤ 4δ(1 + KL)
    (log-probabilities by 2δ each, p by a factor e^{±2δ}), and loss recovered (a − s)/(a − c) by
    (4δ + |ratio|·4δ) / (|a − c| − 4δ)."""
    import torch
    from conftest import make_hf_model

    import minibert

    hf = make_hf_model(tmp_path, "BertForSequenceClassification", num_labels=3).eval()
    model = minibert.load(tmp_path)
    texts, labels = ["ab cd ef", "g h i j k", "a b", "cd ab g"], np.array([0, 2, 1, 2])
    hook = "blocks.0.hook_resid_post"
    config = sae.SAEConfig(d_in=model.config.hidden_size, d_sae=24, k=3, hook_name=hook)
    params = {name: np.asarray(value, np.float64) for name, value in sae.init_params(config, seed=5).items()}
    got = sae.spliced_fidelity(model, config, params, texts, labels=labels)

    def numpy_sae(x):
        pre = (x - params["b_dec"]) @ params["W_enc"] + params["b_enc"]
        kept = np.where(pre >= np.sort(pre, -1)[..., -config.k][..., None], np.maximum(pre, 0), 0)
        return kept @ params["W_dec"] + params["b_dec"]

    batch = model.tokenize(texts)
    inputs = {k: torch.tensor(np.asarray(v)) for k, v in batch.to_dict().items()}
    norm = hf.bert.encoder.layer[0].output.LayerNorm
    runs = {}
    captured = {}

    def mean_of_real_tokens(x):  # the clean run's value (captured below) averaged over the real tokens
        real = np.asarray(batch.attention_mask) > 0
        return np.broadcast_to(captured["clean"][real].mean(0), x.shape)

    def capture(x):
        captured["clean"] = x
        return x

    for name, replace in (("clean", capture), ("spliced", numpy_sae), ("ablated", np.zeros_like),
                          ("mean", mean_of_real_tokens)):
        handle = norm.register_forward_pre_hook(
            lambda module, args, replace=replace: (torch.tensor(replace(args[0].double().numpy()),
                                                                dtype=args[0].dtype),))
        with torch.no_grad():
            runs[name] = hf(**inputs).logits.double().numpy()
        handle.remove()
    mean_ablated = runs.pop("mean")
    log_p = {name: logits - np.log(np.exp(logits).sum(-1, keepdims=True)) for name, logits in runs.items()}
    ce = {name: -lp[np.arange(len(labels)), labels].mean() for name, lp in log_p.items()}
    kl = np.mean(np.sum(np.exp(log_p["clean"]) * (log_p["clean"] - log_p["spliced"]), -1))
    recovered = (ce["ablated"] - ce["spliced"]) / (ce["ablated"] - ce["clean"])
    scale = max(np.abs(r).max() for r in [*runs.values(), mean_ablated])
    delta = head_rtol(model.config, S=np.asarray(batch.input_ids).shape[1]) * scale
    for name in runs:
        assert abs(got[f"ce_{name}"] - ce[name]) <= 2 * delta + sum_rtol(len(labels)) * ce[name], name
    assert abs(got["kl"] - kl) <= 4 * delta * (1 + kl) and kl > 100 * delta  # the SAE changes the outputs
    gap = abs(ce["ablated"] - ce["clean"])
    assert gap > 8 * delta
    assert abs(got["loss_recovered"] - recovered) <= 4 * delta * (1 + abs(recovered)) / (gap - 4 * delta)
    # mean ablation: the mean's sum over the real tokens is one more reduction, within a stage's roundings
    mean_ce = -(mean_ablated - np.log(np.exp(mean_ablated).sum(-1, keepdims=True)))[np.arange(len(labels)), labels]
    got_mean = sae.spliced_fidelity(model, config, params, texts, labels=labels, ablation="mean")
    assert abs(got_mean["ce_ablated"] - mean_ce.mean()) <= 2 * delta + sum_rtol(len(labels)) * mean_ce.mean()
    assert abs(mean_ce.mean() - ce["ablated"]) > 100 * delta  # the two ablations differ: the mean path is checked
    margins = {name: np.diff(np.sort(r, -1)[:, -2:], axis=-1) for name, r in runs.items()}
    assert all((m > 4 * delta).all() for m in margins.values())  # no near-tie: the argmax is the same in both
    for name in ("clean", "spliced"):
        assert got[f"accuracy_{name}"] == np.mean(runs[name].argmax(-1) == labels)


def test_spliced_fidelity_refuses_labels_the_classifier_lacks_and_reads_its_label_names(tmp_path):
    """Docs-only tester (trust) item 23: labels=[1, 0, 5, -1] on a 2-class model gave NaN cross-entropies and no
    error; names from config.json's id2label were refused although training.examples reads them."""
    from conftest import make_hf_model

    import minibert

    make_hf_model(tmp_path, "BertForSequenceClassification", num_labels=3)
    model = minibert.load(tmp_path)
    texts = ["ab cd ef", "g h i j k", "a b", "cd ab g"]
    config = sae.SAEConfig(d_in=model.config.hidden_size, d_sae=24, k=3, hook_name="blocks.0.hook_resid_post")
    params = sae.init_params(config, seed=5)
    for bad, shown in (([1, 0, 5, 2], "labels[2]=5"), ([1, 0, 2, -1], "labels[3]=-1"),
                       (["LABEL_1", "LABEL_0", "LABEL_9", "LABEL_2"], "labels[2]='LABEL_9'")):
        with pytest.raises(AnalysisError, match=re.escape(shown) + r" is not a class of the model \(0 … 2: "
                                                                   r"LABEL_0, LABEL_1, LABEL_2\)"):
            sae.spliced_fidelity(model, config, params, texts, labels=bad)
    by_id = sae.spliced_fidelity(model, config, params, texts, labels=[1, 0, 2, 2])
    by_name = sae.spliced_fidelity(model, config, params, texts, labels=["LABEL_1", "LABEL_0", "LABEL_2", "LABEL_2"])
    assert by_name == by_id and np.isfinite(by_id["ce_clean"])  # the same program on the same ids


def test_nan_activations_an_empty_stream_and_a_pickled_file_are_named(tiny_mlm, tmp_path):
    """Docs-only tester (trust) items 9, 10, 11: evaluate on activations holding a NaN gave fvu nan; activations of
    no texts (or of fewer tokens than one batch) was an empty stream; Trainer.resume of a pickled .npy quoted
    numpy's advice to load it with allow_pickle."""
    config = sae.SAEConfig(d_in=D, d_sae=S, k=4)
    params = sae.init_params(config, seed=0)
    x = np.random.default_rng(0).normal(size=(20, D)).astype(np.float32)
    x[3, 1] = np.nan
    with pytest.raises(AnalysisError, match="holds 1 non-finite activations .*the first in row 3"):
        sae.evaluate(config, params, x)
    model = tiny_mlm[0]
    for texts in ([], ["ab cd"]):
        with pytest.raises(AnalysisError, match=r"no batch of activations: .*fewer than batch_size=16 tokens"):
            _stream(model, texts)
    pickled = tmp_path / "junk.sae"
    np.save(open(pickled, "wb"), np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DataFileError, match=r"is not a whole SAE checkpoint \(it holds pickled objects, which are "
                                            r"never loaded\)") as raised:
        sae.Trainer.resume(pickled)
    assert "allow_pickle" not in str(raised.value) and "unsafely" not in str(raised.value)


# ---- what a first-time user's mistakes get (a docs-only tester's findings) --------------------------------------

def _tiny_trainer():
    return sae.Trainer(sae.SAEConfig(d_in=4, d_sae=8, k=2))


def test_save_replaces_only_a_trainer_checkpoint_and_never_a_users_file(tmp_path):
    trainer = _tiny_trainer()
    run = trainer.save(tmp_path / "run.npz")
    trainer.step(np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32))
    assert trainer.save(run) == run and sae.Trainer.resume(run).steps == 1  # saving again during a run replaces it
    notes, figure, arrays = tmp_path / "notes.txt", tmp_path / "plot.png", tmp_path / "arrays.npz"
    notes.write_text("my notes")
    figure.write_bytes(b"\x89PNG not really")
    np.savez(arrays, x=np.arange(3))  # an .npz, but not a trainer's (no "settings")
    for path in (notes, figure, arrays):
        before = path.read_bytes()
        with pytest.raises(DataFileError, match="not a trainer checkpoint.*another path"):
            trainer.save(path)
        assert path.read_bytes() == before
    users = tmp_path / "run.npz.tmp"  # the old temporary file's name: a user's file of that name survives
    users.write_text("mine")
    trainer.save(run)
    assert users.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["arrays.npz", "notes.txt", "plot.png", "run.npz",
                                                          "run.npz.tmp"]  # no temporary file left


def test_save_to_a_directory_or_under_a_file_is_refused_and_parents_are_created(tmp_path):
    trainer = _tiny_trainer()
    (tmp_path / "adir").mkdir()
    with pytest.raises(DataFileError, match="is a directory"):
        trainer.save(tmp_path / "adir")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(DataFileError, match="afile"):
        trainer.save(tmp_path / "afile" / "run.npz")
    with pytest.raises(DataFileError, match="path"):
        trainer.save(5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "afile"] and not any((tmp_path / "adir").iterdir())
    deep = trainer.save(tmp_path / "new" / "folder" / "run.npz")  # as transcoders.save and graphs.write_json do
    assert sae.Trainer.resume(deep).steps == 0
    umask = os.umask(0)
    os.umask(umask)
    assert deep.stat().st_mode & 0o777 == 0o666 & ~umask  # a plain new file's permissions, not mkstemp's 0600


def test_configs_of_numpy_numbers_hold_python_numbers_and_save(tmp_path):
    config = sae.SAEConfig(d_in=np.int64(4), d_sae=np.int32(8), k=np.int64(2), k_aux=np.int64(3),
                           l1_warmup=np.int64(0), aux_coefficient=np.float32(0.5))
    assert all(type(getattr(config, name)) is int for name in ("d_in", "d_sae", "k", "k_aux", "l1_warmup"))
    assert type(config.aux_coefficient) is float and config.aux_coefficient == 0.5  # 0.5 is exact in float32
    trainer = sae.Trainer(config)
    trainer.save(tmp_path / "run.npz")
    assert sae.Trainer.resume(tmp_path / "run.npz").config == config


@pytest.mark.parametrize("steps", ["3", 3.0, -1, True])
def test_train_refuses_a_step_count_that_is_no_whole_number(steps):
    batches = [np.zeros((8, 4), np.float32)] * 4
    with pytest.raises(AnalysisError, match=f"steps={steps!r} must be a whole number"):
        _tiny_trainer().train(batches, steps=steps)


@pytest.mark.parametrize("batch_size", ["16", 16.0, 0, True])
def test_activations_refuse_a_batch_size_that_is_no_whole_number(tiny_mlm, batch_size):
    model, _ = tiny_mlm
    with pytest.raises(AnalysisError, match=f"batch_size={batch_size!r} must be a whole number ≥ 1"):
        sae.activations(model, ["a text"], "blocks.1.mlp.hook_post", batch_size=batch_size)
