"""viz.explore: the workbench widget answers the page's messages with the same JSON as the server's API."""

from __future__ import annotations

import json

import anywidget  # noqa: F401 (viz.explore imports it lazily; the test needs it installed)
import pytest
from starlette.testclient import TestClient

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
    assert "function render(root, data)" in widget.views_js and "minibertTransport" in widget.workbench_js
    assert json.loads(widget.config)["models"][0]["layers"] == tiny_mlm[0].config.num_hidden_layers
