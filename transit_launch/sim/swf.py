"""Traces in the Standard Workload Format (SWF, the Parallel Workloads Archive's): one job a
line, 18 whitespace-separated fields, -1 for unknown; header lines begin with ';'.

Field mapping (1-based, as the format numbers them):
  1 job number        -> job id
  2 submit time (s)   -> submit time (from the log's start; `; UnixStartTime: T` in the
                         header gives the wall time of 0)
  4 run time (s)      -> duration
  5 allocated procs   -> GPUs (a processor of the log is a GPU here; -1: field 8, the
                         requested count)
  9 requested time(s) -> time limit (-1 or 0: none recorded, sim/limits.py models one)
 11 status            -> end state: 1 COMPLETED, 0 FAILED, 5 CANCELLED, else unknown
                         (a failed job keeps its recorded time to failure under scale-in)
Fields 3 (wait), 6-8, 10 and 12-18 are not used: the replay decides the waits. Jobs have
no type (every multi-node job is eligible for scale-in). Lines that cannot be read are
dropped and counted by reason, as in the CSV loaders."""

from __future__ import annotations

import math
from datetime import timezone
from pathlib import Path

from transit_launch.errors import UsageError
from transit_launch.sim.trace import MAX_DURATION, Trace, _finish, _lines, duration_refusal

STATES = {1: "COMPLETED", 0: "FAILED", 5: "CANCELLED"}


def _num(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(text)
    return v


def parse(lines, source: str) -> Trace:
    rows, dropped, start = [], {}, 0.0

    def drop(reason):
        dropped[reason] = dropped.get(reason, 0) + 1

    for line in lines:
        text = line.strip()
        if not text:
            continue
        if text.startswith(";"):
            key, _, value = text[1:].partition(":")
            if key.strip() == "UnixStartTime":
                try:
                    start = _num(value)
                except ValueError:
                    pass
            continue
        f = text.split()
        if len(f) < 11:
            drop("short row")
            continue
        try:
            submit, run, procs, asked, limit, status = (_num(f[1]), _num(f[3]), _num(f[4]), _num(f[7]), _num(f[8]),
                                                        _num(f[10]))
        except ValueError:
            drop("unparsable number")
            continue
        gpus = procs if procs > 0 else asked
        if gpus <= 0:
            drop("not a GPU job")
            continue
        if not gpus.is_integer():
            drop("unparsable GPU count")
            continue
        why = duration_refusal(run)
        if why:
            drop(why)
            continue
        rows.append((start + submit, run, int(gpus), f[0], "", STATES.get(int(status), ""),
                     limit if 0 < limit <= MAX_DURATION else 0.0))
    return _finish(rows, dropped, source, timezone.utc)


def load_swf(path: str | Path, progress=None) -> Trace:
    path = Path(path)
    try:
        with path.open(encoding="utf-8-sig", errors="replace") as f:
            return parse(_lines(f, progress), f"{path} (swf)")
    except OSError as e:
        raise UsageError(f"cannot read trace {path}: {e.strerror}") from None
