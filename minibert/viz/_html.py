"""`View`: a self-contained interactive HTML view (inline JS and CSS, data as escaped JSON, no network).

One fragment is a `<div>` holding its own `<style>`, its data in a `<script type="application/json">`
and a script that draws into that `<div>` only, so several views on one page, or one view shown
twice, do not interfere. Every rendering gets a fresh element id. User text (tokens, titles)
reaches the page as JSON data set with `textContent`, or through `html.escape`; never as markup.
"""

from __future__ import annotations

import html
import json
import uuid
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Mapping

import numpy as np

from minibert.viz.report import page


@cache
def _static(name: str) -> str:
    return (resources.files("minibert.viz") / "static" / name).read_text(encoding="utf-8")


def _numbers(array: np.ndarray, digits: int) -> str:
    """A JSON list of the flattened array, each number rounded to `digits` significant digits."""
    spec = f".{digits}g"
    return "[" + ",".join(format(v, spec) for v in np.asarray(array, np.float64).ravel().tolist()) + "]"


def _safe_json(value) -> str:
    """JSON that cannot end its <script> element or open a comment: <, > and & become \\u escapes."""
    text = json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


class View:
    """An interactive view: shows inline in Jupyter, JupyterLab and VS Code; `.save(path)` writes a page.

    `.html` is an HTML fragment (a `<div>` with everything inlined), `.document()` a full page.
    """

    def __init__(self, kind: str, meta: Mapping, arrays: Mapping[str, tuple[np.ndarray, int]], *,
                 title: str, theme: str):
        self.kind = kind
        self.title = title
        self.theme = theme
        # Encoded once; each rendering only adds a fresh id.
        parts = [f'"{name}":{_numbers(array, digits)}' for name, (array, digits) in arrays.items()]
        self._data = '{"kind":' + _safe_json(kind) + ',"meta":' + _safe_json(dict(meta)) + \
                     ',"arrays":{' + ",".join(parts) + "}}"

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
            f"<script>(function () {{\n{_static('views.js')}\nboot(document.currentScript, "
            f'"{element_id}");\n}})();</script>'
            "</div>"
        )

    def _repr_html_(self) -> str:
        return self.html

    def document(self) -> str:
        """A standalone HTML page holding this view; it loads nothing from the network."""
        background = "#0d1117" if self.theme == "dark" else "#ffffff"
        return page(self.title, self.html, style=f"body{{margin:16px;background:{background}}}")

    def save(self, path: str | Path) -> Path:
        """Write the standalone page to `path` (e.g. 'head_view.html'); returns the path."""
        path = Path(path)
        path.write_text(self.document(), encoding="utf-8")
        return path

    def __repr__(self) -> str:
        return f"<minibert View {self.kind!r}: {self.title!r}>"
