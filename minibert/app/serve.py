"""`minibert serve`: the live workbench, a local web page driving a loaded model (docs/serve.md).

    minibert serve                          # the bundled model; prints the URL (with its token) and opens it
    minibert serve --model A --compare B    # two models side by side
    app = create_app([Workbench(model)], token="…")   # the Starlette app, for tests and other ASGI servers

The computations are minibert.viz.workbench.Workbench's (the notebook widget answers with the same code);
this module adds HTTP and what keeps a local server safe:
  - every request carries the access token (the page's URL has it as ?token=, the page sends it back in
    the X-Minibert-Token header); without it: 403;
  - the Host header must name this machine (127.0.0.1, localhost, ::1, or the --host asked for) and an
    Origin header, when sent, this server: a page elsewhere that rebinds its DNS name to 127.0.0.1
    (DNS rebinding) or posts cross-site gets 403;
  - the models are fixed at start: no request names a path; request bodies, texts and tokens are capped
    (413, 400) and each client may send RATE requests a second (bursts of BURST), beyond which 429;
  - the page is one document with everything inlined, under a Content-Security-Policy that lets it load
    nothing from the network and run only its own scripts; user text reaches it as JSON set with
    textContent.
"""

from __future__ import annotations

import errno
import html
import json
import math
import secrets
import sys
import threading
import time
from collections.abc import Callable, Sequence
from functools import cache
from importlib import resources

from minibert.errors import InputError, MinibertError
from minibert.viz._html import View, workbench_script
from minibert.viz.workbench import Workbench

TOKEN_HEADER = "X-Minibert-Token"
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
# Every address of this machine: the Host check cannot accept "0.0.0.0" (no client sends it), so the URL printed
# names the loopback address in its place, and another machine needs --host with the address it will use.
ALL_ADDRESSES = {"0.0.0.0": "127.0.0.1", "::": "::1"}
MAX_BODY_BYTES = 64 * 1024  # two texts of MAX_CHARS and the controls fit many times over
RATE = 20.0  # requests a second per client, sustained: a person typing and clicking never reaches it
BURST = 40  # requests a client may send at once (the page sends a handful per edit)


@cache
def _static(name: str) -> str:
    return (resources.files("minibert.viz") / "static" / name).read_text(encoding="utf-8")


class RateLimiter:
    """A token bucket per client: `rate` requests a second, `burst` at once."""

    def __init__(self, rate: float = RATE, burst: int = BURST, clock: Callable[[], float] = time.monotonic):
        self.rate, self.burst, self.clock = rate, burst, clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def allow(self, client: str) -> bool:
        with self._lock:
            now = self.clock()
            tokens, last = self._buckets.get(client, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - last) * self.rate)
            allowed = tokens >= 1.0
            self._buckets[client] = (tokens - 1.0 if allowed else tokens, now)
            return allowed


def _hostname(authority: str) -> str:
    """"127.0.0.1:8765" → "127.0.0.1"; "[::1]:8765" → "::1"; "LOCALHOST" → "localhost" (names are
    case-insensitive)."""
    if authority.startswith("["):
        return authority[1:].split("]", 1)[0].lower()
    return (authority.rsplit(":", 1)[0] if authority.count(":") == 1 else authority).lower()


def create_app(workbenches: Sequence[Workbench], token: str, *, host: str = "127.0.0.1", port: int = 8765,
               tour: bool = False, limiter: RateLimiter | None = None):
    """The ASGI app serving the page and the JSON API for these workbenches (the first is the main model,
    a second is --compare's). `token`: the access token every request must carry; `host`, `port`: where
    it is served, for the Host and Origin checks."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    hosts = {*LOCAL_HOSTS, host.lower()}
    origins = {f"http://{name}:{port}" for name in hosts} | {f"http://[{name}]:{port}" for name in hosts}
    limiter = limiter or RateLimiter()

    def refused(request) -> tuple[str, int, dict] | None:
        """(reason, 403 or 429, headers) for a request that must not be answered; None when it may be."""
        if _hostname(request.headers.get("host", "")) not in hosts:
            return ("this server answers only requests addressed to it by a local name (127.0.0.1 or localhost); "
                    "the Host header names another.", 403, {})
        origin = request.headers.get("origin")
        if origin is not None and origin not in origins:
            return f"requests from pages of {origin} are refused; open the workbench's own URL.", 403, {}
        given = request.headers.get(TOKEN_HEADER) or request.query_params.get("token") or ""
        if not secrets.compare_digest(given.encode(), token.encode()):
            return ("the access token is missing or wrong; open the URL minibert serve printed (it ends with "
                    "?token=…).", 403, {})
        if not limiter.allow(request.client.host if request.client else "?"):
            return (f"too many requests: at most {limiter.rate:g} a second (bursts of {limiter.burst}); wait a "
                    f"moment.", 429, {"Retry-After": "1"})
        return None

    def page(request):
        refusal = refused(request)
        if refusal is not None:  # a person at a browser: the reason as a page, not as JSON
            reason, status, headers = refusal
            return HTMLResponse(_refusal_page(reason), status, headers={
                "Content-Security-Policy": "default-src 'none'", **_PRIVATE, **headers})
        nonce = secrets.token_urlsafe(16)
        return HTMLResponse(workbench_page(nonce, [wb.info() for wb in workbenches], tour), headers={
            "Content-Security-Policy": _policy(nonce), **_PRIVATE})

    async def api(request):
        refusal = refused(request)
        if refusal is not None:
            reason, status, headers = refusal
            return json_answer({"error": reason}, status, headers={**_PRIVATE, **headers})
        body = await _body_within(request, MAX_BODY_BYTES)
        if body is None:
            return json_answer({"error": f"the request has more than {MAX_BODY_BYTES} bytes; at most "
                                          f"{MAX_BODY_BYTES}."}, 413)
        try:
            payload = request_json(body)
            chosen = _workbench(workbenches, payload)
            answer = await run_in_threadpool(chosen.answer, request.path_params["action"], payload)
        except MinibertError as error:
            return json_answer({"error": " ".join(str(error).split())}, 400, headers=_PRIVATE)
        return json_answer(answer, headers=_PRIVATE)

    return Starlette(routes=[Route("/", page), Route("/api/{action}", api, methods=["POST"])])


def json_answer(content, status: int = 200, headers: dict | None = None):
    """A JSON response with every character past ASCII escaped: a text may hold a lone surrogate ("\\ud800"),
    which JSON carries and the page reads back but UTF-8 cannot encode — Starlette's JSONResponse failed on it
    with a 500."""
    from starlette.responses import Response

    body = json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")
    return Response(body, status, headers=headers, media_type="application/json")


_PRIVATE = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff",
            "X-Frame-Options": "DENY"}


def _refusal_page(reason: str) -> str:
    """The page a refused browser request gets: the reason, escaped, and nothing that runs."""
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>minibert serve: refused</title>"
            f"</head><body><h1>minibert serve</h1><p>{html.escape(reason)}</p></body></html>\n")


def _policy(nonce: str) -> str:
    """The page runs its own inlined scripts only and connects only to this server: nothing from the network."""
    return (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; img-src data: blob:; "
            "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


async def _body_within(request, limit: int) -> bytes | None:
    """The request's body, read as it arrives; None as soon as it passes `limit` bytes, or before any byte is
    read when its Content-Length says it will: a client announcing or sending more is answered at once, not read
    to its end."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and (len(declared) > len(str(limit)) or int(declared) > limit):
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


MAX_DEPTH = 8  # the API's bodies nest 3 deep ("ablate": [[layer, head], …]); deeper is no request of the page's
MAX_DIGITS = 19  # a layer, head, position or count fits in 64 bits; int() of 4,300+ digits raises


def request_json(body: bytes):
    """The body as JSON (an empty body is {}). InputError for what no page sends: not UTF-8 JSON, nested deeper
    than MAX_DEPTH (json's own recursion fails past about 1,000), an integer of more than MAX_DIGITS digits, a
    number that is not finite (1e999, NaN, Infinity)."""
    nested = InputError(f"the request body is nested more than {MAX_DEPTH} deep; the workbench's requests nest 3 "
                        f"deep.")
    try:
        payload = json.loads(body or b"{}", parse_int=_whole_number, parse_float=_finite_number,
                             parse_constant=_finite_number)
    except RecursionError:
        raise nested from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InputError("the request body must be JSON, e.g. {\"text\": \"The cat sat.\"}.") from None
    if _depth(payload) > MAX_DEPTH:
        raise nested
    return payload


def _whole_number(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise InputError(f"the request holds a number of {len(text.lstrip('-'))} digits; numbers here are layers, "
                         f"heads and positions, of at most {MAX_DIGITS} digits.")
    return int(text)


def _finite_number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InputError(f"the request holds the number {text}; numbers here must be finite.")
    return value


def _depth(value) -> int:
    """How deep lists and objects nest in `value` (a scalar: 0), without recursion."""
    deepest, pending = 0, [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, depth + 1)
            pending.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _workbench(workbenches: Sequence[Workbench], payload) -> Workbench:
    index = payload.get("model", 0) if isinstance(payload, dict) else 0
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(workbenches):
        raise InputError(f"'model' must be 0 (the main model){' or 1 (--compare)' if len(workbenches) > 1 else ''}; "
                         f"got {index!r}.")
    return workbenches[index]


def workbench_page(nonce: str, infos: list[dict], tour: bool = False) -> str:
    """The workbench page: the views' code, the workbench's (step-through, tour, page) and its .css, the models' info
    as JSON.
    Every script carries `nonce`, the only scripts the page's Content-Security-Policy runs."""
    library = View.library().replace("<script>", f'<script nonce="{nonce}">')
    config = json.dumps({"models": infos, "tour": tour}).replace("<", "\\u003c").replace(">", "\\u003e")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape('minibert workbench')}</title><style>{_static('workbench.css')}</style>"
            f"{library}</head><body>"
            f'<script type="application/json" id="wb-config">{config}</script>'
            f'<div id="workbench" aria-busy="true"></div>'
            f'<script nonce="{nonce}">{workbench_script()}</script></body></html>\n')


def warm_up(workbenches: Sequence[Workbench], step: Callable[[str], None]) -> None:
    """Compile each program a run needs before a request does, saying which one compiles and how far it got: the
    interactive path (tokens, patterns, the step-through, an ablation) of the main model first, shortest texts
    first, once per row length Model.run really runs (Workbench.warm_up_lengths). It holds no lock a request needs
    (Workbench.warm_up), so the page answers meanwhile; the mixing maps (ALTI, value zeroing: seconds each)
    compile when a view first asks for them, and the page says so while they do."""
    for n, wb in enumerate(workbenches):
        lengths = wb.warm_up_lengths()
        for done, length in enumerate(lengths, 1):
            step(f"model {n}: compiling for {wb.program_length(length)}-token rows (texts of up to {length} tokens)… "
                 f"({done}/{len(lengths)})")
            wb.warm_up(length)
    step("ready")


def checked_port(port) -> int:
    """--port: a TCP port, 0 … 65535 (0: the system picks a free one)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InputError(f"--port {port}: pass a port from 0 to 65535 (0 picks a free one).")
    return port


def serve(workbenches: Sequence[Workbench], *, host: str = "127.0.0.1", port: int = 8765, open_browser: bool = True,
          tour: bool = False, step: Callable[[str], None] = lambda what: print(what, file=sys.stderr)) -> None:
    """Serve until Ctrl-C: bind, print the URL as the first line on stdout, warm up in the background."""
    import socket
    import warnings
    import webbrowser

    import uvicorn

    from minibert import RecompileWarning

    # One program per row length (and one more per length for a sentence-transformers pair) is the plan, not
    # a hook that recompiles by mistake: the warning would only alarm whoever started the server.
    warnings.filterwarnings("ignore", category=RecompileWarning)

    checked_port(port)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        # No such name, or an address that is not this machine's: the host is wrong, not the port.
        fix = "pass a valid --host (127.0.0.1: this machine only)" if isinstance(error, socket.gaierror) or \
            error.errno == errno.EADDRNOTAVAIL else "choose another --port (0 picks a free one)"
        raise InputError(f"cannot listen on {host}:{port} ({error.strerror or error}); {fix}.") from None
    # Listen before printing the URL: a client that follows it at once (a script, a fast click) then waits in
    # the backlog until uvicorn accepts, instead of being refused while the server is still starting.
    sock.listen(128)
    port = sock.getsockname()[1]
    token = secrets.token_urlsafe(24)
    shown = ALL_ADDRESSES.get(host, host)
    shown = f"[{shown}]" if ":" in shown else shown
    url = f"http://{shown}:{port}/?token={token}" + ("&tour=1" if tour else "")
    print(url, flush=True)
    app = create_app(workbenches, token, host=host, port=port, tour=tour)
    threading.Thread(target=warm_up, args=(workbenches, step), daemon=True).start()
    if open_browser:
        webbrowser.open(url)
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
