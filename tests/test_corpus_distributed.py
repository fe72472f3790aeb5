"""corpus.distributed in one process: the settings a multi-process survey checks before it starts, and where
jax.distributed is started (tests/test_distributed.py runs real processes)."""

from __future__ import annotations

import pytest

from minibert.analysis import corpus
from minibert.app import distributed


@pytest.mark.parametrize("texts, pairs, settings, message", [
    (["A."], None, {"reduce": "both"}, "reduce must be 'global'"),
    (["A."], None, {"every": 0}, "every .* must be at least 1"),
    (["A."], None, {"timeout": 0}, "timeout .* positive"),
    (["A."], True, {}, "pairs=True reads a corpus file's lines"),
])
def test_bad_scale_out_inputs(bundled, texts, pairs, settings, message):
    with pytest.raises(ValueError, match=message):
        corpus.survey(bundled, texts, pairs, progress=False, **settings)


def test_initialize_names_missing_settings(monkeypatch):
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="JAX_NUM_PROCESSES, JAX_PROCESS_ID not set"):
        distributed.initialize("localhost:1234")
    with pytest.raises(RuntimeError, match=r"process id 2 must lie in 0 … 1"):
        distributed.initialize("localhost:1234", 2, 2)


def test_corpus_initialize_is_gone():
    """0.4 removed the 0.2 alias (CHANGELOG.md): starting jax.distributed is minibert.app.distributed.initialize's."""
    assert not hasattr(corpus, "initialize") and not hasattr(corpus.distributed, "initialize")


def test_the_one_private_jax_access_is_isolated():
    """The coordination client is the only thing corpus takes from a private JAX module, in one function."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(corpus.distributed))
    private = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and "_src" in (node.module or "")]
    assert [node.module for node in private] == ["jax._src.distributed"]
    function = next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                    and node.name == "_coordination_client")
    assert private[0] in list(ast.walk(function))
