"""What a lecturer still asked of the workbench (issue 41, round 3), in headless chromium: dark mode following the
system, the step-through (and head view) saved as a figure for slides, two heads side by side, the after − before
map of every layer and head, 14 px type and legible thumbnails in standard mode, and the first use of ALTI /
value zeroing saying how long it takes. Each test failed on the page before its change."""

from __future__ import annotations

import re
import threading
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import test_serve_browser
import test_serve_classroom
from test_serve_browser import HELD_RUN_GUARD_S, Server
from test_serve_classroom import contrast_on_white
from tolerances import forward_rtol

from minibert.analysis import interventions
from minibert.viz import workbench as workbench_module

server, open_page = test_serve_browser.server, test_serve_browser.open_page  # its fixtures: a tiny MLM's workbench
twelve_heads = test_serve_classroom.twelve_heads  # a tiny MLM with 12 heads a layer, as the bundled model has

SVG = "{http://www.w3.org/2000/svg}"

# Every text node's colour, and the background it is drawn on: the element's and its ancestors' backgrounds composed
# (source-over) from the first opaque one down, the page's white or the canvas below all. SVG text (the views'
# drawings) is measured by its fill against its view's background. Only what is rendered: no display: none, no
# visibility: hidden, no zero-sized box.
TEXT_COLOURS = """root => {
  const rgba = c => { const m = c.match(/[\\d.]+/g).map(Number); return m.length === 4 ? m : m.concat([1]); };
  const under = n => {
    const layers = [];
    for (let e = n; e && e.nodeType === 1; e = e.parentElement) {
      const b = rgba(getComputedStyle(e).backgroundColor);
      if (b[3] > 0) layers.push(b);
      if (b[3] >= 1) break;
    }
    let out = [255, 255, 255];
    layers.reverse().forEach(b => { out = out.map((v, i) => b[i] * b[3] + v * (1 - b[3])); });
    return out;
  };
  const shown = [];
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let t = walker.nextNode(); t; t = walker.nextNode()) {
    const e = t.parentElement;
    if (!t.textContent.trim() || !e.getClientRects().length || getComputedStyle(e).visibility !== "visible") continue;
    if (e.closest("option, title, script, style")) continue;
    const inSvg = e instanceof SVGElement;
    const colour = rgba(inSvg ? getComputedStyle(e).fill : getComputedStyle(e).color);
    const view = e.closest(".mbv");
    shown.push([t.textContent.trim().slice(0, 30), colour, inSvg ? under(view) : under(e)]);
  }
  return shown;
}"""


def luminance(rgb) -> float:
    channels = [c / 255 for c in rgb[:3]]
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(a, b) -> float:
    """WCAG's contrast ratio of two [r, g, b] colours (1 to 21; 4.5 the AA minimum for text, 3 for graphics)."""
    light, dark = sorted((luminance(a), luminance(b)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def blended(colour, background):
    """An [r, g, b, a] colour drawn over an opaque [r, g, b] background."""
    return [colour[i] * colour[3] + background[i] * (1 - colour[3]) for i in range(3)]


@pytest.mark.slow  # 12 s at load 12 (a page, an ablation, and the page drawn again dark)
def test_dark_mode_follows_the_system_and_keeps_every_text_readable(open_page, tiny_mlm):
    """With the system dark (prefers-color-scheme, switched while the page is open), the page and its views turn
    dark and every text rendered — the controls, the tokens, the step-through, the outputs, the after − before map,
    the views' drawings — is at least 4.5:1 on what it is drawn on (it was black on white whatever the setting);
    the heads' colours stay 3:1 on the views' dark background (the light palette's #393b79 was 1.8:1) and the
    step-through's strongest strip cell and bars too. Projector mode stays black on white, and a light system
    setting brings the light page back."""
    page = open_page()
    page.type("a b c d e", "f g")
    page.page.click("#wb-head-0-0-1")
    page.page.wait_for_selector("#wb-change-map-0")
    page.settle()
    assert page.page.eval_on_selector("#workbench", "n => n.classList.contains('wb-dark')") is False
    page.page.emulate_media(color_scheme="dark")
    page.page.wait_for_selector("#workbench.wb-dark #wb-views-0 .mbv.mbv-dark")
    page.settle()
    background = page.page.eval_on_selector("body", "n => getComputedStyle(n).backgroundColor")
    assert contrast_on_white(background) > 15, background  # the page's own background is dark, margins too
    texts = page.page.eval_on_selector("#workbench", TEXT_COLOURS)
    assert len(texts) > 200, len(texts)
    poor = [(text, round(contrast(blended(colour, under), under), 2)) for text, colour, under in texts
            if contrast(blended(colour, under), under) < 4.5]
    assert poor == [], poor
    assert any(luminance(under) < 0.02 for _, _, under in texts)  # measured on the dark background, not white
    view_background = page.page.eval_on_selector("#wb-views-0 .mbv", "n => getComputedStyle(n).backgroundColor")
    view_rgb = [float(c) for c in re.findall(r"[\d.]+", view_background)[:3]]
    swatches = page.page.eval_on_selector_all(
        "#wb-views-0 .mbv[data-mbv-kind=head] .mbv-swatch", "ns => ns.map(n => getComputedStyle(n).borderTopColor)")
    assert len(swatches) >= 4
    for swatch in swatches:
        assert contrast([float(c) for c in re.findall(r"[\d.]+", swatch)[:3]], view_rgb) >= 3, swatch
    # the step-through's colour scale: its strongest cell (|value| = the step's largest, opacity 1) and its bars
    strongest = page.page.eval_on_selector(
        "#wb-step-0 .wb-step[data-step=q] canvas.wb-strip-cells", "c => { const d = c.getContext('2d')"
        ".getImageData(0, 0, c.width, 1).data; let best = [0, 0, 0, 0]; for (let i = 0; i < d.length; i += 4) "
        "if (d[i + 3] > best[3]) best = [d[i], d[i + 1], d[i + 2], d[i + 3]]; return best; }")
    page_rgb = [float(c) for c in re.findall(r"[\d.]+", background)[:3]]
    assert strongest[3] == 255 and contrast(strongest[:3], page_rgb) >= 3, strongest
    bars = page.page.eval_on_selector_all("#wb-step-0 .wb-bar-fill", "ns => ns.map(n => getComputedStyle(n)"
                                          ".backgroundColor)")
    for bar in set(bars):
        assert contrast([float(c) for c in re.findall(r"[\d.]+", bar)[:3]], page_rgb) >= 3, bar
    page.page.click("#wb-projector")
    page.page.wait_for_selector("#workbench:not(.wb-dark) #wb-views-0 .mbv.mbv-light")
    page.settle()
    assert page.page.eval_on_selector("#workbench", "n => getComputedStyle(n).backgroundColor") == "rgb(255, 255, 255)"
    page.page.click("#wb-projector")
    page.page.emulate_media(color_scheme="light")
    page.page.wait_for_selector("#workbench:not(.wb-dark) #wb-views-0 .mbv.mbv-light")
    page.settle()
    assert page.problems == []


def figure_of(page, selector: str, tmp_path, name: str):
    """Click the download button `selector`: (the file's suggested name, its bytes)."""
    with page.page.expect_download() as download:
        page.page.click(selector)
    path = tmp_path / name
    download.value.save_as(path)
    return download.value.suggested_filename, path.read_bytes()


def test_the_step_through_and_head_view_save_figures_named_for_what_they_show(open_page, server, tiny_mlm, tmp_path):
    """Download SVG | PNG beside the step-through saves it as a figure for slides, named after the model, the head
    and the query: its title, every step's label and equation, the softmax's numbers and bars (heights in
    proportion, as drawn on the page) and every key's whole token. The PNG is that drawing. The head view's file is
    named after the model and layer (it was minibert-head-view.svg whatever it showed)."""
    model = tiny_mlm[0]
    page = open_page()
    page.type("a b c d e")
    page.page.select_option("#wb-step-head-0", "2")
    page.settle()
    name = server.workbenches[0].model.source.rstrip("/").split("/")[-1]
    filename, data = figure_of(page, "#wb-step-0 .mbv-download button[data-format=svg]", tmp_path, "steps.svg")
    assert filename == f"minibert-step-through-{name}-L1-H3-query-1.svg"
    drawing = ET.fromstring(data)
    texts = [t.text for t in drawing.iter(SVG + "text")]
    answer = server.workbenches[0].answer("step", {"text": "a b c d e", "layer": 0, "head": 2, "query": 1})
    tokens = model.tokenize(["a b c d e"]).tokens[0]
    assert texts[0].startswith("Head 1-3 (0-indexed: layer 0, head 2) · query “a” (position 1)"), texts[0]
    for n, step in enumerate(answer["steps"]):
        assert f"{n + 1}. {step['label']}: {step['equation']}" in texts, step["label"]
    pattern = next(step for step in answer["steps"] if step["id"] == "pattern")["values"]
    values = [t for t in drawing.iter(SVG + "text") if t.get("class") == "wb-fig-value"]
    shown = [t.text for t in values[-len(tokens):]]  # the softmax is the last per-key step drawn
    assert shown == [f"{p:.3f}" if abs(p) >= 5e-4 else "0.000" for p in pattern]
    bars = [r for r in drawing.iter(SVG + "rect") if r.get("data-key")][-len(tokens):]
    heights = [float(r.get("height")) for r in bars]
    np.testing.assert_allclose(heights, 48 * np.array(pattern) / max(pattern), rtol=1e-12)  # a 48-px track
    number = [step["id"] for step in answer["steps"]].index("pattern") + 1  # the softmax's number in the list
    title = next(t for t in drawing.iter(SVG + "text") if t.text.startswith(f"{number}. softmax"))
    for bar, value in zip(bars, values[-len(tokens):]):  # each number under its bar, the bar under the step's title
        assert float(title.get("y")) < float(bar.get("y")) < float(value.get("y")) - float(bar.get("height")), (
            bar.attrib, value.attrib)
    assert set(tokens) <= set(texts)
    width, height = float(drawing.get("width")), float(drawing.get("height"))
    filename, png = figure_of(page, "#wb-step-0 .mbv-download button[data-format=png]", tmp_path, "steps.png")
    assert filename == f"minibert-step-through-{name}-L1-H3-query-1.png" and png[:8] == b"\x89PNG\r\n\x1a\n"
    ratio = page.page.evaluate("window.devicePixelRatio")  # the PNG is the SVG drawn at the screen's pixel ratio
    assert (int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")) == (round(width * ratio),
                                                                                      round(height * ratio))
    head_view = "#wb-views-0 .mbv[data-mbv-kind=head] .mbv-download button[data-format=svg]"
    filename, _ = figure_of(page, head_view, tmp_path, "head.svg")
    assert filename == f"minibert-{name}-head-view-layer-1.svg"
    assert page.problems == []


@pytest.mark.slow  # 11 s at load 12
def test_two_heads_side_by_side_in_the_step_through(open_page, server, tiny_mlm, tmp_path):
    """"Compare with" puts a second head's steps beside the selected one's, for the same query: its softmax is the
    model's pattern of that head (the hook, within the forward bound), its ids are its own (no id twice on the page),
    it follows a new query, and the figure holds both heads, named after both."""
    model = tiny_mlm[0]
    text = "a b c d e"
    page = open_page()
    page.type(text)
    page.page.select_option("#wb-step-compare-0", value="1:2")  # layer 1, head 2 (0-indexed): "2-3"
    page.page.wait_for_selector("#wb-step-second-0[aria-busy=false] .wb-steps")
    batch = model.tokenize([text])
    patterns = np.asarray(model.run_with_cache(batch, names="blocks.*.attn.hook_pattern")[1]
                          .stack("attn.hook_pattern"), np.float64)[:, 0]  # [L, H, T, S]
    rtol = forward_rtol(model.config, len(batch.tokens[0]))  # probabilities ≤ 1: within rtol of 1 each
    for query in (1, 3):
        if query == 3:
            page.page.click("#wb-tokens-0 .wb-token[data-index='3']")
            page.settle()
            page.page.wait_for_selector("#wb-step-second-0[aria-busy=false] .wb-steps")
        first = page.values("#wb-step-0 .wb-step-column:first-child .wb-step[data-step=pattern] .wb-bar-fill")
        second = page.values("#wb-step-second-0 .wb-step[data-step=pattern] .wb-bar-fill")
        np.testing.assert_allclose(first, patterns[0, 0, query], rtol=0, atol=rtol, err_msg=f"first, query {query}")
        np.testing.assert_allclose(second, patterns[1, 2, query], rtol=0, atol=rtol, err_msg=f"second, query {query}")
        assert page.page.text_content("#wb-step-second-0 h3") == "Head 2-3"
    ids = page.page.eval_on_selector_all("[id]", "ns => ns.map(n => n.id)")
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    name = server.workbenches[0].model.source.rstrip("/").split("/")[-1]
    filename, data = figure_of(page, "#wb-step-0 .mbv-download button[data-format=svg]", tmp_path, "two.svg")
    assert filename == f"minibert-step-through-{name}-L1-H1-query-3-and-L2-H3.svg"
    titles = [t.text for t in ET.fromstring(data).iter(SVG + "text") if t.text.startswith("Head ")]
    assert [t.split(" (")[0] for t in titles] == ["Head 1-1", "Head 2-3"]
    page.page.select_option("#wb-step-compare-0", value="")
    assert page.page.locator("#wb-step-second-0").count() == 0
    assert page.problems == []


def test_the_after_minus_before_map_shows_every_layer_and_head(open_page, server, tiny_mlm):
    """After an ablation, a layers × heads map gives each head's largest |after − before| attention — the hooked
    patterns with and without ablate_heads, within the forward bound — with the first layer that changes marked and
    the ablated head struck through; a click on a cell shows that layer and head in the step-through."""
    model, text = tiny_mlm[0], "a b c d e f"
    cfg = model.config
    batch = model.tokenize([text])
    names = "blocks.*.attn.hook_pattern"
    plain = np.asarray(model.run_with_cache(batch, names=names)[1].stack("attn.hook_pattern"), np.float64)
    mask = interventions.head_mask(0, 1, cfg.num_hidden_layers, cfg.num_attention_heads)
    _, cache = model.run(batch, names=names, hooks=interventions.ablate_heads(mask))
    expected = np.abs(np.asarray(cache.stack("attn.hook_pattern"), np.float64) - plain)[:, 0].max(axis=(2, 3))
    rtol = forward_rtol(cfg, len(batch.tokens[0]))  # two runs' probabilities ≤ 1: a difference within 2 rtol
    answer = server.workbenches[0].answer("run", {"text": text, "ablate": [[0, 1]]})["change"]
    assert answer["per_head"][0] == [0.0] * cfg.num_attention_heads  # the ablated head's layer: bit for bit
    np.testing.assert_allclose(answer["per_head"], expected, rtol=0, atol=2 * rtol)
    np.testing.assert_array_equal(np.max(answer["per_head"], axis=1), answer["per_layer"])
    assert expected[1].max() > 2 * rtol  # layer 2 changes, beyond the bound
    page = open_page()
    page.type(text)
    page.page.click("#wb-head-0-0-1")
    page.page.wait_for_selector("#wb-change-map-0")
    page.settle()
    cells = page.page.eval_on_selector_all("#wb-change-map-0 .wb-change-cell", "ns => ns.map(n => [Number("
                                           "n.dataset.layer), Number(n.dataset.head), Number(n.dataset.value), "
                                           "n.classList.contains('wb-change-ablated')])")
    assert [(layer, head) for layer, head, _, _ in cells] == [(layer, head) for layer in range(cfg.num_hidden_layers)
                                                              for head in range(cfg.num_attention_heads)]
    np.testing.assert_allclose([value for _, _, value, _ in cells], expected.ravel(), rtol=0, atol=2 * rtol)
    assert [(layer, head) for layer, head, _, off in cells if off] == [(0, 1)]
    assert page.page.text_content("#wb-change-map-0 .wb-change-axis.wb-change-first").startswith("Layer 2")
    page.page.click("#wb-change-map-0 .wb-change-cell[data-layer='1'][data-head='3']")
    page.settle()
    assert page.page.eval_on_selector("#wb-step-layer-0", "n => n.value") == "1"
    assert page.page.eval_on_selector("#wb-step-head-0", "n => n.value") == "3"
    assert page.problems == []


MONOSPACE = "n => /mono/i.test(getComputedStyle(n).fontFamily)"


@pytest.mark.slow  # 5-12 s each at load 12: a 12-head model's workbench, ablated, at each size
@pytest.mark.parametrize("size, projector", [((1366, 768), False), ((1366, 768), True), ((910, 512), False),
                                             ((910, 512), True)],
                         ids=["standard", "projector", "150-percent", "150-percent-projector"])
def test_type_is_14px_and_thumbnails_legible_and_nothing_overflows(open_page, twelve_heads, size, projector):
    """Standard mode's monospace (tokens, heads, numbers, the bars' tokens, a dot product's terms) was 11–13 px and
    the model view's thumbnails 35 px before / after an ablation at 1366 px: every monospace text is now 14 px at
    least and the thumbnails at least 60 px at 1366 px (before above after), and nothing is wider than the window at
    1366×768 and 150 % scaling (910×512 CSS px), in standard and projector mode."""
    width, height = size
    with Server([twelve_heads]) as running:
        page = open_page(running)
        page.page.set_viewport_size({"width": width, "height": height})
        page.type("the professor explained attention this afternoon")
        page.page.click("#wb-head-0-0-2")
        page.page.wait_for_selector("#wb-views-0 .wb-view-side[data-side=after]")
        page.settle()
        if projector:
            page.page.click("#wb-projector")
            page.settle()
        page.page.hover("#wb-step-0 .wb-step[data-step=qk] .wb-num")  # the terms of a dot product, shown
        sizes = page.page.eval_on_selector_all(
            "#workbench *:not(svg *)", f"ns => ns.filter({MONOSPACE}).filter(n => n.getClientRects().length && "
            "[...n.childNodes].some(c => c.nodeType === 3 && c.textContent.trim()))"
            ".map(n => [n.className, parseFloat(getComputedStyle(n).fontSize)])")
        kinds = {(name.split() or [""])[0] for name, _ in sizes}
        assert kinds >= {"wb-token", "wb-head", "wb-num", "wb-bar-token", "wb-change-cell"}, kinds
        assert min(px for _, px in sizes) >= 14, sorted(sizes, key=lambda s: s[1])[:5]
        thumbs = page.page.eval_on_selector_all("#wb-views-0 canvas.mbv-thumb", "ns => ns.map(n => n.clientWidth)")
        assert len(thumbs) == 2 * 2 * 12  # before and after, 2 layers of 12 heads
        if width == 1366:
            assert min(thumbs) >= 60, min(thumbs)
        assert page.page.evaluate("document.documentElement.scrollWidth") <= width
        assert page.problems == []


def test_the_first_use_of_alti_says_it_compiles_and_how_long_it_takes(open_page, server, monkeypatch):
    """ALTI's and value zeroing's first use compiles their program (seconds on a CPU, docs/teaching.md): while it
    does, the busy line names it and says how long a first use takes, instead of a bare "working…"."""
    entered, release = threading.Event(), threading.Event()

    def held(model, padded, hooks=None):  # a compile that takes long; then maps of zeros, of ALTI's shape [L, B, T, T]
        entered.set()
        release.wait(timeout=HELD_RUN_GUARD_S)
        rows, length = padded["input_ids"].shape
        return np.zeros((model.config.num_hidden_layers, rows, length, length), np.float32)

    monkeypatch.setattr(workbench_module.mixing, "alti", held)
    page = open_page()
    page.type("a b c d e f g")
    try:
        page.page.select_option("#wb-mixing", "alti")
        page.page.wait_for_function(
            "() => /compiling ALTI for \\d+-token texts \\(first use, ~\\d+–\\d+ s[;)]/"
            ".test(document.getElementById('wb-busy').textContent)")
    finally:
        release.set()
    page.settle()
    assert entered.is_set()
    assert page.problems == []
