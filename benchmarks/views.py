"""HTML views of the bundled model at 128 and 512 tokens, before and after issue 15 (packed data, layers
inflated on demand, lines rasterised on a canvas): page size, time to draw, time to follow a click.

    python benchmarks/views.py [--quick] [--before COMMIT]
    python benchmarks/views.py --smoke     # 128 tokens only, one page per case, timings checked (CI)

"before" is minibert/viz as of COMMIT (default: the last commit before the change), extracted with
`git show` into a scratch package and given the same arrays. Times are wall seconds in headless
chromium (Playwright, software rendering, device pixel ratio 1), median of the repeats, before and
after interleaved in each round:
  draw   navigation start → the view has drawn (no aria-busy="true" left) → the next animation frame
  click  head view: choose layer 4; model view: open layer 6 head 12; neuron view: make token 100 the
         query; from the click to the next animation frame once the view is no longer busy
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import numpy as np  # noqa: E402
from harness import ROOT, check_times, cpu_model, english_like_texts, fmt, load_average, markdown_table  # noqa: E402

BEFORE = "132b55f"  # minibert/viz just before the packed views
OLD_FILES = ("__init__.py", "views.py", "_html.py", "_check.py", "static/views.js", "static/views.css")
LENGTHS = (128, 512)
KINDS = ("head", "model", "neuron")
CLICKS = {
    "head": lambda page: page.select_option(".mbv-controls select >> nth=0", index=3),
    "model": lambda page: page.click("canvas.mbv-thumb[data-layer='5'][data-head='11']"),
    "neuron": lambda page: page.click(".mbv-tok[data-side=left][data-i='100']"),
}
DRAWN = "() => new Promise(done => { (function wait() { if (document.querySelector('.mbv[aria-busy=true]')) " \
        "setTimeout(wait, 5); else requestAnimationFrame(() => done()); })(); })"


def old_views(commit: str, directory: Path):
    """minibert/viz at `commit` as the package `oldviz` (its __init__ stubbed: only the views are needed)."""
    package = directory / "oldviz"
    (package / "static").mkdir(parents=True)
    for name in OLD_FILES:
        text = subprocess.run(["git", "show", f"{commit}:minibert/viz/{name}"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout
        if name == "__init__.py":
            text = ""
        (package / name).write_text(text.replace("minibert.viz", "oldviz"), encoding="utf-8")
    sys.path.insert(0, str(directory))
    from oldviz import views

    return views


def has_commit(commit: str) -> bool:
    """Whether this checkout holds `commit` (a shallow CI clone may not)."""
    found = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True)
    return found.returncode == 0


def long_text(tokens: int) -> str:
    """English-like sentences (harness.english_like_texts), enough for `tokens` word pieces and more."""
    texts, pairs = english_like_texts(tokens // 40 + 2, min_tokens=60, max_tokens=100)
    return " ".join(t + " " + p for t, p in zip(texts, pairs))


def build(module, kind: str, doc) -> object:
    if kind == "neuron":
        return module.neuron_view(doc.tokens, doc.q, doc.k, doc.attention, doc.sentence_b_start)
    return getattr(module, f"{kind}_view")(doc.tokens, doc.attention, doc.sentence_b_start)


def browse(browser, path: Path, kind: str) -> tuple[float, float]:
    """(draw, click) wall seconds of one fresh page."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    start = time.perf_counter()
    page.goto(path.as_uri(), timeout=600_000)
    page.evaluate(DRAWN)
    draw = time.perf_counter() - start
    start = time.perf_counter()
    CLICKS[kind](page)
    page.evaluate(DRAWN)
    click = time.perf_counter() - start
    page.close()
    if errors:
        raise RuntimeError(f"{path.name}: {errors[0]}")
    return draw, click


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one timed page per case instead of three")
    parser.add_argument("--before", default=BEFORE, help="the commit whose minibert/viz is 'before'")
    parser.add_argument("--smoke", action="store_true",
                        help="128 tokens, one page per case, timings checked; 'before' is today's views when the "
                             "checkout lacks --before (CI)")
    args = parser.parse_args(argv)
    repeats = 1 if args.quick or args.smoke else 3
    lengths = LENGTHS[:1] if args.smoke else LENGTHS

    from playwright.sync_api import sync_playwright

    import minibert
    from minibert import viz

    scratch = Path(tempfile.mkdtemp(prefix="minibert-views-"))
    stand_in = args.smoke and not has_commit(args.before)
    old = viz.views if stand_in else old_views(args.before, scratch)
    versions = {"before": old, "after": viz.views}
    model = minibert.load()
    text = long_text(max(lengths))
    load_start = load_average()
    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                    args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"])
        for n_tokens in lengths:
            doc = viz.document(model, text, max_length=n_tokens)
            assert len(doc.tokens) == n_tokens, len(doc.tokens)
            for kind in KINDS:
                result = {}
                for version, module in versions.items():
                    start = time.perf_counter()
                    path = build(module, kind, doc).save(scratch / f"{version}-{kind}-{n_tokens}.html")
                    result[version] = {"size": path.stat().st_size, "build": time.perf_counter() - start,
                                       "path": path, "draw": [], "click": []}
                for _ in range(repeats):
                    for version in versions:
                        draw, click = browse(browser, result[version]["path"], kind)
                        result[version]["draw"].append(draw)
                        result[version]["click"].append(click)
                if args.smoke:
                    check_times({f"{v} {m} {i}": t for v in versions for m in ("build", "draw", "click")
                                 for i, t in enumerate(np.atleast_1d(result[v][m]))})
                    assert all(result[v]["size"] > 0 for v in versions), result
                b, a = result["before"], result["after"]
                med = {v: {m: statistics.median(result[v][m]) for m in ("draw", "click")} for v in versions}
                rows.append([kind, n_tokens, f"{b['size'] / 1e6:.1f}", f"{a['size'] / 1e6:.2f}",
                             f"{b['size'] / a['size']:.0f}×", fmt(b["build"]), fmt(a["build"]),
                             fmt(med["before"]["draw"]), fmt(med["after"]["draw"]),
                             fmt(med["before"]["click"]), fmt(med["after"]["click"])])
                print(rows[-1], flush=True)
                for version in versions:
                    result[version]["path"].unlink()
        browser.close()
    print()
    if args.smoke:
        print(f"smoke run: {', '.join(KINDS)} views at {lengths[0]} tokens, one page each")
    print(f"- cpu: {cpu_model()}, {len(os.sched_getaffinity(0))} cores; chromium headless "
          f"({subprocess.run(['/usr/bin/chromium', '--version'], capture_output=True, text=True).stdout.strip()}), "
          "--disable-gpu")
    before = "today's minibert/viz (this checkout lacks --before)" if stand_in else f"minibert/viz at {args.before}"
    print(f"- before: {before}; repeats: {repeats} pages per case (median)")
    print(f"- load average (1, 5, 15 min) at start: {load_start}; at end: {load_average()}")
    print()
    print(markdown_table(["view", "tokens", "MB before", "MB after", "smaller", "build s before", "build s after",
                          "draw s before", "draw s after", "click s before", "click s after"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
