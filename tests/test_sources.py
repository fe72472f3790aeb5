"""minibert/io/sources.py: where a checkpoint name resolves, in order — an existing path, the weights/
store ($MINIBERT_WEIGHTS first), the bundled package, the Hugging Face cache — and what an unknown
name reports."""

from __future__ import annotations

import re

import pytest

from minibert import SourceError
from minibert.io import sources


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A working directory of its own, with no $MINIBERT_WEIGHTS."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MINIBERT_WEIGHTS", raising=False)
    return tmp_path


def test_an_existing_path_is_used_as_it_is(elsewhere):
    directory = elsewhere / "my-bert"
    directory.mkdir()
    (directory / "config.json").write_text("{}")
    assert sources.resolve(directory) == directory
    assert sources.resolve(str(directory / "config.json")) == directory  # a file: its folder


def test_weights_store_finds_hub_ids_by_their_last_part(elsewhere):
    (elsewhere / "weights" / "tiny-bert").mkdir(parents=True)
    assert sources.resolve("someone/tiny-bert") == elsewhere / "weights" / "tiny-bert"


def test_minibert_weights_comes_before_the_working_directory(elsewhere, monkeypatch):
    (elsewhere / "weights" / "tiny-bert").mkdir(parents=True)
    store = elsewhere / "store"
    (store / "tiny-bert").mkdir(parents=True)
    monkeypatch.setenv("MINIBERT_WEIGHTS", str(store))
    assert sources.weights_dirs()[:2] == [store, elsewhere / "weights"]
    assert sources.resolve("tiny-bert") == store / "tiny-bert"


def test_bundled_names_resolve_to_the_package(elsewhere, bundled_dir):
    for name in sorted(sources.BUNDLED) + [None]:
        assert sources.resolve(name) == bundled_dir == sources.bundled_dir()
    assert (bundled_dir / "config.json").is_file()


def test_the_weights_store_shadows_the_bundled_package(elsewhere):
    (elsewhere / "weights" / "all-MiniLM-L6-v2").mkdir(parents=True)
    assert sources.resolve("sentence-transformers/all-MiniLM-L6-v2") == elsewhere / "weights" / "all-MiniLM-L6-v2"


def test_an_unknown_name_lists_every_place_looked(elsewhere):
    with pytest.raises(SourceError) as error:
        sources.resolve("nobody/no-such-bert")
    message = str(error.value)
    assert "no checkpoint 'nobody/no-such-bert' found" in message
    looked = message.split("Looked in: ", 1)[1]
    assert looked.startswith("path nobody/no-such-bert; ")  # the path as given
    assert f"{elsewhere / 'weights'}/nobody/no-such-bert" in looked
    assert "the Hugging Face cache" in looked


@pytest.mark.parametrize("name", ["../outside", "nothing/..", "/nowhere/bert"])
def test_a_name_cannot_leave_the_weights_store(elsewhere, monkeypatch, name):
    """From work/, the store's weights/../outside is work/outside and weights/.. is work: both used to load."""
    work = elsewhere / "work"
    (work / "weights").mkdir(parents=True)
    (work / "outside").mkdir()
    monkeypatch.chdir(work)
    with pytest.raises(SourceError, match=re.escape(f"no checkpoint at {name!r}: it is not an existing path, and a "
                                                    f"name looked up in the weights store")):
        sources.resolve(name)
    assert sources.resolve("outside").resolve() == work / "outside"  # an existing path is used as it is


def test_a_file_beside_no_config_is_named_as_a_file(elsewhere):
    """Docs-only tester (trust) item 18: --model afile.txt said 'config.json does not exist', naming neither the
    path given nor that it is a file."""
    (elsewhere / "afile.txt").write_text("hi")
    with pytest.raises(SourceError, match=re.escape("afile.txt is a file, and its folder holds no config.json; pass a "
                                                    "checkpoint directory")):
        sources.resolve("afile.txt")
