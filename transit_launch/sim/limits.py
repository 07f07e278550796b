"""Jobs' time limits, apart from their run times, and the Slurm scheduler parameters the
replay plans with (sim/scheduler.py).

Slurm plans reservations and backfill on a job's time limit (`--time`, whole minutes), not
on how long it will run, which no scheduler knows; a job ends at its run time. A limit
comes from the trace where it records one (SWF's requested time, a generic CSV's
`time_limit`), else from a model (`modelled`): the run time times a user's overestimate
drawn from [1, --limit-factor] by the run's seed (factor 1, the default: a user who knew
the run time exactly; nothing random). Either way it is at least the
run time (a recorded limit below it was a grace period of the trace's own site: the job
ran that long) and rounded up to a whole minute, as `--time` is. A scaled-in job's limit
stretches as its run time does at submission (n / n' / efficiency); a placement slow-down
that takes it past its limit raises the limit to its run time (the job is never killed)."""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass

from transit_launch.checks import integer, real
from transit_launch.errors import UsageError
from transit_launch.sim.trace import Trace

MINUTE = 60.0
PLAN_ON = ("limits", "runtimes")
RESERVE_AT = ("earliest", "slurm")


def minutes_up(seconds: float) -> float:
    """Seconds rounded up to a whole minute, at least one (Slurm's --time unit)."""
    return max(1, math.ceil(seconds / MINUTE - 1e-9)) * MINUTE


def of(duration: list, recorded: list) -> list:
    """Every job's limit in seconds: the recorded one (a positive value) or the run time,
    at least the run time, rounded up to a minute."""
    return [minutes_up(max(d, recorded[i] if recorded else 0.0)) for i, d in enumerate(duration)]


def modelled(trace: Trace, factor: float, seed: int) -> Trace:
    """The trace with a limit for every job: a recorded one stays; another is the run time
    times a user's overestimate drawn uniformly from [1, factor] (seeded; factor 1: the run
    time itself). One draw a job, recorded or not, so that a seed's draws do not shift
    with which jobs record limits."""
    if not real(factor) or not 1 <= factor <= 100:
        raise UsageError(f"--limit-factor takes 1 to 100 (a limit is at least the run time), got {factor!r}")
    rng = random.Random(seed)
    out = []
    for i, d in enumerate(trace.duration):
        over = 1 + (factor - 1) * rng.random()
        r = trace.limits[i] if trace.limits else 0.0
        out.append(r if r > 0 else d * over)
    return dataclasses.replace(trace, limits=out)


@dataclass(frozen=True)
class SchedParams:
    """Slurm's defaults (slurm.conf SchedulerParameters, sched/backfill):
    bf_max_job_test: jobs the backfill pass tests, the queue's head included (500);
    bf_interval: seconds between backfill passes (30); between them only the head of the
      queue starts (the main scheduler); 0 backfills at every event;
    bf_resolution: seconds to which the head's reservation is rounded down (60); 0: exact;
    plan_on: limits (Slurm) or runtimes (a scheduler that knows every run time: the
      simulator before limits, kept for what-ifs);
    bf_window: seconds ahead a backfill pass plans; a job that cannot start sooner gets no
      reservation (1440 minutes);
    bf_reserve: jobs a pass gives a reservation, in queue order; the later ones only start
      if they fit now without delaying those (Slurm's bf_job_part_count_reserve, whose 0,
      its default, reserves for every job tested: 0 here too; the simulator's default is 1,
      the head's on its own nodes, for speed: sim/backfill.py, docs/simulate.md);
    bf_reserve_at: where a reservation starts and which nodes it holds: earliest (the
      earliest time the job fits, the simulator's default) or slurm (Slurm's _will_run_test:
      at the last planned end of the batch of running jobs whose ending lets it fit;
      sim/backfill.py's slurm_reservation);
    epilog: seconds a node takes no new job after a job on it ends (Slurm keeps a COMPLETING
      node, its epilog running, out of every new job: node_scheduler.c's cg_node_bitmap); the
      job's GPUs come back then (0: at its end, the default)."""
    bf_max_job_test: int = 500
    bf_interval: float = 30.0
    bf_resolution: float = 60.0
    plan_on: str = "limits"
    bf_window: float = 86400.0
    bf_reserve: int = 1
    bf_reserve_at: str = "earliest"
    epilog: float = 0.0

    def __post_init__(self):
        if not integer(self.bf_max_job_test) or not 1 <= self.bf_max_job_test <= 1_000_000:
            raise UsageError(f"--bf-max-job-test takes 1 to 1,000,000 jobs, got {self.bf_max_job_test!r}")
        for name in ("bf_interval", "bf_resolution"):
            v = getattr(self, name)
            if not real(v) or not 0 <= v <= 86400:
                raise UsageError(f"--{name.replace('_', '-')} takes 0 to 86400 seconds, got {v!r}")
        if not real(self.bf_window) or not 60 <= self.bf_window <= 30 * 86400:
            shown = self.bf_window / 60 if real(self.bf_window) else self.bf_window
            raise UsageError(f"--bf-window takes 1 to 43,200 minutes (30 days), got {shown!r}")
        if not integer(self.bf_reserve) or not 0 <= self.bf_reserve <= 1_000_000:
            raise UsageError(f"--bf-reserve takes 0 (every job tested) to 1,000,000 jobs, got {self.bf_reserve!r}")
        if self.plan_on not in PLAN_ON:
            raise UsageError(f"--plan-on {self.plan_on!r} is not one of {', '.join(PLAN_ON)}")
        if not real(self.epilog) or not 0 <= self.epilog <= 3600:
            raise UsageError(f"--epilog takes 0 to 3600 seconds, got {self.epilog!r}")
        if self.bf_reserve_at not in RESERVE_AT:
            raise UsageError(f"--bf-reserve-at {self.bf_reserve_at!r} is not one of {', '.join(RESERVE_AT)}")

    def reported(self) -> dict:
        """The parameters as --json reports them: bf_reserve_at and epilog only where they are
        not the default, so that a default run's report is what it was before the options."""
        d = dict(vars(self))
        if d["bf_reserve_at"] == RESERVE_AT[0]:
            del d["bf_reserve_at"]
        if not d["epilog"]:
            del d["epilog"]
        return d

    def reservation(self, t: float) -> float:
        """A reservation's start as the backfill pass sees it (rounded down to bf_resolution)."""
        r = self.bf_resolution
        return t if not r or math.isinf(t) else math.floor(t / r) * r

    def next_pass(self, t: float) -> float:
        """The first backfill pass at or after t (passes at multiples of bf_interval)."""
        b = self.bf_interval
        return t if not b else math.ceil(t / b - 1e-9) * b
