"""The `minibert` command's entry point: Ctrl-C is handled from the first moment, before the imports.

Importing JAX takes seconds, and a KeyboardInterrupt raised inside it can leave its extension half initialised: the
process died by SIGSEGV, printed a long ImportError traceback, or printed "Exception ignored in _xla_gc_callback"
and ran on. So the handler (one line, status 130: cli._interrupted's) is installed before anything is imported,
and `import minibert` itself imports nothing heavy (minibert/__init__.py's lazy names).
"""

from __future__ import annotations

import os
import signal
import sys

INTERRUPTED = 130  # the shell's status for a command stopped by Ctrl-C (128 + SIGINT), as cli.INTERRUPTED


def main() -> int:
    command = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), "")
    signal.signal(signal.SIGINT, lambda signum, frame: _interrupted(command))
    from minibert.app import cli  # imports the library; cli.main installs its own handler (the same line)

    return cli.main()


def _interrupted(command: str) -> None:
    print(f"\nminibert{' ' + command if command else ''}: interrupted", file=sys.stderr, flush=True)
    os._exit(INTERRUPTED)


if __name__ == "__main__":
    sys.exit(main())
