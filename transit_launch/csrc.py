"""Where the C sources (shim/ and spank/) are: inside the installed package
(transit_launch/_csrc/, copied there by the package build, so `spank build` and the
tests work from a wheel), else beside the package in a source checkout."""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def root() -> Path:
    packaged = _PKG / "_csrc"
    return packaged if (packaged / "shim" / "transit.h").is_file() else _PKG.parent


def shim() -> Path:
    return root() / "shim"


def spank() -> Path:
    return root() / "spank"
