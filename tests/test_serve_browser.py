"""The workbench page in headless chromium, against a live uvicorn server on a tiny random masked LM.

Every request the page makes is intercepted: anything not addressed to the server fails the test, as do
console errors and page errors. The numbers the page shows (its data-value attributes carry them unrounded)
must equal `run_with_hooks` with the clicked ablation and `run_with_cache`'s hook values, within the forward
bound of tests/tolerances.py (test_serve.py derives it). MINIBERT_WRITE_SCREENSHOTS=1 also writes the README's
picture, docs/images/workbench.png, from the bundled model.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import uvicorn
from test_serve import MASKED, head_rtol, softmax
from tolerances import assert_close_to_scale, forward_rtol

from minibert.analysis import interventions
from minibert.app import serve
from minibert.viz.explore import TOP_K, Workbench

TOKEN = "browser-token"
IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"


class Server:
    """uvicorn serving the workbench app on a free local port, in a thread."""

    def __init__(self, models, tour: bool = False):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        app = serve.create_app([Workbench(model, max_tokens=64) for model in models], TOKEN, port=self.port,
                               tour=tour)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:  # a server thread that died at start fails here instead of hanging CI
            assert self.thread.is_alive(), "uvicorn's thread ended before the server started (see its log above)"
            time.sleep(0.05)
        self.origin = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.origin}/?token={TOKEN}"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def server(tiny_mlm):
    running = Server([tiny_mlm[0]])
    yield running
    running.stop()


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


def test_typed_text_gives_tokens_and_views(browser, server, tiny_mlm):
    page = Workbench_page(browser, server)
    page.settle()
    page.type("a b c d", "e")
    tokens = page.page.eval_on_selector_all("#wb-tokens-0 .wb-token", "ns => ns.map(n => n.textContent)")
    assert tokens == tiny_mlm[0].tokenize(["a b c d"], ["e"]).tokens[0]
    assert page.page.locator("#wb-views-0 .mbv").count() == 3
    assert page.page.locator("#wb-views-0 .mbv-body svg, #wb-views-0 .mbv-body canvas").count() > 0
    assert page.problems == []


def test_clicking_a_head_shows_the_ablated_outputs(browser, server, tiny_mlm):
    model = tiny_mlm[0]
    page = Workbench_page(browser, server)
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


def test_ablation_shows_the_views_before_and_after(browser, server, tiny_mlm):
    """Both sides are drawn; each neuron view's softmax column (layer 1, after the ablated layer-0 head) equals the
    pattern of its run: run_with_cache's unablated, and the run under the ablation hooks."""
    model = tiny_mlm[0]
    page = Workbench_page(browser, server)
    page.type("a b c d e")
    page.page.click("#wb-heads-0 .wb-head[data-layer='0'][data-head='2']")
    page.page.wait_for_selector("#wb-views-0 .wb-view-side[data-side=after]")
    page.settle()
    batch = model.tokenize(["a b c d e"])
    mask = interventions.head_mask(0, 2, model.config.num_hidden_layers, model.config.num_attention_heads)
    name = "blocks.1.attn.hook_pattern"
    ablated = model.run(batch, names=[name], hooks=interventions.ablate_heads(mask))[1]  # run_with_hooks + capture
    expected = {"before": np.asarray(model.run_with_cache(batch, [name])[1][name])[0, 0, 1],  # head 0, query 1
                "after": np.asarray(ablated[name])[0, 0, 1]}
    rtol = forward_rtol(model.config, batch.input_ids.shape[1])
    assert np.abs(expected["before"] - expected["after"]).max() > 10 * rtol  # the two sides must differ to tell
    for side, pattern in expected.items():
        assert_close_to_scale(page.neuron_softmax(side, layer=1), pattern, rtol, side)
    page.page.select_option("#wb-mixing", "rollout")  # a mixing map, before and after the ablation too
    page.settle()
    for side in ("before", "after"):
        assert page.page.locator(f"#wb-views-0 .wb-view-side[data-side={side}] .mbv").count() == 2  # head, model
    assert page.problems == []


def test_masking_a_token_compares_with_the_text_before(browser, server, tiny_mlm):
    """After [MASK] replaces a token, the "before" side is the text as typed: its views' pattern is the typed text's
    (run_with_cache), the "after" side's the masked text's, and only the after side has the masked-LM guesses."""
    model = tiny_mlm[0]
    page = Workbench_page(browser, server)
    page.type("a b c d e")
    page.page.click("#wb-tokens-0 .wb-token[data-index='3']")
    page.settle()
    page.page.click("#wb-mask")
    page.page.wait_for_selector("#wb-views-0 .wb-view-side[data-side=after]")
    page.settle()
    assert page.page.input_value("#wb-text") == "a b [MASK] d e"
    rtol = forward_rtol(model.config, 7)
    name = "blocks.0.attn.hook_pattern"
    expected = {side: np.asarray(model.run_with_cache(model.tokenize([text]), [name])[1][name])[0, 0, 1]
                for side, text in (("before", "a b c d e"), ("after", "a b [MASK] d e"))}  # head 0, query 1
    assert np.abs(expected["before"] - expected["after"]).max() > 10 * rtol  # the two sides must differ to tell
    for side, pattern in expected.items():
        assert_close_to_scale(page.neuron_softmax(side, layer=0), pattern, rtol, side)
    guesses = {side: page.page.locator(f"#wb-outputs-0 .wb-output[data-side={side}] .wb-value[data-kind=mlm]").count()
               for side in ("before", "after")}
    assert guesses == {"before": 0, "after": TOP_K}
    assert page.problems == []


def test_step_through_shows_the_hooks_values(browser, server, tiny_mlm):
    model = tiny_mlm[0]
    page = Workbench_page(browser, server)
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


def test_hostile_text_stays_text(browser, server, tiny_mlm):
    hostile = "<img src=x onerror=alert(1)></script><b>"  # 61 tokens with B (the server takes 64)
    page = Workbench_page(browser, server)
    page.type(hostile, "<svg onload=alert(2)>")
    assert page.page.text_content(".wb-status") == ""
    tokens = page.page.eval_on_selector_all("#wb-tokens-0 .wb-token", "ns => ns.map(n => n.textContent)")
    assert tokens == tiny_mlm[0].tokenize([hostile], ["<svg onload=alert(2)>"]).tokens[0]
    assert page.page.locator("#workbench img, #workbench [onerror], #workbench [onload]").count() == 0
    assert page.problems == []


def test_the_page_needs_the_token(browser, server):
    page = Workbench_page(browser, server, url=server.origin + "/")
    assert page.response.status == 403
    assert "token" in page.page.content()


def test_keyboard_reaches_every_control(browser, server):
    page = Workbench_page(browser, server)
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
    page.page.wait_for_selector("#wb-outputs-0 .wb-output[data-side=after]")
    assert page.problems == []


def test_tour_walks_the_story(browser, tiny_mlm):
    running = Server([tiny_mlm[0]], tour=True)
    try:
        page = Workbench_page(browser, running)
        page.settle()
        said = []
        for _ in range(7):
            said.append(page.page.text_content(".wb-tour p"))
            page.page.click("#wb-tour-next")
        assert said[0].startswith("1/7") and said[-1].startswith("7/7") and "ablate" in said[-1]
        assert page.page.locator(".wb-spotlight").count() == 1
        assert page.problems == []
    finally:
        running.stop()


@pytest.mark.slow
def test_readme_picture(browser, bundled, tmp_path):
    """The README's picture, drawn by this browser: written to docs/images/ when MINIBERT_WRITE_SCREENSHOTS is set."""
    picture = IMAGES / "workbench.png" if os.environ.get("MINIBERT_WRITE_SCREENSHOTS") else tmp_path / "workbench.png"
    running = Server([bundled])
    try:
        page = Workbench_page(browser, running)
        page.page.set_default_timeout(300_000)  # the bundled model's programs compile on the first requests
        page.type("The cat sat on the mat because it was tired.", "It slept all afternoon.")
        page.page.click("#wb-heads-0 .wb-head[data-layer='2'][data-head='5']")
        page.page.wait_for_selector("#wb-outputs-0 .wb-output[data-side=after]")
        page.settle()
        page.page.screenshot(path=str(picture), clip={"x": 0, "y": 0, "width": 1400, "height": 1000})
        assert page.problems == []
        assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        running.stop()
