"""Alibaba PAI's GPU trace of 2020 (cluster-trace-gpu-v2020, the NSDI '22 paper's): a job
table and a task table, CSVs without a header, read together (the task table from the
same folder: pai_task_table.csv beside pai_job_table.csv).

Columns, in order, from github.com/alibaba/clusterdata: cluster-trace-gpu-v2020/data/
pai_job_table.header and pai_task_table.header (the CSVs carry none: analysis/utils.py's
get_df reads them with header=None and takes the names from the .header files), meanings
from cluster-trace-gpu-v2020/README.md:
  pai_job_table:  job_name, inst_id, user, status, start_time, end_time
  pai_task_table: job_name, task_name, inst_num, status, start_time, end_time, plan_cpu,
                  plan_mem, plan_gpu, gpu_type
Used:
  job inst_id          -> job id (the README: "please treat or revise it as job_id")
  job start_time       -> submit time ("timestamp of job submission time"; seconds, shifted
                          by a constant; as Unix time in UTC+8 they keep the time of day
                          and the weekday, not the date)
  job status           -> end state: Terminated COMPLETED, Failed FAILED ("only
                          'Terminated' tasks are successful"); Running and Waiting jobs
                          have not ended: dropped
  job end_time and the earliest task start_time -> duration: the job's completion minus
                          its first task's launch (the README: the gap from the job's
                          start_time to the earliest task start_time is its wait, which
                          the replay decides); a start or end of 0 or none is no time
                          (utils.py sets start_time == 0 to NaN)
  task inst_num x plan_gpu -> GPUs, summed over the job's tasks: plan_gpu is "number of
                          GPUs requested in percentage (i.e., 50.0 is 50% GPU)", an
                          instance's share; each instance is given whole GPUs here
                          (ceil(plan_gpu / 100): 50 -> 1, 150 -> 2), as the replay has no
                          GPU sharing; an empty plan_gpu is none (a CPU task)
user, task_name, task status and times other than the first launch, plan_cpu, plan_mem
and gpu_type are not used. No time limits, no job types. Rows that cannot be read are
dropped and counted by reason, as in sim/trace.py; a job whose task rows cannot be read is
dropped whole, and task rows of no job in the job table are counted."""

from __future__ import annotations

import math
from datetime import timedelta, timezone
from pathlib import Path

from transit_launch.errors import UsageError
from transit_launch.sim.trace import MAX_TIME, MIN_TIME, Trace, _finish, _rows, duration_refusal

JOB_TABLE, TASK_TABLE = "pai_job_table.csv", "pai_task_table.csv"
JOB_COLUMNS = ("job_name", "inst_id", "user", "status", "start_time", "end_time")
TASK_COLUMNS = ("job_name", "task_name", "inst_num", "status", "start_time", "end_time", "plan_cpu", "plan_mem",
                "plan_gpu", "gpu_type")
STATES = {"Terminated": "COMPLETED", "Failed": "FAILED"}
NOT_ENDED = frozenset({"Running", "Waiting"})
TZ = timezone(timedelta(hours=8))  # the README's "Asia/Shanghai"; analysis/utils.py's tz too
BAD = -1  # a job whose task rows could not all be read


def is_pai(path: Path) -> bool:
    """Told by the name: one of the two tables, or a folder holding the job table."""
    return path.name in (JOB_TABLE, TASK_TABLE) or (path.is_dir() and (path / JOB_TABLE).is_file())


def tables(path: Path) -> tuple[Path, Path]:
    """(job table, task table): the task table named, or the folder given, finds the job
    table beside it; any other name is the job table."""
    if path.is_dir():
        return path / JOB_TABLE, path / TASK_TABLE
    if path.name == TASK_TABLE:
        return path.with_name(JOB_TABLE), path
    return path, path.with_name(TASK_TABLE)


def _seconds(text: str) -> float:
    """A time of the tables; 0.0 for none (empty, or 0 as the tables write it)."""
    if not text.strip():
        return 0.0
    t = float(text)
    if not MIN_TIME <= t <= MAX_TIME:  # also nan
        raise ValueError(text)
    return t


def _tasks(rows_in, drop) -> dict:
    """job_name -> [GPUs, earliest launch (0: none), task rows], or [BAD, ...] when one of
    its task rows could not be read."""
    out = {}
    for row in rows_in:
        if row is None or len(row) < len(TASK_COLUMNS):
            drop("unreadable or short task row")  # its job, unknown, is kept
            continue
        if list(row) == list(TASK_COLUMNS):  # a header someone prepended
            continue
        job = out.setdefault(row[0], [0, 0.0, 0])
        job[2] += 1
        if job[0] == BAD:
            continue
        try:
            inst = float(row[2])
            share = float(row[8]) if row[8].strip() else 0.0
            start = _seconds(row[4])
            if not inst.is_integer() or inst < 0 or not math.isfinite(share) or share < 0:
                raise ValueError(row)
        except ValueError:
            job[0] = BAD
            continue
        job[0] += int(inst) * math.ceil(share / 100)
        if start > 0 and (job[1] == 0 or start < job[1]):
            job[1] = start
    return out


def parse(job_rows, task_rows, path) -> Trace:
    rows, dropped = [], {}

    def drop(reason, n=1):
        dropped[reason] = dropped.get(reason, 0) + n

    tasks = _tasks(task_rows, drop)
    seen = set()
    for row in job_rows:
        if row is None or len(row) < len(JOB_COLUMNS):
            drop("unreadable or short job row")
            continue
        if list(row) == list(JOB_COLUMNS):
            continue
        name, status = row[0], row[3].strip()
        if name in seen:
            drop("job named twice")
            continue
        seen.add(name)
        task = tasks.pop(name, None)
        if status in NOT_ENDED:
            drop("running or waiting when the trace was taken")
            continue
        if task is None:
            drop("no task rows")
            continue
        if task[0] == BAD:
            drop("unparsable task row")
            continue
        if task[0] <= 0:
            drop("not a GPU job")
            continue
        try:
            submit = _seconds(row[4])
        except ValueError:
            submit = 0.0
        if submit == 0:  # none recorded, or not a number
            drop("unparsable or no submit time")
            continue
        try:
            end = _seconds(row[5])
        except ValueError:
            end = 0.0
        if task[1] <= 0 or end <= 0:
            drop("no launch or end time")
            continue
        dur = end - task[1]
        why = duration_refusal(dur)
        if why:
            drop(why)
            continue
        rows.append((submit, dur, task[0], row[1] or name, "", STATES.get(status, ""), 0.0))
    left = sum(t[2] for t in tasks.values())
    if left:
        drop("task rows of no job in the job table", left)
    return _finish(rows, dropped, f"{path} (pai)", TZ)


def _open(path: Path):
    # bytes that are not UTF-8 become U+FFFD: the field fails to parse and the row is counted
    return path.open(newline="", encoding="utf-8-sig", errors="replace")


def load_pai(path: str | Path, progress=None) -> Trace:
    path = Path(path)
    jobs_path, tasks_path = tables(path)
    for p in (jobs_path, tasks_path):
        if not p.is_file():
            other = "" if p == path else f" (simulate reads {TASK_TABLE} and {JOB_TABLE} together, from one folder)"
            raise UsageError(f"cannot read trace {p}: {'no such file' if not p.exists() else 'not a file'}{other}")
    try:
        with _open(tasks_path) as tf, _open(jobs_path) as jf:
            half = (lambda x: progress(x / 2)) if progress else None
            rest = (lambda x: progress(0.5 + x / 2)) if progress else None
            task_rows, job_rows = _rows(tf, half), _rows(jf, rest)
            return parse(job_rows, task_rows, jobs_path)
    except OSError as e:
        raise UsageError(f"cannot read trace {path}: {e.strerror}") from None
