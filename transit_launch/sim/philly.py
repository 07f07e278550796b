"""Philly traces (Microsoft's GPU clusters, the ATC '19 paper's): cluster_job_log, a JSON
list of jobs, each with its scheduling attempts.

Keys, from github.com/msr-fiddle/philly-traces, README.md ("cluster_job_log": example
entry and list of keys) and analysis/Philly Trace Analysis.ipynb (how it is parsed:
`json.load` of the whole file, a list of `Job(**job)`):
  jobid           -> job id
  submitted_time  -> submit time ('2017-10-07 01:11:39', the notebook's
                     '%Y-%m-%d %H:%M:%S'; the job log names no zone, its utilization logs
                     print PDT/PST: read as written, as UTC, so a run across the clock
                     change of 5 Nov 2017 is an hour off)
  attempts        -> duration: the sum of the attempts' end_time - start_time. The
                     notebook's run time is the last attempt's end minus the first's start;
                     the gaps between attempts are the job queued again, which the replay
                     decides, so they are not run time here.
                     GPUs: the first attempt's GPUs, summed over its detail[].gpus lists
                     (the notebook's num_gpus)
  status          -> end state: Pass COMPLETED, Killed CANCELLED, Failed FAILED
vc and user, and detail[].ip (the machines) are not used. No time limits, no job types.
Dropped and counted (the README's notes): a job with no attempts (never ran), a last
attempt with no end_time (still running when the log was taken), any other attempt with
no start or end time (a logging error: the run time is unknown) or one that ends before
it starts; a missing time is None, '' or 'None' (the notebook's parse_date). A record
that is not a job object is dropped as malformed; a file that is not a JSON list is
refused."""

from __future__ import annotations

import json
from datetime import timezone
from pathlib import Path

from transit_launch.errors import UsageError
from transit_launch.sim.trace import Trace, _finish, _lines, _time, duration_refusal

STATES = {"Pass": "COMPLETED", "Killed": "CANCELLED", "Failed": "FAILED"}
TZ = timezone.utc


class _Missing(Exception):
    pass


def _when(value) -> float:
    """A time of the log as epoch seconds; _Missing for None, '' or 'None'; ValueError for
    anything else that is not a time."""
    if value is None or value in ("", "None"):
        raise _Missing
    if not isinstance(value, str):
        raise ValueError(value)
    return _time(value, TZ)


def _gpus(attempt) -> int:
    """GPUs of an attempt: the lengths of its detail[].gpus lists; TypeError when malformed."""
    detail = attempt["detail"]
    if not isinstance(detail, list) or not all(isinstance(d, dict) and isinstance(d["gpus"], list) for d in detail):
        raise TypeError("detail")
    return sum(len(d["gpus"]) for d in detail)


def parse(jobs, path) -> Trace:
    if not isinstance(jobs, list):
        raise UsageError(f"trace {path} is JSON but not a list of jobs (Philly's cluster_job_log is one)")
    rows, dropped = [], {}

    def drop(reason):
        dropped[reason] = dropped.get(reason, 0) + 1

    for job in jobs:
        try:
            attempts, jobid, status = job["attempts"], job["jobid"], job.get("status")
            if not isinstance(attempts, list) or not all(isinstance(a, dict) for a in attempts):
                raise TypeError("attempts")
            gpus = _gpus(attempts[0]) if attempts else 0
        except (TypeError, KeyError, IndexError):
            drop("malformed job record")
            continue
        if not attempts:
            drop("no attempts (never ran)")
            continue
        if gpus <= 0:
            drop("not a GPU job")
            continue
        try:
            submit = _when(job.get("submitted_time"))
        except (_Missing, ValueError, OverflowError, OSError):
            drop("unparsable submit time")
            continue
        run, why = 0.0, ""
        for k, a in enumerate(attempts):
            try:
                end = _when(a.get("end_time"))
                start = _when(a.get("start_time"))
            except _Missing:
                last_open = k == len(attempts) - 1 and a.get("end_time") in (None, "", "None")
                why = "still running when the log was taken" if last_open else "attempt without a start or end time"
                break
            except (ValueError, OverflowError, OSError):
                why = "unparsable attempt time"
                break
            if end < start:
                why = "attempt ending before it starts"
                break
            run += end - start
        if why:
            drop(why)
            continue
        why = duration_refusal(run)
        if why:
            drop(why)
            continue
        rows.append((submit, run, gpus, str(jobid), "", STATES.get(status, "") if isinstance(status, str) else "",
                     0.0))
    return _finish(rows, dropped, f"{path} (philly)", TZ)


def load_philly(path: str | Path, progress=None) -> Trace:
    path = Path(path)
    try:
        with path.open(encoding="utf-8-sig", errors="replace") as f:
            text = "".join(_lines(f, progress))
    except OSError as e:
        raise UsageError(f"cannot read trace {path}: {e.strerror}") from None
    try:
        jobs = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"trace {path} is not valid JSON ({e.msg}: line {e.lineno} column {e.colno}); Philly's "
                         "cluster_job_log is a JSON list of jobs") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise UsageError(f"trace {path} is not JSON Philly's cluster_job_log can hold: {e}") from None
    except RecursionError:
        raise UsageError(f"trace {path} nests its JSON too deeply to be Philly's cluster_job_log") from None
    return parse(jobs, path)
