"""The lab's tutorials (1 to 4: docs/teaching.md) against the edits students make in the room — one sentence,
three sentences, texts of different lengths, another layer and head, a word the text no longer has, punctuation
only, non-English text. docs/teaching.md promises "✗ no longer true" lines for such edits, never a crash, and a
claim printed with ✓ only where there was something to test.

The tutorials' cells run in this process (one model load, JAX's compiled programs shared between the edits) and
as a student runs them (expect() prints; MINIBERT_TUTORIAL_CHECKS is not strict). Cells whose cost is a sweep
over every head and that no edit can break on its own (they read only arrays of a fixed shape [L, H]) are left
out and named in SKIPPED; the whole tutorials, edited, also run in test_tutorials.py (slow)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from minibert.app import tutorials

ROOT = Path(__file__).resolve().parent.parent
PAGES = {page.stem[:2]: page for page in (ROOT / "docs" / "tutorials").glob("0[1234]_*.py")}

# A cell is left out when it contains one of these (the sweeps over every head, their figures, the loop over
# layers): each reads only [L, H] grids, whatever the text.
SKIPPED = {"04": ("ablation_sweep(model, pair", "for ax, grid, name in zip", "all heads of layer")}


def run_edited(number: str, edits: list[tuple[str, str]], monkeypatch) -> str:
    """Run tutorial `number` with each (old, new) replaced once; return what it printed."""
    import matplotlib
    import matplotlib.pyplot as plt

    matplotlib.use("Agg")
    monkeypatch.delenv(tutorials.STRICT, raising=False)
    source = PAGES[number].read_text(encoding="utf-8")
    for old, new in edits:
        assert source.count(old) == 1, f"tutorial {number} no longer has {old!r} once: update the edits"
        source = source.replace(old, new)
    page = Path("edited.py")
    namespace = {"__name__": "__main__"}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        for cell in code_cells_of(source):
            if any(marker in cell for marker in SKIPPED.get(number, ())):
                continue
            try:
                exec(compile(cell, str(page), "exec"), namespace)
            except Exception as error:
                raise AssertionError(f"tutorial {number} with {edits} crashed in the cell\n{cell}\n"
                                     f"--- printed (end) ---\n{printed.getvalue()[-3000:]}") from error
            finally:
                plt.close("all")
    return printed.getvalue()


def code_cells_of(source: str) -> list[str]:
    """The code cells of a percent script's text, in order, without IPython's magics (`%matplotlib inline`)."""
    notebook = tutorials.notebook(source)
    cells = ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code"]
    return ["".join(line for line in cell.splitlines(keepends=True) if not line.startswith("%")) for cell in cells]


# Each run combines edits that touch different cells, so that every edit of the list is run and the runs stay few.
ONE = 'sentences = ["The cat sat on the mat.", "The quick brown fox jumps over the lazy dog."]'
T1 = {
    "one sentence, another layer and head": [(ONE, 'sentences = ["The quick brown fox jumps over the lazy dog."]'),
                                             ("LAYER, HEAD = 0, 2", "LAYER, HEAD = 4, 11")],
    "three sentences, the padded one in the middle, words not in the text": [
        (ONE, 'sentences = ["Dogs bark at night.", "Birds sing.", "A long sentence about the old house."]')],
    "same lengths": [(ONE, 'sentences = ["The cat sat on the mat.", "The dog sat on the rug."]')],
    "punctuation only, non-English": [(ONE, 'sentences = ["?!", "Der braune Fuchs: 猫がマットの上に座った。"]')],
}

@pytest.mark.slow  # the tutorial's cells on the bundled checkpoint: ~10 s on a loaded 2-core machine
@pytest.mark.parametrize("edit", T1, ids=list(T1))
def test_tutorial_one_survives_a_students_edit(edit, monkeypatch):
    printed = run_edited("01", T1[edit], monkeypatch)
    # Nothing to test must not print ✓: a sentence with no padding has no padded key to look at.
    padded = [int(n) for n in re.findall(r"the (\d+) \[PAD\] keys", printed)]
    if not padded or padded == [0]:
        assert "✓ padded keys get exactly zero attention" not in printed, printed
        assert "✓ every score at a padded key holds the mask value" not in printed, printed
        assert "not tested" in printed, printed
    # "where each token looks" lists real tokens only
    assert "[PAD] →" not in printed, printed


def test_tutorial_one_says_its_claims_print_rather_than_assert():
    text = PAGES["01"].read_text(encoding="utf-8")
    assert "is checked by an\n# `assert`" not in text and "checked by an `assert`" not in text


def test_tutorial_two_describes_broad_as_the_library_does():
    """behaviour_labels' "broad" is relative to the uniform entropy ln n (docs/definitions.md): the text said no
    head passes 3.8 nats here while the cell above it counted 11 broad heads."""
    text = PAGES["02"].read_text(encoding="utf-8")
    assert '"broad" above 3.8 nats of entropy' not in text
    assert "no head can be\n# \"broad\" by the 3.8-nat rule" not in text
    assert "uniform_entropy" in text and "BROAD_FRACTION" in text


PAIR = '["The company said profits rose sharply.", "Profits climbed steeply, the firm said."]'
CLEAN, CORRUPT = '"The film was wonderful."', '"The film was terrible."'
T4 = {
    "one sentence, clean and corrupted of different lengths": [
        (PAIR, '["The company said profits rose sharply."]'), (CORRUPT, '"The film was not wonderful at all."')],
    "three sentences, corrupted shorter, another layer and head": [
        (PAIR, '["Profits rose.", "The firm said profits climbed.", "It rained."]'),
        (CLEAN, '"The long film was truly wonderful."'), ("LAYER, HEAD = 3, 7", "LAYER, HEAD = 0, 0")],
    "punctuation only, non-English": [(PAIR, '["?", "会社は利益が急増したと述べた。"]'),
                                      (CLEAN, '"Der Film war wunderbar."'), (CORRUPT, '"!"')],
}


@pytest.mark.slow  # the tutorial's cells but its sweeps: ~20 s on a loaded 2-core machine
@pytest.mark.parametrize("edit", T4, ids=list(T4))
def test_tutorial_four_survives_a_students_edit(edit, monkeypatch):
    printed = run_edited("04", T4[edit], monkeypatch)
    assert "similarity to the probe" in printed and "∂similarity/∂pattern" in printed, printed


@pytest.mark.slow  # the tutorial's cells but its sweeps: ~20 s on a loaded 2-core machine
def test_tutorial_four_with_no_difference_tests_nothing_about_patching(monkeypatch):
    """Corrupted = clean: every patching claim is about a zero difference, so none may print ✓ or ✗ (the lecturer
    saw ✓ "patching the changed position gives the clean run's value" with both values equal)."""
    printed = run_edited("04", [(CORRUPT, CLEAN)], monkeypatch)
    assert "✗ no longer true: the clean and corrupted texts differ in at least one token" in printed, printed
    for claim in ("at layer 0, patching the changed position gives the clean run's value",
                  "at layer 0, patching any other position leaves the corrupted value",
                  "attribution patching ranks hook_attn_out's cells as real patching does",
                  "on the one large change the first-order estimate misses ≥ 30%"):
        assert f"– not tested: {claim}" in printed, (claim, printed)
        assert f"✓ {claim}" not in printed and f"✗ no longer true: {claim}" not in printed, (claim, printed)


@pytest.mark.slow  # tutorial 3's cells on the bundled checkpoint: ~15 s on a loaded 2-core machine
def test_tutorial_three_leaves_out_a_sentence_without_its_word(monkeypatch):
    """docs/teaching.md: a word the tutorial looks for and no longer finds gives a note, never a traceback."""
    printed = run_edited("03", [('"I made the mistake.", ', '"I made the error.", ')], monkeypatch)
    assert "note: 'I made the error.' has no word 'mistake'" in printed, printed
    assert "attention to 'mistake' spreads out" in printed, printed  # the cells after it ran


FIRST = ('first = ["The cat sat on the mat.", "She bought three apples at the market.", '
         '"The train left the station late.",\n         "He wrote a long letter to his aunt.", '
         '"Rain fell on the quiet town all night.",\n         "The children played football in the park."]')
SECOND = ('second = ["It was warm in the sun.", "They were fresh and cheap.", "Everyone missed the meeting.",\n'
          '          "She never answered it.", "By morning the streets were flooded.", '
          '"Their parents watched from a bench."]')


@pytest.mark.slow  # tutorial 2's cells on the bundled checkpoint: ~15 s on a loaded 2-core machine
def test_tutorial_two_pairs_lists_of_different_lengths_with_a_note(monkeypatch):
    """The lab plan's edit (minutes 32-41): three sentences A and two B were a TokenizerError traceback."""
    printed = run_edited("02", [(FIRST, 'first = ["The cat sat.", "She bought apples.", "The train left late."]'),
                                (SECOND, 'second = ["It was warm.", "They were cheap."]')], monkeypatch)
    assert "note: `first` has 3 sentences and `second` 2; using the first 2 pairs." in printed, printed


def test_teaching_installs_clean_notebooks_and_states_measured_times():
    """docs/teaching.md's install gave notebooks a red TqdmWarning (no ipywidgets without the notebook extra), said
    30 s where an empty pip cache took minutes, and fitted neither Windows nor a machine without `python3.11`."""
    import tomllib

    text = (ROOT / "docs" / "teaching.md").read_text(encoding="utf-8")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert any(requirement.startswith("ipywidgets") for requirement in extras["notebook"])
    installs = re.findall(r"""pip install ['"]\.\[([a-z,]+)\]['"]""", text)
    assert len(installs) >= 2 and all("notebook" in extra.split(",") and "serve" in extra.split(",")
                                      for extra in installs), installs
    assert "python3.11 -m venv .venv && " not in text  # a name many machines lack: python3, with the version said
    assert "Scripts\\Activate.ps1" in text and "py -3.11 -m venv" in text  # Windows
    assert "--host" in text and "shared server" in text.lower()
    assert "empty pip cache" in text and "| 30 s |" not in text
