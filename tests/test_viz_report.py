"""minibert/viz/report.py: the page skeleton escapes user text, the views page holds each view once, the
demo's index links what was written, the head summary ranks heads as the statistics say, and the CSV
table holds every row."""

from __future__ import annotations

import csv
import html.parser
import types

import numpy as np
import pytest

from minibert.analysis import heads
from minibert.errors import DataFileError
from minibert.families.registry import FAMILIES
from minibert.viz import report

HOSTILE = "<img src=x onerror=alert(1)>"


class Elements(html.parser.HTMLParser):
    """The start tags of a page and its text, as a browser's parser sees them."""

    def __init__(self, page: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def test_page_escapes_the_title_and_keeps_body_and_style():
    page = report.page(HOSTILE, "<p id='x'>body</p>", style="body{margin:0}")
    parsed = Elements(page)
    assert [tag for tag, _ in parsed.tags] == ["html", "head", "meta", "meta", "title", "style", "body", "p"]
    assert HOSTILE in parsed.text  # the title arrives as text, not as an <img>
    assert "body{margin:0}" in parsed.text
    assert page.startswith("<!DOCTYPE html>") and "http" not in page.replace('"width=device-width', "")


class FakeView:
    def __init__(self, name: str):
        self.html = f'<div class="view">{name}</div>'


def test_views_page_holds_each_view_once_under_an_escaped_heading():
    parsed = Elements(report.views_page(HOSTILE, [FakeView("a"), FakeView("b")]))
    assert [tag for tag, attrs in parsed.tags if attrs.get("class") == "view"] == ["div", "div"]
    assert [tag for tag, _ in parsed.tags].count("img") == 0
    assert parsed.text.count(HOSTILE) == 2  # <title> and <h1>


def test_index_page_links_views_figures_and_tables(tmp_path):
    names = ["figures/pca.png", "figures/pca.svg", "head_view.html", "head_statistics.csv", "head_statistics.json"]
    paths = [tmp_path / name for name in names]
    captions = {"pca": f"PCA {HOSTILE}", "head_view": "lines"}
    parsed = Elements(report.index_page(tmp_path, paths, captions, f"summary {HOSTILE}", "model <dir>"))
    links = [attrs["href"] for tag, attrs in parsed.tags if tag == "a"]
    assert links == ["head_view.html", "figures/pca.png", "figures/pca.svg", "head_statistics.csv",
                     "head_statistics.json"]
    assert [attrs["src"] for tag, attrs in parsed.tags if tag == "img"] == ["figures/pca.png"]
    text = "".join(parsed.text)
    assert f"PCA {HOSTILE}" in text and f"summary {HOSTILE}" in text and "model <dir>" in text


def hand_statistics() -> dict[str, np.ndarray]:
    """Two layers × three heads; each ranked statistic has a known order."""
    mean = {name: np.zeros((2, 3)) for name in report.RANKINGS}
    mean["prev"] = np.array([[0.1, 0.9, 0.2], [0.3, 0.0, 0.7]])  # heads 1-2 (0.9), 2-3 (0.7), 2-1 (0.3)
    mean["to_cls"] = np.array([[0.0, 0.0, 0.0], [0.0, 0.8, 0.0]])  # 2-2 earns "cls" (> 0.6)
    mean["entropy"] = np.full((2, 3), 1.0)
    return mean


def test_head_summary_ranks_heads_by_each_statistic():
    lines = report.head_summary(hand_statistics(), documents=7, top=3).splitlines()
    assert lines[0].startswith("head statistics over 7 documents")
    prev = next(line for line in lines if line.strip().startswith("previous token"))
    assert prev.split()[2:] == ["1-2", "0.90", "2-3", "0.70", "2-1", "0.30"]
    cls = next(line for line in lines if line.strip().startswith("[CLS] / <s>"))  # no tokenizer: both spellings
    assert cls.split()[3:5] == ["2-2", "0.80"]
    labels = heads.behaviour_labels(hand_statistics())
    # "prev" above 0.5: heads 1-2 and 2-3; "cls" above 0.6: head 2-2 (BEHAVIOURS order: prev before cls)
    assert labels[0, 1] == labels[1, 2] == "prev" and labels[1, 1] == "cls"
    assert lines[-1] == "  behaviour labels: prev 2, cls 1"


def test_head_summary_without_behaviours():
    mean = {name: np.zeros((1, 2)) for name in report.RANKINGS}
    assert report.head_summary(mean, documents=1).splitlines()[-1] == "  behaviour labels: none"


def test_write_table_round_trips_every_row(tmp_path):
    rows = heads.head_table(hand_statistics())
    path = report.write_table(rows, tmp_path / "heads.csv")
    with path.open(newline="", encoding="utf-8") as file:
        read = list(csv.DictReader(file))
    assert len(read) == 6 and list(read[0]) == list(rows[0])
    assert [row["label"] for row in read] == ["1-1", "1-2", "1-3", "2-1", "2-2", "2-3"]
    assert [float(row["prev"]) for row in read] == [0.1, 0.9, 0.2, 0.3, 0.0, 0.7]


def test_write_table_refuses_an_existing_file_unless_overwrite(tmp_path):
    """Issue 40: write_table replaced a file already at its path; the rule of every writer now."""
    rows = heads.head_table(hand_statistics())
    path = tmp_path / "heads.csv"
    path.write_text("mine")
    with pytest.raises(DataFileError, match=r"heads.csv already exists; pass overwrite=True to replace it"):
        report.write_table(rows, path)
    assert path.read_text() == "mine"
    report.write_table(rows, path, overwrite=True)
    assert path.read_text().splitlines()[0] == ",".join(rows[0])


def test_write_table_refuses_a_link_and_never_writes_through_one(tmp_path):
    """The one writers' rule (errors.refuse_existing): a link where the table would go, dangling or not, is
    refused; overwrite=True replaces the link with the table and leaves the file it pointed to alone."""
    rows = heads.head_table(hand_statistics())
    target, link, dangling = tmp_path / "mine.txt", tmp_path / "heads.csv", tmp_path / "gone.csv"
    target.write_text("mine")
    link.symlink_to(target)
    dangling.symlink_to(tmp_path / "nowhere.csv")
    for path in (link, dangling):
        with pytest.raises(DataFileError, match=r"is a symbolic link \(to .*\) and is not written through; pass "
                                                r"overwrite=True to replace it \(the link"):
            report.write_table(rows, path)
    report.write_table(rows, link, overwrite=True)
    assert not link.is_symlink() and link.read_text().splitlines()[0] == ",".join(rows[0])
    assert target.read_text() == "mine"


def test_head_summary_names_the_tokenizers_special_tokens():
    """With a tokenizer, the [CLS] and [SEP] rows carry its own cls_token and sep_token (RoBERTa's here)."""
    roberta = dict(FAMILIES["roberta"].special_tokens)
    tokenizer = types.SimpleNamespace(cls_token=roberta["cls_token"], sep_token=roberta["sep_token"])
    lines = report.head_summary(hand_statistics(), documents=7, tokenizer=tokenizer).splitlines()
    assert next(line for line in lines if "2-2" in line and "0.80" in line).split()[0] == "<s>"
    assert any(line.split()[0] == "</s>" for line in lines)
    assert not any("[CLS]" in line or "[SEP]" in line for line in lines)
