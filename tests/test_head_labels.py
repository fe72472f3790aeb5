"""One "L-H" convention (issue 19 C11): a head's label is 1-indexed, built in one place (config.head_label) on
the Python side, and every label the pages' JavaScript builds says which counting it uses right beside it."""

from __future__ import annotations

import re
from pathlib import Path

from minibert.core.config import head_label

PACKAGE = Path(__file__).resolve().parent.parent / "minibert"
PYTHON_LABEL = re.compile(r"\{[^{}]*\+ ?1\}-\{[^{}]*\+ ?1\}")  # f"{layer + 1}-{head + 1}" written by hand
JS_LABEL = re.compile(r"\+ 1\) \+ \"-\" \+ \(")  # (layer + 1) + "-" + (head + 1)
STATED = re.compile(r"[01]-indexed")


def test_head_label_is_one_indexed():
    assert head_label(0, 3) == "1-4" and head_label(2, 5) == "3-6"


def test_python_builds_labels_only_in_head_label():
    offenders = [f"{path.relative_to(PACKAGE)}:{number}" for path in sorted(PACKAGE.rglob("*.py"))
                 if path.name != "config.py"
                 for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if PYTHON_LABEL.search(line)]
    assert not offenders, offenders


def test_every_javascript_label_states_its_counting_beside_it():
    """The workbench's head grid and its list of ablated heads printed "4-8" with nothing saying 1-indexed while
    requests and tooltips count from 0: each label built in the pages' JavaScript has "1-indexed" or
    "0-indexed" (a tooltip with the 0-indexed numbers) on its line or the three before."""
    offenders = []
    for path in sorted((PACKAGE / "viz" / "static").glob("*.js")):
        lines = path.read_text(encoding="utf-8").splitlines()
        offenders += [f"{path.name}:{i + 1}: {line.strip()}" for i, line in enumerate(lines)
                      if JS_LABEL.search(line) and not STATED.search(" ".join(lines[max(0, i - 3):i + 1]))]
    assert not offenders, offenders
