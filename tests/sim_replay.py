"""The simulator against Slurm itself (issue 54), the machinery the lab test
(tests/test_sim_slurm.py) and the bench (bench/sim_vs_slurm.py) share: one trace replayed on
a lab cluster (tests/slurm_lab.py: slurmctld with sched/backfill, fake-GPU slurmd nodes on
this machine, racks as a topology/tree of leaf switches) and through `simulate`'s scheduler
with the same parameters, compared job by job.

A replay job sleeps for its run time with `--time` its limit (whole minutes, Slurm's unit)
and asks what the simulator gives it: one node's GPUs (`--gres=gpu:g`), or whole nodes
(`--nodes=n --gres=gpu:G --exclusive`). Time is the lab's own: a trace of hours is
compressed before it comes here, and its limits must then be whole minutes in lab time
(`compress`). The simulator replays the submit times Slurm recorded (whole seconds), the
same run times and limits, and the lab's bf_interval and bf_resolution."""

from __future__ import annotations

import math
import random
import statistics
import threading
import time
from dataclasses import dataclass

from transit_launch.sim.limits import SchedParams
from transit_launch.sim.scheduler import Scenario, demand, simulate
from transit_launch.sim.trace import Trace

ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


@dataclass(frozen=True)
class Lab:
    """The lab cluster's shape and Slurm's scheduler parameters for it."""
    racks: int = 2
    nodes_per_rack: int = 4
    gpus_per_node: int = 4
    bf_interval: int = 1      # Slurm's minimum: the default 30 s is half a compressed run
    bf_resolution: int = 1

    @property
    def nodes(self) -> int:
        return self.racks * self.nodes_per_rack

    def sched_params(self) -> str:
        return f"batch_sched_delay=0,bf_interval={self.bf_interval},bf_resolution={self.bf_resolution}"

    def scenario(self, plan_on: str = "limits") -> Scenario:
        return Scenario("lab", racks=self.racks, rack_gpus=self.nodes_per_rack * self.gpus_per_node,
                        gpus_per_node=self.gpus_per_node,
                        sched=SchedParams(bf_interval=self.bf_interval, bf_resolution=self.bf_resolution,
                                          plan_on=plan_on, bf_reserve=0))  # Slurm's default: every job


@dataclass
class Replay:
    """What happened to each job, in seconds from the first submission; nodes: each job's
    nodes by index from 0 (Slurm's replays record them since 2026-12-07; None: not recorded)."""
    submit: list
    start: list
    end: list
    racks: list
    nodes: list | None = None


def sbatch_args(gpus: int, gpn: int, limit_min: int, run_s: float) -> list[str]:
    nodes, _ = demand(gpus, gpn)
    where = ["--nodes=1", f"--gres=gpu:{gpus}"] if nodes == 1 else \
        [f"--nodes={nodes}", f"--gres=gpu:{gpn}", "--exclusive"]
    return ["sbatch", "--parsable", "--output=/dev/null", f"--time={limit_min}", *where, "--wrap",
            f"sleep {run_s:g}"]


def _stamp(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


def on_slurm(lab, shape: Lab, trace: Trace, timeout: float = 600, stop: threading.Event | None = None) -> Replay:
    """Submit the trace's jobs at their submit times and wait for all to end; limits
    (seconds) must be whole minutes. With a bf_resolution, the first job goes in at a
    multiple of it in wall time, where Slurm's rounding grid starts, as the simulator's does.
    stop, when set, ends the waiting (a run interrupted while the replay ran on a thread)."""
    ids, fields = [], {}
    stop = stop or threading.Event()

    def sleep(s: float) -> None:
        if stop.wait(s):
            raise RuntimeError("the replay was stopped")

    def poll() -> None:
        """Keep every ended job's record: slurmctld forgets one MinJobAge (300 s) after it ends."""
        for line in lab.cmd("scontrol", "show", "job", "-o").stdout.splitlines():
            f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            if f.get("JobState") in ENDED:
                fields[f["JobId"]] = f

    if shape.bf_resolution > 1:
        sleep(-time.time() % shape.bf_resolution)
    t0 = time.monotonic()
    for i in range(len(trace)):
        while t0 + trace.submit[i] - time.monotonic() > 5:
            poll()
            sleep(max(0.0, min(2.0, t0 + trace.submit[i] - time.monotonic() - 5)))
        wait = t0 + trace.submit[i] - time.monotonic()
        if wait > 0:
            sleep(wait)
        minutes = trace.limits[i] / 60
        if minutes != int(minutes):
            raise ValueError(f"job {i}: limit {trace.limits[i]} s is not whole minutes")
        res = lab.cmd(*sbatch_args(trace.gpus[i], shape.gpus_per_node, int(minutes), trace.duration[i]))
        if res.returncode:
            raise RuntimeError(f"sbatch: {res.stderr.strip()}")
        ids.append(res.stdout.strip().split(";")[0])
    while time.monotonic() - t0 < timeout:
        poll()
        if all(j in fields for j in ids):
            break
        sleep(0.5)
    else:
        raise RuntimeError(f"the replay did not end in {timeout} s")
    bad = [j for j in ids if fields[j]["JobState"] != "COMPLETED"]
    if bad:
        raise RuntimeError(f"jobs {bad} did not complete: {[fields[j]['JobState'] for j in bad]}")
    first = _stamp(fields[ids[0]]["SubmitTime"])
    per_rack = shape.nodes_per_rack

    def nodes(nodelist: str) -> list:
        return sorted(int(n[1:]) - 1 for n in lab.cmd("scontrol", "show", "hostnames", nodelist).stdout.split())
    held = [nodes(fields[j]["NodeList"]) for j in ids]
    return Replay(submit=[_stamp(fields[j]["SubmitTime"]) - first for j in ids],
                  start=[_stamp(fields[j]["StartTime"]) - first for j in ids],
                  end=[_stamp(fields[j]["EndTime"]) - first for j in ids],
                  racks=[len({n // per_rack for n in ns}) for ns in held], nodes=held)


def in_sim(shape: Lab, trace: Trace, submit: list | None = None, plan_on: str = "limits") -> Replay:
    """The trace through the simulator; submit: the times Slurm recorded, instead of the trace's."""
    t = trace if submit is None else Trace(submit=list(submit), duration=trace.duration, gpus=trace.gpus,
                                           ids=trace.ids, limits=trace.limits, source=trace.source)
    r = simulate(t, shape.scenario(plan_on))
    return Replay(submit=list(t.submit), start=r.start, end=r.end, racks=r.racks)


def instants(trace: Trace, slurm: Replay) -> list:
    """When each job went in, to the sub-second, in Slurm's clock: Slurm records whole seconds
    (its SubmitTime floors the time of the RPC), the driver submitted at the trace's time
    (on_slurm: from a first submission at a whole second, plus sbatch's own latency). So the
    trace's time where Slurm's second holds it, else Slurm's stamp (a submission that sbatch
    took into the next second). A pass at the second's start then sees a job stamped that
    second only if it went in at that instant, not the 0.9 s later its stamp alone allows."""
    return [max(s, t) if t < s + 1 else s for s, t in zip(slurm.submit, trace.submit)]


def summary(r: Replay) -> dict:
    waits = [s - b for s, b in zip(r.start, r.submit)]
    return {"queue_mean_s": statistics.fmean(waits), "queue_median_s": statistics.median(waits),
            "makespan_s": max(r.end) - min(r.submit), "traversals": sum(k - 1 for k in r.racks)}


def start_order(r: Replay, tie: float = 1.5) -> list:
    """Jobs by start time, as groups of jobs that started within `tie` seconds of the
    group's first (Slurm records whole seconds and starts a job 0-2 s after it could)."""
    order = sorted(range(len(r.start)), key=lambda i: (r.start[i], i))
    groups, first = [], None
    for i in order:
        if first is None or r.start[i] - first > tie:
            groups.append([])
            first = r.start[i]
        groups[-1].append(i)
    return [sorted(g) for g in groups]


def pairs_in_order(a: Replay, b: Replay, tie: float = 1.5) -> float:
    """The share of job pairs whose start order b agrees with a on (pairs a starts within
    `tie` seconds of each other count as agreeing either way)."""
    n, agree, total = len(a.start), 0, 0
    for i in range(n):
        for j in range(i + 1, n):
            da = a.start[i] - a.start[j]
            db = b.start[i] - b.start[j]
            total += 1
            agree += abs(da) <= tie or abs(db) <= tie or (da > 0) == (db > 0)
    return agree / total if total else 1.0


def compress(trace: Trace, factor: float, rng: random.Random | None = None) -> Trace:
    """A trace of real times in lab time: submit times and run times divided by factor;
    each job's limit its compressed run time rounded up to a whole minute (Slurm's unit),
    times a user's overestimate drawn from rng (1 without one)."""
    lim = []
    for d in trace.duration:
        over = rng.choice((1.0, 1.0, 1.5, 2.0, 4.0)) if rng else 1.0
        lim.append(max(1, math.ceil(d / factor * over / 60 - 1e-9)) * 60.0)
    return Trace(submit=[s / factor for s in trace.submit], duration=[max(1.0, round(d / factor)) for d in trace.duration],
                 gpus=list(trace.gpus), ids=list(trace.ids), limits=lim, source=f"{trace.source} / {factor:g}")
