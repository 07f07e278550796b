"""argparse pieces every subcommand shares: a parser whose errors are one line and exit 2
(through UsageError), and value types that refuse bad input with a clear message."""

from __future__ import annotations

import argparse

from transit_launch import rules
from transit_launch.errors import UsageError


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse would print usage + message)
        raise UsageError(message)


def number(cast, what, minimum, desc):
    """argparse type: cast(text) >= minimum, else one clear line."""
    def conv(text):
        try:
            v = cast(text)
        except ValueError:
            v = None
        if v is None or v < minimum:
            raise argparse.ArgumentTypeError(f"{what} must be {desc}, got {text!r}")
        return v
    return conv


def positive_int(what):
    return number(int, what, 1, "a positive integer")


nonneg_float = number(float, "the value", 0.0, "a non-negative number")


def size(text):
    """argparse type: a size in the shared grammar (rules.py), as bytes."""
    try:
        return rules.parse_size(text)
    except rules.SizeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def fractions(flag, allow_zero=False):
    """Comma-separated fractions: in (0, 1), or [0, 1) with allow_zero."""
    def conv(text):
        try:
            vals = [float(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} takes fractions like 0.25,0.5, got {text!r}") from None
        low_ok = (lambda v: v >= 0) if allow_zero else (lambda v: v > 0)
        if not vals or any(not (low_ok(v) and v < 1) for v in vals):
            span = "must lie in [0, 1)" if allow_zero else "fractions must lie strictly between 0 and 1"
            raise argparse.ArgumentTypeError(f"{flag} {span}, got {text!r}")
        return vals
    return conv
