"""The package's layers: every import points down (or sideways within a layer), and `import minibert`
stays light (no matplotlib).

    app (cli, demo)  →  analysis, viz  →  api  →  model, hooks, tokenizer(s), checkpoint, sources, accounting
                     →  config  →  errors

Imports inside functions count too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import minibert

PACKAGE = Path(minibert.__file__).parent
LAYERS = {  # module (or subpackage) → layer, lowest first
    "minibert.errors": 0,
    "minibert.config": 1,
    **{f"minibert.{name}": 2 for name in ("model", "hooks", "tokenizer", "tokenizers_hf", "checkpoint", "sources",
                                          "accounting")},
    "minibert.api": 3,
    "minibert": 3,  # the package's __init__ re-exports the api and what it stands on
    "minibert.analysis": 4,
    "minibert.viz": 4,
    "minibert.app": 5,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    """The layer of a minibert module: its own entry, else its subpackage's. A new top-level module has
    none (it does not inherit the package's): place it in LAYERS."""
    while module not in LAYERS:
        parent = module.rsplit(".", 1)[0]
        if "." not in module or parent == "minibert":
            raise KeyError(f"{module} has no layer; add it to LAYERS in tests/test_layers.py")
        module = parent
    return LAYERS[module]


def imported_modules(path: Path) -> set[str]:
    """The minibert modules a file imports (`from minibert import viz` is minibert.viz; `from minibert
    import Model` is the package itself)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                is_module = (PACKAGE.parent / Path(*submodule.split("."))).with_suffix(".py").exists() \
                    or (PACKAGE.parent / Path(*submodule.split("."))).is_dir()
                found.add(submodule if is_module else node.module)
    return {name for name in found if name == "minibert" or name.startswith("minibert.")}


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer():
    assert SOURCES
    for path in SOURCES:
        layer(module_name(path))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: module_name(p))
def test_imports_point_down(path):
    module = module_name(path)
    upward = {name: layer(name) for name in imported_modules(path) if layer(name) > layer(module)}
    assert not upward, f"{module} (layer {layer(module)}) imports from layers above it: {upward}"


def test_layer_check_sees_an_upward_import(tmp_path):
    """The check itself can fail: a model.py importing the analyses is caught."""
    fake = PACKAGE / "model.py"
    source = "from minibert.analysis import heads\nfrom minibert import viz\nimport minibert.app.cli\n"
    (tmp_path / "model.py").write_text(source)
    found = imported_modules(tmp_path / "model.py")
    assert found == {"minibert.analysis.heads", "minibert.viz", "minibert.app.cli"}
    assert all(layer(name) > layer(module_name(fake)) for name in found)


def test_import_minibert_does_not_load_matplotlib():
    code = "import minibert, sys; assert 'matplotlib' not in sys.modules, 'matplotlib was imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
