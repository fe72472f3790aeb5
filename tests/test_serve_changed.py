"""The workbench's "what changed" panel (viz/changed.py) through the HTTP API, against the library and NumPy called
directly: the latents listed are diffing.encode of run_with_cache's site vectors in A and B (the unpadded text:
other programs), each model's share (x^M − b_dec^M) · W_enc^M computed here in float64, ranked by the largest
gap where the latent fires; the classes are diffing.norm_labels' and diffing.latent_table's; bad input (no
--compare, a missing file, a crosscoder of another width or site) is refused at start-up with the fix. The
crosscoder is planted: random encoder and decoders, saved as a CrosscoderTrainer checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_hf_model
from starlette.testclient import TestClient
from test_serve import PORT, TOKEN, post
from tolerances import assert_close_to_scale, dot_rtol, forward_rtol

import minibert
from minibert.analysis import diffing
from minibert.analysis.diffing.pairs import pair_source
from minibert.app import serve
from minibert.viz import changed
from minibert.viz.workbench import Workbench

SITE = "blocks.1.hook_resid_post"
TEXT = "a b c d e f"


def planted_crosscoder(d_in: int, hook_name: str, seed: int = 0):
    """16 latents: random unit encoder columns per model, decoders their transposes scaled apart (B's doubled for
    the first four, so their relative norm is 2/3), b_enc −0.5 so some fire and some do not."""
    rng = np.random.default_rng(seed)
    config = diffing.CrosscoderConfig(d_in=d_in, d_sae=16, architecture="l1", hook_name=hook_name)
    W_enc = rng.normal(size=(2, d_in, 16)).astype(np.float32)
    W_enc /= np.linalg.norm(W_enc, axis=1, keepdims=True)
    W_dec = W_enc.transpose(0, 2, 1).copy()
    W_dec[1, :4] *= 2
    params = {"W_enc": W_enc, "b_enc": np.full(16, -0.5, np.float32), "W_dec": W_dec,
              "b_dec": rng.normal(scale=0.1, size=(2, d_in)).astype(np.float32), "threshold": np.float32(-1.0)}
    return config, params


@pytest.fixture(scope="module")
def pair(tiny_mlm, tmp_path_factory):
    """(A, B, the crosscoder's (config, params), its checkpoint, a client serving A beside B with it)."""
    directory = tmp_path_factory.mktemp("tiny-mlm-b")
    make_hf_model(directory, "BertForMaskedLM", scale=0.2, seed=1)
    model_a, model_b = tiny_mlm[0], minibert.load(directory)
    config, params = planted_crosscoder(model_a.config.hidden_size, SITE)
    path = diffing.CrosscoderTrainer(config, params=params).save(tmp_path_factory.mktemp("crosscoder") / "cc.npz")
    loaded = changed.load_crosscoder(model_a, model_b, path)
    workbenches = [Workbench(model_a, max_tokens=64, resources={"crosscoder": loaded}),
                   Workbench(model_b, max_tokens=64)]
    client = TestClient(serve.create_app(workbenches, TOKEN, port=PORT), base_url=f"http://127.0.0.1:{PORT}")
    return model_a, model_b, (config, params), path, client


def ask(client, body):
    response = post(client, "changed", body)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.slow  # the site's program compiled for two models, and latent_table's: past 10 s on a loaded machine
def test_the_latents_that_changed_most_are_the_crosscoders_on_both_models_vectors(pair):
    model_a, model_b, (config, params), _, client = pair
    answer = ask(client, {"text": TEXT})
    batch = model_a.tokenize([TEXT])
    assert answer["tokens"] == batch.tokens[0] and answer["site"] == SITE
    x = np.stack([np.asarray(m.run_with_cache(batch, names=[SITE])[1][SITE])[0] for m in (model_a, model_b)], 1)
    f = np.asarray(diffing.encode(config, params, x))  # [T, S]
    c = np.einsum("TMD,MDS->MTS", x.astype(np.float64) - params["b_dec"], params["W_enc"])
    gap = np.where(f > 0, np.abs(c[1] - c[0]), -np.inf).max(0)
    order = [i for i in np.argsort(-gap, kind="stable")[:changed.TOP_LATENTS] if np.isfinite(gap[i])]
    assert order, "the planted crosscoder fires on the text"
    assert [latent["latent"] for latent in answer["latents"]] == order
    # the site's vectors: the padded bucket's program against the unpadded text's, each within the forward's bound;
    # a share is a D-term dot product of them
    T, D = x.shape[0], model_a.config.hidden_size
    rtol = forward_rtol(model_a.config, T) + dot_rtol(D)
    for latent in answer["latents"]:
        i = latent["latent"]
        assert_close_to_scale(latent["a"], c[0, :, i], rtol, "A's shares")
        assert_close_to_scale(latent["b"], c[1, :, i], rtol, "B's shares")
        assert_close_to_scale(latent["activation"], f[:, i], rtol, "activations")
    norms = np.linalg.norm(params["W_dec"].astype(np.float64), axis=-1)
    relative = norms[1] / norms.sum(0)
    table = diffing.latent_table(config, params, x)
    labels = diffing.norm_labels(relative)
    for latent in answer["latents"]:
        i = latent["latent"]
        assert latent["relative_norm"] == pytest.approx(2 / 3 if i < 4 else 0.5, rel=1e-6)  # planted: B's doubled
        assert latent["norm_label"] == labels[i] and latent["scaling_label"] == table.labels[i]


def test_without_a_crosscoder_the_panel_says_what_to_pass(tiny_mlm):
    answer = Workbench(tiny_mlm[0], max_tokens=32).answer("changed", {"text": "a b"})
    assert answer["latents"] is None and "minibert serve --model A --compare B --crosscoder run.npz" in answer["hint"]


def test_a_crosscoder_of_other_models_or_no_compare_is_refused_at_start_up(pair, tmp_path):
    model_a, model_b, _, path, _ = pair
    with pytest.raises(minibert.InputError, match="--crosscoder needs --compare"):
        changed.load_crosscoder(model_a, None, path)
    with pytest.raises(minibert.InputError, match=r"--crosscoder .*nowhere.npz: no such file"):
        changed.load_crosscoder(model_a, model_b, tmp_path / "nowhere.npz")
    (tmp_path / "runs").mkdir()
    with pytest.raises(minibert.InputError, match=r"--crosscoder .*runs is a folder; pass the .npz file "
                                                  r"CrosscoderTrainer.save wrote, e.g. .*runs/run.npz\.$"):
        changed.load_crosscoder(model_a, model_b, tmp_path / "runs")
    (tmp_path / "text.npz").write_text("abcd")  # 4 bytes, no zip: numpy's words would be "pickled data"
    with pytest.raises(minibert.InputError, match=r"text.npz is not a whole crosscoder checkpoint \(it is not an .npz "
                                                  r"archive: a checkpoint is a zip of arrays, this file is not one\)"):
        changed.load_crosscoder(model_a, model_b, tmp_path / "text.npz")
    narrow, params = planted_crosscoder(16, SITE)
    diffing.CrosscoderTrainer(narrow, params=params).save(tmp_path / "narrow.npz")
    with pytest.raises(minibert.InputError, match=r"reads 16-wide vectors at 'blocks.1.hook_resid_post', where these "
                                                  r"models have 32"):
        changed.load_crosscoder(model_a, model_b, tmp_path / "narrow.npz")
    elsewhere, params = planted_crosscoder(32, "blocks.7.hook_resid_post")
    diffing.CrosscoderTrainer(elsewhere, params=params).save(tmp_path / "elsewhere.npz")
    with pytest.raises(minibert.InputError, match="reads 'blocks.7.hook_resid_post', which model A does not have"):
        changed.load_crosscoder(model_a, model_b, tmp_path / "elsewhere.npz")
    with pytest.raises(minibert.InputError, match="the same model"):
        changed.load_crosscoder(model_a, model_a, path)
    broken = {name: np.array(value) for name, value in params.items()}
    broken["W_enc"][0, 1, 2] = np.inf
    diffing.CrosscoderTrainer(planted_crosscoder(32, SITE)[0], params=broken).save(tmp_path / "inf.npz")
    with pytest.raises(minibert.InputError, match=r"--crosscoder: params\['W_enc'\] is not finite at index "
                                                  r"\(0, 1, 2\) \(value inf; 1 such entry\)"):
        changed.load_crosscoder(model_a, model_b, tmp_path / "inf.npz")


def test_a_crosscoder_of_the_two_models_swapped_is_refused_at_start_up(pair, tmp_path):
    # the trainer's record of its pair (pair_source: A's weights, then B's), kept by save: serving B as --model and
    # A as --compare is what_changed's "swapped" refusal, not a panel with A and B reversed
    model_a, model_b, (config, params), _, _ = pair
    source = pair_source(model_a, model_b, SITE)
    path = diffing.CrosscoderTrainer(config, params=params, source=source).save(tmp_path / "recorded.npz")
    assert changed.load_crosscoder(model_a, model_b, path).config.hook_name == SITE
    with pytest.raises(minibert.InputError, match="the same two models, swapped: pass A \\(the base\\) first"):
        changed.load_crosscoder(model_b, model_a, path)


def test_the_serve_command_refuses_a_crosscoder_without_compare_in_one_line(pair, capsys, monkeypatch):
    from minibert.app import cli

    monkeypatch.setattr(serve, "serve", lambda *args, **kwargs: pytest.fail("the server started"))
    model_a, _, _, path, _ = pair
    status = cli.main(["serve", "--model", str(model_a.source), "--no-browser", "--crosscoder", str(path)])
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert status == 2 and said == ("minibert serve: error: --crosscoder needs --compare: the crosscoder reads two "
                                    "models, --model (A) and --compare (B).")


# ---- the panel in the page (headless chromium) --------------------------------------------------------------

@pytest.mark.slow
def test_the_what_changed_panel_lists_the_latents_with_both_models_shares(browser, pair):
    """Opened, the panel (in A's column only) lists the API's latents, each token's A and B shares unrounded in
    data-a / data-b, typed markup as text."""
    from test_serve_browser import Server, Workbench_page

    model_a, model_b, _, path, client = pair
    text = "a <i id=pwn>b</i> c d"
    with Server([model_a, model_b],
                resources={"crosscoder": changed.load_crosscoder(model_a, model_b, path)}) as running:
        page = Workbench_page(browser, running)
        page.type(text)
        assert page.page.locator("#wb-changed-1").count() == 0
        page.page.click("#wb-changed-open-0 summary")
        page.page.wait_for_selector("#wb-changed-0[aria-busy=false] .wb-changed-latent")
        answer = ask(client, {"text": text})
        assert page.values("#wb-changed-0 .wb-changed-latent") == [latent["gap"] for latent in answer["latents"]]
        want_a = [a for latent in answer["latents"] for a, f in zip(latent["a"], latent["activation"]) if f > 0]
        assert page.values_of("#wb-changed-0 .wb-changed-token", "a") == want_a
        assert page.page.locator("#pwn").count() == 0
        assert page.problems == []
        page.page.close()
