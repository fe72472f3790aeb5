"""The tutorials in docs/tutorials and the findings page run top to bottom (their expect() claims are their
checks, strict under the test suite) and are in the site's nav; the package ships them and writes them as
notebooks without jupytext."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from minibert.app import cli, tutorials

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = sorted((ROOT / "docs" / "tutorials").glob("*.py"))
PAGES = [*TUTORIALS, ROOT / "docs" / "findings.py"]  # every executed page of the site


def nav_pages(nav) -> list[str]:
    """Every page path in an mkdocs `nav` (nested lists of {title: path or list})."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return [page for item in nav or [] for page in nav_pages(item)]


def test_there_are_tutorials():
    assert len(TUTORIALS) >= 3, [p.name for p in TUTORIALS]


@pytest.mark.slow  # a fresh interpreter runs a whole notebook
@pytest.mark.parametrize("tutorial", PAGES, ids=lambda path: path.stem)
def test_tutorial_runs(tutorial, tmp_path):
    """A fresh interpreter, headless matplotlib, offline, in an empty directory: exit 0 and write nothing there."""
    env = {**os.environ, "MPLBACKEND": "Agg", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           tutorials.STRICT: "strict",  # a claim of expect() that fails raises
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    # The timeout guards against a hang only: tutorial 7 fine-tunes MiniLM twice, many minutes on a loaded machine.
    result = subprocess.run([sys.executable, str(tutorial)], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=1800)
    assert result.returncode == 0, (f"{tutorial.name} exited with {result.returncode}\n"
                                    f"--- stdout (end) ---\n{result.stdout[-3000:]}\n"
                                    f"--- stderr (end) ---\n{result.stderr[-6000:]}")
    assert not list(tmp_path.iterdir()), f"{tutorial.name} wrote into its working directory: {list(tmp_path.iterdir())}"


def test_every_tutorial_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = nav_pages(config["nav"])
    missing = [p.name for p in PAGES if str(p.relative_to(ROOT / "docs")) not in pages]
    assert not missing, f"add these tutorials to the nav in mkdocs.yml: {missing}"
    for page in pages:
        assert (ROOT / "docs" / page).exists(), f"mkdocs.yml's nav names {page}, which is not in docs/"


# ---- a student's own sentences, layer and head -------------------------------------------------------------

# What a student changes in each tutorial: (text of the tutorial, what they put instead): example sentences replaced
# by others of other words and lengths, and the layer and head where a tutorial sets them by hand (the others
# choose theirs from the numbers). Every tutorial has an entry, and every entry must still be in its tutorial.
VARIANTS = {
    "01_one_head_by_hand": [
        ('sentences = ["The cat sat on the mat.", "The quick brown fox jumps over the lazy dog."]',
         'sentences = ["A dog slept under the old wooden table for most of the long afternoon.", "Birds sing."]'),
        ("LAYER, HEAD = 0, 2", "LAYER, HEAD = 1, 5")],
    "02_patterns": [
        ('first = ["The cat sat on the mat.", "She bought three apples', 'first = ["My brother never reads the '
         'newspapers that arrive on Sunday mornings.", "She bought three apples'),
        ('"The children played football in the park near the old church."', '"Snow covered every roof."')],
    "03_heads_to_meaning": [
        ('"I made the mistake."', '"We all made a terrible mistake yesterday evening."'),
        ('"It\'s fine."', '"It is perfectly fine by me."')],
    "04_intervening": [
        ('["The company said profits rose sharply.", "Profits climbed steeply, the firm said."]',
         '["Rain is expected tomorrow.", "The forecast says that it will probably rain all day tomorrow."]'),
        ('"The film was wonderful."', '"That long novel felt truly wonderful to me."'),
        ('"The film was terrible."', '"That long novel felt truly terrible to me."'),
        ("LAYER, HEAD = 3, 7", "LAYER, HEAD = 1, 4")],
    "05_your_own_checkpoint": [
        ('"What a wonderful film."', '"Absolutely nobody in the audience enjoyed the second half of that show."')],
    "06_context_mixing": [
        ('["what do you think of the food ?"], ["the food was great but the service was slow ."]',
         '["is the room quiet ?"], ["the staff were kind , yet the room by the lift was never quiet at night ."]')],
    "07_finetuning": [
        ('QUESTION = "what do you think of the {a} ?"', 'QUESTION = "how would you rate the {a} , all in all ?"')],
    "08_probes_and_saes": [
        ("sentences = syntax.read_conllu(syntax.sample_treebank())",
         "sentences = syntax.read_conllu(syntax.sample_treebank())[1::2]")],
    "09_circuits": [
        ('QUESTION = "what do you think of the {a} ?"', 'QUESTION = "how would you rate the {a} , all in all ?"')],
    "10_features_and_graphs": [
        ('TEXT = "the battery on this phone is excellent ."', 'TEXT = "sadly , my old phone had a weak battery ."')],
    "11_model_diffing": [
        ('QUESTION = "what do you think of the {a} ?"', 'QUESTION = "how would you rate the {a} , all in all ?"')],
}


def test_every_tutorial_has_a_students_variant():
    assert sorted(VARIANTS) == [p.stem for p in TUTORIALS]
    for page in TUTORIALS:
        source = page.read_text(encoding="utf-8")
        for old, _ in VARIANTS[page.stem]:
            assert source.count(old) == 1, f"{page.name} no longer has {old!r} once: update VARIANTS"
        hand_set = re.search(r"^LAYER, HEAD = .*$", source, re.MULTILINE)
        assert not hand_set or any(old == hand_set.group() or old in hand_set.group()
                                   for old, _ in VARIANTS[page.stem]), f"{page.name}: change its LAYER, HEAD too"


@pytest.mark.slow  # a fresh interpreter runs a whole notebook
@pytest.mark.parametrize("tutorial", TUTORIALS, ids=lambda path: path.stem)
def test_tutorial_runs_with_a_students_sentences(tutorial, tmp_path):
    """The tutorial with VARIANTS' sentences, layer and head, run as a student runs it (a claim that no longer holds
    is printed with what it means, and the notebook goes on): it runs to the end, or stops at an expect() claim
    that explains (a TutorialCheckFailed) — never at a ValueError of a word that is gone."""
    source = tutorial.read_text(encoding="utf-8")
    for old, new in VARIANTS[tutorial.stem]:
        source = source.replace(old, new)
    script = tmp_path / "variant" / tutorial.name
    script.parent.mkdir()
    script.write_text(source, encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    env = {key: value for key, value in os.environ.items() if key != tutorials.STRICT}
    env |= {"MPLBACKEND": "Agg", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, str(script)], cwd=work, env=env, capture_output=True, text=True,
                            timeout=1800)
    last = result.stderr.strip().splitlines()[-1:] or [""]
    assert result.returncode == 0 or last[0].startswith("minibert.app.tutorials.TutorialCheckFailed"), (
        f"{tutorial.name} with a student's sentences exited with {result.returncode}\n"
        f"--- stdout (end) ---\n{result.stdout[-3000:]}\n--- stderr (end) ---\n{result.stderr[-6000:]}")


def test_readme_links_every_tutorial_and_installs_from_a_clone():
    """The README's tutorial list is the shipped one (it listed 6 of 8), and its install lines work from a clone."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in TUTORIALS if f"](docs/tutorials/{p.name})" not in readme]
    assert not missing, f"README.md does not link {missing}"
    for page in (ROOT / "README.md", ROOT / "docs" / "serve.md"):
        installs = re.findall(r"pip install '([^']*)'", page.read_text(encoding="utf-8"))
        assert installs and all(extra.startswith(".[") for extra in installs), (page.name, installs)


def test_tutorial_one_says_large_scores_make_the_softmax_peaked():
    """Students read "flat" as uniform: large scores make the softmax peaked (and saturated), not flat."""
    text = (ROOT / "docs" / "tutorials" / "01_one_head_by_hand.py").read_text(encoding="utf-8")
    assert "flat," not in text and "peaked" in text


def test_position_finds_a_word_or_says_which_token_stands_in(capsys):
    tokens = ["[CLS]", "the", "cat", "sat", "[SEP]"]
    assert tutorials.position(tokens, "sat", instead=1) == 3 and capsys.readouterr().out == ""
    assert tutorials.position(tokens, "dog", instead=9) == 3  # kept among the word tokens
    assert "'dog' is not among the tokens" in capsys.readouterr().out
    assert tutorials.position(tokens, "dog", instead=0) == 1


# ---- what a student meets: labels, checks, positions -------------------------------------------------------

HAND_LABEL = re.compile(r"\{[^{}]*\}-\{[^{}]*\}")  # "{layer}-{head}" formatted by hand in an f-string
TYPED_LABEL = re.compile(r"\bheads? \d+-\d+", re.IGNORECASE)  # "head 3-7" typed into code, e.g. a print
# A token position typed as a number (query = 5, query_index=5): it points elsewhere once the text is edited.
NAME = r"(?:(?:query|key|position|token)\w*|t|s)"  # t, s: query and key positions in the tutorials' equations
TYPED_POSITION = re.compile(rf"^\s*{NAME}(?:\s*,\s*{NAME})*\s*=\s*\d+(?:\s*,\s*\d+)*\s*(#.*)?$|\w*_index=\d")
EXPLAINED = [p for p in TUTORIALS if p.name[:2] in {"01", "02", "03", "04", "05", "06", "07"}]


def code_lines(page: Path):
    """(line number, line) of a page's code: not its comments or Markdown cells."""
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if not line.lstrip().startswith("#"):
            yield number, line


def test_pages_label_heads_only_through_head_label():
    """One convention: "L-H" 1-indexed from config.head_label. Tutorials used to print "0-2" (0-indexed, by hand)
    next to best_heads' "1-11", and tutorial 4 printed "head 3-7" for 0-indexed (3, 7), whose label is 4-8."""
    offenders = [f"{page.name}:{number}: {line.strip()}" for page in PAGES for number, line in code_lines(page)
                 if HAND_LABEL.search(line) or TYPED_LABEL.search(line)]
    assert not offenders, offenders


def test_tutorials_find_token_positions_in_the_text():
    """A student who edits a sentence keeps a working notebook: positions come from the tokens (tokens.index)."""
    offenders = [f"{page.name}:{number}: {line.strip()}" for page in PAGES for number, line in code_lines(page)
                 if TYPED_POSITION.search(line)]
    assert not offenders, offenders


def test_tutorials_explain_their_checks_instead_of_bare_asserts():
    """A student who edits a cell gets expect()'s explanation, not an AssertionError with no words — a bare
    assert or NumPy's assert_* alike. Tutorial 1 keeps np.testing: its lesson is that each step written by hand
    equals the hook's value, whatever the text, so that running the file is a test."""
    offenders = [f"{page.name}:{number}" for page in EXPLAINED for number, line in code_lines(page)
                 if line.lstrip().startswith("assert ")
                 or ("np.testing.assert" in line and not page.name.startswith("01_"))]
    assert not offenders, offenders


def test_expect_explains_and_goes_on_unless_strict(capsys, monkeypatch):
    monkeypatch.delenv(tutorials.STRICT, raising=False)
    assert tutorials.expect(1 > 0, "one is positive", "never shown") is True
    assert tutorials.expect(0 > 1, "zero is positive", "it is not; see above") is False
    assert capsys.readouterr().out == "✓ one is positive\n✗ no longer true: zero is positive\n  it is not; see above\n"
    monkeypatch.setenv(tutorials.STRICT, "strict")
    with pytest.raises(tutorials.TutorialCheckFailed, match="zero is positive — it is not"):
        tutorials.expect(0 > 1, "zero is positive", "it is not")


# ---- shipped as notebooks ------------------------------------------------------------------------------------

def test_the_package_ships_every_tutorial():
    """minibert/tutorials/NAME.percent are links to docs/tutorials/NAME.py (the wheel holds their content)."""
    shipped = tutorials.available()
    assert list(shipped) == [p.stem for p in TUTORIALS]
    for page in TUTORIALS:
        assert shipped[page.stem].read_bytes() == page.read_bytes(), page.name


@pytest.mark.parametrize("tutorial", TUTORIALS, ids=lambda path: path.stem)
def test_notebook_has_the_cells_jupytext_makes(tutorial):
    import jupytext
    expected = jupytext.read(tutorial)
    ours = tutorials.notebook(tutorial.read_text(encoding="utf-8"))
    assert [c["cell_type"] for c in ours["cells"]] == [c.cell_type for c in expected.cells]
    for mine, theirs in zip(ours["cells"], expected.cells):
        assert "".join(mine["source"]) == theirs.source


def test_minibert_tutorial_writes_a_valid_notebook_and_never_overwrites(tmp_path, capsys):
    import nbformat
    output = tmp_path / "six.ipynb"
    assert cli.main(["tutorial", "6", "--output", str(output)]) == 0
    notebook = nbformat.reads(output.read_text(encoding="utf-8"), as_version=4)
    nbformat.validate(notebook)
    assert json.loads(output.read_text(encoding="utf-8"))["cells"][0]["source"][0].startswith("# 6. Context mixing")
    assert cli.main(["tutorial", "context_mixing", "--output", str(output)]) == cli.USER_ERROR  # exists: refused
    assert cli.main(["tutorial", "nonsense"]) == cli.USER_ERROR
    assert "06_context_mixing" in capsys.readouterr().err
    assert cli.main(["tutorial"]) == 0 and "01_one_head_by_hand" in capsys.readouterr().out
