"""The live workbench's latency and load, over HTTP against a real uvicorn server (minibert serve's app).

    .venv/bin/python benchmarks/serve.py            # bundled model, 128-token texts; prints a Markdown table
    .venv/bin/python benchmarks/serve.py --smoke    # a few requests at 16 tokens: the code paths, for CI
    .venv/bin/python benchmarks/serve.py --start    # `minibert serve` from a fresh process: issue 28's targets
    .venv/bin/python benchmarks/serve.py --mixing   # ALTI's and value zeroing's first use (issue 41)

Three measurements, after warm-up (every length bucket compiled, as minibert serve does at start):
  edit     a new 128-token text: what the page asks for after an edit (POST /api/run, then /api/step)
  ablate   one more head ablated on the same text: /api/run with the head, then /api/step
  load     8 clients at once × 50 requests each (texts and ablations varied): errors, and the server's
           resident memory after each tenth of the requests (flat: no growth beyond the first tenth)
--start (issue 28): `minibert serve --no-browser --port 0` in a fresh process, twice: with an empty persistent
compilation cache, then with the cache the first start filled, each opened in headless chromium (playwright) at
1366×768. Each start is timed to its URL on stdout and to the first full screen: the page's tokens, views and
step-through drawn, nothing busy. Then a student types a new sentence of 16 word pieces over the default text, a
word a second from a second after the first screen; each word is an edit, timed from its last key until the page
has drawn its answer (the page's 200 ms wait after a key included). CPU seconds of the server process beside.
Latencies are wall-clock per edit as a client sees them (p50, p95), beside the CPU seconds the process spent
on it (server and client together: the process time, all threads), which other processes' load changes far
less than the wall time. Only the public API is used: minibert.load, viz.explore.Workbench, app.serve.create_app.
--mixing (issue 41): the "Views show" maps' first use, in two fresh processes sharing a new persistent compilation
cache (empty, then filled by the first): for texts of 13, 64 and 128 tokens, the first ALTI / value-zeroing
answer of that length (its compile and run), the same text with head 1-3 ablated (one program: no compile), and
another text of that length (what every later edit pays).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import harness
import httpx
import numpy as np
import uvicorn

import minibert
from minibert.app import serve
from minibert.viz.workbench import Workbench

TOKEN = "benchmark"


def resident_mib() -> float:
    """This process's resident memory (the server runs in it), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def text_of(model, tokens: int, seed: int) -> str:
    """A sentence of common words that tokenizes to exactly `tokens` tokens with [CLS] and [SEP]."""
    rng = np.random.default_rng(seed)
    words: list[str] = []
    while True:
        candidate = words + [harness.WORDS[rng.integers(len(harness.WORDS))]]
        if model.tokenize([" ".join(candidate)]).input_ids.shape[1] > tokens:
            break
        words = candidate
    while model.tokenize([" ".join(words)]).input_ids.shape[1] < tokens:
        words.append("a")
    return " ".join(words)


def start(workbench: Workbench) -> tuple[uvicorn.Server, str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    limiter = serve.RateLimiter(rate=1e9, burst=10**9)  # the load test is one client address sending for eight
    app = serve.create_app([workbench], TOKEN, port=port, limiter=limiter)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 300  # a hang guard: uvicorn starts in well under a second
    while not server.started:  # a thread that died or hangs at start ends the benchmark instead of hanging it
        if not thread.is_alive():
            raise RuntimeError("uvicorn's thread ended before the server started (see its log above)")
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start within 300 s")
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}"


def post(client: httpx.Client, action: str, body: dict) -> dict:
    answer = client.post(f"/api/{action}", json=body, headers={serve.TOKEN_HEADER: TOKEN}, timeout=120)
    answer.raise_for_status()
    return answer.json()


def edit(client, text: str, ablate: list) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) until every panel of an edit has its data: the run (tokens, views,
    outputs), then the step."""
    begin, cpu = time.perf_counter(), time.process_time()
    post(client, "run", {"text": text, "ablate": ablate})
    post(client, "step", {"text": text, "ablate": ablate, "layer": 2, "head": 5, "query": 3})
    return time.perf_counter() - begin, time.process_time() - cpu


def percentiles(seconds: list[float]) -> tuple[float, float]:
    return float(np.percentile(seconds, 50) * 1000), float(np.percentile(seconds, 95) * 1000)


def row(what: str, timings: list[tuple[float, float]]) -> list[str]:
    """A table row: the count, wall p50 and p95, CPU p50 and p95 (ms)."""
    walls, cpus = zip(*timings)
    return [what, str(len(timings)), *map(harness.fmt, percentiles(walls) + percentiles(cpus))]


def load(url: str, texts: list[str], clients: int, requests: int, n_layers: int, n_heads: int):
    """Errors and the resident memory after each tenth of `clients` × `requests` concurrent requests."""
    done, errors, memory, lock = [0], [], [], threading.Lock()
    total = clients * requests

    def one_client(c: int):
        with httpx.Client(base_url=url) as client:
            for r in range(requests):
                body = {"text": texts[(c + r) % len(texts)], "ablate": [[r % n_layers, (c + r) % n_heads]]}
                try:
                    post(client, "run" if r % 2 == 0 else "step", body)
                except httpx.HTTPError as error:
                    errors.append(repr(error))
                with lock:
                    done[0] += 1
                    if done[0] % max(1, total // 10) == 0:
                        memory.append(resident_mib())

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one_client, range(clients)))
    return errors, memory


# ---- --start: a fresh `minibert serve` to its first screen, then typing ------------------------------------------

TYPED = "The students quickly noticed that the tired teacher had forgotten her notes at home again."  # 16 pieces
TYPING = 1.0  # seconds between the typed words
CHROMIUM = "/usr/bin/chromium"  # Debian's, as the browser tests launch it (tests/conftest.py)
SETTLED = ("() => document.getElementById('workbench').getAttribute('aria-busy') === 'false' && "
           "!document.querySelector('.mbv[aria-busy=true]') && document.querySelectorAll('#wb-tokens-0 .wb-token')"
           ".length > 0 && document.querySelector('#wb-step-0 .wb-step') !== null")  # tokens, views, step-through


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_start(browser, cache: Path, log: Path) -> dict:
    """Seconds from launching `minibert serve` to its URL and to its first full screen in chromium at 1366×768
    (the page's tokens, views and step-through drawn and nothing busy); then the typed edits' latencies, each from
    its last key until the page has drawn the answer (the page's 200 ms wait after a key included)."""
    env = os.environ | {"MINIBERT_CACHE_DIR": str(cache)}
    command = [sys.executable, "-m", "minibert.app.cli", "serve", "--no-browser", "--port", "0"]
    page = browser.new_page(viewport={"width": 1366, "height": 768})
    began = time.perf_counter()
    with log.open("a") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
    try:
        url = process.stdout.readline().strip()
        times = {"url": time.perf_counter() - began}
        if not url.startswith("http"):
            raise RuntimeError(f"minibert serve printed {url!r}; see {log}")
        page.goto(url)
        page.wait_for_function(SETTLED, polling=20, timeout=600_000)
        times["screen"] = time.perf_counter() - began
        times["screen_cpu"] = cpu_seconds(process.pid)
        time.sleep(TYPING)
        page.click("#wb-text")
        page.keyboard.press("Control+A")
        edits = []
        for n, word in enumerate(TYPED.split()):
            page.keyboard.type(word if n == 0 else " " + word)
            typed = time.perf_counter()
            page.wait_for_function(SETTLED, polling=20, timeout=600_000)
            edits.append(time.perf_counter() - typed)
            time.sleep(max(0.0, TYPING - edits[-1]))
        times["edits"] = edits
    finally:
        page.close()
        process.terminate()
        process.wait(timeout=120)
    return times


def start_report(args) -> int:
    from playwright.sync_api import sync_playwright

    scratch = Path(tempfile.mkdtemp(prefix="serve-start-"))
    load_before = harness.load_average()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox",
                                                                             "--disable-gpu", "--no-first-run"])
        cold = one_start(browser, scratch / "cache", scratch / "serve.log")
        warm = one_start(browser, scratch / "cache", scratch / "serve.log")
        browser.close()
    machine = harness.machine()
    rows = [[name, harness.fmt(t["url"]), harness.fmt(t["screen"]), harness.fmt(t["screen_cpu"]),
             harness.fmt(max(t["edits"])), harness.fmt(float(np.median(t["edits"])))]
            for name, t in (("cold (empty cache)", cold), ("second start (cache)", warm))]
    text = "\n".join([
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']}; {machine['versions']}; load "
        f"average {load_before} before, {harness.load_average()} after. Command: `benchmarks/serve.py --start`.", "",
        harness.markdown_table(["start", "URL printed (s)", "first full screen (s)", "server CPU to first screen (s)",
                                "slowest typed edit (s)", "median typed edit (s)"], rows), "",
        "Typed edits, cold start (s from the last key to the page drawn): "
        + ", ".join(f"{e:.2f}" for e in cold["edits"]),
    ])
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


MIXING_LENGTHS = (13, 64, 128)  # tokens: the default text's length, and the two row lengths minibert serve compiles


def mixing_child() -> None:
    """In a fresh process: one JSON line per (length, method) of seconds for the first, ablated and later answer."""
    import json

    model = minibert.load()
    workbench = Workbench(model)
    for tokens in MIXING_LENGTHS:
        text, other = text_of(model, tokens, 1), text_of(model, tokens, 2)
        workbench.answer("run", {"text": text})  # compiled at start by minibert serve: not part of the map's wait
        workbench.answer("run", {"text": text, "ablate": [[0, 2]]})
        for method in ("value_zeroing", "alti"):
            seconds = []
            for body in ({"text": text}, {"text": text, "ablate": [[0, 2]]}, {"text": other}):
                begin = time.perf_counter()
                workbench.answer("mixing", dict(body, method=method))
                seconds.append(time.perf_counter() - begin)
            print(json.dumps({"tokens": tokens, "method": method, "seconds": seconds}), flush=True)


def mixing_report(args) -> int:
    import json

    cache, load_before = Path(tempfile.mkdtemp(prefix="serve-mixing-")) / "cache", harness.load_average()
    runs = []
    for _ in range(2):  # empty cache, then the cache the first filled
        out = subprocess.run([sys.executable, __file__, "--mixing-child"], capture_output=True, text=True, check=True,
                             env=os.environ | {"MINIBERT_CACHE_DIR": str(cache)}).stdout
        runs.append([json.loads(line) for line in out.splitlines() if line.startswith("{")])
    rows = [[f"{cold['method'].replace('_', ' ')}, {cold['tokens']} tokens", harness.fmt(cold["seconds"][0]),
             harness.fmt(warm["seconds"][0]), harness.fmt(cold["seconds"][1]), harness.fmt(cold["seconds"][2])]
            for cold, warm in zip(*runs)]
    machine = harness.machine()
    text = "\n".join([
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']}; {machine['versions']}; load "
        f"average {load_before} before, {harness.load_average()} after. Command: `benchmarks/serve.py --mixing`.", "",
        harness.markdown_table(["map", "first use, empty cache (s)", "first use, cache filled (s)",
                                "head 1-3 ablated (s)", "another text (s)"], rows)])
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="a few requests at 16 tokens (CI)")
    parser.add_argument("--start", action="store_true", help="time a fresh `minibert serve` to its first screen "
                        "(empty cache, then a second start) and typed edits after it")
    parser.add_argument("--mixing", action="store_true", help="time ALTI's and value zeroing's first use (empty "
                        "cache, then filled) and later answers")
    parser.add_argument("--mixing-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="also write the Markdown here")
    args = parser.parse_args(argv)
    if args.start:
        return start_report(args)
    if args.mixing_child:
        mixing_child()
        return 0
    if args.mixing:
        return mixing_report(args)
    tokens, edits, clients, requests = (16, 4, 2, 4) if args.smoke else (128, 20, 8, 50)
    model = minibert.load()
    cfg = model.config
    workbench = Workbench(model, max_tokens=tokens)
    serve.warm_up([workbench], step=lambda what: print(what, file=sys.stderr))
    server, url = start(workbench)
    texts = [text_of(model, tokens, seed) for seed in range(edits)]
    with httpx.Client(base_url=url) as client:
        edit(client, texts[0], [])  # the first request of a text pays tokenizer and JSON warm-up too
        edit_times = [edit(client, text, []) for text in texts[1:]]
        ablate_times = [edit(client, texts[-1], [[n % cfg.num_hidden_layers, n % cfg.num_attention_heads]])
                        for n in range(edits)]
    memory_before = resident_mib()
    errors, memory = load(url, texts, clients, requests, cfg.num_hidden_layers, cfg.num_attention_heads)
    server.should_exit = True
    rows = [row(f"edit → every panel ({tokens} tokens)", edit_times),
            row(f"ablate one head ({tokens} tokens)", ablate_times)]
    machine = harness.machine()
    text = "\n".join([
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']}; {machine['versions']}; "
        f"load average {harness.load_average()}. Command: `benchmarks/serve.py{' --smoke' if args.smoke else ''}`.",
        "", harness.markdown_table(["what", "edits", "p50 ms", "p95 ms", "CPU p50 ms", "CPU p95 ms"], rows), "",
        f"{clients} concurrent clients × {requests} requests: {len(errors)} errors; resident memory "
        f"{memory_before:.0f} MiB before, then after each tenth: {', '.join(f'{m:.0f}' for m in memory)} MiB.",
    ])
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
