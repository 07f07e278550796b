"""A trace file of any format simulate reads: the CSVs (sim/trace.py: ACME Seren/Kalos,
generic), SWF (sim/swf.py), Helios' cluster_log.csv (sim/helios.py), Philly's
cluster_job_log (sim/philly.py) and Alibaba PAI's job and task tables (sim/pai.py)."""

from __future__ import annotations

import csv
from pathlib import Path

from transit_launch.errors import UsageError
from transit_launch.sim import helios, pai, philly
from transit_launch.sim.swf import load_swf
from transit_launch.sim.trace import FORMATS as CSV_FORMATS
from transit_launch.sim.trace import Trace, detect_format, load_csv

FORMATS = CSV_FORMATS + ("helios", "swf", "philly", "pai")
HEADED = ("seren", "kalos", "generic", "helios")  # CSVs told apart by their header's column set
# the readers of the formats that are not sim/trace.py's CSVs
READERS = {"swf": load_swf, "helios": helios.load_helios, "philly": philly.load_philly, "pai": pai.load_pai}
OTHERS = ("or one of Helios' cluster_log.csv, Philly's cluster_job_log (a JSON list), Alibaba PAI's "
          f"{pai.JOB_TABLE} and {pai.TASK_TABLE} (by name), SWF (a name ending in .swf)")


def _head(path: Path) -> str:
    """The file's first 64 KiB as text (a byte-order mark dropped)."""
    try:
        with path.open(encoding="utf-8-sig", errors="replace", newline="") as f:
            return f.read(65536)
    except OSError as e:
        raise UsageError(f"cannot read trace {path}: {e.strerror}") from None


def kind(path: Path) -> str:
    """What auto reads path as: swf or pai by its name, philly when it begins as JSON does,
    else the CSV column set of its header (seren, kalos, helios, generic); "" when none."""
    if path.name.lower().endswith(".swf"):
        return "swf"
    if pai.is_pai(path):
        return "pai"
    head = _head(path)
    if head.lstrip()[:1] in ("[", "{"):
        return "philly"
    try:
        header = [h.strip() for h in next(csv.reader([head.splitlines()[0] if head else ""]), [])]
    except csv.Error:  # load_csv says what is wrong with it
        return ""
    try:
        found = detect_format(header)
    except UsageError:
        found = ""
    if found in ("seren", "kalos"):
        return found
    return "helios" if helios.is_helios(header) else found


def load(path: str | Path, fmt: str = "auto", progress=None) -> Trace:
    """auto: told apart by kind(); a format named is read as that format, except that a
    CSV header of another known column set is refused with what it is."""
    path = Path(path)
    found = kind(path)
    if fmt == "auto":
        fmt = found or "auto"
    elif found in HEADED and fmt in HEADED and found != fmt:
        raise UsageError(f"trace {path} has the {found} column set, not {fmt}")
    if fmt in READERS:
        return READERS[fmt](path, progress)
    try:
        return load_csv(path, fmt, progress)
    except UsageError as e:
        if str(e).startswith("unrecognised trace columns"):
            raise UsageError(f"{e}; {OTHERS}") from None
        raise
