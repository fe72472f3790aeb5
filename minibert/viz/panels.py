"""The workbench's panels: a section of the page that answers one JSON action of its own, computed only when the
page asks for it (after the run's tokens and views are drawn), declared as one `Panel` record and listed in one
table that the Workbench (its actions, locks and program names), the server and the page's scripts all read.

    PANEL = Panel("why", answer=why_answer, script="why_view.js", constructor="minibertWhy", programs=("why",))

A panel is one module in viz/ (its `answer(workbench, body) → dict`, on the Workbench's public API only:
`request`, `cached_run`, `padded_inputs`, `compiling`, `resource`) beside its drawing in viz/static/ (a function
`constructor(page) → {section(column, panel), show(panel, ticket)}`, workbench.js's `page` object: prefix,
state, send, body, el, number, choose, clear, and lazySection, which builds the section that asks when opened),
plus one line in `PANELS` below (the record, `Panel`, is viz/_panel.py's).
Tests register a toy one (`register`, `unregister`).
"""

from __future__ import annotations

from minibert.errors import InputError
from minibert.viz import changed, feature_panel, why
from minibert.viz._panel import Panel

__all__ = ["Panel", "constructors_script", "register", "scripts", "table", "unregister"]


PANELS = (why.PANEL, feature_panel.PANEL, changed.PANEL)  # one line per panel, in the page's order

_registered: dict[str, Panel] = {panel.name: panel for panel in PANELS}


def table() -> dict[str, Panel]:
    """{name: Panel}, in the page's order: PANELS, then any registered since."""
    return dict(_registered)


def register(panel: Panel) -> None:
    """Add a panel (a test's, a plug-in's) after the built-in ones; a workbench built afterwards answers it."""
    if panel.name in _registered:
        raise InputError(f"a panel named {panel.name!r} exists already; choose another name.")
    _registered[panel.name] = panel


def unregister(name: str) -> None:
    """Remove a registered panel (PANELS' own stay)."""
    if name not in {panel.name for panel in PANELS}:
        _registered.pop(name, None)


def scripts() -> tuple[str, ...]:
    """The panels' script files, in the page's order."""
    return tuple(panel.script for panel in table().values() if panel.script is not None)


def constructors_script() -> str:
    """The line after the panels' scripts that hands workbench.js their constructors, in the page's order."""
    names = [panel.constructor for panel in table().values() if panel.constructor is not None]
    return f"var MINIBERT_PANELS = [{', '.join(names)}];"
