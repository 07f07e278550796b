"""Helios traces (SenseTime's GPU clusters, the SC '21 paper's): one cluster_log.csv a
cluster (Earth, Saturn, Uranus, Venus), one Slurm job a row, with a header.

Columns, from github.com/S-Lab-System-Group/HeliosData, README.md ("cluster_log.csv",
Example and Schema): job_id, user, vc, gpu_num, cpu_num, node_num, state, submit_time,
start_time, end_time, duration, queue. Used:
  job_id       -> job id
  gpu_num      -> GPUs ("number of GPUs required for the job"; 0: a CPU job, dropped)
  submit_time  -> submit time ('2020-06-09 18:41:01', naive: the README names no zone; read
                  as UTC, so the first submission prints as the file writes it)
  duration     -> duration ("calculated from the difference between end_time and
                  start_time. (Unit: seconds)")
  state        -> end state as written: COMPLETED, CANCELLED, FAILED, TIMEOUT, NODE_FAIL
                  (the README's five; the latter two count as failed, as ACME's)
user, vc, cpu_num, node_num, start_time, end_time and queue are not used: the replay
decides the waits and the nodes. No time limits, no job types. Columns are found by name,
in any order (HeliosArtifact's analysis/trace_parser.py reads them with pandas by name).
Rows that cannot be read are dropped and counted by reason, as in sim/trace.py."""

from __future__ import annotations

from datetime import timezone
from pathlib import Path

from transit_launch.errors import UsageError
from transit_launch.sim.trace import Trace, _finish, _rows, csv_jobs

COLUMNS = ("job_id", "user", "vc", "gpu_num", "cpu_num", "node_num", "state", "submit_time", "start_time",
           "end_time", "duration", "queue")
TZ = timezone.utc


def is_helios(header: list[str]) -> bool:
    """The README's twelve columns; vc (and no type, no gpu_time) sets it apart from ACME's."""
    return set(COLUMNS) <= {h.strip() for h in header}


def parse(rows_in, path) -> Trace:
    header = next(rows_in, None)
    if not header or not is_helios(header):
        missing = sorted(set(COLUMNS) - {h.strip() for h in header or []})
        raise UsageError(f"trace {path} is not a Helios cluster_log.csv: its header lacks {', '.join(missing)}")
    col = {h.strip(): i for i, h in enumerate(header)}
    i_id, i_g, i_sub, i_dur, i_state = (col[c] for c in ("job_id", "gpu_num", "submit_time", "duration", "state"))
    rows, dropped = csv_jobs(rows_in, len(header), (i_sub, i_dur, i_g, i_id, None, i_state, None), TZ)
    return _finish(rows, dropped, f"{path} (helios)", TZ)


def load_helios(path: str | Path, progress=None) -> Trace:
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8-sig", errors="replace") as f:
            return parse(_rows(f, progress), path)
    except OSError as e:
        raise UsageError(f"cannot read trace {path}: {e.strerror}") from None
