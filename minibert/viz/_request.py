"""Checks on the numbers a workbench request carries (the server's and the "why" panel's), each error naming the
field, its range and what came."""

from __future__ import annotations

from collections.abc import Mapping

from minibert.errors import InputError


def index(body: Mapping, key: str, count: int, what: str, default: int | None = None) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
        raise InputError(f"{key!r} must be a whole number from 0 to {count - 1} (the model has {count} {what}); "
                         f"got {value!r}.")
    return value
