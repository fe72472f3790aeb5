"""Reports of a run: standalone HTML pages, a text summary of the head statistics, the per-head CSV table.

    report.views_page("minibert: 'The cat sat.'", [doc.head_view(), doc.model_view()])   # one page, two views
    print(report.head_summary(result.mean, result.documents, model.tokenizer))           # the top heads
    report.write_table(result.table(), Path("heads.csv"))                                # one row per head

Every page here (and `View.document`) is made by `_html.page`: one skeleton, user text escaped.
Layers and heads are labelled "L-H", 1-indexed (Clark et al.): layer 2, head 5 is "3-6".
"""

from __future__ import annotations

import csv
import html
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from minibert.analysis import heads
from minibert.core.config import head_label
from minibert.errors import DataFileError, refuse_existing
from minibert.io.files import unlink_link
from minibert.viz._html import page

TOP_HEADS = 3
# The first special token and the separator without a tokenizer to name them: BERT's and RoBERTa's spellings.
GENERIC_SPECIAL_TOKENS = ("[CLS] / <s>", "[SEP] / </s>")


def rankings(tokenizer=None) -> dict[str, str]:
    """What the summary ranks heads by (highest first): statistic → what a high value means, with the
    tokenizer's own first special token and separator (cls_token, sep_token), or both families' spellings."""
    cls, sep = GENERIC_SPECIAL_TOKENS if tokenizer is None else (tokenizer.cls_token, tokenizer.sep_token)
    return {"prev": "previous token", "next": "next token", "self": "the token itself", "to_cls": cls,
            "to_sep": sep, "to_punct": '"." or ","', "entropy": "broad (entropy, nats)"}


RANKINGS = rankings()


def views_page(title: str, views: Sequence) -> str:
    """Several interactive views (viz.View) on one page; each view draws into its own element."""
    return page(title, f"<h1>{html.escape(title)}</h1>" + "".join(view.html for view in views))


def index_page(out: Path, paths: Sequence[Path], captions: Mapping[str, str], summary: str, source: str) -> str:
    """The demo's index: links to the views (.html), each figure's PNG shown with links to its other formats,
    the summary and the head_statistics tables. paths lie under `out`; captions are keyed by file stem."""
    def link(path: Path) -> str:
        name = path.relative_to(out).as_posix()
        return f'<a href="{html.escape(name)}">{html.escape(name)}</a>'

    parts = [f"<h1>minibert demo</h1><p>Model: <code>{html.escape(source)}</code>. Layers and heads are labelled "
             "L-H, 1-indexed (Clark et al.).</p><h2>Views of the pair (open in a browser; interactive)</h2><ul>"]
    parts += [f"<li>{link(p)}: {html.escape(captions[p.stem])}</li>" for p in paths if p.suffix == ".html"]
    parts.append("</ul><h2>Figures</h2>")
    for png in (p for p in paths if p.suffix == ".png"):
        others = " ".join(link(p) for p in paths if p.stem == png.stem and p.parent == png.parent and p != png)
        parts.append(f'<figure><img src="{html.escape(png.relative_to(out).as_posix())}" '
                     f'alt="{html.escape(png.stem)}"><figcaption>{html.escape(captions[png.stem])} '
                     f"({link(png)} {others})</figcaption></figure>")
    tables = " ".join(link(p) for p in paths if p.stem == "head_statistics" and p.parent == out)
    parts.append(f"<h2>Head statistics</h2><pre>{html.escape(summary)}</pre><p>Every head: {tables}</p>")
    return page("minibert demo", "".join(parts))


def head_summary(mean: Mapping[str, np.ndarray], documents: int, tokenizer=None, top: int = TOP_HEADS,
                 broad: str = "relative") -> str:
    """A few lines: for each statistic of rankings(tokenizer), the `top` heads with the highest value, and
    the behaviour labels (heads.behaviour_labels, "broad" judged by `broad`) that the heads earn."""
    lines = [f"head statistics over {documents} documents; heads as L-H, 1-indexed as in the figures "
             "(3-6 is layer 2, head 5 with 0-indexed options)"]
    for statistic, meaning in rankings(tokenizer).items():
        values = np.asarray(mean[statistic])
        order = np.argsort(values.ravel())[::-1][:top]
        best = "   ".join(f"{head_label(*divmod(int(i), values.shape[1])):>5s} {values.ravel()[i]:.2f}"
                           for i in order)
        lines.append(f"  {meaning:<22s} {best}")
    labels = heads.behaviour_labels(mean, broad).ravel()
    counts = {name: int(sum(name in label.split("+") for label in labels)) for name in heads.BEHAVIOURS}
    lines.append("  behaviour labels: " + ", ".join(f"{name} {n}" for name, n in counts.items() if n)
                 if any(counts.values()) else "  behaviour labels: none")
    return "\n".join(lines)


def write_table(rows: Sequence[Mapping], path: str | Path, *, overwrite: bool = False) -> Path:
    """One CSV row per head (heads.head_table), columns in the table's order; returns the path. An existing file
    is refused unless overwrite=True."""
    path = Path(path)
    refuse_existing(path, overwrite, DataFileError)
    unlink_link(path)  # overwrite=True replaces a link with the file, never writing through it
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path
