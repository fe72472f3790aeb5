"""Reference libraries the tests compare against (circuit-tracer, sae-lens): skipped where one is not installed,
except in CI (the environment variable CI is "true"), where a missing reference library fails the test instead
of skipping it — a parity check that quietly stops running is no check."""

from __future__ import annotations

import importlib
import os

import pytest


def reference_library(name: str):
    """The module `name`: imported outright in CI (an ImportError fails the test), else pytest.importorskip."""
    if os.environ.get("CI") == "true":
        return importlib.import_module(name)
    return pytest.importorskip(name)
