"""The workbench as a lecturer who never read the code found it (a docs-only trial at 1366×768, after issue 31), in
headless chromium: an ablated head marked in the step-through, model-view and bar labels that fit, a tour that ends
and keeps clear of what it outlines, a busy sign that renders everywhere and moves nothing, projector mode that
enlarges and darkens everything, a "why" panel that says what it explains, messages a student can act on, one head
numbering. Each test failed on the page before its fix. Values are compared with run_with_cache within
tests/tolerances.py's forward bound."""

from __future__ import annotations

import json

import numpy as np
import pytest
import test_serve_browser
from conftest import make_hf_model
from test_serve_browser import Server, Workbench_page, held_runs
from tolerances import assert_close_to_scale, forward_rtol

import minibert
from minibert.analysis import interventions

server, open_page = test_serve_browser.server, test_serve_browser.open_page  # its fixtures: a tiny MLM's workbench


def test_an_ablated_head_is_marked_in_the_step_through(open_page, tiny_mlm):
    """After clicking 1-3 (ablate, and select it), the step-through's heading says "ablated (zero)"; its weighted
    values z are the hook's (the replacement, 0) and say so, with the run before the ablation's z = Σ α v beside them
    (run_with_cache's, unablated)."""
    model, text = tiny_mlm[0], "a b c d e"
    page = open_page()
    page.type(text)
    page.page.click("#wb-head-0-0-2")
    page.page.wait_for_selector("#wb-step-ablated-0")
    page.settle()
    assert "ablated (zero)" in page.page.text_content("#wb-step-ablated-0")
    z = "#wb-step-0 .wb-step[data-step=z]"
    assert page.values(f"{z} .wb-num") == [0.0] * len(page.values(f"{z} .wb-num"))  # the hook's: the replacement
    note = page.page.text_content(f"{z} .wb-ablated-note")
    assert "replaced by 0" in note and "Before the ablation" in note
    _, cache = model.run_with_cache(model.tokenize([text]), names=["blocks.0.attn.hook_z"])
    before = np.asarray(cache["blocks.0.attn.hook_z"])[0, 1, 2]  # query 1 (the page's first), head 2
    shown = page.values(f"{z} .wb-before-num")
    assert len(shown) > 0
    assert_close_to_scale(shown, before[:len(shown)], forward_rtol(model.config, 7), "z before the ablation")
    assert "ablated" in page.page.text_content("#wb-step-0 .wb-step[data-step=head_out] .wb-ablated-note")
    page.page.click("#wb-head-0-0-2")  # ablated no more: no mark
    page.page.wait_for_selector("#wb-step-ablated-0", state="detached")
    page.settle()
    assert page.page.locator("#wb-step-0 .wb-ablated-note").count() == 0
    assert page.problems == []


def test_an_ablated_head_button_is_struck_through_and_offers_to_restore(open_page):
    """docs/teaching.md says the ablated head is struck through; its button was only red, and its tooltip still
    said "click to ablate" (lecturer, finding 7)."""
    page = open_page()
    page.type("a b c d e")
    button = "#wb-head-0-0-2"
    assert page.page.get_attribute(button, "title").endswith(": click to ablate")
    page.page.click(button)
    page.page.wait_for_selector(f'{button}[aria-pressed="true"]')
    page.settle()
    assert page.page.get_attribute(button, "title").endswith(": ablated, click to restore")
    style = page.page.eval_on_selector(button, "b => getComputedStyle(b).textDecorationLine")
    assert "line-through" in style, style
    page.page.click(button)
    page.page.wait_for_selector(f'{button}[aria-pressed="false"]')
    page.settle()
    assert page.page.get_attribute(button, "title").endswith(": click to ablate")
    assert page.problems == []


def test_too_long_text_says_how_short_to_make_it(open_page):
    """A text over the limit (64 tokens here, [CLS] and [SEP] included) says how many word pieces to keep; the limit
    is only named in parentheses, after what a student can do (here the model's own 64 positions: no server flag
    raises it)."""
    page = open_page()
    page.type("a b c")
    page.page.fill("#wb-text", " ".join(["a"] * 70))  # 70 word pieces + [CLS] + [SEP]
    page.page.wait_for_function("() => document.querySelector('.wb-status').textContent.includes('word pieces')")
    said = page.page.text_content(".wb-status")
    assert "the text is 70 word pieces long; shorten it to about 62 word pieces" in said, said
    assert said.index("the model takes no more") > said.index("(") and "--max-tokens" not in said


def test_the_neuron_view_names_its_head_as_l_h(open_page, tiny_mlm):
    """The neuron view's caption names the head as everything else does, config.head_label's "L-H", with the code's
    0-indexed pair beside it (it wrote "layer 2, head 4")."""
    page = open_page()
    page.type("a b c d")
    page.page.select_option("#wb-step-layer-0", "1")
    page.settle()
    page.page.select_option("#wb-step-head-0", "3")
    page.settle()
    caption = page.page.text_content("#wb-views-0 .mbv[data-mbv-kind=neuron] .mbv-sub")
    assert f"head {tiny_mlm[0].config.head_label(1, 3)} (L-H, 1-indexed; 0-indexed: layer 1, head 3)" in caption
    assert "layer 2, head 4" not in caption
    assert page.problems == []


def test_the_busy_sign_renders_everywhere_and_moves_nothing(browser, tiny_mlm):
    """While a first run is held (a compile that takes long), the busy line shows with a mark drawn by CSS, not a
    glyph a lab machine's fonts may lack (its ::before has no character beyond ASCII), and the panels below it stay
    where they are when it appears and goes."""
    with Server([tiny_mlm[0]]) as running, held_runs(running.workbenches[0].model) as (_, release):
        page = Workbench_page(browser, running)
        page.page.wait_for_function(
            "() => /compiling for \\d+-token texts/.test(document.getElementById('wb-busy').textContent)")
        mark = page.page.eval_on_selector("#wb-busy", "n => getComputedStyle(n, '::before').content")
        assert all(ord(c) < 128 for c in mark), mark
        top = lambda: page.page.eval_on_selector("#wb-model-0", "n => n.getBoundingClientRect().top")  # noqa: E731
        busy_top = top()
        release.set()
        page.settle()
        assert page.page.locator("#wb-busy").is_hidden()
        assert top() == busy_top
        assert page.problems == []
        page.page.close()


def overlap(a: dict, b: dict) -> bool:
    """Whether two bounding boxes ({x, y, width, height}) share any area."""
    return (a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"]
            and a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"])


def test_the_tour_ends_and_its_box_covers_nothing_it_outlines(open_page, tiny_mlm):
    """At 1366×768, no stop's box covers the element it outlines; on stop 9 (the neuron view, which fits the window
    beside the box) it covers none of the views the stop talks about either. On the last stop Next reads "Done"
    and ends the tour."""
    with Server([tiny_mlm[0]], tour=True) as running:
        page = open_page(running)
        page.page.set_viewport_size({"width": 1366, "height": 768})
        page.type("a b c d e f g h i j k")
        for stop in range(1, 11):
            page.settle()
            said = page.page.text_content(".wb-tour p")
            assert said.startswith(f"{stop}/10"), said
            box = page.page.locator("#wb-tour").bounding_box()
            outlined = page.page.locator(".wb-spotlight").bounding_box()
            assert not overlap(box, outlined), said
            if stop == 9:
                assert outlined["height"] < 768 - box["height"] - 24  # room for both: the case the lecturer met
                for kind in ("head", "model", "neuron"):
                    view = page.page.locator(f"#wb-view-0-{kind}-only").bounding_box()
                    assert not overlap(box, view), kind
            expected = "Done" if stop == 10 else "Next"
            assert page.page.text_content("#wb-tour-next") == expected
            page.page.click("#wb-tour-next")
        assert page.page.locator("#wb-tour").count() == 0 and page.page.locator(".wb-spotlight").count() == 0
        assert page.problems == []


LONG_WORDS = ["professor", "afternoon", "explained", "attention"]  # longer than a bar's column


@pytest.fixture(scope="module")
def twelve_heads(tmp_path_factory):
    """A tiny random masked LM with 12 heads a layer (the bundled model's count) and some long words in its vocab."""
    directory = tmp_path_factory.mktemp("twelve-heads")
    make_hf_model(directory, "BertForMaskedLM", scale=0.2, hidden_size=48, num_attention_heads=12)
    vocab = (directory / "vocab.txt").read_text().splitlines()
    for word in LONG_WORDS:  # in place of made-up pieces: the ids (and the weights) stay as they are
        vocab[vocab.index(f"w{LONG_WORDS.index(word)}")] = word
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return minibert.load(directory)


def test_model_view_labels_and_bar_labels_fit_at_1366(open_page, twelve_heads):
    """Before / after an ablation at 1366×768 (and in projector mode), the model view's column labels of 12 heads
    neither touch each other nor leave its frame ("Head 10Head 11Head 12", the last cut); the step-through's bars
    name each key by its whole token (it cut "professor" to "profess…"), with the token in a tooltip."""
    text = "the professor explained attention this afternoon"
    with Server([twelve_heads]) as running:
        page = open_page(running)
        page.page.set_viewport_size({"width": 1366, "height": 768})
        page.type(text)
        page.page.click("#wb-head-0-0-2")
        page.page.wait_for_selector("#wb-views-0 .wb-view-side[data-side=after]")
        page.settle()
        for projector in (False, True):
            if projector:
                page.page.click("#wb-projector")
                page.settle()
            for side in ("before", "after"):
                view = f"#wb-views-0 .wb-view-side[data-side={side}] .mbv[data-mbv-kind=model]"
                frame = page.page.locator(f"{view} .mbv-scroll").bounding_box()
                labels = page.page.eval_on_selector_all(
                    f"{view} .mbv-grid .mbv-axis:not(.mbv-rowlab)",
                    "ns => ns.filter(n => n.textContent).map(n => { const r = document.createRange(); "
                    "r.selectNodeContents(n); const b = r.getBoundingClientRect(); return [b.left, b.right]; })")
                assert len(labels) == 12, (side, projector)
                assert all(right + 2 <= left for (_, right), (left, _) in zip(labels, labels[1:])), (side, labels)
                assert labels[0][0] >= frame["x"] and labels[-1][1] <= frame["x"] + frame["width"], (side, projector)
            tokens = twelve_heads.tokenize([text]).tokens[0]
            assert set(LONG_WORDS) <= set(tokens)
            for step in ("qk", "scaled", "pattern"):
                shown = page.page.eval_on_selector_all(
                    f"#wb-step-0 .wb-step[data-step={step}] .wb-bar-token",
                    "ns => ns.map(n => [n.textContent, n.title, n.scrollWidth <= n.clientWidth && "
                    "n.scrollHeight <= n.clientHeight])")
                assert [token for token, _, _ in shown] == tokens
                assert all(f"“{token}”" in title and whole for token, title, whole in shown), (step, shown)
        assert page.problems == []


def contrast_on_white(css_colour: str) -> float:
    """WCAG's contrast ratio of an "rgb(r, g, b)" colour against white (21 for black, 4.5 the AA minimum)."""
    channels = [float(c) / 255 for c in css_colour[css_colour.index("(") + 1:].rstrip(")").split(",")[:3]]
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    luminance = 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]
    return 1.05 / (luminance + 0.05)


def test_projector_mode_enlarges_and_darkens_every_text(open_page, twelve_heads):
    """In projector mode the "why" panel's summary is as large as the headings, the views' captions and column heads
    are full contrast (AAA's 7:1 on white at least; they were light grey, 5:1), the neuron view's numbers are half as
    large again as the 11.5 px ones (they grew to 14 px only), and the head buttons' labels keep a margin inside
    their borders ("1-10" filled them edge to edge)."""
    with Server([twelve_heads]) as running:
        page = open_page(running)
        page.page.set_viewport_size({"width": 1366, "height": 768})
        page.type("the professor explained attention")
        page.page.click("#wb-projector")
        page.settle()
        size = lambda selector: float(page.page.eval_on_selector(  # noqa: E731
            selector, "n => parseFloat(getComputedStyle(n).fontSize)"))
        assert size("#wb-why-open-0 summary") >= size("#wb-step-0 h2")
        neuron = "#wb-views-0 .mbv[data-mbv-kind=neuron]"
        assert size(f"{neuron} svg text.mbv-num") >= 1.5 * 11.5
        captions = page.page.eval_on_selector_all(
            f"{neuron} .mbv-help, {neuron} .mbv-sub, #wb-views-0 .mbv svg text.mbv-colhead, #wb-views-0 .mbv-help",
            "ns => ns.map(n => n.tagName === 'text' ? getComputedStyle(n).fill : getComputedStyle(n).color)")
        assert len(captions) > 4 and all(contrast_on_white(c) >= 7 for c in captions), captions
        # the views' captions ("Hover a token…") and head swatches (1…12) as large as the page's 18–20 px text: they
        # stayed at 14–15 px (lecturer, finding 10)
        sizes = page.page.eval_on_selector_all("#wb-views-0 .mbv-help, #wb-views-0 .mbv-swatch",
                                               "ns => ns.map(n => parseFloat(getComputedStyle(n).fontSize))")
        assert len(sizes) > 12 and min(sizes) >= 18, sizes
        margins = page.page.eval_on_selector_all(
            "#wb-heads-0 .wb-head", "ns => ns.map(n => { const r = document.createRange(); r.selectNodeContents(n); "
            "const t = r.getBoundingClientRect(), b = n.getBoundingClientRect(); "
            "return Math.min(t.left - b.left, b.right - t.right); })")
        assert min(margins) >= 6, min(margins)
        assert page.page.evaluate("document.documentElement.scrollWidth") <= 1366
        assert page.problems == []


def saved_sentence_model(directory, **config):
    """A tiny random encoder saved as a sentence-transformers model (Transformer → mean Pooling), the bundled model's
    kind: its output is the A–B similarity."""
    make_hf_model(directory, "BertModel", seed=3, **config)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "1_Pooling").mkdir()
    width = config.get("hidden_size", 32)  # make_hf_model's default
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": width,
                                                                     "pooling_mode_mean_tokens": True}))
    return minibert.load(directory)


@pytest.fixture(scope="module")
def sentence_model(tmp_path_factory):
    return saved_sentence_model(tmp_path_factory.mktemp("sentence-model"))


@pytest.fixture(scope="module")
def bundled_shape(tmp_path_factory):
    """A sentence model with the bundled model's 6 layers of 12 heads, at a tiny width: its page is laid out as the
    bundled model's (the head grid as tall, the tour's last stop as long)."""
    return saved_sentence_model(tmp_path_factory.mktemp("bundled-shape"), hidden_size=48, num_attention_heads=12,
                                num_hidden_layers=6)


def test_the_why_panel_of_a_sentence_model_says_to_type_sentence_b(open_page, sentence_model):
    """Opened on a sentence model (whose output is the A–B similarity) with no sentence B, the panel says to type one
    and where the similarity's heads show (ablating them), and explains no ‖h[CLS]‖ with "(no head reads this text)"
    (a number a self-attention lab cannot use); with a sentence B Outputs show the similarity and the panel says it
    is there (it still said "type a sentence B")."""
    assert sentence_model.pooling is not None
    with Server([sentence_model]) as running:
        page = open_page(running)
        page.type("a b c d")
        page.page.click("#wb-why-open-0 summary")
        page.page.wait_for_selector("#wb-why-0[aria-busy=false] .wb-why-hint")
        said = page.page.text_content("#wb-why-body-0")
        assert "type a sentence B" in said and "ablate" in said
        assert "‖h[CLS]‖" not in said and "no head reads" not in said
        assert page.page.locator("#wb-why-0 .wb-why-token, #wb-why-0 .wb-why-head").count() == 0
        page.type("a b c d", "e f")
        page.page.wait_for_selector("#wb-why-0[aria-busy=false] .wb-why-hint")
        assert page.page.locator("#wb-outputs-0 .wb-value[data-kind=similarity]").count() == 1
        said = page.page.text_content("#wb-why-body-0")  # a B is typed: the panel no longer asks for one (issue 41)
        assert "type a sentence B" not in said and "in Outputs above" in said and "ablate" in said, said
        assert page.problems == []


def test_the_tours_last_stop_asks_a_sentence_model_for_sentence_b_first(open_page, sentence_model, tiny_mlm):
    """The last stop asks to ablate 1-3. A sentence model's output, the A–B similarity, needs a sentence B, so there
    it first asks for one (without it Outputs showed no number to compare); it says where the change shows (the
    ablation acts after the head's softmax: later layers). A masked LM's tour asks for no sentence B."""
    for model, asks in ((sentence_model, True), (tiny_mlm[0], False)):
        with Server([model], tour=True) as running:
            page = open_page(running)
            page.type("a b c d")
            for _ in range(9):
                page.page.click("#wb-tour-next")
            page.settle()
            said = page.page.text_content(".wb-tour p")
            assert said.startswith("10/10") and "click 1-3 " in said and "next layer on" in said, said
            assert ("type a sentence B first" in said) == asks, said
            assert page.problems == []


def test_the_similarity_before_and_after_an_ablation_is_the_models(sentence_model):
    """The number the lab's intervention reads: the A–B cosine of a sentence model, before and after zero-ablating
    1-3, against each text run alone (run_with_hooks under ablate_heads) and mean-pooled over its tokens by hand."""
    from test_serve import client_for, post

    model, texts = sentence_model, ["a b c d e", "b c d f"]
    answer = post(client_for(model), "run", {"text": texts[0], "pair": texts[1], "ablate": [[0, 2]]}).json()
    cfg = model.config
    mask = interventions.head_mask(0, 2, cfg.num_hidden_layers, cfg.num_attention_heads)
    rtol = max(forward_rtol(cfg, len(model.tokenize([text]).tokens[0])) for text in texts)
    for side, hooks in (("before", {}), ("after", interventions.ablate_heads(mask))):
        hidden = [np.asarray(model.run_with_hooks(model.tokenize([text]), hooks=hooks).last_hidden_state,
                             np.float64)[0] for text in texts]  # one row each, no padding
        a, b = (h.mean(0) for h in hidden)  # mean pooling over every token
        cosine = a @ b / np.linalg.norm(a) / np.linalg.norm(b)
        # each hidden entry within rtol · max|h|, so each mean within √D · rtol · max|h| (‖Δ‖); a cosine moves by
        # at most 2‖Δ‖/‖·‖ for each of its two vectors
        bound = 2 * np.sqrt(cfg.hidden_size) * rtol * sum(np.abs(h).max() / np.linalg.norm(h.mean(0)) for h in hidden)
        assert abs(answer["outputs"][side]["similarity"] - cosine) <= bound, side
    assert answer["outputs"]["before"]["similarity"] != answer["outputs"]["after"]["similarity"]


# ---- the second lecturer's findings (a docs-only trial of the fixed page, 1366×768 and 1400×1000) ----------------


def test_projector_mode_enlarges_the_before_and_after_labels(open_page):
    """In projector mode the labels over each side of a comparison ("Before", "After: ablated … 1-3"), the only text
    saying which side is ablated, are as large as the page's text (they stayed 13 px beside 24 px headings)."""
    page = open_page()
    page.type("a b c d")
    page.page.click("#wb-projector")
    page.page.click("#wb-head-0-0-2")
    page.page.wait_for_selector("#wb-views-0 .wb-view-side[data-side=after] h3")
    page.settle()
    text = float(page.page.eval_on_selector("#workbench", "n => parseFloat(getComputedStyle(n).fontSize)"))
    sizes = page.page.eval_on_selector_all("#wb-views-0 .wb-view-side h3",
                                           "ns => ns.map(n => parseFloat(getComputedStyle(n).fontSize))")
    assert len(sizes) == 6 and min(sizes) >= text >= 20, (sizes, text)  # three views, before and after
    assert page.problems == []


def test_ablating_with_no_output_says_why_instead_of_empty_columns(open_page, sentence_model):
    """Ablating on a sentence model with no sentence B: Outputs show the line asking for sentence B, not two empty
    "Before" / "After: ablated …" headings over nothing; after [MASK] on a masked LM, the side with no [MASK] says
    so under its heading."""
    with Server([sentence_model]) as running:
        page = open_page(running)
        page.type("a b c d")
        page.page.click("#wb-head-0-0-2")
        page.page.wait_for_selector("#wb-views-0 .wb-view-side[data-side=after]")
        page.settle()
        assert page.page.locator("#wb-outputs-0 h3").count() == 0
        said = page.page.text_content("#wb-outputs-0")
        assert "Type a sentence B to see the A–B similarity" in said and "before and after" in said, said
        assert page.problems == []
    page = open_page()
    page.mask("a b c d e", 3)
    before = page.page.text_content("#wb-outputs-0 .wb-output[data-side=before]")
    assert before.startswith("Before") and "no [MASK] in this text" in before, before
    assert page.problems == []


def test_the_terms_on_hover_say_which_rows_are_in_sight(open_page, tiny_mlm):
    """Hovering a value of q (x · W_Q[:, h, j] + b: 32 terms on the tiny model, more than the table's box shows)
    says which rows are in sight, how many of all, and their sum, labelled as partial (the lecturer read 13 rows
    as adding up to the total); scrolled to the end, it names the last rows. The rows in sight are measured here
    from their boxes, and their sum recomputed from each row's operands."""
    hidden = tiny_mlm[0].config.hidden_size
    page = open_page()
    page.type("a b c d")
    q = "#wb-step-0 .wb-step[data-step=q]"
    page.page.hover(f"{q} .wb-num >> nth=0")
    page.page.wait_for_selector(f"{q} .wb-terms:not([hidden]) .wb-terms-sight")

    def in_sight():
        rows = page.page.eval_on_selector(
            f"{q} .wb-terms-scroll", "box => { const b = box.getBoundingClientRect(); "
            "return [...box.querySelectorAll('tr.wb-term')].map((r, i) => [i, r.getBoundingClientRect(), r.dataset])"
            ".filter(([, r]) => r.top >= b.top - 0.5 && r.bottom <= b.bottom + 0.5)"
            ".map(([i, , d]) => [i, Number(d.left), Number(d.right)]); }")
        cue = page.page.locator(f"{q} .wb-terms-sight")
        return rows, cue.text_content(), {k: float(cue.get_attribute(f"data-{k}")) for k in ("first", "last", "sum")}

    for scrolled in (False, True):
        if scrolled:
            page.page.eval_on_selector(f"{q} .wb-terms-scroll", "n => { n.scrollTop = n.scrollHeight; "
                                                                "n.dispatchEvent(new Event('scroll')); }")
            page.page.wait_for_function(
                f"() => document.querySelector('{q} .wb-terms-sight').dataset.last === '{hidden - 1}'")
        rows, said, cue = in_sight()
        assert 0 < len(rows) < hidden, len(rows)  # the case: some rows out of sight
        assert (cue["first"], cue["last"]) == (rows[0][0], rows[-1][0])
        assert f"{len(rows)} of {hidden}" in said and "scroll" in said, said
        products = [left * right for _, left, right in rows]
        # float64 sums of the same products in another order: within n·eps·Σ|terms|
        assert abs(cue["sum"] - sum(products)) <= len(rows) * np.finfo(np.float64).eps * sum(map(abs, products))
    assert page.problems == []


def test_the_step_throughs_strips_line_up_in_one_column(open_page, twelve_heads):
    """Every per-token row's colour strip (the keys, the values…) starts at the same x, with long tokens and in
    projector mode too (each strip started right after its token's label there)."""
    with Server([twelve_heads]) as running:
        page = open_page(running)
        page.page.set_viewport_size({"width": 1366, "height": 768})
        page.type("the professor explained attention")
        for projector in (False, True):
            if projector:
                page.page.click("#wb-projector")
                page.settle()
            lefts = page.page.eval_on_selector_all(
                "#wb-step-0 .wb-number-row", "ns => ns.filter(n => n.querySelector('.wb-row-label'))"
                ".map(n => n.querySelector('canvas.wb-strip-cells').getBoundingClientRect().left)")
            assert len(lefts) > 8 and max(lefts) - min(lefts) < 1, (projector, lefts)
        assert page.problems == []


def test_a_text_over_the_character_limit_is_kept_and_the_message_says_so(open_page):
    """A paste past 2,000 characters stays whole in the box (the box's maxlength cut it mid-word, silently) and the
    message says how long it is, the limit, and that nothing was cut."""
    page = open_page()
    page.type("a b c")
    long = " ".join(["b c d"] * 420)  # 2,519 characters
    page.page.fill("#wb-text", long)
    page.page.wait_for_function("() => document.querySelector('.wb-status').textContent.includes('characters')")
    assert page.page.input_value("#wb-text") == long
    said = page.page.text_content(".wb-status")
    assert f"the text has {len(long):,} characters; the workbench takes at most 2,000" in said, said
    assert "nothing was cut" in said, said


def test_an_empty_text_is_named_as_the_page_names_it(open_page):
    """An empty or blank text says "the text is empty; type a sentence", not the request's field name 'text'."""
    page = open_page()
    page.type("a b c")
    for blank in ("", "   "):
        page.page.fill("#wb-text", blank)
        page.page.wait_for_function("() => document.querySelector('.wb-status').textContent.includes('empty')")
        said = page.page.text_content(".wb-status")
        assert said.startswith("the text is empty; type a sentence"), said
        assert "'text'" not in said
        page.type("a b c")


def test_the_tours_back_and_its_last_stop_leave_the_next_controls_usable(open_page, bundled_shape):
    """Back is disabled on the first stop (it was enabled and did nothing); on the last stop at 1366×768 the box
    covers neither the button it outlines nor the step-through's Layer and Head selects students reach for next
    (it covered them, on the bundled model's 6 × 12 heads); Escape closes the tour."""
    with Server([bundled_shape], tour=True) as running:
        page = open_page(running)
        page.page.set_viewport_size({"width": 1366, "height": 768})
        page.type("a b c d e f g h i j")
        assert page.page.is_disabled("#wb-tour-back")
        page.page.click("#wb-tour-next")
        page.settle()
        assert page.page.is_enabled("#wb-tour-back")
        for _ in range(8):
            page.page.click("#wb-tour-next")
        page.settle()
        assert page.page.text_content(".wb-tour p").startswith("10/10")
        box = page.page.locator("#wb-tour").bounding_box()
        for kept in (".wb-spotlight", "#wb-step-layer-0", "#wb-step-head-0"):
            assert not overlap(box, page.page.locator(kept).bounding_box()), kept
        page.page.keyboard.press("Escape")
        assert page.page.locator("#wb-tour").count() == 0 and page.page.locator(".wb-spotlight").count() == 0
        assert page.problems == []
