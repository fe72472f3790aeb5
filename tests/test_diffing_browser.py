"""The feature browser over a crosscoder and its two models: each latent's data against the crosscoder's encode
computed directly on each model's activations, text by text (a brute-force loop); user text and model names
escaped; a pair other than the crosscoder's refused."""

from __future__ import annotations

import base64
import json
import zlib

import numpy as np
import pytest
from tolerances import forward_rtol

from minibert.analysis import diffing
from minibert.errors import AnalysisError, VizError
from minibert.viz.features import HISTOGRAM_EDGES, feature_browser

SITE = "blocks.1.hook_resid_post"
NAMES = ("<b>base</b>", "tuned & co")  # a user's labels, markup included
TEXTS = ["ab cd ef gh", "a b c <script>", "de fg & hi", "c d e f g h"]  # generated; one holds markup


@pytest.fixture(scope="module")
def browsed(tiny_mlm):
    """(A, B, config, params, browser): B is A with every weight moved by 10% noise (a fine-tune keeps A's source,
    so the two are named alike); a random BatchTopK crosscoder whose threshold lets about half the latents fire."""
    model_a = tiny_mlm[0]
    rng = np.random.default_rng(0)
    moved = {name: value * (1 + 0.1 * rng.normal(size=value.shape)).astype(np.float32)
             for name, value in model_a.named_parameters().items()}
    model_b = type(model_a).from_parameters(model_a.config, moved, model_a.tokenizer, source=model_a.source)
    config = diffing.CrosscoderConfig(d_in=model_a.config.hidden_size, d_sae=12, k=2, hook_name=SITE)
    params = {name: np.asarray(value) for name, value in diffing.init_params(config, seed=3).items()}
    params["b_enc"] = rng.normal(size=12).astype(np.float32)
    params["threshold"] = np.float32(0.5)
    return model_a, model_b, config, params, feature_browser((model_a, model_b), config, params, TEXTS, top=3,
                                                             window=2, batch_size=2, names=NAMES)


def _by_text(model_a, model_b, config, params):
    """Per text: paired activations [T, 2, D] at every real token, each model run on that text alone, and the
    crosscoder's latents [T, S] of them."""
    xs = []
    for text in TEXTS:
        batch = model_a.tokenize([text])
        xs.append(np.stack([np.asarray(m.run_with_cache(batch, names=[SITE])[1][SITE][0]) for m in (model_a, model_b)],
                           axis=1))
    return xs, [np.asarray(diffing.encode(config, params, x)) for x in xs]


def test_each_latents_contexts_activations_and_both_models_contributions_match_a_loop_over_texts(browsed):
    """fires, histogram and peak per latent; the peak context's tokens; at each top context the two models'
    contributions x_M · W_enc[M]_i at its peak token; relative norm, cosine and label from the decoders and
    latent_table on the same tokens."""
    model_a, model_b, config, params, browser = browsed
    xs, per_text = _by_text(model_a, model_b, config, params)
    latents, x = np.concatenate(per_text), np.concatenate(xs)
    data = browser.data
    assert data["tokens_seen"] == len(latents) and data["models"] == list(NAMES)
    # the browser's batches of 2 texts round differently from one text alone: by ≲ forward_rtol × max|x| per input
    # entry, ‖W_enc[M, :, j]‖₁ times that in a latent or a contribution; 6 significant digits on the page
    x_moved = forward_rtol(model_a.config, S=16) * np.abs(x).max()
    norms = np.linalg.norm(params["W_dec"].astype(np.float64), axis=-1)
    table = diffing.latent_table(config, params, x)
    assert sum(bool(latent["contexts"]) for latent in data["latents"]) >= 4  # enough latents fire to test
    for j, latent in enumerate(data["latents"]):
        active = latents[latents[:, j] > 0, j]
        assert latent["fires"] == len(active)
        expected = np.histogram(np.log10(active), bins=HISTOGRAM_EDGES)[0] if len(active) else np.zeros(16)
        assert latent["histogram"] == expected.tolist()
        assert latent["relative_norm"] == pytest.approx(norms[1, j] / norms.sum(0)[j], rel=1e-5)
        cosine = params["W_dec"][0, j] @ params["W_dec"][1, j] / norms[:, j].prod()
        assert latent["cosine"] == pytest.approx(cosine, rel=1e-5, abs=1e-6)
        assert latent["label"] == table.labels[j]
        assert len(latent["nearest"]) == 2 and all(len(found) == 5 for found in latent["nearest"])
        if not len(active):
            assert latent["contexts"] == [] and latent["parts"] == []
            continue
        moved = np.abs(params["W_enc"][:, :, j]).sum() * x_moved
        assert abs(latent["max"] - active.max()) <= 5e-6 * active.max() + moved
        order = np.argsort(-latents[:, j], kind="stable")[:len(latent["contexts"])]
        assert len(latent["contexts"]) == min(3, len(active)) == len(latent["parts"])
        for n, (a, b) in zip(order, latent["parts"], strict=True):
            expected = x[n, 0] @ params["W_enc"][0, :, j], x[n, 1] @ params["W_enc"][1, :, j]
            assert abs(a - expected[0]) <= 5e-6 * abs(expected[0]) + moved
            assert abs(b - expected[1]) <= 5e-6 * abs(expected[1]) + moved
        text = max(range(len(TEXTS)), key=lambda t: per_text[t][:, j].max())
        peak = int(per_text[text][:, j].argmax())
        ids = model_a.tokenize([TEXTS[text]]).input_ids[0]
        top_ids, top_acts = latent["contexts"][0]
        assert [data["tokens"][t] for t in top_ids] == model_a.tokenizer.convert_ids_to_tokens(
            list(ids[max(0, peak - 2):peak + 3]))
        assert max(top_acts) == 255


def _blob(document: str) -> dict:
    start = document.index('id="fb-data">') + len('id="fb-data">')
    return json.loads(zlib.decompress(base64.b64decode(json.loads(document[start:document.index("</script>", start)]))))


def test_the_page_escapes_text_and_the_models_names(browsed):
    *_, browser = browsed
    page = browser.page()
    assert "<b>base" not in page and "A = &lt;b&gt;base&lt;/b&gt;, B = tuned &amp; co" in page
    assert page.count("<script") == 2  # the data and the page's script, nothing from the texts
    assert _blob(page) == browser.data


@pytest.mark.browser
def test_the_page_draws_a_latent_with_both_models_contributions(browsed, tmp_path, browser):
    *_, features = browsed
    path = features.save(tmp_path / "crosscoder.html")
    latents = features.data["latents"]
    busiest = max(range(len(latents)), key=lambda j: latents[j]["fires"])
    page = browser.new_page()
    console = []
    page.on("console", lambda message: console.append(message.text))
    page.goto(path.as_uri())
    page.wait_for_selector("#fb-view .ctx")
    assert page.locator("#fb-view h2").inner_text() == f"latent {busiest}"
    parts = page.locator("#fb-view .parts").all_inner_texts()
    expected = [["A", f"{a:+.2f}", "|", "B", f"{b:+.2f}"] for a, b in latents[busiest]["parts"]]
    assert [p.split() for p in parts] == expected
    assert f"latent scaling: {latents[busiest]['label']}" in page.locator("#fb-view").inner_text()
    assert "A = <b>base</b>" in page.locator("#fb-meta").inner_text()  # shown as text, not markup
    headers = page.locator("#fb-overview th").all_inner_texts()
    assert headers[-2:] == ["relative norm", "latent scaling"]
    assert page.locator("#fb-view .near").count() == 2  # nearest tokens in A's and in B's embeddings
    assert console == []
    page.close()


def test_the_browser_refuses_one_model_another_site_or_another_pair(browsed):
    model_a, model_b, config, params, _ = browsed
    with pytest.raises(VizError, match=r"read two models.*feature_browser\(\(base, tuned\)"):
        feature_browser(model_a, config, params, TEXTS)
    with pytest.raises(AnalysisError, match="hook_name='blocks.0.hook_resid_post' but the crosscoder's config reads"):
        feature_browser((model_a, model_b), config, params, TEXTS, hook_name="blocks.0.hook_resid_post")
    source = diffing.pairs.pair_source(model_a, model_b, SITE)
    with pytest.raises(AnalysisError, match="the same two models, swapped"):
        feature_browser((model_b, model_a), config, params, TEXTS, source=source)
    with pytest.raises(AnalysisError, match="same model"):
        feature_browser((model_a, model_a), config, params, TEXTS)
