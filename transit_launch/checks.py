"""The type tests the dataclasses share, so that Python callers get the CLI's checks:
values may come from TOML, JSON or code, and in Python True is an int and nan a float."""

from __future__ import annotations

import math


def integer(v) -> bool:
    """An int, not a bool (nor a float, a string or None)."""
    return isinstance(v, int) and not isinstance(v, bool)


def real(v) -> bool:
    """A finite int or float, not a bool (nor nan or inf)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
