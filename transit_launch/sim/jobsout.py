"""`simulate --jobs-out FILE`: one CSV row a job, scenario and seed, as the replay ran it.

Columns: seed, scenario, job (the trace's id), submit, start, end (seconds from the first
submission), gpus and nodes it held, nodes it asked (before scale-in), racks it spanned,
limit (the time limit the scheduler planned on, seconds), scaled_in (1 when it ran on
fewer nodes than it asked). Rows are written as each scenario ends, so that a million
jobs do not wait in memory."""

from __future__ import annotations

import csv

from transit_launch.errors import UsageError
from transit_launch.sim.scheduler import Result

COLUMNS = ("seed", "scenario", "job", "submit", "start", "end", "gpus", "nodes", "asked_nodes", "racks", "limit",
           "scaled_in")


class JobsOut:
    def __init__(self, path: str):
        self.path = path
        try:
            self.f = open(path, "w", newline="", encoding="utf-8")
        except OSError as e:
            raise UsageError(f"cannot write --jobs-out {path}: {e.strerror}") from None
        self.w = csv.writer(self.f)
        self.w.writerow(COLUMNS)

    def write(self, seed: int, res: Result, ids: list, submit: list) -> None:
        name = res.scenario.name
        try:
            self.w.writerows((seed, name, ids[i], f"{submit[i]:.3f}", f"{res.start[i]:.3f}", f"{res.end[i]:.3f}",
                              res.gpus[i], res.nodes[i], res.orig_nodes[i], res.racks[i], f"{res.limit[i]:.0f}",
                              int(res.nodes[i] < res.orig_nodes[i])) for i in range(len(res.start)))
        except OSError as e:
            raise UsageError(f"cannot write --jobs-out {self.path}: {e.strerror}") from None

    def close(self) -> None:
        self.f.close()
