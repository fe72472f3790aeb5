"""The workbench page in headless chromium, against a live uvicorn server on a tiny random masked LM.

Every request the page makes is intercepted: anything not addressed to the server fails the test, as do
console errors and page errors. The numbers the page shows (its data-value attributes carry them unrounded)
must equal `run_with_hooks` with the clicked ablation and `run_with_cache`'s hook values, within the forward
bound of tests/tolerances.py (test_serve.py derives it). MINIBERT_WRITE_SCREENSHOTS=1 also writes the README's
picture, docs/images/workbench.png, from the bundled model.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import uvicorn
from conftest import make_hf_model
from test_serve import MASKED, head_rtol, softmax
from tolerances import assert_close_to_scale, forward_rtol

import minibert
from minibert.analysis import interventions
from minibert.app import serve
from minibert.viz.workbench import TOP_K, Workbench

TOKEN = "browser-token"
IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"


START_HANG_GUARD_S = 300  # uvicorn's start in its thread takes well under a second; this only stops a hang


class Server:
    """uvicorn serving the workbench app on a free local port, in a thread; a context manager that stops it."""

    def __init__(self, models, tour: bool = False, resources: dict | None = None):
        """resources: the main model's panels' (Workbench(resources=…)), as minibert serve's flags give them."""
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.workbenches = [Workbench(model, max_tokens=64, resources=resources if n == 0 else None)
                            for n, model in enumerate(models)]
        app = serve.create_app(self.workbenches, TOKEN, port=self.port, tour=tour)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + START_HANG_GUARD_S
        while not self.server.started:  # a server thread that died or hangs at start fails here, not CI's limit
            assert self.thread.is_alive(), "uvicorn's thread ended before the server started (see its log above)"
            assert time.monotonic() < deadline, f"uvicorn did not start in {START_HANG_GUARD_S} s"
            time.sleep(0.05)
        self.origin = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.origin}/?token={TOKEN}"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=60)  # a daemon thread: one still ending cannot keep the tests from finishing

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


HELD_RUN_GUARD_S = 120  # how long a held run waits for its release at most: a failing test still ends


@contextlib.contextmanager
def held_runs(model):
    """While inside, every model.run waits until the yielded `release` is set, as a long first compile would;
    `entered` is set once one waits. On leaving, the waiting runs are released and model.run is the class's again."""
    entered, release = threading.Event(), threading.Event()
    original = model.run

    def held(*args, **kwargs):
        entered.set()
        release.wait(timeout=HELD_RUN_GUARD_S)
        return original(*args, **kwargs)

    model.run = held
    try:
        yield entered, release
    finally:
        release.set()
        del model.run


@pytest.fixture(scope="module")
def server(tiny_mlm):
    with Server([tiny_mlm[0]]) as running:
        yield running


@pytest.fixture
def open_page(browser, server):
    """Opens workbench tabs (on the module's server unless given another) and closes them after the test, so no
    test leaves a page running beside the next one."""
    opened = []

    def open_(running=None, url=None):
        opened.append(Workbench_page(browser, running or server, url))
        return opened[-1]

    yield open_
    for page in opened:
        page.page.close()


class Workbench_page:  # noqa: N801 (a page object, named for what it drives)
    """The workbench in a browser tab: every problem recorded, every request outside the server refused."""

    def __init__(self, browser, server, url: str | None = None):
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.problems: list[str] = []
        self.origin = server.origin
        self.page.on("console", lambda m: self.problems.append(f"console {m.type}: {m.text}")
                     if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("dialog", lambda d: (self.problems.append(f"dialog: {d.message}"), d.dismiss()))
        self.page.route("**/*", self._local_only)
        self.response = self.page.goto(url or server.url)

    def _local_only(self, route):
        url = route.request.url
        if url.startswith((self.origin + "/", "data:", "blob:", "about:")):
            route.continue_()
        else:
            self.problems.append(f"request leaving the machine: {url}")
            route.abort()

    def settle(self):
        self.page.wait_for_function("() => document.getElementById('workbench').getAttribute('aria-busy') === "
                                    "'false' && !document.querySelector('.mbv[aria-busy=true]')", polling=20)

    def type(self, text: str, pair: str = ""):
        self.page.fill("#wb-pair", pair)
        self.page.fill("#wb-text", text)
        self.page.wait_for_function("t => [...document.querySelectorAll('#wb-tokens-0 .wb-token')].length > 0 && "
                                    "document.getElementById('wb-text').value === t", arg=text)
        self.settle()  # typing marks the page busy at once, until the answers to the edit are drawn

    def mask(self, text: str, index: int):
        """Type `text`, choose token `index` and press [MASK]: settled once both sides' views are drawn."""
        self.type(text)
        self.page.click(f"#wb-tokens-0 .wb-token[data-index='{index}']")
        self.settle()
        self.page.click("#wb-mask")
        self.page.wait_for_selector("#wb-views-0 .wb-view-side[data-side=after]")
        self.settle()

    def values(self, selector: str) -> list[float]:
        return self.values_of(selector, "value")

    def neuron_softmax(self, side: str, layer: int) -> list[float]:
        """The softmax column of the neuron view on one side of the views ("before", "after") at `layer`."""
        neuron = f"#wb-views-0 .wb-view-side[data-side={side}] .mbv[data-mbv-kind=neuron]"
        self.page.select_option(f"{neuron} .mbv-controls select >> nth=0", index=layer)
        self.settle()
        return self.values(f"{neuron} .mbv-num[data-col=softmax]")

    def values_of(self, selector: str, field: str) -> list[float]:
        """The numbers in the data-FIELD attributes of the elements `selector` finds."""
        return [float(v) for v in self.page.eval_on_selector_all(selector, "(ns, f) => ns.map(n => n.dataset[f])",
                                                                 field)]


def test_typed_text_gives_tokens_and_views(open_page, tiny_mlm):
    page = open_page()
    page.settle()
    page.type("a b c d", "e")
    tokens = page.page.eval_on_selector_all("#wb-tokens-0 .wb-token", "ns => ns.map(n => n.textContent)")
    assert tokens == tiny_mlm[0].tokenize(["a b c d"], ["e"]).tokens[0]
    assert page.page.locator("#wb-views-0 .mbv").count() == 3
    assert page.page.locator("#wb-views-0 .mbv-body svg, #wb-views-0 .mbv-body canvas").count() > 0
    assert page.problems == []


def test_clicking_a_head_shows_the_ablated_outputs(open_page, tiny_mlm):
    model = tiny_mlm[0]
    page = open_page()
    page.type(MASKED)
    page.page.click("#wb-heads-0 .wb-head[data-layer='1'][data-head='2']")
    page.page.wait_for_selector("#wb-outputs-0 .wb-output[data-side=after]")
    page.settle()
    assert page.page.get_attribute("#wb-heads-0 .wb-head[data-layer='1'][data-head='2']", "aria-pressed") == "true"
    batch = model.tokenize([MASKED])
    position = batch.tokens[0].index("[MASK]")
    mask = interventions.head_mask(1, 2, model.config.num_hidden_layers, model.config.num_attention_heads)
    rtol = head_rtol(model.config, batch.input_ids.shape[1])
    for side, hooks in (("before", {}), ("after", interventions.ablate_heads(mask))):
        logits = np.asarray(model.run_with_hooks(batch, hooks=hooks).logits[0, position], np.float64)
        labels = page.page.eval_on_selector_all(f"#wb-outputs-0 .wb-output[data-side={side}] .wb-value",
                                                "ns => ns.map(n => n.dataset.label)")
        shown = np.array(page.values(f"#wb-outputs-0 .wb-output[data-side={side}] .wb-value"))
        expected = softmax(logits)[[model.tokenizer.vocab[label] for label in labels]]
        assert np.all(np.abs(shown - expected) <= 2 * expected * rtol * np.abs(logits).max() + 1e-12), side
    assert page.problems == []


def test_ablation_shows_the_views_before_and_after(open_page, tiny_mlm):
    """Both sides are drawn; each neuron view's softmax column (layer 1, after the ablated layer-0 head) equals the
    pattern of its run: run_with_cache's unablated, and the run under the ablation hooks. The neuron views show the
    page's one selection: the head clicked (0-indexed 2) and the query (1), at the layer chosen in a view."""
    model = tiny_mlm[0]
    page = open_page()
    page.type("a b c d e")
    page.page.click("#wb-heads-0 .wb-head[data-layer='0'][data-head='2']")
    page.page.wait_for_selector("#wb-views-0 .wb-view-side[data-side=after]")
    page.settle()
    batch = model.tokenize(["a b c d e"])
    mask = interventions.head_mask(0, 2, model.config.num_hidden_layers, model.config.num_attention_heads)
    name = "blocks.1.attn.hook_pattern"
    ablated = model.run(batch, names=[name], hooks=interventions.ablate_heads(mask))[1]  # run_with_hooks + capture
    expected = {"before": np.asarray(model.run_with_cache(batch, [name])[1][name])[0, 2, 1],  # head 2, query 1
                "after": np.asarray(ablated[name])[0, 2, 1]}
    rtol = forward_rtol(model.config, batch.input_ids.shape[1])
    assert np.abs(expected["before"] - expected["after"]).max() > 10 * rtol  # the two sides must differ to tell
    for side, pattern in expected.items():
        assert_close_to_scale(page.neuron_softmax(side, layer=1), pattern, rtol, side)
    page.page.select_option("#wb-mixing", "rollout")  # a mixing map, before and after the ablation too
    page.settle()
    for side in ("before", "after"):
        assert page.page.locator(f"#wb-views-0 .wb-view-side[data-side={side}] .mbv").count() == 2  # head, model
    assert page.problems == []


def test_masking_a_token_compares_with_the_text_before(open_page, tiny_mlm):
    """After [MASK] replaces a token, the "before" side is the text as typed: its views' pattern is the typed text's
    (run_with_cache), the "after" side's the masked text's, and only the after side has the masked-LM guesses."""
    model = tiny_mlm[0]
    page = open_page()
    page.mask("a b c d e", 3)
    assert page.page.input_value("#wb-text") == "a b [MASK] d e"
    rtol = forward_rtol(model.config, 7)
    name = "blocks.0.attn.hook_pattern"
    expected = {side: np.asarray(model.run_with_cache(model.tokenize([text]), [name])[1][name])[0, 0, 3]
                for side, text in (("before", "a b c d e"), ("after", "a b [MASK] d e"))}  # head 0, query 3 (chosen)
    assert np.abs(expected["before"] - expected["after"]).max() > 10 * rtol  # the two sides must differ to tell
    for side, pattern in expected.items():
        assert_close_to_scale(page.neuron_softmax(side, layer=0), pattern, rtol, side)
    guesses = {side: page.page.locator(f"#wb-outputs-0 .wb-output[data-side={side}] .wb-value[data-kind=mlm]").count()
               for side in ("before", "after")}
    assert guesses == {"before": 0, "after": TOP_K}
    assert page.problems == []


def test_step_through_shows_the_hooks_values(open_page, tiny_mlm):
    model = tiny_mlm[0]
    page = open_page()
    page.type("a b c d e")
    page.page.click("#wb-tokens-0 .wb-token[data-index='3']")
    page.settle()
    page.page.select_option("#wb-step-layer-0", "1")
    page.settle()
    page.page.select_option("#wb-step-head-0", "3")
    page.settle()
    _, cache = model.run_with_cache(model.tokenize(["a b c d e"]))
    rtol = forward_rtol(model.config, 7)
    expected = {"pattern": np.asarray(cache["blocks.1.attn.hook_pattern"])[0, 3, 3],
                "qk": np.asarray(cache["blocks.1.attn.hook_qk"])[0, 3, 3],
                "z": np.asarray(cache["blocks.1.attn.hook_z"])[0, 3, 3],
                "ln2": np.asarray(cache["blocks.1.ln2.hook_out"])[0, 3]}
    for step, value in expected.items():
        shown = page.values(f"#wb-step-0 .wb-step[data-step={step}] .wb-num")
        assert_close_to_scale(shown, value[:len(shown)], rtol, step)
    hover = page.page.get_attribute("#wb-step-0 .wb-step[data-step=resid_mid] .wb-num", "title")
    assert "block 1 input[0]" in hover and "attention output[0]" in hover  # the operands of x + a
    page.page.hover("#wb-step-0 .wb-step[data-step=scaled] .wb-num[data-index='2']")  # the score of key 2
    terms = page.page.locator("#wb-step-0 .wb-step[data-step=scaled] .wb-term")
    assert terms.count() == model.config.head_dim  # q_i × k_i for every i
    products = page.values_of("#wb-step-0 .wb-step[data-step=scaled] .wb-term", "product")
    q, k = (np.asarray(cache[f"blocks.1.attn.hook_{name}"])[0, :, 3] for name in ("q", "k"))
    assert_close_to_scale(products, q[3] * k[2], forward_rtol(model.config, 7), "q_i × k_i")
    total = page.values_of("#wb-step-0 .wb-step[data-step=scaled] .wb-terms-sum", "value")
    assert_close_to_scale(total, [np.asarray(cache["blocks.1.attn.hook_attn_scores"])[0, 3, 3, 2]], rtol, "score")
    assert page.problems == []


def test_hostile_text_stays_text(open_page, tiny_mlm):
    hostile = "<img src=x onerror=alert(1)></script><b>"  # 61 tokens with B (the server takes 64)
    page = open_page()
    page.type(hostile, "<svg onload=alert(2)>")
    assert page.page.text_content(".wb-status") == ""
    tokens = page.page.eval_on_selector_all("#wb-tokens-0 .wb-token", "ns => ns.map(n => n.textContent)")
    assert tokens == tiny_mlm[0].tokenize([hostile], ["<svg onload=alert(2)>"]).tokens[0]
    assert page.page.locator("#workbench img, #workbench [onerror], #workbench [onload]").count() == 0
    assert page.problems == []


def test_the_page_needs_the_token(open_page, server):
    page = open_page(url=server.origin + "/")
    assert page.response.status == 403
    assert "token" in page.page.content()


@pytest.mark.parametrize("switch, on", [("&projector=0", False), ("&projector=off", False), ("&projector=1", True),
                                        ("&projector", True), ("", False)])
def test_a_url_switch_of_0_keeps_projector_mode_off(open_page, server, switch, on):
    """Issue 40: &projector=0 turned projector mode on (Boolean("0") is true in JavaScript)."""
    page = open_page(url=server.url + switch)
    page.settle()
    assert page.page.get_attribute("#wb-projector", "aria-pressed") == str(on).lower()
    assert page.problems == []


def test_keyboard_reaches_every_control(open_page):
    page = open_page()
    page.type("a b", "c")
    page.page.evaluate("document.addEventListener('focusin', e => e.target.dataset.reached = '1')")
    stops = page.page.locator("button, select, input, textarea, [tabindex='0']").count()
    page.page.focus("#wb-text")  # the first control; Tab from there must reach every other one
    for _ in range(stops + 5):
        page.page.keyboard.press("Tab")
    missed = page.page.eval_on_selector_all(
        "button:not([data-reached]), select:not([data-reached]), input:not([data-reached]), "
        "textarea:not([data-reached])", "ns => ns.filter(n => n.offsetParent !== null).map(n => n.outerHTML)")
    assert missed == []
    page.page.focus("#wb-heads-0 .wb-head[data-layer='0'][data-head='1']")
    page.page.keyboard.press("Enter")
    page.page.wait_for_selector("#wb-views-0 .wb-view-side[data-side=after]")  # no [MASK]: no output to compare
    assert page.problems == []


def test_tour_tells_tutorial_one_with_the_sentences_numbers(open_page, tiny_mlm):
    """--tour walks tutorial 1 on the student's own sentence: it sets tutorial 1's head (layer 0, head 2) and query 2,
    and every number it tells is the hook's value for that sentence (run_with_cache): q's first value, the key the
    query attends to most, that key's q·k and scaled score, its weight, and z's cosine with that key's value."""
    model, text = tiny_mlm[0], "a b c d e f"
    layer, head, query = 0, 2, 2
    with Server([model], tour=True) as running:
        page = open_page(running)
        page.settle()
        page.type(text)
        said, facts = [], {}
        for _ in range(10):
            page.settle()  # a step that chooses the head waits for its answer
            said.append(page.page.text_content(".wb-tour p"))
            facts |= dict(page.page.eval_on_selector_all(".wb-tour-fact", "ns => ns.map(n => [n.dataset.fact, "
                                                                           "Number(n.dataset.value)])"))
            if said[-1].startswith("4/"):  # the tour's head is the step-through's now
                assert page.page.input_value("#wb-step-layer-0") == str(layer)
                assert page.page.input_value("#wb-step-head-0") == str(head)
            if len(said) < 10:  # (on the last stop, Next is Done and ends the tour)
                page.page.press("#wb-tour-next", "Enter")  # the keyboard drives the tour too
        assert said[0].startswith("1/10") and said[-1].startswith("10/10") and "click 1-3 " in said[-1]
        assert not any("working it out" in line for line in said)
        assert page.page.locator(".wb-spotlight").count() == 1
        assert page.problems == []
    batch = model.tokenize([text])
    _, cache = model.run_with_cache(batch)
    at = lambda site: np.asarray(cache[f"blocks.{layer}.attn.{site}"], np.float64)[0]  # noqa: E731
    pattern, q, z = at("hook_pattern")[head, query], at("hook_q")[query, head], at("hook_z")[query, head]
    best = int(np.argmax(pattern))
    rtol = forward_rtol(model.config, batch.input_ids.shape[1])
    assert pattern[best] - np.sort(pattern)[-2] > 2 * rtol  # one clear favourite, so the page must find this one
    assert facts["tokens"] == len(batch.tokens[0]) and facts["query"] == query and facts["key"] == best
    v = at("hook_v")[best, head]
    for name, value, row in (("q0", q[0], q), ("score", at("hook_qk")[head, query, best], at("hook_qk")[head, query]),
                             ("scaled", at("hook_attn_scores")[head, query, best], at("hook_attn_scores")[head, query]),
                             ("weight", pattern[best], pattern)):
        assert abs(facts[name] - value) <= rtol * np.abs(row).max(), name  # the forward bound, at the row's scale
    # z and v each within rtol · max|·| per entry, so ‖Δ‖ ≤ √K · rtol · ‖·‖; a cosine moves by at most 2‖Δ‖/‖·‖ for
    # each of its two vectors (and the page's 8 digits are far below that)
    cosine = z @ v / np.linalg.norm(z) / np.linalg.norm(v)
    assert abs(facts["cosine"] - cosine) <= 4 * np.sqrt(len(z)) * rtol
    assert ("the token just before it" in said[5]) == (best == query - 1)  # what it says of the head is the truth


def test_compare_shows_two_models_side_by_side(open_page, tiny_mlm, tmp_path):
    """minibert serve --compare: one column per model, both driven by the text typed; a head clicked in the second
    column is ablated there only, and that model's token-classification outputs (each token's most probable label)
    equal run_with_hooks before and after."""
    make_hf_model(tmp_path, "BertForTokenClassification", num_labels=3, seed=1)
    tagger, text = minibert.load(tmp_path), "a b c d"
    with Server([tiny_mlm[0], tagger]) as running:
        page = open_page(running)
        page.type(text)
        tokens = [page.page.eval_on_selector_all(f"#wb-tokens-{n} .wb-token", "ns => ns.map(n => n.textContent)")
                  for n in (0, 1)]
        batch = tagger.tokenize([text])
        assert tokens[0] == tokens[1] == batch.tokens[0]
        page.page.click("#wb-heads-1 .wb-head[data-layer='1'][data-head='0']")
        page.page.wait_for_selector("#wb-outputs-1 .wb-output[data-side=after]")
        page.settle()
        assert page.page.locator("#wb-model-0 [data-side=after], #wb-model-0 .wb-head[aria-pressed=true]").count() == 0
        shown = {side: page.page.eval_on_selector_all(
            f"#wb-outputs-1 .wb-output[data-side={side}] .wb-value[data-kind=token_class]",
            "ns => ns.map(n => [Number(n.dataset.position), n.dataset.label, Number(n.dataset.value)])")
            for side in ("before", "after")}
        assert page.problems == []
    labels = list(tagger.config.id2label)
    mask = interventions.head_mask(1, 0, tagger.config.num_hidden_layers, tagger.config.num_attention_heads)
    rtol = head_rtol(tagger.config, batch.input_ids.shape[1])
    for side, hooks in (("before", {}), ("after", interventions.ablate_heads(mask))):
        logits = np.asarray(tagger.run_with_hooks(batch, hooks=hooks).logits[0], np.float64)  # [T, labels]
        assert [position for position, _, _ in shown[side]] == list(range(len(batch.tokens[0])))
        for position, label, p in shown[side]:
            expected = softmax(logits[position])
            delta = rtol * np.abs(logits[position]).max()  # |Δp_i| ≤ 2 p_i max|Δlogit| (test_serve.py)
            assert expected[labels.index(label)] >= expected.max() - 2 * delta, (side, position)  # the top label
            assert abs(p - expected[labels.index(label)]) <= 2 * expected.max() * delta + 1e-12, (side, position)


@pytest.mark.slow
def test_readme_pictures(open_page, bundled, tmp_path):
    """The README's pictures, drawn by this browser: the page after ablating a head, and the terms of one score
    shown on hover; written to docs/images/ when MINIBERT_WRITE_SCREENSHOTS is set."""
    folder = IMAGES if os.environ.get("MINIBERT_WRITE_SCREENSHOTS") else tmp_path
    page_picture, terms_picture = folder / "workbench.png", folder / "workbench_terms.png"
    with Server([bundled]) as running:
        page = open_page(running)
        page.page.set_default_timeout(300_000)  # the bundled model's programs compile on the first requests
        page.type("The cat sat on the mat because it was tired.", "It slept all afternoon.")
        page.page.click("#wb-heads-0 .wb-head[data-layer='2'][data-head='5']")
        page.page.wait_for_selector("#wb-outputs-0 .wb-output[data-side=after]")
        page.settle()
        page.page.screenshot(path=str(page_picture), clip={"x": 0, "y": 0, "width": 1400, "height": 1000})
        page.page.click("#wb-tokens-0 .wb-token[data-index='8']")  # "it" as the query
        page.settle()
        score = "#wb-step-0 .wb-step[data-step=scaled]"
        page.page.hover(f"{score} .wb-num[data-index='2']")  # its score for the key "cat": every term q_i × k_i
        page.page.wait_for_selector(f"{score} .wb-terms:not([hidden])")
        page.page.locator(score).screenshot(path=str(terms_picture))
        assert page.problems == []
    for picture in (page_picture, terms_picture):
        assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
