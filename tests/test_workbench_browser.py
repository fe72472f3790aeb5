"""The workbench in a classroom (issue 31), in headless chromium on a tiny random model: one numbering, one selection
the views and the step-through share, signs of work, a tour whose numbers match the page, honest [MASK], labels
not clipped, ablated heads marked, the step-through's labels and drawings, projector mode, a 1366×768 layout, and
panels marked stale after an error. Each test failed on the page before its fix. Values the page shows are compared
with run_with_cache within tests/tolerances.py's forward bound."""

from __future__ import annotations

import re

import numpy as np
import test_serve_browser
from conftest import make_hf_model
from test_serve_browser import Server, Workbench_page, held_runs
from tolerances import assert_close_to_scale, forward_rtol

import minibert
from minibert.core.config import head_label

server, open_page = test_serve_browser.server, test_serve_browser.open_page  # its fixtures: a tiny MLM's workbench


def step_values(page, step: str, selector: str = ".wb-num") -> list[float]:
    return page.values(f"#wb-step-0 .wb-step[data-step={step}] {selector}")


def test_one_numbering_rule_labels_heads_l_h_with_the_code_pair_beside(open_page, tiny_mlm):
    """Clicking "1-3" selects head 1-3 everywhere: the step-through says "1-3 (0-indexed: layer 0, head 2)" and its
    selects read "1 (0-indexed: 0)", "3 (0-indexed: 2)"; every head button is config.head_label's."""
    model = tiny_mlm[0]
    page = open_page()
    page.type("a b c d")
    buttons = page.page.eval_on_selector_all("#wb-heads-0 .wb-head", "ns => ns.map(n => [Number(n.dataset.layer), "
                                                                       "Number(n.dataset.head), n.textContent])")
    assert [text for _, _, text in buttons] == [head_label(layer, head) for layer, head, _ in buttons]
    assert len(buttons) == model.config.num_hidden_layers * model.config.num_attention_heads
    page.page.click("#wb-head-0-0-2")
    page.settle()
    assert "1-3 (0-indexed: layer 0, head 2)" in page.page.text_content("#wb-step-title-0")
    shown = {name: page.page.eval_on_selector(f"#wb-step-{name}-0", "s => s.options[s.selectedIndex].textContent")
             for name in ("layer", "head")}
    assert shown == {"layer": "1  (0-indexed: 0)", "head": "3  (0-indexed: 2)"}
    assert page.problems == []


def test_views_and_step_through_share_one_selection(open_page, tiny_mlm):
    """A token clicked, a head chosen in the neuron view or a layer in the step-through moves them all: the neuron
    view's softmax is the step-through's pattern row for that layer, head and query (run_with_cache's)."""
    model, text = tiny_mlm[0], "a b c d e"
    page = open_page()
    page.type(text)
    page.page.click("#wb-tokens-0 .wb-token[data-index='3']")  # the query
    page.settle()
    neuron = "#wb-views-0 .mbv[data-mbv-kind=neuron]"
    page.page.select_option(f"{neuron} .mbv-controls select >> nth=1", index=3)  # the neuron view's head
    page.settle()
    assert page.page.input_value("#wb-step-head-0") == "3"
    page.page.select_option("#wb-step-layer-0", "1")  # the step-through's layer
    page.settle()
    assert page.page.input_value(f"{neuron} .mbv-controls select >> nth=0") == "1"
    assert page.page.input_value("#wb-views-0 .mbv[data-mbv-kind=head] .mbv-controls select >> nth=0") == "1"
    assert "Query “" + model.tokenize([text]).tokens[0][3] + "”" in page.page.text_content(f"{neuron} .mbv-sub")
    _, cache = model.run_with_cache(model.tokenize([text]), names=["blocks.1.attn.hook_pattern"])
    pattern = np.asarray(cache["blocks.1.attn.hook_pattern"])[0, 3, 3]  # layer 1, head 3, query 3
    rtol = forward_rtol(model.config, 7)
    assert_close_to_scale(page.values(f"{neuron} .mbv-num[data-col=softmax]"), pattern, rtol, "neuron view")
    assert_close_to_scale(step_values(page, "pattern"), pattern, rtol, "step-through")
    assert page.problems == []


def test_the_page_says_what_it_waits_for(browser, tiny_mlm):
    """While a program compiles, the page says "compiling for N-token texts…" — N the rows Model.run compiles for,
    64 tokens for every text of this 64-position model — and its empty sections say "computing…"; when the answers
    come, both go. (The first run is held on an event: a compile that takes long.)"""
    with Server([tiny_mlm[0]]) as running, held_runs(running.workbenches[0].model) as (entered, release):
        page = Workbench_page(browser, running)
        page.page.wait_for_selector("#wb-busy.wb-busy-on")
        entered.wait(timeout=120)
        page.page.wait_for_function(
            "() => /compiling for \\d+-token texts/.test(document.getElementById('wb-busy').textContent)")
        assert page.page.text_content("#wb-busy") == ("compiling for 64-token texts… (once for every text up to that "
                                                      "length; later edits are fast)")
        assert page.page.text_content("#wb-outputs-0 .wb-pending") == "computing…"
        release.set()
        page.settle()
        assert page.page.locator("#wb-busy").is_hidden()
        assert page.page.locator(".wb-pending").count() == 0
        assert page.problems == []
        page.page.close()


def test_tour_numbers_the_rows_it_explains_and_keeps_the_button_in_sight(open_page, tiny_mlm):
    """Each stop that names "row N" outlines the step-through's item N (and only it); the last stop outlines the
    "1-3" button it asks to click, and its box does not cover it."""
    with Server([tiny_mlm[0]], tour=True) as running:
        page = open_page(running)
        page.type("a b c d e f")
        named = 0
        for _ in range(10):
            page.settle()
            said = page.page.text_content(".wb-tour p")
            row = re.search(r"row (\d+) \(“([^”]+)”\)", said)
            spotlit = page.page.eval_on_selector_all(".wb-spotlight", "ns => ns.map(n => n.id)")
            assert len(spotlit) == 1, said
            if row:
                named += 1
                items = page.page.eval_on_selector_all("#wb-step-0 .wb-step", "ns => ns.map(n => n.id)")
                assert spotlit[0] == items[int(row.group(1)) - 1], said
                assert page.page.text_content(f"#{spotlit[0]} .wb-step-label").startswith(row.group(2)), said
            if said.startswith("10/"):
                break
            page.page.click("#wb-tour-next")
        assert named >= 5
        assert spotlit == ["wb-head-0-0-2"] and "click 1-3 " in said
        button, box = (page.page.locator(selector).bounding_box() for selector in ("#wb-head-0-0-2", "#wb-tour"))
        assert (button["x"] + button["width"] <= box["x"] or box["x"] + box["width"] <= button["x"]
                or button["y"] + button["height"] <= box["y"] or box["y"] + box["height"] <= button["y"])
        center = (button["x"] + button["width"] / 2, button["y"] + button["height"] / 2)
        assert page.page.evaluate("([x, y]) => document.elementFromPoint(x, y).id", center) == "wb-head-0-0-2"
        assert page.problems == []


def test_mask_promises_guesses_only_with_a_masked_lm_head(open_page, tiny_mlm, tmp_path):
    """The bundled kind of model (no masked-LM head): the [MASK] button and the tour's last stop say it makes no
    guesses; the masked LM's page promises them."""
    make_hf_model(tmp_path, "BertModel", seed=2)
    with Server([minibert.load(tmp_path)], tour=True) as running:
        page = open_page(running)
        page.settle()
        assert "no masked-LM head" in page.page.text_content("#wb-mask")
        for _ in range(9):
            page.page.click("#wb-tour-next")
        page.settle()
        said = page.page.text_content(".wb-tour p")
        assert said.startswith("10/") and "guesses change" not in said and "no masked-LM head" in said
        assert page.problems == []
    page = open_page()
    page.settle()
    assert page.page.text_content("#wb-mask") == "[MASK] the chosen token"


def test_word_labels_are_not_clipped(open_page):
    """Every token label of the head and neuron views lies inside its drawing (the query side, right-aligned to a
    measured width, lost its first letters when the view measured its text before it was on the page)."""
    page = open_page()
    page.type("a b [UNK] c [MASK] d")
    outside = page.page.eval_on_selector_all(
        "#wb-views-0 .mbv svg.mbv-lines text", "ns => ns.filter(n => n.getBBox().x < 0 || n.getBBox().x + "
        "n.getBBox().width > n.ownerSVGElement.width.baseVal.value).map(n => n.textContent)")
    assert outside == []
    assert page.page.locator("#wb-views-0 .mbv svg.mbv-lines text").count() > 0
    assert page.problems == []


def test_ablated_heads_are_marked_in_the_views_after(open_page):
    """After ablating 1-3: its model-view thumbnail and its head-view swatch are marked on the "after" side only,
    and the neuron view, showing that head, says so."""
    page = open_page()
    page.type("a b c d")
    page.page.click("#wb-head-0-0-2")
    page.page.wait_for_selector("#wb-views-0 .wb-view-side[data-side=after]")
    page.settle()
    for side, marked in (("before", 0), ("after", 1)):
        views = f"#wb-views-0 .wb-view-side[data-side={side}]"
        assert page.page.locator(f"{views} .mbv-thumb.mbv-ablated").count() == marked, side
        assert page.page.locator(f"{views} .mbv-thumb.mbv-ablated[data-layer='0'][data-head='2']").count() == marked
        assert page.page.locator(f"{views} .mbv-swatch.mbv-ablated").count() == marked, side
        assert ("ablated" in page.page.text_content(f"{views} .mbv[data-mbv-kind=neuron] .mbv-sub")) == bool(marked)
    assert page.problems == []


def test_step_through_labels_say_what_each_number_is(open_page, tiny_mlm):
    """z's terms are named by key token and sum over s; the concatenation shows this head's slice; LayerNorm's r is
    the residual's; h⁰ is written one way; sums are rounded and the score divides by "√K"."""
    model = tiny_mlm[0]
    K = model.config.head_dim
    page = open_page()
    page.type("a b c d e")
    page.page.select_option("#wb-step-head-0", "2")
    page.settle()
    tokens = model.tokenize(["a b c d e"]).tokens[0]
    page.page.hover("#wb-step-0 .wb-step[data-step=z] .wb-num[data-index='1']")
    z_terms = "#wb-step-0 .wb-step[data-step=z] .wb-terms"
    assert "Σ_s" in page.page.text_content(f"{z_terms} .wb-terms-head")
    rows = page.page.eval_on_selector_all(f"{z_terms} .wb-term td:first-child", "ns => ns.map(n => n.textContent)")
    assert rows == [f"{token} ({s})" for s, token in enumerate(tokens)]
    first = page.page.get_attribute("#wb-step-0 .wb-step[data-step=concat] .wb-num", "data-index")
    assert int(first) == 2 * K  # head 2's slice of [z_1 … z_H]
    assert page.page.locator("#wb-step-0 .wb-step[data-step=concat] .wb-strip-slice").count() == 1
    equations = dict(page.page.eval_on_selector_all(
        "#wb-step-0 .wb-step", "ns => ns.map(n => [n.dataset.step, n.querySelector('.wb-equation').textContent])"))
    assert equations["resid_mid"].startswith("r = x + a") and "(r − μ)/σ" in equations["ln1"]
    assert "h⁰" in equations["x"] and not any("^" in equation for equation in equations.values())
    page.page.hover("#wb-step-0 .wb-step[data-step=scaled] .wb-num[data-index='2']")
    total = page.page.text_content("#wb-step-0 .wb-step[data-step=scaled] .wb-terms-sum")
    assert f"/ √{K}" in total and not re.search(r"\d\.\d{6}", total), total
    assert page.problems == []


def test_step_through_draws_vectors_scores_and_the_softmax(open_page, tiny_mlm):
    """Each vector is a colour strip whose hovered cell reads its value; q·k and the softmax are bars, one per key,
    whose values are the hooks'; an operand's link brings its step into view."""
    model, text = tiny_mlm[0], "a b c d e"
    page = open_page()
    page.type(text)
    _, cache = model.run_with_cache(model.tokenize([text]))
    rtol = forward_rtol(model.config, 7)
    for step, site in (("qk", "attn.hook_qk"), ("pattern", "attn.hook_pattern")):  # layer 0, head 0, query 1
        bars = step_values(page, step, ".wb-bar-fill")
        assert_close_to_scale(bars, np.asarray(cache[f"blocks.0.{site}"])[0, 0, 1], rtol, step)
    strip = page.page.locator("#wb-step-0 .wb-step[data-step=q] canvas.wb-strip-cells")
    box = strip.bounding_box()
    strip.hover(position={"x": 0.5, "y": box["height"] / 2})
    q = np.asarray(cache["blocks.0.attn.hook_q"])[0, 1, 0]
    assert_close_to_scale([float(strip.get_attribute("data-hovered"))], q[:1], rtol, "q[0]")
    page.page.click("#wb-step-0 .wb-step[data-step=scaled] .wb-jump[data-target='wb-step-0-qk']")
    assert page.page.locator("#wb-step-0-qk.wb-flash").count() == 1
    assert page.problems == []


def test_projector_mode_and_a_1366_screen_cut_no_view(browser, open_page):
    """At 1366×768 with an ablation (before / after side by side) no view is cut off: nothing scrolls sideways,
    every head of the model view is in its frame. Projector mode makes the head buttons and the step numbers large."""
    page = open_page()
    page.page.set_viewport_size({"width": 1366, "height": 768})
    page.type("a b c d e f")
    page.page.click("#wb-head-0-0-2")
    page.page.wait_for_selector("#wb-views-0 .wb-view-side[data-side=after]")
    page.settle()
    cut = page.page.eval_on_selector_all("#wb-views-0 .mbv-scroll", "ns => ns.filter(n => n.scrollWidth > "
                                                                    "n.clientWidth + 1).length")
    assert cut == 0
    assert page.page.evaluate("document.documentElement.scrollWidth") <= 1366
    page.page.click("#wb-projector")
    page.settle()
    size = lambda selector: float(page.page.eval_on_selector(  # noqa: E731
        selector, "n => parseFloat(getComputedStyle(n).fontSize)"))
    assert size("#wb-head-0-0-0") >= 18 and size("#wb-step-0 .wb-num") >= 16
    assert page.page.locator("#wb-views-0 .mbv.mbv-large").count() > 0
    assert page.page.evaluate("document.documentElement.scrollWidth") <= 1366
    assert page.problems == []


def test_panels_after_an_error_are_marked_stale(open_page):
    """A text the server refuses (more tokens than it takes): the message says the panels show the last text that
    worked, and they are marked (dimmed, with a title saying why)."""
    page = open_page()
    page.type("a b c")
    page.page.fill("#wb-text", " ".join(["a"] * 70))  # 72 tokens; the test server takes 64
    page.page.wait_for_function("() => document.querySelector('.wb-status').textContent.includes('tokens')")
    assert "last text that worked" in page.page.text_content(".wb-status")
    for part in ("tokens", "outputs", "step", "views"):
        assert "wb-stale" in page.page.get_attribute(f"#wb-{part}-0", "class"), part
        assert "out of date" in page.page.get_attribute(f"#wb-{part}-0", "title"), part
    assert page.page.locator("#wb-heads-0.wb-stale").count() == 0
    page.type("a b c d")
    assert page.page.locator("#wb-app .wb-stale, #workbench .wb-stale").count() == 0
