"""The SAE feature browser: its data against a brute-force pass over every token, text escaped, small pages,
and the page drawn in headless Chromium."""

from __future__ import annotations

import base64
import json
import zlib

import numpy as np
import pytest
from tolerances import forward_rtol

from minibert.analysis import sae
from minibert.errors import VizError
from minibert.viz.features import HISTOGRAM_EDGES, feature_browser

HOOK = "blocks.1.hook_resid_post"
TEXTS = ["ab cd ef gh", "a b c <script>", "de fg & hi", "c d e f g h"]  # generated; one holds markup


@pytest.fixture(scope="module")
def browsed(tiny_mlm):
    model = tiny_mlm[0]
    config = sae.SAEConfig(d_in=model.config.hidden_size, d_sae=24, architecture="relu", hook_name=HOOK)
    params = {k: np.asarray(v) for k, v in sae.init_params(config, seed=5).items()}
    return model, config, params, feature_browser(model, config, params, TEXTS, top=3, window=2, batch_size=2)


def _blob(document: str) -> dict:
    start = document.index('id="fb-data">') + len('id="fb-data">')
    text = json.loads(document[start:document.index("</script>", start)])
    return json.loads(zlib.decompress(base64.b64decode(text)))


def test_browser_data_matches_a_pass_over_every_token(browsed):
    """Per latent: the peak over all real tokens, the count of tokens it fires on, the histogram of log10
    activations in the page's bins, and the top context's tokens around the peak (window 2, same text)."""
    model, config, params, browser = browsed
    per_text = [np.asarray(sae.encode(config, params, sae.token_activations(model, [t], HOOK, special=True)))
                for t in TEXTS]
    ids = [model.tokenize([t]).input_ids[0] for t in TEXTS]
    latents = np.concatenate(per_text)
    data = browser.data
    assert data["tokens_seen"] == len(latents)
    for j, latent in enumerate(data["latents"]):
        assert latent["fires"] == int((latents[:, j] > 0).sum())
        active = latents[latents[:, j] > 0, j]
        expected = np.histogram(np.log10(active), bins=HISTOGRAM_EDGES)[0] if len(active) else np.zeros(16)
        assert latent["histogram"] == expected.tolist()  # no activation here falls outside 10^-3 … 10^2
        if not len(active):
            assert latent["contexts"] == []
            continue
        # 6 significant digits; the browser's batches of 2 texts round differently from one text alone: by at
        # most forward_rtol × max|x| per input entry, ‖W_enc[:, j]‖₁ times that in the latent
        x_scale = max(np.abs(sae.token_activations(model, [t], HOOK, special=True)).max() for t in TEXTS)
        moved = np.abs(params["W_enc"][:, j]).sum() * forward_rtol(model.config, S=16) * x_scale
        assert abs(latent["max"] - active.max()) <= 5e-6 * active.max() + moved
        text = max(range(len(TEXTS)), key=lambda t: per_text[t][:, j].max())
        peak = int(per_text[text][:, j].argmax())
        window = ids[text][max(0, peak - 2):peak + 3]
        top_ids, top_acts = latent["contexts"][0]
        assert [data["tokens"][t] for t in top_ids] == model.tokenizer.convert_ids_to_tokens(list(window))
        assert max(top_acts) == 255


def test_browser_page_escapes_text_and_stays_small(browsed):
    """User text reaches the page escaped (the title) or as compressed data set with textContent (tokens)."""
    *_, browser = browsed
    browser.title = "<b>features</b> & more"
    page = browser.page()
    assert "<b>features" not in page and "&lt;b&gt;features&lt;/b&gt; &amp; more" in page
    assert page.count("<script") == 2  # the data and the page's script, nothing from the texts
    assert _blob(page) == browser.data
    assert len(page) < 40_000 + 400 * len(browser.data["latents"])  # bytes grow ~ a few hundred per latent


@pytest.mark.slow
def test_browser_page_stays_small_at_4096_latents(tiny_mlm):
    """4,096 latents, each firing somewhere (ReLU of random directions over 24 texts): every latent carries its
    contexts, histogram and nearest tokens, and the page stays within 400 bytes a latent (~1.7 MB), which
    one compressed blob holding token strings once and activations as bytes allows."""
    model = tiny_mlm[0]
    config = sae.SAEConfig(d_in=model.config.hidden_size, d_sae=4096, architecture="relu", hook_name=HOOK)
    params = {k: np.asarray(v) for k, v in sae.init_params(config, seed=7).items()}
    texts = [" ".join("abcdefgh"[(i * j) % 8] for j in range(4 + i % 6)) for i in range(24)]
    browser = feature_browser(model, config, params, texts, batch_size=8)
    latents = browser.data["latents"]
    assert len(latents) == 4096 and sum(bool(latent["contexts"]) for latent in latents) > 0.9 * 4096
    assert len(browser.page()) < 40_000 + 400 * 4096


def test_browser_refuses_a_mismatched_hook(browsed):
    model, config, params, _ = browsed
    with pytest.raises(VizError, match="wide vectors"):
        feature_browser(model, config, params, TEXTS, hook_name="blocks.1.mlp.hook_post")
    for name in ("top", "batch_size"):
        with pytest.raises(VizError, match=f"{name}=0 must be a whole number ≥ 1"):
            feature_browser(model, config, params, TEXTS, **{name: 0})


def test_browser_reads_one_text_pairs_and_files_and_is_reached_as_the_readme_writes(browsed, tmp_path):
    """A str was run one character per text; pairs and corpus files (what training reads) were refused;
    `from minibert import viz; viz.features.feature_browser` raised AttributeError."""
    from minibert import viz

    model, config, params, _ = browsed
    one = feature_browser(model, config, params, TEXTS[0], top=2)
    real = int(np.asarray(model.tokenize([TEXTS[0]]).attention_mask).sum())
    assert one.data["tokens_seen"] == real  # one text, not one per character
    corpus = tmp_path / "pairs.tsv"
    corpus.write_text("ab cd\tef gh\nc d\te f\n", encoding="utf-8")
    paired = model.tokenize(["ab cd", "c d"], ["ef gh", "e f"])
    for texts, pairs in ((corpus, None), (["ab cd", "c d"], ["ef gh", "e f"]), ([("ab cd", "ef gh"), ("c d", "e f")],
                                                                                  None)):
        got = viz.features.feature_browser(model, config, params, texts, pairs=pairs, top=2)
        assert got.data["tokens_seen"] == int(np.asarray(paired.attention_mask).sum())


def test_nearest_tokens_skip_embedding_rows_past_the_vocabulary(browsed, monkeypatch):
    """ModernBERT-base pads its embedding table past its tokenizer (50,368 rows, 50,280 tokens): a padding row
    nearest to a decoder direction had no token (KeyError). Here rows past the tokenizer's ids are appended,
    equal to the decoder rows themselves (cosine 1, the nearest of all) and must not be chosen."""
    model, config, params, _ = browsed
    table = np.asarray(model.W_E, np.float32)
    padded = np.concatenate([table, np.asarray(params["W_dec"], np.float32)])
    monkeypatch.setattr(type(model), "W_E", property(lambda self: padded))
    browser = feature_browser(model, config, params, TEXTS, top=2)
    vocabulary = set(model.tokenizer.ids_to_tokens.values())
    assert all(browser.data["tokens"][t] in vocabulary for latent in browser.data["latents"]
               for t in latent["nearest"])


@pytest.mark.browser
def test_browser_page_draws_a_latent(browsed, tmp_path, browser):
    *_, features = browsed
    path = features.save(tmp_path / "features.html")
    busiest = max(range(len(features.data["latents"])), key=lambda j: features.data["latents"][j]["fires"])
    page = browser.new_page()
    console = []
    page.on("console", lambda message: console.append(message.text))
    page.goto(path.as_uri())
    page.wait_for_selector("#fb-view .ctx")  # it opens on the most frequent latent, not on latent 0
    assert page.locator("#fb-view h2").inner_text() == f"latent {busiest}"
    assert page.locator("#fb-view .ctx").count() == len(features.data["latents"][busiest]["contexts"])
    assert page.locator(".bar").count() == len(HISTOGRAM_EDGES) - 1
    powers = range(int(np.ceil(HISTOGRAM_EDGES[0])), int(HISTOGRAM_EDGES[-1]) + 1)  # 10^-3 … 10^2
    assert page.locator(".tick").all_inner_texts() == [f"{10.0 ** p:g}" for p in powers]
    rows = page.locator("#fb-overview tr")
    assert rows.count() == 1 + min(20, len(features.data["latents"]))  # a header and the most frequent latents
    fires = sorted((latent["fires"] for latent in features.data["latents"]), reverse=True)
    assert [int(t) for t in page.locator("#fb-overview tr td:nth-child(2)").all_inner_texts()] == fires[:20]
    page.select_option("#fb-order", index=0)  # the "most frequent first" heading: once a console warning
    quietest = min(range(len(features.data["latents"])), key=lambda j: features.data["latents"][j]["fires"])
    page.fill("#fb-pick", str(quietest))
    assert page.locator("#fb-view h2").inner_text() == f"latent {quietest}"
    assert console == []
    page.close()


def test_an_sae_holding_nan_is_refused_not_drawn_as_invalid_json(browsed):
    """Issue 40: an SAE whose W_enc holds NaN gave a page whose data was invalid JSON (NaN) and drew nothing."""
    model, config, params, _ = browsed
    broken = dict(params, W_enc=np.where(np.eye(*params["W_enc"].shape, dtype=bool), np.nan, params["W_enc"]))
    with pytest.raises(VizError, match="W_enc"):
        feature_browser(model, config, broken, TEXTS, top=2)


def test_browser_cuts_long_texts_to_max_length_and_says_how_many(browsed):
    """A text past max_length was cut without a word; now the browse of its first max_length tokens warns once,
    over every batch, with the count of cut texts and the fix."""
    model, config, params, _ = browsed
    long_texts = ["ab cd ef gh " * 3, "a b", "c d e f g h " * 2]
    whole = np.asarray(model.tokenize(long_texts).attention_mask).sum(1)  # [CLS] and [SEP] counted
    assert list(whole > 8) == [True, False, True]
    with pytest.warns(UserWarning, match=r"2 of the 3 texts had more than max_length=8 tokens .* first 8 were "
                                         r"browsed; to browse them whole, pass max_length= up to") as caught:
        cut = feature_browser(model, config, params, long_texts, top=2, max_length=8, batch_size=1)
    assert len([w for w in caught if "max_length" in str(w.message)]) == 1  # one warning for the three batches
    assert cut.data["tokens_seen"] == 8 + whole[1] + 8
    with pytest.raises(VizError, match="max_length=1 must be a whole number ≥ 2"):
        feature_browser(model, config, params, long_texts, max_length=1)
