"""Make the README's pictures: run `minibert demo`, photograph its three views in headless Chromium,
and copy its figures, all scaled down, into docs/images/.

    .venv/bin/python docs/screenshots.py            # needs the `test` extra (playwright) and chromium

The demo runs as the installed command, so the pictures are what `minibert demo` makes. Chromium
runs offline: every request that is not a local file is refused.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "docs" / "images"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run"]
VIEWS = ("head_view", "model_view", "neuron_view")
FIGURES = ("pca", "attention_to_word", "head_heatmap", "head_grid", "neuron", "head_statistics", "head_mds")
MAX_WIDTH = 1400  # pixels; wider pictures are scaled down
MAX_BYTES = 200_000
VIEWPORT = {"width": 1200, "height": 900}


def run_demo(out: Path) -> None:
    command = Path(sys.executable).with_name("minibert")
    subprocess.run([str(command), "demo", "--out", str(out)], check=True, stdout=subprocess.DEVNULL)


def photograph_views(out: Path, images: Path) -> list[Path]:
    """A PNG of each view as the browser draws it on opening (the view's own element only)."""
    written = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for name in VIEWS:
                page = browser.new_page(viewport=VIEWPORT)
                page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                           else route.abort())
                page.goto((out / f"{name}.html").as_uri())
                page.wait_for_selector(".mbv-body")
                # Views unpack their layers and draw after load; aria-busy is cleared when the drawing is done.
                page.wait_for_function("!document.querySelector('.mbv[aria-busy=true]')")
                path = images / f"{name}.png"
                page.locator("div.mbv").first.screenshot(path=path)
                written.append(path)
                page.close()
        finally:
            browser.close()
    return written


def shrink(path: Path) -> Path:
    """Scale `path` down to MAX_WIDTH and, if it is still over MAX_BYTES, to 256 colours (in place)."""
    image = Image.open(path).convert("RGB")
    if image.width > MAX_WIDTH:
        image = image.resize((MAX_WIDTH, round(image.height * MAX_WIDTH / image.width)), Image.LANCZOS)
    image.save(path, optimize=True)
    if path.stat().st_size > MAX_BYTES:
        image.quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=Path, default=IMAGES, help=f"output folder (default {IMAGES})")
    args = parser.parse_args(argv)
    args.images.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        run_demo(out)
        written = photograph_views(out, args.images)
        for name in FIGURES:
            written.append(shutil.copyfile(out / "figures" / f"{name}.png", args.images / f"{name}.png"))
    for path in written:
        shrink(path)
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}  "
              f"{Image.open(path).size[0]}×{Image.open(path).size[1]}  {path.stat().st_size // 1000} kB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
