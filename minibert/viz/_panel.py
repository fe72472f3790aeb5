"""`Panel`: the record one workbench panel declares (viz/panels.py lists them; docs/architecture.md says how to add
one). Apart from the table so that a panel's module imports the record without importing the other panels."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from minibert.errors import InputError


@dataclasses.dataclass(frozen=True)
class Panel:
    """name: the action (POST /api/NAME); answer(workbench, body) → a JSON-ready dict; script: its drawing in
    viz/static/ and constructor the function that file defines (both None: an action without a page part);
    lock: answers sharing a lock name run one at a time (None: the panel's own lock); programs: the names
    `status` reports while the panel's compiled programs compile (Workbench.compiling)."""

    name: str
    answer: Callable[[object, Mapping], dict]
    script: str | None = None
    constructor: str | None = None
    lock: str | None = None
    programs: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.name.isidentifier():
            raise InputError(f"a panel's name is its action in /api/NAME: a word of letters, digits and _; got "
                             f"{self.name!r}.")
        if (self.script is None) != (self.constructor is None):
            raise InputError(f"panel {self.name!r}: give its script and the constructor that script defines, or "
                             f"neither (an action without a page part).")
        if self.constructor is not None and not self.constructor.isidentifier():
            raise InputError(f"panel {self.name!r}: constructor {self.constructor!r} is not a JavaScript name.")
