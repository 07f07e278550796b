"""A trace file of any format simulate reads: SWF (sim/swf.py) or the CSVs (sim/trace.py)."""

from __future__ import annotations

from pathlib import Path

from transit_launch.sim.swf import load_swf
from transit_launch.sim.trace import FORMATS as CSV_FORMATS
from transit_launch.sim.trace import Trace, load_csv

FORMATS = CSV_FORMATS + ("swf",)


def load(path: str | Path, fmt: str = "auto", progress=None) -> Trace:
    """auto: SWF when the name ends in .swf, else a CSV told apart by its header."""
    if fmt == "swf" or (fmt == "auto" and str(path).lower().endswith(".swf")):
        return load_swf(path, progress)
    return load_csv(path, fmt, progress)
