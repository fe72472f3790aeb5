"""The HTML views in headless chromium: offline, interactive, escaped, independent, and true to the model.

One browser per module; every page blocks all network requests and records console errors,
page errors and dialogs, which each test asserts empty. Views inflate their data and draw after
load and after each click; `Loaded.settle` waits until no view on the page is busy.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import warnings
import xml.etree.ElementTree as ElementTree

import matplotlib.image
import numpy as np
import pytest
from tolerances import score_delta

import minibert
from minibert import viz
from minibert.viz._html import UNIT_BYTE_ERROR

TOKENS = ["[CLS]", "the", "cat", "sat", "[SEP]", "it", "slept", "[SEP]"]
B_START = 5
HOSTILE = ["<img src=x onerror=alert(1)>", "</script><script>alert(1)</script>", "<!-- x", "a\u2028b &amp; \"q\""]
MIN_WEIGHT = 0.005  # views.js draws no line fainter than this
PAGE_LIMIT = 15_000_000  # bytes: a 512-token page of the bundled model must stay below this (issue 15)
# Eight distinct sentences, cycled: well over 512 wordpieces, so max_length=512 gives a full-length document.
LONG_TEXT = " ".join([
    "The rovers act as robotic geologists on the surface of Mars.",
    "Each one moves on six wheels and carries cameras, drills and a small laboratory.",
    "Engineers on Earth plan every drive a day ahead, because signals take minutes to arrive.",
    "Dust storms can cover the solar panels and end a mission that was meant to last ninety days.",
    "Spirit became stuck in soft sand in 2009, while Opportunity kept driving for years.",
    "Curiosity landed in Gale crater with a sky crane that lowered it on cables.",
    "Its nuclear battery lets it work through the winter when sunlight is weak.",
    "Perseverance collects rock samples in sealed tubes for a later mission to bring home.",
] * 10)


def shown_weight(attention: np.ndarray) -> np.ndarray:
    """The weights a page decodes: one byte per weight, round(255·a) (the "unit_byte" packing)."""
    return np.round(attention * 255) / 255


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def hand_arrays(n_tokens: int = len(TOKENS), seed: int = 0, n_layers: int = 2, n_heads: int = 3, d_head: int = 4):
    """q, k [L, T, H, K] and their pattern softmax(q·k/√K) [L, H, T, T], peaked enough to vary."""
    rng = np.random.default_rng(seed)
    q, k = (2 * rng.normal(size=(n_layers, n_tokens, n_heads, d_head)) for _ in range(2))
    return q, k, softmax(np.einsum("LTHK,LSHK->LHTS", q, k) / np.sqrt(d_head))


class Loaded:
    """A page showing some views, with everything that went wrong on it."""

    def __init__(self, browser, url: str | None = None, content: str | None = None):
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.problems: list[str] = []
        self.page.on("console", lambda m: self.problems.append(f"console {m.type}: {m.text}")
                     if m.type in ("error", "warning") else None)
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("dialog", lambda d: (self.problems.append(f"dialog: {d.message}"), d.dismiss()))
        self.page.route("**/*", self._offline)
        if url:
            self.page.goto(url)
        else:
            self.page.set_content(content)
        self.settle()

    def settle(self):
        """Wait until every view has inflated the data it shows and drawn it (no aria-busy="true")."""
        self.page.wait_for_function("!document.querySelector('.mbv[aria-busy=true]')", polling=20)

    def _offline(self, route):
        url = route.request.url
        if url.startswith(("file:", "about:", "data:", "blob:")):
            route.continue_()
        else:
            self.problems.append(f"network request: {url}")
            route.abort()

    def edges(self, nth: int = 0) -> dict[tuple[int, int, int], float]:
        """{(head, query, key): opacity} of the lines the nth token-lines drawing on the page drew last."""
        self.settle()
        rows = json.loads(self.page.evaluate(  # one string: 10⁵ small arrays cross to Python slowly
            "n => JSON.stringify(document.querySelectorAll('.mbv-linesbox')[n].mbvDrawn)", nth))
        return {(h, i, j): w for h, i, j, w in rows}

    def pixels(self, selector: str, nth: int = 0) -> np.ndarray:
        """RGB(A) floats in [0, 1] of a screenshot of the nth element matching `selector`."""
        self.settle()
        return matplotlib.image.imread(io.BytesIO(self.page.locator(selector).nth(nth).screenshot()), format="png")

    def download(self, root: str, format: str) -> bytes:
        """The file the view's Download PNG or SVG button saves."""
        with self.page.expect_download() as saved:
            self.page.click(f"{root} .mbv-download button[data-format={format}]")
        with open(saved.value.path(), "rb") as file:
            return file.read()

    def thumbnail_ink(self) -> list[float]:
        """How much each model-view thumbnail differs from its white background, inside its border."""
        count = self.page.locator("canvas.mbv-thumb").count()
        return [float((1 - self.pixels("canvas.mbv-thumb", n)[2:-2, 2:-2, :3]).sum()) for n in range(count)]


def page_of(*views: viz.View) -> str:
    return "<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>" + \
        "".join(v.html for v in views) + "</body></html>"


def expected_edges(attention_2d: np.ndarray, head: int, rows=None, cols=None):
    """{(head, query, key): true weight} of the lines a page draws: those whose decoded weight shows."""
    keep = np.zeros(attention_2d.shape, bool)
    keep[np.ix_(range(len(attention_2d)) if rows is None else list(rows),
                range(len(attention_2d)) if cols is None else list(cols))] = True
    i, j = np.nonzero(keep & (shown_weight(attention_2d) >= MIN_WEIGHT))
    return {(head, a, b): w for a, b, w in zip(i.tolist(), j.tolist(), attention_2d[i, j].tolist())}


def all_heads(attention_3d: np.ndarray) -> dict:
    """expected_edges of every head of one layer, attention_3d [H, T, S]."""
    return {e: w for h, pattern in enumerate(attention_3d) for e, w in expected_edges(pattern, h).items()}


def assert_edges(drawn: dict, expected: dict):
    """The same lines, each drawn at its weight within the packing's error (plus float64 rounding of byte/255)."""
    assert drawn.keys() == expected.keys()
    np.testing.assert_allclose([drawn[e] for e in expected], list(expected.values()), rtol=0,
                               atol=UNIT_BYTE_ERROR + 1e-12)


def test_head_view_saved_page_is_offline_and_interactive(browser, tmp_path):
    _, _, attention = hand_arrays()
    path = viz.head_view(TOKENS, attention, B_START, layer=0).save(tmp_path / "head.html")
    view = Loaded(browser, url=path.as_uri())
    page = view.page
    every = {}
    for h in range(3):
        every |= expected_edges(attention[0, h], h)
    assert_edges(view.edges(), every)
    image = view.pixels(".mbv")
    assert image[..., :3].std() > 0.05  # not blank

    page.select_option(".mbv-controls select >> nth=0", index=1)  # layer 2 (0-indexed 1)
    assert_edges(view.edges(), {e: w for h in range(3) for e, w in expected_edges(attention[1, h], h).items()})

    page.click(".mbv-swatch >> nth=0")  # switch head 0 off
    assert {h for h, _, _ in view.edges()} == {1, 2}
    page.dblclick(".mbv-swatch >> nth=2")  # only head 2
    assert_edges(view.edges(), expected_edges(attention[1, 2], 2))

    page.hover(".mbv-tok[data-side=left][data-i='2']")  # "cat": only its row
    assert_edges(view.edges(), expected_edges(attention[1, 2], 2, rows=[2]))
    assert page.locator("rect.mbv-bar").count() == len(expected_edges(attention[1, 2], 2, rows=[2]))  # one per line
    page.click(".mbv-tok[data-side=right][data-i='6']")  # pin the key "slept": only its column
    page.hover(".mbv-tok[data-side=left][data-i='1']")  # pinned: hovering elsewhere changes nothing
    assert_edges(view.edges(), expected_edges(attention[1, 2], 2, cols=[6]))
    page.click(".mbv-tok[data-side=right][data-i='6']")  # unpin
    page.mouse.move(1, 1)

    page.select_option(".mbv-controls select >> nth=1", value="AB")
    assert_edges(view.edges(), expected_edges(attention[1, 2], 2, rows=range(B_START), cols=range(B_START, 8)))
    assert page.locator(".mbv-tok.mbv-dim[data-side=left]").count() == len(TOKENS) - B_START
    assert not np.array_equal(view.pixels(".mbv"), image)
    assert view.problems == []


def test_model_view_thumbnails_open_into_a_head_view(browser):
    _, _, attention = hand_arrays()
    view = Loaded(browser, content=page_of(viz.model_view(TOKENS, attention, B_START)))
    page = view.page
    assert page.locator("canvas.mbv-thumb").count() == 6
    lines = view.thumbnail_ink()
    assert min(lines) > 50  # every thumbnail has drawn pixels
    assert page.locator(".mbv-detail").is_hidden()

    page.click("canvas.mbv-thumb[data-layer='1'][data-head='2']")
    assert page.locator(".mbv-detail").is_visible()
    assert page.locator(".mbv-detail-head b").inner_text().startswith("Layer 2 · Head 3")
    assert_edges(view.edges(), expected_edges(attention[1, 2], 2))
    page.hover(".mbv-detail .mbv-tok[data-side=left][data-i='3']")
    assert_edges(view.edges(), expected_edges(attention[1, 2], 2, rows=[3]))
    page.keyboard.press("Escape")
    assert page.locator(".mbv-detail").is_hidden()

    page.select_option(".mbv-controls select >> nth=1", value="matrix")
    matrices = view.thumbnail_ink()
    assert min(matrices) > 50 and matrices != lines
    page.select_option(".mbv-controls select >> nth=0", value="BA")
    assert all(b < m for b, m in zip(view.thumbnail_ink(), matrices))  # the filter leaves a part of each
    assert view.problems == []


def test_neuron_view_shows_the_models_numbers(browser, bundled):
    a, b = "The rovers act as robotic geologists.", "The rovers move on six wheels."
    doc = viz.document(bundled, a, b)
    batch = bundled.tokenize([a], [b])
    names = [f"blocks.2.attn.hook_{s}" for s in ("q", "k", "pattern")]
    # The hooks viz.document captures, on the same shape: the compiled program is reused.
    _, cache = bundled.run_with_cache(batch, names=[f"blocks.*.attn.hook_{s}" for s in ("pattern", "q", "k")])
    q, k, pattern = (np.asarray(cache[n], np.float64)[0] for n in names)  # [T, H, K], [T, H, K], [H, T, S]
    assert doc.tokens == batch.tokens[0]
    assert doc.sentence_b_start == batch.sequence_ids[0].index(1)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # q, k and the pattern agree: no mismatch warning
        neuron = doc.neuron_view(layer=2, head=5, query_index=3)
    view = Loaded(browser, content=page_of(neuron))
    page = view.page
    assert page.locator(".mbv-warn").count() == 0
    assert page.locator("svg.mbv-lines .mbv-tok[data-side=left] text").all_text_contents() == doc.tokens

    for head, query in ((5, 3), (5, 9), (0, 9)):
        if head == 0:
            page.select_option(".mbv-controls select >> nth=1", index=0)
        elif query == 9:
            page.click(f".mbv-tok[data-side=left][data-i='{query}']")
        assert_neuron_numbers(view, q[:, head], k[:, head], pattern[head, query], query)
    size = q.shape[-1]
    assert cell_readout(view, "q", 0, 0, size) == ("q[0]", doc.tokens[9], float(q[9, 0, 0]))
    assert cell_readout(view, "k", 4, 7, size) == ("k[7]", doc.tokens[4], float(k[4, 0, 7]))
    assert view.problems == []


def shown_column(page, column: str) -> np.ndarray:
    """The exact numbers (data-value) of one column of the neuron view's table."""
    cells = f"document.querySelectorAll('text[data-col={column}]')"
    return np.array(page.evaluate(f"[...{cells}].map(t => +t.dataset.value)"))


def assert_neuron_numbers(view: Loaded, q: np.ndarray, k: np.ndarray, pattern_row: np.ndarray, query: int):
    """q·k, q·k/√K and softmax shown for `query` (q, k [T, K] of one head, float32) against float64 NumPy.

    The page computes them in float64 from the float32 q and k it carries exactly, so only summation
    order differs: a dot of K terms is within K·2⁻⁵² ≈ K·2.2e-16 of Σ|q_d·k_d|; exp and the sum over
    T keys add about (T + 8)·2.2e-16 to each softmax weight. The model's own pattern (fp32) is within
    SOFTMAX_TOLERANCE of that softmax, which viz.neuron_view checks before it omits the pattern.
    """
    view.settle()
    q64, k64 = q.astype(np.float64), k.astype(np.float64)
    eps, n_keys, size = np.finfo(np.float64).eps, len(k), q.shape[-1]
    dots = k64 @ q64[query]
    bound = size * eps * (np.abs(k64) @ np.abs(q64[query]))
    np.testing.assert_array_less(np.abs(shown_column(view.page, "dot") - dots), bound + 1e-300)
    np.testing.assert_array_less(np.abs(shown_column(view.page, "scaled") - dots / np.sqrt(size)), 2 * bound + 1e-300)
    weights = shown_column(view.page, "softmax")
    np.testing.assert_allclose(weights, softmax(dots / np.sqrt(size)), rtol=0, atol=(n_keys + 8) * eps)
    np.testing.assert_allclose(weights, pattern_row, rtol=0, atol=viz.views.SOFTMAX_TOLERANCE)


def cell_readout(view: Loaded, kind: str, row: int, dim: int, size: int) -> tuple[str, str, float]:
    """Hover the neuron view's q (row: ignored), k or q×k cell and parse the readout: (name, token, value)."""
    cell = max(2, min(6, 192 // size))  # views.js: px per vector element
    x = dim * cell + cell / 2 + (size * cell + 16 if kind == "qk" else 0)  # the q×k block sits after k's and a gap
    y = 22 * 1.5 if kind == "q" else 22 * (2.5 + row)  # 22 px rows: headings, the q row, then one per key
    view.page.hover("canvas.mbv-cells", position={"x": x, "y": y})
    text = view.page.locator(".mbv-readout").inner_text()
    name, token, value = re.fullmatch(r"(\w\[\d+\]) of “(.*)” = (\S+)", text).groups()
    return name, token, float(value)


def test_document_keeps_one_rows_real_tokens(bundled):
    # The bundled model's first layer alone: it compiles fast, and padding does not depend on depth.
    params = bundled.params | {"blocks": {0: bundled.params["blocks"][0]}}
    model = minibert.Model(dataclasses.replace(bundled.config, num_hidden_layers=1), params, bundled.tokenizer)
    texts = ["Short one.", "A much longer sentence, with many more tokens in it."]
    batch = model.tokenize(texts)
    _, cache = model.run_with_cache(batch, names="blocks.*.attn.hook_pattern")
    doc = viz.document(model, batch, index=0)
    n = int(batch.attention_mask[0].sum())
    assert doc.tokens == ["[CLS]", "short", "one", ".", "[SEP]"] and doc.sentence_b_start is None
    assert doc.attention.shape == (1, 12, n, n) and doc.q.shape == doc.k.shape == (1, n, 12, 32)
    padded = np.asarray(cache.stack("attn.hook_pattern"))[:, 0, :, :n, :n]
    # One row run alone vs inside a batch of two: two programs whose scores differ by δs (score_delta);
    # softmax moves each weight a by ≤ 2·a·δs ≤ 2δs.
    delta = score_delta(model, texts, row_length=batch.input_ids.shape[1])
    np.testing.assert_allclose(doc.attention, padded, rtol=0, atol=2 * delta)
    with pytest.raises(viz.VizError, match="index=2 is out of range"):
        viz.document(model, batch, index=2)
    with pytest.raises(viz.VizError, match="a Batch already holds its pairs"):
        viz.document(model, batch, "a pair")
    with pytest.raises(viz.VizError, match="text must be a string or a Batch from model.tokenize; got list"):
        viz.document(model, ["two", "texts"])


def test_hostile_text_stays_text(browser):
    tokens = ["[CLS]", *HOSTILE, "[SEP]"]
    q, k, attention = hand_arrays(len(tokens))
    title = "</script><script>alert(1)</script><b>title</b>"
    views = [viz.head_view(tokens, attention, 3, title=title), viz.model_view(tokens, attention, 3, title=title),
             viz.neuron_view(tokens, q, k, attention, 3, title=title)]
    for v in views:  # the data and the title cannot end a script or open a comment
        assert v.html.count("</script>") == 2 and "<!--" not in v.html and "\u2028" not in v.html
    view = Loaded(browser, content=page_of(*views))
    page = view.page
    page.hover(".mbv-tok[data-side=left][data-i='1']")
    page.click("canvas.mbv-thumb >> nth=0")
    page.click("svg.mbv-lines >> nth=2 >> .mbv-tok[data-side=left][data-i='2']")
    assert page.locator(".mbv img, .mbv-title b").count() == 0 and page.locator("script").count() == 6
    assert page.locator(".mbv-title").all_inner_texts() == [title] * 3
    for n in range(3):  # the token columns of the head view, the model view's detail and the neuron view
        shown = page.evaluate("n => [...document.querySelectorAll('svg.mbv-lines')[n]"
                              ".querySelectorAll('.mbv-tok text')].map(t => t.textContent)", n)
        assert shown == tokens + tokens
    assert HOSTILE[1] in page.locator(".mbv-sub").inner_text()  # the neuron view names its query
    assert view.problems == []


def test_views_on_one_page_are_independent(browser):
    _, _, first = hand_arrays(seed=1)
    _, _, second = hand_arrays(seed=2)
    shared = viz.head_view(TOKENS, first, B_START)
    html = page_of(shared, viz.head_view(TOKENS, second, B_START, layer=1), shared)  # one view shown twice
    view = Loaded(browser, content=html)
    page = view.page
    ids = page.evaluate("[...document.querySelectorAll('.mbv')].map(e => e.id)")
    assert len(set(ids)) == 3
    before = [view.edges(n) for n in range(3)]
    assert before[0] == before[2] != before[1]

    page.select_option(f"#{ids[0]} .mbv-controls select >> nth=0", index=1)
    page.hover(f"#{ids[1]} .mbv-tok[data-side=left][data-i='4']")
    after = [view.edges(n) for n in range(3)]
    assert_edges(after[0], {e: w for h in range(3) for e, w in expected_edges(first[1, h], h).items()})
    assert_edges(after[1], {e: w for h in range(3) for e, w in expected_edges(second[1, h], h, rows=[4]).items()})
    assert after[2] == before[2]
    assert view.problems == []


def test_a_views_standalone_page_is_page():
    """An HTML file is a page (View.page); "document" means one text of a batch (viz.document)."""
    _, _, attention = hand_arrays()
    view = viz.head_view(TOKENS, attention, title="<b>heads</b>")
    page = view.page()
    assert page.startswith("<!DOCTYPE html>") and "<title>&lt;b&gt;heads&lt;/b&gt;</title>" in page
    assert view.html.split('class="mbv-data">')[1].split("</script>")[0] in page  # the data its fragment embeds
    fresh_id = re.compile(r"mbv-[0-9a-f]{12}")  # each rendering gets a new element id; nothing else differs
    assert fresh_id.sub("ID", view.page()) == fresh_id.sub("ID", page)


def test_saving_a_page_never_replaces_a_users_file_unasked(tmp_path):
    """View.save, TokenText.save and FeatureBrowser.save share one writer: an existing file is refused, left as it
    was, and replaced only with overwrite=True."""
    _, _, attention = hand_arrays()
    view = viz.head_view(TOKENS, attention)
    mine = tmp_path / "notes.html"
    mine.write_text("my notes")
    with pytest.raises(viz.VizError, match="already exists; pass overwrite=True"):
        view.save(mine)
    for truthy in ("no", 1, [0]):  # a truthy non-flag replaced the file before; now refused, the file kept
        with pytest.raises(viz.VizError, match=r"overwrite=.*: pass True or False"):
            view.save(mine, overwrite=truthy)
    assert mine.read_text() == "my notes"
    assert view.save(tmp_path / "other.html", overwrite=np.False_).exists()  # NumPy's booleans are flags too
    replaced = view.save(mine, overwrite=True).read_text(encoding="utf-8")
    data = view.html.split('class="mbv-data">')[1].split("</script>")[0]
    assert replaced.startswith("<!DOCTYPE html>") and data in replaced
    with pytest.raises(viz.VizError, match="is a folder"):
        view.save(tmp_path, overwrite=True)
    with pytest.raises(viz.VizError, match="cannot write"):  # a file where a folder should be
        view.save(mine / "such" / "folder.html", overwrite=True)


def test_dark_theme_is_applied(browser):
    _, _, attention = hand_arrays()
    view = Loaded(browser, content=page_of(viz.head_view(TOKENS, attention, theme="dark"),
                                           viz.head_view(TOKENS, attention)))
    colours = view.page.evaluate("[...document.querySelectorAll('.mbv')].map(e => getComputedStyle(e).backgroundColor)")
    assert colours == ["rgb(13, 17, 23)", "rgb(255, 255, 255)"]
    text = view.page.evaluate("getComputedStyle(document.querySelector('.mbv-tok:not(.mbv-special) text')).fill")
    assert text == "rgb(230, 237, 243)"  # light text on the dark background
    assert "background:#0d1117" in viz.head_view(TOKENS, attention, theme="dark").page()
    assert view.page.get_by_text("Attention").first.is_hidden()  # no sentence filter for one sentence
    assert view.problems == []


@pytest.mark.parametrize("call, message", [
    (lambda a: viz.head_view(TOKENS, a[0]), r"attention must be \[L, H, T, S\]"),
    (lambda a: viz.head_view(TOKENS[:-1], a), "covers 8 positions but there are 7 tokens"),
    (lambda a: viz.head_view("the cat", a), "tokens must be a list of strings"),
    (lambda a: viz.head_view(TOKENS, a, layer=2), r"layer=2 is out of range: there are 2 layers \(0-indexed: 0..1\)"),
    (lambda a: viz.head_view(TOKENS, a, 8), "sentence_b_start must be the index of sentence B's first token"),
    (lambda a: viz.model_view(TOKENS, a, heads=[0, 0]), "heads must list distinct heads"),
    (lambda a: viz.model_view(TOKENS, a, thumbnail="dots"), "thumbnail must be 'lines' or 'matrix'"),
    (lambda a: viz.head_view(TOKENS, a, theme="blue"), "theme must be 'light' or 'dark'"),
    (lambda a: viz.neuron_view(TOKENS, np.zeros((2, 8, 3)), np.zeros((2, 8, 3, 4)), a), r"q must be \[L, T, H, K\]"),
    (lambda a: viz.neuron_view(TOKENS, *hand_arrays()[:2], a, layer=1, layers=[0]), "must be among layers=\\[0\\]"),
])
def test_bad_arguments_are_named(call, message):
    with pytest.raises(viz.VizError, match=message):
        call(hand_arrays()[2])


def test_neuron_view_warns_when_pattern_is_not_the_softmax(browser):
    q, k, attention = hand_arrays()
    with pytest.warns(UserWarning, match="differs from the given attention"):
        neuron = viz.neuron_view(TOKENS, q, k, attention[:, ::-1], B_START, layer=1, head=2, layers=[1], heads=[1, 2])
    view = Loaded(browser, content=page_of(neuron))
    assert "differs from the model's attention" in view.page.locator(".mbv-warn").inner_text()
    np.testing.assert_allclose(view.page.evaluate("[...document.querySelectorAll('text[data-col=softmax]')]"
                                                  ".map(t => +t.dataset.value)"), attention[1, 0, 0], atol=1e-6)
    assert view.problems == []


def test_head_view_layer_filter_keeps_only_those_layers(browser):
    _, _, attention = hand_arrays(n_layers=3)
    view = Loaded(browser, content=page_of(viz.head_view(TOKENS, attention, B_START, layers=[2, 0], layer=0)))
    page = view.page
    layer_select = ".mbv-controls select >> nth=0"
    assert page.locator(layer_select + " >> option").all_inner_texts() == ["3", "1"]  # numbered from 1
    assert_edges(view.edges(), all_heads(attention[0]))
    page.select_option(layer_select, index=0)
    assert_edges(view.edges(), all_heads(attention[2]))
    data = json.loads(page.locator("script.mbv-data").text_content())
    assert len(data["arrays"]["attention"]["layers"]) == 2  # the page carries the chosen layers only
    assert view.problems == []
    first = Loaded(browser, content=page_of(viz.head_view(TOKENS, attention, layers=[1, 2])))
    assert_edges(first.edges(), all_heads(attention[1]))  # shown first: the first of layers
    with pytest.raises(viz.VizError, match=r"layer=0 must be among layers=\[1, 2\]"):
        viz.head_view(TOKENS, attention, layers=[1, 2], layer=0)


SVG = "{http://www.w3.org/2000/svg}"


def svg_texts(tree: ElementTree.Element) -> list[str]:
    return [t.text or "" for t in tree.iter(SVG + "text")]


def assert_png(data: bytes, width: float, height: float):
    """A PNG of the drawing's size (device pixel ratio 1 in headless chromium) that is not blank."""
    image = matplotlib.image.imread(io.BytesIO(data), format="png")
    assert data.startswith(b"\x89PNG") and image.shape[:2] == (round(height), round(width))
    drawn = np.abs(image[..., :3] - image[0, 0, :3]).sum(axis=-1) > 0.1  # unlike the background in the corner
    assert drawn.mean() > 0.01


def test_downloads_save_the_current_drawing_as_png_and_svg(browser):
    tokens = ["[CLS]", *HOSTILE, "[SEP]"]
    q, k, attention = hand_arrays(len(tokens))
    views = [viz.head_view(tokens, attention, 3), viz.model_view(tokens, attention, 3),
             viz.neuron_view(tokens, q, k, attention, 3, layer=1, head=2)]
    view = Loaded(browser, content=page_of(*views))
    page = view.page
    ids = page.evaluate("[...document.querySelectorAll('.mbv')].map(e => '#' + e.id)")

    page.dblclick(f"{ids[0]} .mbv-swatch >> nth=1")  # the head view shows head 1 only
    drawing = ElementTree.fromstring(view.download(ids[0], "svg"))  # parses: user text is escaped
    lines = {(int(e.get("data-h")), int(e.get("data-i")), int(e.get("data-j"))): float(e.get("stroke-opacity"))
             for e in drawing.iter(SVG + "line") if e.get("data-h") is not None}
    assert lines == view.edges(0) and lines.keys() == expected_edges(attention[0, 1], 1).keys()
    assert svg_texts(drawing) == ["query", "key", *tokens, *tokens]
    assert_png(view.download(ids[0], "png"), float(drawing.get("width")), float(drawing.get("height")))

    grid = ElementTree.fromstring(view.download(ids[1], "svg"))  # the model view's grid: a PNG per thumbnail
    images = [e.get("href") for e in grid.iter(SVG + "image")]
    assert len(images) == 6 and all(h.startswith("data:image/png;base64,") for h in images)
    assert "Layer 2" in svg_texts(grid) and "Head 3" in svg_texts(grid)
    assert_png(view.download(ids[1], "png"), float(grid.get("width")), float(grid.get("height")))
    page.click(f"{ids[1]} canvas.mbv-thumb[data-layer='1'][data-head='2']")
    view.settle()
    detail = ElementTree.fromstring(view.download(ids[1], "svg"))  # with a head open: that head's lines
    assert {int(e.get("data-h")) for e in detail.iter(SVG + "line") if e.get("data-h") is not None} == {2}

    neuron = ElementTree.fromstring(view.download(ids[2], "svg"))
    cells = [e for e in neuron.iter(SVG + "rect") if e.get("fill-opacity") is not None and e.get("rx") is None]
    size = q.shape[-1]
    assert len([c for c in cells if c.get("height") == str(22 - 6)]) == size * (1 + 2 * len(tokens))  # q, k, q×k
    assert HOSTILE[0] in svg_texts(neuron)
    assert_png(view.download(ids[2], "png"), float(neuron.get("width")), float(neuron.get("height")))
    assert page.locator(".mbv img").count() == 0
    assert view.problems == []


@pytest.fixture(scope="module")
def long_doc(bundled):
    doc = viz.document(bundled, LONG_TEXT, max_length=512)
    assert len(doc.tokens) == 512
    return doc


@pytest.fixture(scope="module")
def long_views(long_doc):
    """The three views of the 512-token document, all layers and heads (the neuron view opens on 2-5)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the neuron view need not carry the pattern: softmax(q·k/√K) matches it
        return {"head": long_doc.head_view(), "model": long_doc.model_view(),
                "neuron": long_doc.neuron_view(layer=2, head=5)}


def test_512_token_pages_of_the_bundled_model_are_small(long_views):
    sizes = {name: len(v.page().encode("utf-8")) for name, v in long_views.items()}
    assert max(sizes.values()) <= PAGE_LIMIT, sizes


def test_512_token_views_draw_and_follow_clicks(browser, long_doc, long_views, tmp_path):
    a = long_doc.attention
    head = Loaded(browser, url=long_views["head"].save(tmp_path / "head.html").as_uri())
    assert_edges(head.edges(), all_heads(a[0]))
    before = head.pixels("canvas.mbv-edges")
    head.page.select_option(".mbv-controls select >> nth=0", index=3)
    assert_edges(head.edges(), all_heads(a[3]))
    assert not np.array_equal(head.pixels("canvas.mbv-edges"), before)
    head.page.click(".mbv-swatch >> nth=0")  # head 0 off
    assert {h for h, _, _ in head.edges()} == set(range(1, 12))
    assert head.problems == []

    model = Loaded(browser, url=long_views["model"].save(tmp_path / "model.html").as_uri())
    ink = model.page.evaluate("[...document.querySelectorAll('canvas.mbv-thumb')].map(c => c.getContext('2d')"
                              ".getImageData(0, 0, c.width, c.height).data.filter((_, n) => n % 4 === 3)"
                              ".reduce((s, v) => s + v, 0))")
    assert len(ink) == 72 and min(ink) > 0
    model.page.click("canvas.mbv-thumb[data-layer='5'][data-head='11']")
    assert_edges(model.edges(), expected_edges(a[5, 11], 11))
    assert model.problems == []

    neuron = Loaded(browser, url=long_views["neuron"].save(tmp_path / "neuron.html").as_uri())
    neuron.page.click(".mbv-tok[data-side=left][data-i='300']")
    assert_neuron_numbers(neuron, long_doc.q[2, :, 5], long_doc.k[2, :, 5], a[2, 5, 300], 300)
    q, k = (x[2, :, 5].astype(np.float64) for x in (long_doc.q, long_doc.k))
    weights = softmax(k @ q[300] / np.sqrt(q.shape[-1]))  # the neuron view draws its own softmax, unquantised
    lines = neuron.edges()
    assert lines.keys() == {(5, 300, j) for j in np.flatnonzero(weights >= MIN_WEIGHT).tolist()}
    np.testing.assert_allclose([lines[5, 300, j] for _, _, j in lines], weights[[j for _, _, j in lines]],
                               rtol=0, atol=(len(weights) + 8) * np.finfo(np.float64).eps)
    assert neuron.problems == []


def test_every_page_writer_follows_the_one_rule_for_its_path(tmp_path, monkeypatch):
    """Issue 40, round 5 (a docs-only tester): View.save wrote through a dangling link, said "… already exists"
    for "", wrote HTML into x.png, raised pathlib's TypeError for 5, refused a missing folder where the figures
    created one, and took "~" literally. Now io.files.output_path decides for every writer."""
    _, _, attention = hand_arrays()
    view = viz.head_view(TOKENS, attention)
    target, dangling = tmp_path / "target.txt", tmp_path / "dangling.html"
    target.write_text("keep")
    (tmp_path / "link.html").symlink_to(target)
    dangling.symlink_to(tmp_path / "nothing_here.txt")
    with pytest.raises(viz.VizError, match=r"link\.html is a symbolic link .*overwrite=True"):
        view.save(tmp_path / "link.html")
    with pytest.raises(viz.VizError, match=r"dangling\.html is a symbolic link"):
        view.save(dangling)
    assert not (tmp_path / "nothing_here.txt").exists() and target.read_text() == "keep"
    view.save(tmp_path / "link.html", overwrite=True)  # the link is replaced by the page; its target is left
    assert not (tmp_path / "link.html").is_symlink() and target.read_text() == "keep"
    assert (tmp_path / "link.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    for path, message in [(5, "path must be a str or pathlib.Path, such as 'out.html'; got int 5"),
                          ("", "the path is empty"), (tmp_path / "x.png", r"must end in \.html or \.htm .*'\.png'")]:
        with pytest.raises(viz.VizError, match=message):
            view.save(path)
    assert not (tmp_path / "x.png").exists()
    assert view.save(tmp_path / "out" / "nope" / "x.HTM").is_file()  # missing folders are created, as figures do
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert view.save("~/views/v.html") == tmp_path / "home" / "views" / "v.html"
    assert (tmp_path / "home" / "views" / "v.html").is_file() and not (tmp_path / "~").exists()
