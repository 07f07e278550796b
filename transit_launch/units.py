"""Byte sizes: parse what users type ("80GB", "141GiB", "512M") and print GB.

Decimal units (GB = 1e9) are what GPU and DRAM vendors print and what the paper
reports; binary units (GiB = 2**30) are accepted too. A bare number is bytes.
"""

import re

from transit_launch.errors import UsageError

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "kib": 2**10,
    "m": 10**6, "mb": 10**6, "mib": 2**20,
    "g": 10**9, "gb": 10**9, "gib": 2**30,
    "t": 10**12, "tb": 10**12, "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")

GB = 10**9


def parse_size(text: str, what: str = "size") -> int:
    """'80GB' -> 80_000_000_000. Raises UsageError naming `what` on bad input."""
    m = _SIZE_RE.match(str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise UsageError(f"{what}: cannot parse {text!r} as a size (examples: 80GB, 141GiB, 512MiB)")
    value = float(m.group(1)) * _UNITS[unit]
    if value <= 0:
        raise UsageError(f"{what}: {text!r} must be larger than zero")
    return int(value)


def gb(nbytes: float) -> float:
    """Bytes -> decimal GB, rounded for reports."""
    return round(nbytes / GB, 2)
