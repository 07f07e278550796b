"""Where the C sources (shim/ and spank/) are: inside the installed package
(transit_launch/_csrc/, copied there by the package build, so `spank build` and the
tests work from a wheel), else beside the package in a source checkout."""

from __future__ import annotations

import re
from pathlib import Path

_PKG = Path(__file__).resolve().parent


def root() -> Path:
    packaged = _PKG / "_csrc"
    return packaged if (packaged / "shim" / "transit.h").is_file() else _PKG.parent


def shim() -> Path:
    return root() / "shim"


def spank() -> Path:
    return root() / "spank"


def first_error(output: str, rc: int) -> str:
    """The line of a C compiler's output that says what went wrong first (its last line
    is often only a caret under the code)."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    return next((ln for ln in lines if re.search(r"\b(error|fatal error)\b", ln)), lines[0] if lines else f"exit {rc}")
