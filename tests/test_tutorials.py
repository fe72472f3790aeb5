"""The tutorials in docs/tutorials and the findings page run top to bottom (their asserts are their checks) and
are in the site's nav."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, str(tutorial)], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=900)
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
