"""viz.explore: the workbench widget answers the page's messages with the same JSON as the server's API."""

from __future__ import annotations

import json

import anywidget  # noqa: F401 (viz.explore imports it lazily; the test needs it installed)
import numpy as np
import pytest
from starlette.testclient import TestClient
from tolerances import assert_close_to_scale, forward_rtol

from minibert import viz
from minibert.app import serve
from minibert.viz.explore import Workbench

TOKEN = "t"


@pytest.mark.parametrize("action, body", [
    ("info", {}),
    ("run", {"text": "a b [MASK] d.", "pair": "e f", "ablate": [[1, 2]], "mode": "mean"}),
    ("step", {"text": "a b c", "layer": 1, "head": 3, "query": 2}),
    ("mixing", {"text": "a b c", "method": "rollout"}),
    ("run", {"text": "a b", "ablate": [[9, 0]]}),  # an error: the same message both ways
])
def test_widget_messages_match_the_server(tiny_mlm, action, body):
    model = tiny_mlm[0]
    widget = viz.explore(model)
    sent = []
    widget.send = sent.append  # what the widget would send to the page
    widget._handle_custom_msg({"id": 7, "action": action, "body": body}, [])
    client = TestClient(serve.create_app([Workbench(model)], TOKEN, port=1), base_url="http://127.0.0.1:1")
    http = client.post(f"/api/{action}", json=body, headers={serve.TOKEN_HEADER: TOKEN}).json()
    assert len(sent) == 1 and sent[0]["id"] == 7
    from_widget = sent[0].get("answer", {"error": sent[0].get("error")})
    assert json.loads(json.dumps(from_widget)) == http


def test_widget_carries_the_pages_code(tiny_mlm):
    widget = viz.explore(tiny_mlm[0])
    assert "function render(root, data)" in widget.views_js and "function minibertWorkbench(" in widget.workbench_js
    assert json.loads(widget.config)["models"][0]["layers"] == tiny_mlm[0].config.num_hidden_layers


def test_step_sends_the_operands_of_its_dot_products(tiny_mlm):
    """Each dot-product step's operands rebuild its values: Σ_i left_i · right_i (+ b) (/ √K) equals the hook's value
    (the score q·k_s/√K against run_with_cache), within one forward's rounding (tests/tolerances.py)."""
    model = tiny_mlm[0]
    answer = Workbench(model).step({"text": "a b c d e", "layer": 1, "head": 2, "query": 3})
    steps = {step["id"]: step for step in answer["steps"]}
    assert {"qk", "scaled", "z", "q", "head_out", "ffn_pre", "ffn_out"} <= {i for i, s in steps.items() if "dot" in s}
    batch = model.tokenize(["a b c d e"])
    _, cache = model.run_with_cache(batch, ["blocks.1.attn.hook_q", "blocks.1.attn.hook_attn_scores"])
    rtol = forward_rtol(model.config, batch.input_ids.shape[1])
    scaled = steps["scaled"]["dot"]
    assert_close_to_scale(steps[scaled["left"]]["values"], np.asarray(cache["blocks.1.attn.hook_q"])[0, 3, 2], rtol)
    rebuilt = np.asarray(scaled["right"]) @ np.asarray(steps["q"]["values"]) / scaled["divisor"]
    assert scaled["divisor"] == np.sqrt(model.config.head_dim)
    assert_close_to_scale(rebuilt, np.asarray(cache["blocks.1.attn.hook_attn_scores"])[0, 2, 3], rtol, "scores")
    for step in (s for s in steps.values() if "dot" in s):  # every other dot product rebuilds its shown values
        dot = step["dot"]
        bias = np.asarray(dot["bias"]) if dot["bias"] is not None else 0.0
        rebuilt = (np.asarray(dot["right"]) @ np.asarray(steps[dot["left"]]["values"]) + bias) / dot["divisor"]
        assert len(rebuilt) == min(len(step["values"]), max(answer["shown"], len(answer["tokens"])))
        assert_close_to_scale(rebuilt, step["values"][:len(rebuilt)], rtol, step["id"])


# Two views of anywidget's model API (get, on/off "msg:custom", send) on one blank page, each widget's messages
# answered by its Python widget, as the kernel would: the page needs no server and requests nothing.
TWO_WIDGETS = """async ([esm, widgets]) => {
  const module = await import(URL.createObjectURL(new Blob([esm], {type: "text/javascript"})));
  widgets.forEach((values, n) => {
    const heard = [];
    const model = {
      get: (name) => values[name],
      on: (event, handler) => heard.push(handler),
      off: (event, handler) => heard.splice(heard.indexOf(handler), 1),
      send: (message) => window.kernel(n, message).then((answer) => heard.forEach((h) => h(answer))),
    };
    const el = document.createElement("div");
    el.id = "widget-" + n;
    document.body.append(el);
    module.default.render({model, el});
  });
}"""


def test_two_widgets_on_one_page_are_independent(browser, tiny_mlm):
    widgets = [viz.explore(tiny_mlm[0]) for _ in range(2)]

    def kernel(n: int, message: dict) -> dict:  # the widget's own message handler, its answer returned
        sent = []
        widgets[n].send = sent.append
        widgets[n]._handle_custom_msg(message, [])
        return sent[0]

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    problems = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.route("**/*", lambda route: (problems.append(route.request.url), route.abort()))  # nothing to fetch
    page.expose_function("kernel", kernel)
    fields = ("css", "views_js", "workbench_js", "config")
    page.evaluate(TWO_WIDGETS, [widgets[0]._esm, [{f: getattr(w, f) for f in fields} for w in widgets]])

    def settle():
        page.wait_for_function("() => [...document.querySelectorAll('.wb-app')].length === 2 && [...document."
                               "querySelectorAll('.wb-app')].every(a => a.getAttribute('aria-busy') === 'false') && "
                               "!document.querySelector('.mbv[aria-busy=true]')", polling=20)

    def tokens(n: int) -> list[str]:
        return page.eval_on_selector_all(f"#widget-{n} .wb-token", "ns => ns.map(n => n.textContent)")

    settle()
    first = tokens(1)
    assert tokens(0) == first and len(first) > 2
    page.fill("#widget-0 textarea", "a b c")
    page.wait_for_function("() => document.querySelectorAll('#widget-0 .wb-token').length === 5")
    settle()
    page.click("#widget-0 .wb-head[data-layer='1'][data-head='2']")
    page.wait_for_selector("#widget-0 .wb-view-side[data-side=after]")
    settle()
    assert tokens(0) == tiny_mlm[0].tokenize(["a b c"]).tokens[0] and tokens(1) == first
    assert page.locator("#widget-1 .wb-head[aria-pressed=true], #widget-1 [data-side=after]").count() == 0
    ids = page.eval_on_selector_all("[id]", "ns => ns.map(n => n.id)")
    assert len(ids) == len(set(ids))  # every id once: each widget's under its own tag
    page.click("#widget-1 label:has-text('Text')")  # a label focuses its own widget's field, not the first one
    assert page.evaluate("() => document.activeElement.closest('#widget-1') !== null")
    assert problems == []
    page.close()
