"""Job traces: the ACME CSVs (Seren and Kalos column sets) and a minimal generic CSV
(SWF: sim/swf.py; synthetic ones: sim/synth.py). A trace is a list of jobs (submit
seconds, duration seconds, GPUs, job id, and where the source says so its type, end
state and time limit) sorted by submit time, plus the count of rows dropped for each
reason.

The generic CSV: a header naming submit_time (seconds, or ISO-8601 with UTC for a time
without an offset), duration (run time, seconds) and gpus (a count), in any order among
other columns; optional job_id, type (ACME's: Evaluation and Debug jobs are not scaled
in), state (COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL) and time_limit (seconds;
empty or 0: none recorded). A byte-order mark before the header is ignored.

Filtering follows the paper: only GPU jobs with a positive duration are kept; rows that
cannot be parsed (bad numbers, bytes that are not UTF-8, broken CSV quoting, times
outside the calendar) are dropped and counted, never guessed, and never a crash."""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from transit_launch.checks import integer, real
from transit_launch.errors import UsageError

FORMATS = ("auto", "seren", "kalos", "generic")  # what load_csv reads; auto detects
SEREN_COLUMNS = ("job_id", "user", "node_num", "gpu_num", "cpu_num", "type", "state", "submit_time",
                 "start_time", "end_time", "duration", "queue", "gpu_time")
KALOS_EXTRA = ("mem_per_pod_GB", "shared_mem_per_pod", "fail_time", "stop_time")
# ACME timestamps are naive local times: Seren in UTC+8, Kalos in UTC.
TIMEZONES = {"seren": timezone(timedelta(hours=8)), "kalos": timezone.utc}
GENERIC_REQUIRED = ("submit_time", "duration", "gpus")
# Submit times must lie in datetime's calendar (years 1-9999) to become an epoch; 1e300 or
# inf would print a makespan of 300 digits. Durations beyond a year are not one job's run
# (Slurm sites cap time limits at days or weeks): dropped as unreadable rather than
# replayed for centuries.
MIN_TIME, MAX_TIME = -62135596800.0, 253402300799.0
MAX_DURATION = 365 * 86400.0


@dataclass
class Trace:
    submit: list = field(default_factory=list)   # seconds since the first submission, ascending
    duration: list = field(default_factory=list)  # seconds
    gpus: list = field(default_factory=list)
    ids: list = field(default_factory=list)
    dropped: dict = field(default_factory=dict)   # reason -> rows
    types: list = field(default_factory=list)     # ACME's Pretrain, SFT, Evaluation...; empty: not recorded
    states: list = field(default_factory=list)    # COMPLETED, FAILED, CANCELLED...; empty: not recorded
    limits: list = field(default_factory=list)    # time limits, seconds; 0: not recorded; empty: none (sim/limits.py)
    source: str = ""
    epoch: datetime | None = None                 # wall time of submit == 0

    def __post_init__(self):  # the scheduler trusts these; a NaN submit time would loop forever
        n = len(self.submit)
        if not (len(self.duration) == len(self.gpus) == len(self.ids) == n):
            raise UsageError("a trace needs as many durations, GPU counts and ids as submit times")
        if not all(real(t) for t in self.submit) or any(a > b for a, b in zip(self.submit, self.submit[1:])):
            raise UsageError("trace submit times must be finite and ascending")
        if not all(real(d) and 0 < d <= MAX_DURATION for d in self.duration):
            raise UsageError(f"trace durations must lie in (0, {MAX_DURATION:.0f}] seconds")
        if not all(integer(g) and g > 0 for g in self.gpus):
            raise UsageError("trace GPU counts must be positive integers")
        if self.limits and (len(self.limits) != n or not all(real(x) and x >= 0 for x in self.limits)):
            raise UsageError("trace limits must be empty or one non-negative number of seconds a job")
        for name in ("types", "states"):
            v = getattr(self, name)
            if v and (len(v) != n or not all(isinstance(x, str) for x in v)):
                raise UsageError(f"trace {name} must be empty or one string a job")

    def job_type(self, i: int) -> str:
        return self.types[i] if self.types else ""

    def state(self, i: int) -> str:
        return self.states[i] if self.states else ""

    def __len__(self):
        return len(self.submit)


def _finish(rows: list, dropped: dict, source: str, tz) -> Trace:
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0] if rows else 0.0
    try:
        epoch = datetime.fromtimestamp(t0, tz) if rows else None
    except (ValueError, OverflowError, OSError):  # the calendar's edge, shifted by the zone
        epoch = None
    typed = any(r[4] for r in rows) or any(r[5] for r in rows)
    limited = any(r[6] for r in rows)
    return Trace(submit=[r[0] - t0 for r in rows], duration=[r[1] for r in rows], gpus=[r[2] for r in rows],
                 ids=[r[3] for r in rows], dropped=dropped, source=source, epoch=epoch,
                 types=[r[4] for r in rows] if typed else [], states=[r[5] for r in rows] if typed else [],
                 limits=[r[6] for r in rows] if limited else [])


def detect_format(header: list[str]) -> str:
    cols = set(header)
    if set(SEREN_COLUMNS) <= cols:
        return "kalos" if set(KALOS_EXTRA) & cols else "seren"
    if set(GENERIC_REQUIRED) <= cols:
        return "generic"
    missing = sorted(set(GENERIC_REQUIRED) - cols)
    raise UsageError(f"unrecognised trace columns {header[:8]}...: expected the ACME Seren/Kalos columns or "
                     f"a generic CSV with {', '.join(GENERIC_REQUIRED)} (missing {', '.join(missing)})")


def _time(text: str, tz) -> float:
    """ACME's '2023-03-01 00:00:10' (naive, in the cluster's zone) or ISO-8601 with an
    offset, as seconds since the epoch; generic traces may also give plain seconds.
    ValueError when it is neither, or outside the calendar."""
    try:
        t = float(text)
    except ValueError:
        dt = datetime.fromisoformat(text.strip())
        t = (dt if dt.tzinfo else dt.replace(tzinfo=tz)).timestamp()
    if not MIN_TIME <= t <= MAX_TIME:  # also refuses nan
        raise ValueError(f"submit time {text!r} outside the calendar")
    return t


def _count(text: str) -> int:
    """A GPU count: '8' or '8.0'; ValueError for '2.5', 'inf', 'nan' or words."""
    v = float(text)
    if not v.is_integer():  # inf and nan are not integers either
        raise ValueError(text)
    return int(v)


def _rows(f, progress=None):
    """The CSV rows of an open file; a row the csv module cannot split (an unclosed quote,
    a field over its size limit) comes as None, to be counted."""
    reader = csv.reader(_lines(f, progress))
    while True:
        try:
            yield next(reader)
        except StopIteration:
            return
        except csv.Error:
            yield None


def _lines(f, progress):
    """f's lines, telling progress(fraction of the file read) now and then."""
    size = max(1, os.fstat(f.fileno()).st_size)
    done = 0
    for i, line in enumerate(f):
        done += len(line)
        if progress and i % 65536 == 0:
            progress(min(1.0, done / size))
        yield line


def load_csv(path: str | Path, fmt: str = "auto", progress=None) -> Trace:
    path = Path(path)
    try:
        # bytes that are not UTF-8 become U+FFFD: the field fails to parse and the row is
        # dropped and counted, like any other unreadable row
        # (utf-8-sig: a byte-order mark, as spreadsheet programs write, is not the first column's name)
        f = path.open(newline="", encoding="utf-8-sig", errors="replace")
    except OSError as e:
        raise UsageError(f"cannot read trace {path}: {e.strerror}") from None
    try:
        with f:
            return _parse(path, fmt, _rows(f, progress))
    except OSError as e:  # a directory, or a read error half-way
        raise UsageError(f"cannot read trace {path}: {e.strerror}") from None


def duration_refusal(dur: float) -> str | None:
    """Why a job of this run time cannot be replayed (the reason a dropped row is counted
    under), or None."""
    if not math.isfinite(dur) or dur <= 0:
        return "zero or negative duration"
    if dur > MAX_DURATION:
        return "duration over a year"
    return None


def csv_jobs(rows_in, width: int, cols: tuple, tz) -> tuple[list, dict]:
    """The jobs of a CSV's rows after its header: cols = the column indexes of submit time,
    duration, GPUs, and of job id, type, state, time limit (None: not in the file; a job's
    id is then its row's number). (rows for _finish, the dropped rows counted by reason)."""
    i_sub, i_dur, i_g, i_id, i_type, i_state, i_lim = cols
    rows, dropped = [], {}

    def drop(reason):
        dropped[reason] = dropped.get(reason, 0) + 1

    for n, row in enumerate(rows_in, start=2):
        if row is None:
            drop("unreadable CSV row")
            continue
        if len(row) < width:
            drop("short row")
            continue
        try:
            gpus = _count(row[i_g])
        except (ValueError, OverflowError):
            drop("unparsable GPU count")
            continue
        if gpus <= 0:
            drop("not a GPU job")
            continue
        try:
            submit = _time(row[i_sub], tz)
        except (ValueError, OverflowError, OSError):
            drop("unparsable submit time")
            continue
        try:
            dur = float(row[i_dur])
        except ValueError:
            drop("unparsable duration")
            continue
        why = duration_refusal(dur)
        if why:
            drop(why)
            continue
        limit = 0.0
        if i_lim is not None and row[i_lim].strip():
            try:
                limit = float(row[i_lim])
            except ValueError:
                limit = -1.0
            if not 0 <= limit <= MAX_DURATION:  # also nan; 0: none recorded
                drop("unparsable time limit")
                continue
        rows.append((submit, dur, gpus, row[i_id] if i_id is not None else str(n - 1),
                     row[i_type].strip() if i_type is not None else "", row[i_state].strip() if i_state is not None else "",
                     limit))
    return rows, dropped


def _parse(path: Path, fmt: str, rows_in) -> Trace:
    header = next(rows_in, None)
    if not header:
        raise UsageError(f"trace {path} is empty or its first line is not a CSV header")
    header = [h.strip() for h in header]
    found = detect_format(header)
    if fmt != "auto" and fmt != found:
        raise UsageError(f"trace {path} has the {found} column set, not {fmt}")
    col = {name: i for i, name in enumerate(header)}
    if found == "generic":
        i_sub, i_dur, i_g, i_id, tz = col["submit_time"], col["duration"], col["gpus"], col.get("job_id"), timezone.utc
    else:
        i_sub, i_dur, i_g, i_id, tz = col["submit_time"], col["duration"], col["gpu_num"], col["job_id"], TIMEZONES[found]
    cols = (i_sub, i_dur, i_g, i_id, col.get("type"), col.get("state"), col.get("time_limit"))  # the last three optional
    rows, dropped = csv_jobs(rows_in, len(header), cols, tz)
    return _finish(rows, dropped, f"{path} ({found})", tz)
