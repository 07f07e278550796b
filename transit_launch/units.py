"""Byte sizes for the CLI: parse what users type with the shared grammar (rules.py) and
print decimal GB."""

from transit_launch import rules
from transit_launch.errors import UsageError

GB = 10**9


def parse_size(text: str, what: str = "size") -> int:
    """'80GB' -> 80_000_000_000. Raises UsageError naming `what` on bad input."""
    try:
        return rules.parse_size(text)
    except rules.SizeError as e:
        raise UsageError(f"{what}: {e}") from None


def gb(nbytes: float) -> float:
    """Bytes -> decimal GB, rounded for reports."""
    return round(nbytes / GB, 2)


def n_nodes(n: int) -> str:
    """'1 node', '3 nodes'."""
    return f"{n} node{'' if n == 1 else 's'}"
