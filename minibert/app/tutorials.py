"""The tutorials that ship with minibert, as notebooks: `minibert tutorial NAME` writes NAME.ipynb.

The tutorials are jupytext "percent" scripts: docs/tutorials/*.py in the repository, where the docs site
renders them, and the same files in the installed package as minibert/tutorials/*.percent (symbolic links
to docs/tutorials in the repository, which the build copies; not .py, so that they are no module of the
package for the linters and the library's own checks).
`notebook()` turns one into a Jupyter notebook (nbformat 4) without jupytext: a line `# %%` starts a code
cell and `# %% [markdown]` a Markdown cell whose lines lose their leading `# `; a commented IPython magic
(`# %matplotlib inline`) is uncommented in code cells, as jupytext does.

A tutorial states what it expects with `expect(holds, claim, otherwise)` rather than a bare assert: a
student who edits a cell sees which claim no longer holds and what that means, and the notebook runs on.
It finds a word's token with `position(tokens, word, instead)`, which says so and goes on when the student's
sentence lacks the word.
The test suite runs the tutorials with MINIBERT_TUTORIAL_CHECKS=strict, where a claim that fails raises.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from minibert.errors import DataFileError, InputError
from minibert.io.files import output_path, write_output

TUTORIALS = Path(__file__).resolve().parent.parent / "tutorials"
STRICT = "MINIBERT_TUTORIAL_CHECKS"  # set to "strict" (the test suite does): a failed expect() raises
HEADER = re.compile(r"\A# ---\n(?:#.*\n)*?# ---\n")  # jupytext's metadata block
CELL = re.compile(r"^# %%(?P<markdown> \[markdown\])?[^\n]*$", re.MULTILINE)
MAGIC = re.compile(r"^# (%[a-z])", re.MULTILINE)


class TutorialCheckFailed(AssertionError):
    """A tutorial's expectation failed under MINIBERT_TUTORIAL_CHECKS=strict (the test suite)."""


def expect(holds, claim: str, otherwise: str, *, untested: str | None = None) -> bool | None:
    """Print whether `claim` holds on the numbers just computed; if not, print `otherwise` — what that means
    and what to look at — and go on (raise under MINIBERT_TUTORIAL_CHECKS=strict). Returns whether it held.

    untested: why the numbers have nothing to test the claim on (a mask check over zero padded keys): then the
    line says "not tested" and why, never ✓ (a claim about nothing holds vacuously), and None is returned."""
    if untested is not None:
        print(f"– not tested: {claim}\n  {untested}")
        return None
    held = bool(holds)
    print(f"✓ {claim}" if held else f"✗ no longer true: {claim}\n  {otherwise}")
    if not held and os.environ.get(STRICT) == "strict":
        raise TutorialCheckFailed(f"{claim} — {otherwise}")
    return held


def position(tokens: list[str], word: str, instead: int) -> int:
    """Where `word` first is among `tokens` (a row of batch.tokens). A student who changed the sentence gets no
    ValueError but a line saying that `word` is gone and which token stands in for it: position `instead`, kept
    among the word tokens (not [CLS], not the last [SEP]), so the notebook runs on with their sentence."""
    if word in tokens:
        return tokens.index(word)
    chosen = min(max(instead, 1), max(len(tokens) - 2, 1))
    print(f"note: {word!r} is not among the tokens {tokens}; using position {chosen} ({tokens[chosen]!r}) instead. "
          f"Put a word of your sentence in place of {word!r} to choose another.")
    return chosen


def available() -> dict[str, Path]:
    """{name: file} of every shipped tutorial, in order ("06_context_mixing": …/06_context_mixing.py)."""
    return {path.stem: path for path in sorted(TUTORIALS.glob("[0-9]*.percent"))}


def find(name: str) -> Path:
    """The tutorial called `name`: its whole name, its number ("6" or "06") or the rest ("context_mixing")."""
    tutorials = available()
    wanted = name.removesuffix(".py").removesuffix(".ipynb").removesuffix(".percent")
    for stem, path in tutorials.items():
        number, _, rest = stem.partition("_")
        if wanted in (stem, number, rest) or (wanted.isascii() and wanted.isdigit() and int(wanted) == int(number)):
            return path
    raise InputError(f"no tutorial {name!r}; the tutorials are {', '.join(tutorials) or 'missing from this install'} "
                     f"(`minibert tutorial` lists them).")


def _cell(kind: str, lines: list[str]) -> dict:
    source = "\n".join(lines).strip("\n")
    cell = {"cell_type": kind, "metadata": {}, "source": source.splitlines(keepends=True)}
    return cell | ({"execution_count": None, "outputs": []} if kind == "code" else {})


def notebook(script: str) -> dict:
    """A jupytext percent script's text → a Jupyter notebook (nbformat 4) as a dict, ready for json.dump."""
    body = HEADER.sub("", script, count=1)
    marks = list(CELL.finditer(body))
    cells = []
    for mark, end in zip(marks, [*marks[1:], None]):
        text = body[mark.end():end.start() if end else len(body)]
        if mark["markdown"]:
            lines = [re.sub(r"^# ?", "", line) for line in text.strip("\n").splitlines()]
            cells.append(_cell("markdown", lines))
        else:
            cells.append(_cell("code", MAGIC.sub(r"\1", text).splitlines()))
    kernel = {"display_name": "Python 3", "language": "python", "name": "python3"}
    return {"cells": cells, "metadata": {"kernelspec": kernel, "language_info": {"name": "python"}},
            "nbformat": 4, "nbformat_minor": 4}


def write_notebook(name: str, output: Path | None = None) -> Path:
    """Write tutorial `name` as a notebook to `output` (default: ./NAME.ipynb); refuses to overwrite a file."""
    source = find(name)
    # The rule of every minibert writer (io.files.output_path), with no overwrite: a notebook you edited is never
    # replaced. Jupyter opens a notebook by its suffix: d.txt would open as text.
    output = output_path(source.stem + ".ipynb" if output is None else output, (".ipynb",), InputError,
                         replace_hint="remove it first (a notebook you edited is never overwritten)",
                         what="--output path")
    blocked = next((folder for folder in output.parents if folder.is_file()), None)
    if blocked is not None:
        raise DataFileError(f"{blocked} is a file, so {output} cannot be written inside it; pass another --output.")
    text = json.dumps(notebook(source.read_text(encoding="utf-8")), indent=1, ensure_ascii=False) + "\n"
    return write_output(output, lambda path: path.write_text(text, encoding="utf-8"), DataFileError)
