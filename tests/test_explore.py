"""viz.explore: the workbench widget answers the page's messages with the same JSON as the server's API."""

from __future__ import annotations

import json
import threading

import anywidget  # noqa: F401 (viz.explore imports it lazily; the test needs it installed)
import numpy as np
import pytest
from starlette.testclient import TestClient
from test_families_methods import tiny
from test_families_modern import make_modernbert
from test_serve_browser import held_runs
from tolerances import assert_close_to_scale, forward_rtol

import minibert
from minibert import viz
from minibert.app import serve
from minibert.families.deberta_v2 import position_terms
from minibert.viz import _html, views
from minibert.viz.views import TERMS
from minibert.viz.workbench import Workbench

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
    sent = answered(widget, {"id": 7, "action": action, "body": body})
    client = TestClient(serve.create_app([Workbench(model)], TOKEN, port=1), base_url="http://127.0.0.1:1")
    http = client.post(f"/api/{action}", json=body, headers={serve.TOKEN_HEADER: TOKEN}).json()
    assert sent["id"] == 7
    from_widget = sent.get("answer", {"error": sent.get("error")})
    assert json.loads(json.dumps(from_widget)) == http


ANSWER_HANG_GUARD_S = 300  # an answer takes seconds (a first compile); this only stops a hang


def answered(widget, message: dict) -> dict:
    """What the widget sends back to the page for one message, through its own handler (answered on one of its
    threads, or at once)."""
    sent, arrived = [], threading.Event()
    widget.send = lambda reply: (sent.append(reply), arrived.set())  # what the widget would send to the page
    widget._handle_custom_msg(message, [])
    assert arrived.wait(ANSWER_HANG_GUARD_S), f"no answer to {message} in {ANSWER_HANG_GUARD_S} s"
    assert len(sent) == 1
    return sent[0]


def test_the_kernel_says_what_compiles_while_it_runs(tiny_mlm):
    """A kernel reads its messages one at a time: the widget's handler returns at once and works a run out on a
    thread, so the page's "status" message is answered meanwhile, naming the program that compiles (the page then
    says "compiling for N-token texts…"): Model.run's for one row of 5 tokens, 64 tokens long (its smallest for a
    few rows, buckets.FEW_ROWS_SMALLEST), not the workbench's 16-token bucket, which Model.run pads further. The
    run's answer follows. (The run is held on an event: a long compile.)"""
    widget = viz.explore(tiny_mlm[0])
    workbench, sent, handled = widget.workbench, [], threading.Event()
    widget.send = sent.append
    with held_runs(workbench.model) as (entered, release):
        kernel = threading.Thread(target=lambda: (widget._handle_custom_msg(
            {"id": 1, "action": "run", "body": {"text": "a b c"}}, []), handled.set()), daemon=True)
        kernel.start()
        assert entered.wait(ANSWER_HANG_GUARD_S)
        assert handled.wait(10), "the handler waited for the run: the kernel could read no other message"
        widget._handle_custom_msg({"id": 2, "action": "status", "body": {}}, [])
        assert [reply["id"] for reply in sent] == [2]
        assert sent[0]["answer"]["compiling"] == [{"what": "run", "tokens": 64}]
    widget.answering.shutdown(wait=True)
    assert [reply["id"] for reply in sent] == [2, 1]
    assert sent[1]["answer"]["tokens"] == ["[CLS]", "a", "b", "c", "[SEP]"]


def test_widget_carries_the_pages_code(tiny_mlm):
    widget = viz.explore(tiny_mlm[0])
    assert "function render(root, data, page)" in widget._esm and "function minibertWorkbench(" in widget._esm
    scripts = _html.VIEW_SCRIPTS + _html.WORKBENCH_SCRIPTS  # every view's file (common.js's el), the step-through's…
    assert all(_html._static(name) in widget._esm for name in scripts)
    assert json.loads(widget.config)["models"][0]["layers"] == tiny_mlm[0].config.num_hidden_layers


@pytest.fixture(scope="module")
def tiny_modernbert(tmp_path_factory):
    """A tiny random ModernBertForMaskedLM (4 layers: global, local, local, global; a 6-token window)."""
    directory = tmp_path_factory.mktemp("tiny-modernbert")
    make_modernbert(directory, "ForMaskedLM")
    return minibert.load(directory)


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_step_sends_the_operands_of_its_dot_products(request, family):
    """Each dot-product step's operands rebuild its values: Σ_i left_i · right_i (+ b) (/ √K) equals the hook's value
    (the score q·k_s/√K against run_with_cache), within one forward's rounding (tests/tolerances.py)."""
    model = request.getfixturevalue("tiny_mlm")[0] if family == "bert" else request.getfixturevalue("tiny_modernbert")
    text, query = "a b c d e f g h i j k", 3  # 13 tokens: ModernBERT's local layer 1 masks keys beyond ±3
    answer = Workbench(model).step({"text": text, "layer": 1, "head": 2, "query": query})
    steps = {step["id"]: step for step in answer["steps"]}
    products = {"qk", "scaled", "z", "q", "head_out", "ffn_pre", "ffn_out"} | ({"ffn_linear"} if family != "bert"
                                                                             else set())  # GeGLU's second half
    assert products == {i for i, step in steps.items() if "dot" in step}
    scaled = steps["scaled"]["dot"]
    assert scaled["left"] == ("q" if family == "bert" else "rot_q")  # the scores use the rotated q and k
    batch = model.tokenize([text])
    _, cache = model.run_with_cache(batch, ["blocks.1.attn.hook_attn_scores", f"blocks.1.attn.hook_{scaled['left']}"])
    rtol = forward_rtol(model.config, batch.input_ids.shape[1])
    assert_close_to_scale(steps[scaled["left"]]["values"],
                          np.asarray(cache[f"blocks.1.attn.hook_{scaled['left']}"])[0, query, 2], rtol)
    rebuilt = np.asarray(scaled["right"]) @ np.asarray(steps[scaled["left"]]["values"]) / scaled["divisor"]
    assert scaled["divisor"] == np.sqrt(model.config.head_dim)
    scores = np.asarray(cache["blocks.1.attn.hook_attn_scores"])[0, 2, query]
    assert_close_to_scale(rebuilt, scores, rtol, "scores", where=np.isfinite(scores))  # −∞: keys out of reach
    for step in (s for s in steps.values() if "dot" in s):  # every other dot product rebuilds its shown values
        dot = step["dot"]
        bias = np.asarray(dot["bias"]) if dot["bias"] is not None else 0.0
        rebuilt = (np.asarray(dot["right"]) @ np.asarray(steps[dot["left"]]["values"]) + bias) / dot["divisor"]
        per_key = step["id"] in ("qk", "scaled")  # every key's score; else the values the page shows
        assert len(rebuilt) == (len(answer["tokens"]) if per_key else min(answer["shown"], len(step["values"])))
        hooked = np.array([-np.inf if v is None else v for v in step["values"][:len(rebuilt)]])
        assert_close_to_scale(rebuilt, hooked, rtol, step["id"], where=np.isfinite(hooked))


# ModernBERT's step-through, in its order (pre-LN: ln1 before attention, rotary q and k, GeGLU's two halves, no
# LayerNorm after the residual, ln_final after the last block), each step's hook as the family defines it
# (minibert/families/modernbert.py), and what of the hook's [B, …] value the step shows.
PRE_LN_WALK = [("word", "embed.hook_embed", "t"), ("embed_ln", "hook_full_embed", "t"),
               ("x", "hook_resid_pre", "t"), ("ln1", "ln1.hook_out", "t"), ("q", "attn.hook_q", "t,h"),
               ("k", "attn.hook_k", ":,h"), ("v", "attn.hook_v", ":,h"), ("rot_q", "attn.hook_rot_q", "t,h"),
               ("rot_k", "attn.hook_rot_k", ":,h"), ("qk", "attn.hook_qk", "h,t"),
               ("scaled", "attn.hook_attn_scores", "h,t"), ("pattern", "attn.hook_pattern", "h,t"),
               ("z", "attn.hook_z", "t,h"), ("concat", "attn.hook_z", "t"), ("head_out", "attn.hook_result", "t,h"),
               ("attn_out", "hook_attn_out", "t"), ("resid_mid", "hook_resid_mid", "t"), ("ln2", "ln2.hook_out", "t"),
               ("ffn_pre", "mlp.hook_pre", "t"), ("ffn_linear", "mlp.hook_pre_linear", "t"),
               ("ffn_post", "mlp.hook_post", "t"), ("ffn_out", "hook_mlp_out", "t"),
               ("resid_post", "hook_resid_post", "t"), ("ln_final", "ln_final.hook_out", "t")]
SHOWS = {"t": lambda v, t, h: v[0, t].ravel(), "t,h": lambda v, t, h: v[0, t, h], ":,h": lambda v, t, h: v[0, :, h],
         "h,t": lambda v, t, h: v[0, h, t]}


def test_step_through_follows_modernberts_computation(tiny_modernbert):
    """Block 0 (no ln1), a local block and the last block (ln_final): the steps come in ModernBERT's order, and every
    value is its hook's from run_with_cache (−∞ masked scores as null), within one forward's rounding."""
    model, text, query, head = tiny_modernbert, "a b c d e f g h i j k", 3, 1
    workbench = Workbench(model)
    batch = model.tokenize([text])
    _, cache = model.run_with_cache(batch)
    rtol = forward_rtol(model.config, batch.input_ids.shape[1])
    for layer in (0, 1, model.config.num_hidden_layers - 1):
        answer = workbench.step({"text": text, "layer": layer, "head": head, "query": query})
        walk = [row for row in PRE_LN_WALK if (row[0] != "ln1" or layer > 0)
                and (row[0] != "ln_final" or layer == model.config.num_hidden_layers - 1)]
        assert [step["id"] for step in answer["steps"]] == [row[0] for row in walk], layer
        for step, (step_id, site, shows) in zip(answer["steps"], walk):
            name = site if site.startswith(("embed.", "hook_full_embed", "ln_final.")) else f"blocks.{layer}.{site}"
            hooked = SHOWS[shows](np.asarray(cache[name], np.float64), query, head)
            assert step["shape"] == list(hooked.shape), (layer, step_id)
            shown = np.array([-np.inf if v is None else v for v in step["values"]]).reshape(hooked.shape)
            assert np.array_equal(np.isinf(shown), np.isinf(hooked)), (layer, step_id)  # the masked keys
            assert_close_to_scale(shown, hooked, rtol, f"{layer} {step_id}", where=np.isfinite(hooked))
    assert np.isinf(cache["blocks.1.attn.hook_attn_scores"][0, head, query]).any()  # a local layer was walked


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
    """Two widgets from the ESM on a page whose Content-Security-Policy forbids eval (as some notebook front ends'
    do; the widget once built its code with new Function, refused there): acting on one leaves the other unchanged,
    every id is unique, and nothing is fetched."""
    widgets = [viz.explore(tiny_mlm[0]) for _ in range(2)]

    def kernel(n: int, message: dict) -> dict:  # the widget's own message handler, its answer returned
        return answered(widgets[n], message)

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    problems = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.route("**/*", lambda route: (problems.append(route.request.url), route.abort()))  # nothing to fetch
    page.expose_function("kernel", kernel)
    # a page whose policy runs scripts from blob: URLs only (how the module is imported) and forbids eval
    page.set_content("<!DOCTYPE html><html><head><meta http-equiv='Content-Security-Policy' content=\"default-src "
                     "'none'; script-src blob:; style-src 'unsafe-inline'; img-src data: blob:\"></head><body></body>"
                     "</html>")
    fields = ("css", "config")
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


@pytest.fixture(scope="module")
def tiny_deberta(tmp_path_factory):
    """A tiny random DeBERTa-v3 (c2p and p2c, shared keys, 4 position buckets: the texts below are longer)."""
    return tiny("deberta-v2", tmp_path_factory.mktemp("tiny-deberta"))


def test_step_through_shows_debertas_three_score_terms(tiny_deberta):
    """DeBERTa's scores are c2c + c2p + p2c, each already over √(K·m): the step-through shows the three terms and their
    sum in place of q·k/√K, every value its hook's from run_with_cache, and sends operands only for c2c = q·k/√(K·m)
    (the position terms read the relative table), which rebuild it within one forward's rounding."""
    model, text, query, head = tiny_deberta, "a b c d e f g h i j k", 3, 2
    answer = Workbench(model).step({"text": text, "layer": 1, "head": head, "query": query})
    steps = {step["id"]: step for step in answer["steps"]}
    ids = [step["id"] for step in answer["steps"]]
    assert ids[ids.index("qk"):ids.index("pattern") + 1] == ["qk", "c2c", "c2p", "p2c", "scaled", "pattern"]
    assert "√" not in steps["scaled"]["equation"] and steps["scaled"]["from"] == ["c2c", "c2p", "p2c"]
    batch = model.tokenize([text])
    _, cache = model.run_with_cache(batch)
    rtol = forward_rtol(model.config, batch.input_ids.shape[1])
    for step_id in ("q", "k", "qk", "c2c", "c2p", "p2c", "scaled", "pattern"):
        site = "attn.hook_attn_scores" if step_id == "scaled" else f"attn.hook_{step_id}"
        hooked = np.asarray(cache[f"blocks.1.{site}"], np.float64)[0]
        hooked = hooked[query, head] if step_id == "q" else hooked[:, head] if step_id == "k" else hooked[head, query]
        assert_close_to_scale(np.asarray(steps[step_id]["values"]).reshape(hooked.shape), hooked, rtol, step_id)
    terms = sum(np.asarray(cache[f"blocks.1.attn.hook_{term}"], np.float64)[0, head, query] for term in TERMS)
    assert_close_to_scale(steps["scaled"]["values"], terms, rtol, "c2c + c2p + p2c")  # the sum is the scores
    assert {i for i, step in steps.items() if "dot" in step} == {"qk", "c2c", "z", "q", "head_out", "ffn_pre",
                                                                  "ffn_out"}
    c2c = steps["c2c"]["dot"]
    m = 1 + len(position_terms(model.config))
    assert c2c["left"] == "q" and c2c["divisor"] == np.sqrt(model.config.head_dim * m)
    rebuilt = np.asarray(c2c["right"]) @ np.asarray(steps["q"]["values"]) / c2c["divisor"]
    assert_close_to_scale(rebuilt, steps["c2c"]["values"], rtol, "c2c from its operands")


def decoded(packed: dict) -> np.ndarray:
    """The layers of one array a view carries ([L, ...]), decoded as views.js decodes them (viz._html's packings:
    float32 as 4 byte planes, unit_byte as one byte / 255)."""
    import base64
    import zlib

    raw = [np.frombuffer(zlib.decompress(base64.b64decode(layer)), np.uint8) for layer in packed["layers"]]
    if packed["packing"] == "unit_byte":
        return np.stack([layer.reshape(packed["shape"]) for layer in raw]) / 255
    return np.stack([layer.reshape(4, -1).T.copy().view("<f4").reshape(packed["shape"]) for layer in raw])


@pytest.mark.parametrize("family", ["modernbert", "deberta"])
def test_served_neuron_view_softmax_is_the_models_pattern(request, family):
    """The workbench's neuron view carries what the model's scores use — ModernBERT's rotated q and k and its local
    layers' window (the keys −∞ in attn.hook_attn_scores), DeBERTa's three terms — so the softmax the page computes
    from them (rebuilt here as views.js does: q·k/√K or c2c + c2p + p2c, −∞ where key_mask is 0) is the model's
    pattern within one forward's rounding, with no mismatch warning and no pattern carried in its place."""
    import warnings

    model = request.getfixturevalue(f"tiny_{family}")
    text = "a b c d e f g h i j k"  # 13 tokens: ModernBERT's local layers mask keys beyond ±3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        neuron = Workbench(model).run({"text": text})["views"]["neuron"]
    meta, arrays = neuron["meta"], neuron["arrays"]
    assert meta["mismatch"] is None and "attention" not in arrays
    q, k = decoded(arrays["q"]).astype(np.float64), decoded(arrays["k"]).astype(np.float64)  # [L, T, H, K]
    if meta["terms"]:
        scores = sum(decoded(arrays[term]).astype(np.float64) for term in meta["terms"])
    else:
        scores = np.einsum("LTHK,LSHK->LHTS", q, k) / np.sqrt(meta["d_head"])
    if family == "modernbert":
        assert "key_mask" in arrays  # a local layer's window
        scores = np.where(decoded(arrays["key_mask"])[:, None] > 0.5, scores, -np.inf)
    else:
        assert meta["terms"] == list(TERMS) and "key_mask" not in arrays  # no key masked: nothing carried
    batch = model.tokenize([text])
    _, cache = model.run_with_cache(batch, names="blocks.*.attn.hook_pattern")
    pattern = np.asarray(cache.stack("attn.hook_pattern"), np.float64)[:, 0]
    rtol = forward_rtol(model.config, batch.input_ids.shape[1])
    assert_close_to_scale(views.neuron_softmax(scores), pattern, rtol, "softmax of the served scores")
    if family == "modernbert":  # the window was applied: a local layer's pattern has keys it cannot read
        assert (pattern == 0).any()


def test_document_neuron_view_masks_a_local_layers_window(tiny_modernbert, browser):
    """viz.document keeps the keys a ModernBERT local layer masks (|t − s| > local_attention/2, the authors' window);
    its neuron view's page puts −∞ there before the softmax, so the page's softmax column is the model's pattern
    (within one forward's rounding), with no mismatch warning, no pattern carried and no console error."""
    import warnings

    from test_views import Loaded, page_of, shown_column

    model, text, layer, head, query = tiny_modernbert, "a b c d e f g h i j k", 1, 1, 8
    doc = viz.document(model, text)
    T, half = len(doc.tokens), model.config.setting("local_attention") // 2
    distance = np.abs(np.arange(T)[:, None] - np.arange(T)[None, :])
    np.testing.assert_array_equal(doc.key_mask[layer], distance <= half)  # block 1 is local
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        view = doc.neuron_view(layer=layer, head=head, query_index=query)
    assert "attention" not in view.data["arrays"]
    page = Loaded(browser, content=page_of(view))
    page.settle()
    batch = model.tokenize([text])
    _, cache = model.run_with_cache(batch, names="blocks.*.attn.hook_pattern")
    pattern = np.asarray(cache.stack("attn.hook_pattern"), np.float64)[layer, 0, head, query]
    assert np.array_equal(np.isinf(shown_column(page.page, "scaled")), distance[query] > half)
    assert_close_to_scale(shown_column(page.page, "softmax"), pattern, forward_rtol(model.config, T), "softmax")
    assert page.problems == []
