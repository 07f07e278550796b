"""Job traces: the ACME CSVs (Seren and Kalos column sets), a minimal generic CSV, and a
synthetic generator. A trace is a list of jobs (submit seconds, duration seconds, GPUs,
job id) sorted by submit time, plus the count of rows dropped for each reason.

Filtering follows the paper: only GPU jobs with a positive duration are kept; rows that
cannot be parsed are dropped and counted, never guessed."""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from transit_launch.errors import UsageError

SEREN_COLUMNS = ("job_id", "user", "node_num", "gpu_num", "cpu_num", "type", "state", "submit_time",
                 "start_time", "end_time", "duration", "queue", "gpu_time")
KALOS_EXTRA = ("mem_per_pod_GB", "shared_mem_per_pod", "fail_time", "stop_time")
# ACME timestamps are naive local times: Seren in UTC+8, Kalos in UTC.
TIMEZONES = {"seren": timezone(timedelta(hours=8)), "kalos": timezone.utc}
GENERIC_REQUIRED = ("submit_time", "duration", "gpus")


@dataclass
class Trace:
    submit: list = field(default_factory=list)   # seconds since the first submission
    duration: list = field(default_factory=list)  # seconds
    gpus: list = field(default_factory=list)
    ids: list = field(default_factory=list)
    dropped: dict = field(default_factory=dict)   # reason -> rows
    source: str = ""
    epoch: datetime | None = None                 # wall time of submit == 0

    def __len__(self):
        return len(self.submit)

    def drop(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + n


def _finish(trace: Trace, rows: list) -> Trace:
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0] if rows else 0.0
    trace.submit = [r[0] - t0 for r in rows]
    trace.duration = [r[1] for r in rows]
    trace.gpus = [r[2] for r in rows]
    trace.ids = [r[3] for r in rows]
    return trace


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
    offset, as seconds since the epoch; generic traces may also give plain seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    dt = datetime.fromisoformat(text.strip())
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=tz)
    return dt.timestamp()


def load_csv(path: str | Path, fmt: str = "auto") -> Trace:
    path = Path(path)
    try:
        f = path.open(newline="")
    except OSError as e:
        raise UsageError(f"cannot read trace {path}: {e.strerror}") from None
    with f:
        reader = csv.reader(f)
        header = next(reader, None)
        if not header:
            raise UsageError(f"trace {path} is empty")
        header = [h.strip() for h in header]
        found = detect_format(header)
        if fmt != "auto" and fmt != found:
            raise UsageError(f"trace {path} has the {found} column set, not {fmt}")
        col = {name: i for i, name in enumerate(header)}
        trace = Trace(source=f"{path} ({found})")
        rows = []
        if found == "generic":
            i_sub, i_dur, i_g = col["submit_time"], col["duration"], col["gpus"]
            i_id = col.get("job_id")
            tz = timezone.utc
        else:
            i_sub, i_dur, i_g, i_id = col["submit_time"], col["duration"], col["gpu_num"], col["job_id"]
            tz = TIMEZONES[found]
        width = len(header)
        for n, row in enumerate(reader, start=2):
            if len(row) < width:
                trace.drop("short row")
                continue
            try:
                gpus = int(float(row[i_g]))
            except ValueError:
                trace.drop("unparsable GPU count")
                continue
            if gpus <= 0:
                trace.drop("not a GPU job")
                continue
            try:
                submit = _time(row[i_sub], tz)
            except ValueError:
                trace.drop("unparsable submit time")
                continue
            try:
                dur = float(row[i_dur])
            except ValueError:
                trace.drop("unparsable duration")
                continue
            if not math.isfinite(dur) or dur <= 0:
                trace.drop("zero or negative duration")
                continue
            rows.append((submit, dur, gpus, row[i_id] if i_id is not None else str(n - 1)))
    if rows:
        t0 = min(r[0] for r in rows)
        trace.epoch = datetime.fromtimestamp(t0, tz)
    return _finish(trace, rows)


# --- synthetic traces ------------------------------------------------------------

@dataclass(frozen=True)
class SynthSpec:
    """Documented distributions (defaults shaped like ACME Seren: mostly small jobs,
    a heavy tail of multi-node ones).

    sizes: GPU counts and their probabilities.
    duration: lognormal with this median (seconds) and sigma, capped at max_duration.
    arrivals: Poisson; the rate makes the offered load (GPU-seconds asked per second
    over the cluster's GPUs) equal `load` for a cluster of `cluster_gpus`.
    """
    sizes: tuple = ((1, 0.45), (2, 0.10), (4, 0.12), (8, 0.15), (16, 0.08), (32, 0.05), (64, 0.03), (128, 0.02))
    median_duration: float = 1800.0
    sigma: float = 1.5
    max_duration: float = 7 * 86400.0
    load: float = 0.8
    cluster_gpus: int = 72 * 32


def synthetic(n: int, seed: int, spec: SynthSpec = SynthSpec()) -> Trace:
    if n < 1:
        raise UsageError(f"--synthetic needs a positive number of jobs, got {n}")
    rng = random.Random(seed)
    values = [s for s, _ in spec.sizes]
    weights = [w for _, w in spec.sizes]
    gpus = rng.choices(values, weights, k=n)
    mu = math.log(spec.median_duration)
    dur = [min(spec.max_duration, max(1.0, rng.lognormvariate(mu, spec.sigma))) for _ in range(n)]
    mean_work = sum(g * d for g, d in zip(gpus, dur)) / n
    rate = spec.load * spec.cluster_gpus / mean_work  # jobs per second
    t, submit = 0.0, []
    for _ in range(n):
        submit.append(t)
        t += rng.expovariate(rate)
    return Trace(submit=submit, duration=dur, gpus=gpus, ids=[str(i) for i in range(n)],
                 source=f"synthetic n={n} seed={seed} load={spec.load}")
