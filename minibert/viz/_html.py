"""`View`: a self-contained interactive HTML view (inline JS and CSS, data as escaped JSON, no network).

One fragment is a `<div>` holding its own `<style>`, its data in a `<script type="application/json">`
and a script that draws into that `<div>` only, so several views on one page, or one view shown
twice, do not interfere. Every rendering gets a fresh element id. User text (tokens, titles)
reaches the page as JSON data set with `textContent`, or through `html.escape`; never as markup.

Arrays travel packed, one zlib-compressed base64 string per layer (the first axis), so a page of
512 tokens stays a few megabytes and the browser inflates a layer (`DecompressionStream`) only when
it is shown. Two codecs (`PACKINGS`):
  "unit_byte"  values in [0, 1] as round(255·v) in a byte: error ≤ 1/510 (attention, line opacity)
  "float32"    little-endian float32, bytes split into 4 planes so the sign/exponent bytes compress:
               exact for the model's fp32 values, relative rounding ≤ 2⁻²⁴ for float64 input
"""

from __future__ import annotations

import base64
import functools
import html
import json
import uuid
import zlib
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Literal

import numpy as np

from minibert.errors import VizError
from minibert.io.files import output_path, write_output


@cache
def _static(name: str) -> str:
    return (resources.files("minibert.viz") / "static" / name).read_text(encoding="utf-8")


# The views' scripts, in the order they join into one: the common part (el() and the other helpers), each view's own
# file, then boot and render.
VIEW_SCRIPTS = ("common.js", "head_view.js", "model_view.js", "neuron_view.js", "views.js")


def views_script() -> str:
    """The views' code as one script (VIEW_SCRIPTS joined): a standalone view, the workbench and its widget run it."""
    return "\n".join(_static(name) for name in VIEW_SCRIPTS)


# The workbench's own scripts (after the views'): the step-through and the tour, then its panels' (viz/panels.py's
# table) and the line handing workbench.js their constructors, then the page that builds them.
WORKBENCH_SCRIPTS = ("step_through.js", "tour.js", "workbench.js")


def workbench_script() -> str:
    """The workbench page's code as one script: minibert serve's page and the widget."""
    from minibert.viz import panels

    *before, page = WORKBENCH_SCRIPTS
    return "\n".join([*(_static(name) for name in (*before, *panels.scripts())), panels.constructors_script(),
                      _static(page)])


Packing = Literal["unit_byte", "float32"]
PACKINGS = ("unit_byte", "float32")
UNIT_BYTE_ERROR = 0.5 / 255  # largest |decoded − value| of the "unit_byte" packing
# zlib level of the packed layers: 6 for pages that are saved and shared; the live workbench sends its
# views over a local connection at every edit and uses 0 (stored, no compression: time matters there, size not).
ZLIB_LEVEL = 6


def _layer_bytes(layer: np.ndarray, packing: Packing) -> bytes:
    if packing == "unit_byte":
        return np.round(np.clip(layer, 0.0, 1.0) * 255).astype(np.uint8).tobytes()
    planes = np.ascontiguousarray(layer, "<f4").reshape(-1).view(np.uint8).reshape(-1, 4).T
    return planes.tobytes()


def _packed(layers: Sequence[np.ndarray], packing: Packing, level: int = ZLIB_LEVEL) -> dict:
    """{"packing", "shape" (of one layer), "layers": one base64(zlib(bytes)) string per layer}."""
    if packing not in PACKINGS:
        raise VizError(f"packing must be one of {PACKINGS}; got {packing!r}.")
    return {"packing": packing, "shape": list(np.shape(layers[0])),
            "layers": [base64.b64encode(zlib.compress(_layer_bytes(layer, packing), level)).decode("ascii")
                       for layer in layers]}


def _safe_json(value) -> str:
    """JSON that cannot end its <script> element or open a comment: <, > and & become \\u escapes."""
    text = json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


PAGE_STYLE = ("body{font-family:system-ui,sans-serif;margin:24px;max-width:1400px;color:#1f2328}"
              "img{max-width:100%;border:1px solid #d0d7de}figure{margin:0 0 28px}"
              "figcaption{color:#57606a;margin-top:4px}pre{background:#f6f8fa;padding:12px;overflow-x:auto}")


def page(title: str, body: str, style: str = PAGE_STYLE) -> str:
    """A standalone HTML page that loads nothing from the network; `title` is escaped here, `body` and
    `style` must already be HTML and CSS."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title><style>{style}</style></head>"
            f"<body>{body}</body></html>\n")


PAGE_SUFFIXES = (".html", ".htm")


def write_page(path: str | Path, text: str, overwrite: bool) -> Path:
    """Write the page `text` to `path` (.html or .htm), by the rule of every minibert writer (io.files.output_path):
    a file already there is the user's, so it is replaced only when asked."""
    path = output_path(path, PAGE_SUFFIXES, VizError, overwrite=overwrite)
    return write_output(path, lambda p: p.write_text(text, encoding="utf-8"), VizError)


class View:
    """An interactive view: shows inline in Jupyter, JupyterLab and VS Code; `.save(path)` writes a page.

    `.html` is an HTML fragment (a `<div>` with everything inlined), `.page()` a full page.
    """

    def __init__(self, kind: str, meta: Mapping, arrays: Mapping[str, tuple[Sequence[np.ndarray], Packing]], *,
                 title: str, theme: str, level: int = ZLIB_LEVEL):
        """arrays: name -> (its layers: equal-shaped arrays, or one array by its first axis; a packing).

        See the module docstring for the packings; `level`: their zlib compression level (ZLIB_LEVEL).
        """
        self.kind = kind
        self.title = title
        self.theme = theme
        # Encoded once; each rendering only adds a fresh id. `data` is what views.js draws from: the workbench
        # (minibert serve, viz.explore) sends it as JSON to a page that renders it with the same code.
        packed = {name: _packed(array, packing, level) for name, (array, packing) in arrays.items()}
        self.data = {"kind": kind, "meta": dict(meta), "arrays": packed}

    @functools.cached_property
    def _data(self) -> str:
        """`data` as JSON safe inside <script>, encoded at the first rendering (the workbench sends `data` only)."""
        return _safe_json(self.data)

    @property
    def html(self) -> str:
        """The fragment: a self-contained `<div>` with a new unique id."""
        element_id = "mbv-" + uuid.uuid4().hex[:12]
        return (
            f'<div id="{element_id}" class="mbv mbv-{self.theme}" data-mbv-kind="{self.kind}">'
            f"<style>{_static('views.css')}</style>"
            f'<div class="mbv-title">{html.escape(self.title)}</div>'
            '<div class="mbv-fallback">This interactive view needs JavaScript '
            "(in Jupyter: run the cell, or trust the notebook).</div>"
            f'<script type="application/json" class="mbv-data">{self._data}</script>'
            f"<script>(function () {{\n{views_script()}\nboot(document.currentScript, "
            f'"{element_id}");\n}})();</script>'
            "</div>"
        )

    def _repr_html_(self) -> str:
        return self.html

    @staticmethod
    def library() -> str:
        """The views' scripts and views.css for a page that draws views from data it fetches (the workbench): a
        `<style>` and a script defining `window.minibertViews.render(root, data)`, root an element of class
        "mbv", data a View's `.data`, and `window.minibertViews.el`, the one el() the page's own script uses (and its
        downloadControl, the step-through's figure buttons)."""
        return (f"<style>{_static('views.css')}</style>"
                f"<script>(function () {{\n{views_script()}\nwindow.minibertViews = "
                "{render: render, el: el, downloadControl: downloadControl};\n})();"
                "</script>")

    def page(self) -> str:
        """A standalone HTML page holding this view; it loads nothing from the network."""
        background = "#0d1117" if self.theme == "dark" else "#ffffff"
        return page(self.title, self.html, style=f"body{{margin:16px;background:{background}}}")

    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Write the standalone page to `path` (e.g. 'head_view.html'); returns the path. An existing file is
        refused unless overwrite=True."""
        return write_page(path, self.page(), overwrite)


    def __repr__(self) -> str:
        return f"<minibert View {self.kind!r}: {self.title!r}>"
