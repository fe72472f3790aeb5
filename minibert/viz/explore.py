"""`explore(model)`: the live workbench as a notebook widget (anywidget), answered by this kernel.

    explore(model)                                      # the page `minibert serve` shows, driven by the kernel

The page's requests reach the kernel as messages and are answered by viz.workbench.Workbench.answer, the same
function the HTTP server (minibert.app.serve) answers with. A kernel handles its messages one at a time, so the
answers are worked out on threads (as the server's are) and the message handler returns at once: the page's
"status" question, answered on the kernel's own thread, gets through while a run compiles, and the page says
"compiling for N-token texts…" as the served page does.
"""

from __future__ import annotations

import json
import traceback
from concurrent.futures import ThreadPoolExecutor
from importlib import resources

from minibert.errors import InputError, MinibertError
from minibert.viz._html import views_script, workbench_script
from minibert.viz.workbench import MAX_TOKENS, Workbench

# ---- the notebook widget ----------------------------------------------------------------------------------

# The widget's front end: one ES module of the page's own scripts, the views' (their `render` and `el`) and workbench.js
# (`minibertWorkbench`), then renderWidget, which builds the workbench inside the widget's element with the page's
# requests sent to the kernel as messages {id, action, body}, answered with {id, answer} or {id, error}. Module scope
# keeps their names out of the page's globals, and nothing is evaluated from a string: front ends whose
# Content-Security-Policy forbids eval run it too. Each view of a widget numbers its messages under its own random
# tag (a widget shown twice hears both views' answers) and gives its elements ids under it, so any number of
# widgets, and views of one, live on one notebook page.
_WIDGET_MOUNT = """
function renderWidget({ model, el: host }) {  // host: the widget's element (el is common.js's)
  const tag = "wb" + Math.random().toString(36).slice(2, 10) + "-";
  const waiting = new Map();
  let next = 0;
  const answered = (message) => {
    const pending = waiting.get(message.id);
    if (!pending) return;
    waiting.delete(message.id);
    if (message.error) pending.reject(new Error(message.error)); else pending.resolve(message.answer);
  };
  model.on("msg:custom", answered);
  const send = (action, body) => new Promise((resolve, reject) => {
    const id = tag + next++;
    waiting.set(id, { resolve, reject });
    model.send({ id, action, body });
  });
  const style = document.createElement("style");
  style.textContent = model.get("css");
  const root = document.createElement("div");
  host.append(style, root);
  minibertWorkbench(root, JSON.parse(model.get("config")), { send, render, el, downloadControl, prefix: tag });
  return () => model.off("msg:custom", answered);
}
export default { render: renderWidget };
"""


def _static_text(name: str) -> str:
    return (resources.files("minibert.viz") / "static" / name).read_text(encoding="utf-8")


def explore(model, *, max_tokens: int = MAX_TOKENS):
    """The workbench as a notebook widget (JupyterLab, Notebook 7, VS Code): the page `minibert serve` shows,
    its requests answered by this kernel with `Workbench.answer`. Needs anywidget (pip install
    'minibert[notebook]'). A notebook page holds any number of them, each on its own."""
    try:
        import anywidget
        import traitlets
    except ImportError:
        raise InputError("viz.explore needs anywidget: pip install 'minibert[notebook]'.") from None
    workbench = Workbench(model, max_tokens=max_tokens)

    class Explorer(anywidget.AnyWidget):
        _esm = traitlets.Unicode("\n".join([views_script(), workbench_script(), _WIDGET_MOUNT])
                                 ).tag(sync=True)
        css = traitlets.Unicode(_static_text("views.css") + _static_text("workbench.css")).tag(sync=True)
        config = traitlets.Unicode().tag(sync=True)

    widget = Explorer(config=json.dumps({"models": [workbench.info()], "tour": False}))
    widget.workbench = workbench
    widget.answering = ThreadPoolExecutor(ANSWERING_THREADS, thread_name_prefix="explore")
    widget.on_msg(lambda _, content, buffers: answer(widget, content))
    return widget


ANSWERED_AT_ONCE = ("status", "info")  # wait for nothing: answered on the kernel's thread, between other messages
ANSWERING_THREADS = 4  # the page asks for a run, a step and the "why" panel at once; the workbench's locks order them


def answer(widget, message) -> None:
    """Send the widget the answer to one message: at once for ANSWERED_AT_ONCE, else from one of its threads, so
    that the kernel reads the next message (the page's "what compiles now?") while this one computes."""
    action = message.get("action") if isinstance(message, dict) else None
    if action in ANSWERED_AT_ONCE:
        widget.send(reply(widget.workbench, message))
    else:
        widget.answering.submit(_send_reply, widget, message)


def _send_reply(widget, message) -> None:
    try:
        widget.send(reply(widget.workbench, message))
    except Exception as error:  # a bug, not bad input: the page must still hear back (else it waits forever)
        traceback.print_exc()  # the kernel's log keeps the traceback
        widget.send({"id": (message if isinstance(message, dict) else {}).get("id"),
                     "error": f"the kernel failed to answer: {type(error).__name__}: {error}"})


def reply(workbench: Workbench, message) -> dict:
    """The widget's answer to one message {id, action, body}: {id, answer}, or {id, error} for bad input."""
    message = message if isinstance(message, dict) else {}
    try:
        return {"id": message.get("id"), "answer": workbench.answer(message.get("action", ""), message.get("body"))}
    except MinibertError as error:
        return {"id": message.get("id"), "error": " ".join(str(error).split())}
