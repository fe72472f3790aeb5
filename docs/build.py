"""Build the docs site into site/, executing every tutorial.

Regenerates docs/hooks.md from the code, then runs `mkdocs build --strict`, which executes every
tutorial in docs/tutorials through mkdocs-jupyter (a failing cell fails the build).

    ./dev.sh docs                           # installs the `docs` extra, then runs this file
    .venv/bin/python docs/build.py --serve  # the same, then a live preview at http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def regenerate_hook_table() -> None:
    sys.path.insert(0, str(ROOT))
    from minibert.app.cli import main as minibert_cli

    minibert_cli(["hooks", "--output", str(ROOT / "docs" / "hooks.md")])


def kernel_environment() -> dict[str, str]:
    """The environment mkdocs and the tutorials' kernels run in: minibert importable, figures inline, offline."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("MPLBACKEND", None)  # the kernel's inline backend puts figures on the page
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("NO_MKDOCS_2_WARNING", "1")  # Material's banner about MkDocs 2.0; not about this site
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help="after building, serve the site with live reload")
    args = parser.parse_args(argv)
    regenerate_hook_table()
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(ROOT / "site")]
    result = subprocess.run(command, cwd=ROOT, env=kernel_environment())
    if result.returncode != 0 or not args.serve:
        return result.returncode
    return subprocess.run([sys.executable, "-m", "mkdocs", "serve"], cwd=ROOT, env=kernel_environment()).returncode


if __name__ == "__main__":
    sys.exit(main())
