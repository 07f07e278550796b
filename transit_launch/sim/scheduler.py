"""FIFO with Slurm's backfill on time limits, as sched/backfill, over a heapq event loop.

The queue is served in submission order (Slurm's priority with no priority plugin): the
main scheduler starts the head while it fits, at every event. Every bf_interval seconds
(sim/limits.py: SchedParams, Slurm's defaults) a backfill pass (sim/backfill.py) tests the
first bf_max_job_test jobs in order, the head included: each starts now if it fits on
nodes that the reservations of the jobs before it leave free while it would run, else it
gets a reservation of its own, of specific nodes, at the earliest time the running jobs'
planned ends (start + time limit: a job's limit, not its run time, which the scheduler
does not know; sim/limits.py) and those reservations allow, rounded down to
bf_resolution (conservative backfill over the first bf_reserve jobs, as Slurm's reserves
for every job it tests). Jobs end at their run time. A pass runs only when something
changed since the last one (a submission, an end, a start by the main scheduler):
otherwise it would start nothing.

Why not SimPy: measured on this 2-core machine, SimPy 4 needs 5.3 s for the bare
arrival and finish events of one million jobs against 0.6 s for a heapq loop, and the
scheduler must run once per timestamp after all of its events, which a plain loop does
directly. The replay of one million jobs must take under 60 s (bench/RESULTS.md).

Scale-in (a scenario's `reduction` f): an eligible job (sim/jobs.py: more than one node,
a training type) of n nodes runs on n' = jobs.scaled_nodes(n, f). If it ran to
completion its duration becomes d n / n' / efficiency(1 - n'/n) (sim/efficiency.py), and
then a placement-transition factor applies, against the job's placement in the baseline
run of the same cluster (or, without one, whether it needed more than a rack):
inter-rack -> intra-rack divides the duration by (1 + speedup), intra -> inter multiplies
it by (1 + slowdown), unchanged divides by (1 + unchanged). A job that ended at a failure,
a cancellation or its time limit keeps its recorded duration on n' nodes."""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass

from transit_launch.checks import integer, real
from transit_launch.errors import UsageError
from transit_launch.planning.hardware import DEFAULT_GPUS_PER_NODE
from transit_launch.sim import backfill, jobs, limits
from transit_launch.sim.cluster import Cluster
from transit_launch.sim.efficiency import Curve, planner
from transit_launch.sim.limits import SchedParams
from transit_launch.sim.trace import Trace
from transit_launch.sim.waiting import Waiting

# Beyond the largest clusters built (about 100k-200k GPUs, a few thousand racks), and the
# replay grows with racks x jobs (placement scans the racks: 20k jobs on 4000 racks take
# 7 s a scenario here); a larger count is a typo that would run for hours. Racks hold at
# most 1024 GPUs (an NVL72 rack holds 72).
MAX_RACKS = 10_000
MAX_RACK_GPUS = 1024
STRATEGIES = ("pack", "spread", "tree")


@dataclass(frozen=True)
class Factors:
    """Defaults from the ranges of the paper's section 4.3 (derived from its 4.2):
    inter->intra speed-up 0-137%: 0.50, the value its Figure 12(b) assumes;
    intra->inter slow-down 0-55%: 0.275, the middle of the range;
    unchanged placement -5%..+5%: 0.0, the middle of the range.
    Durations are divided (or multiplied) by 1 + factor, so a factor must keep that above
    zero; 10 (1000%) is far past the paper's ranges."""
    speedup: float = 0.50
    slowdown: float = 0.275
    unchanged: float = 0.0

    def __post_init__(self):
        for name, low in (("speedup", 0.0), ("slowdown", 0.0), ("unchanged", -0.99)):
            v = getattr(self, name)
            if not real(v) or not low <= v <= 10:
                raise UsageError(f"--{name} must lie in [{low:g}, 10], got {v!r}")


@dataclass(frozen=True)
class Scenario:
    name: str
    racks: int
    reduction: float = 0.0
    rack_gpus: int = 32
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    strategy: str = "pack"
    factors: Factors = Factors()
    efficiency: Curve | None = None  # None: the planner's curve
    sched: SchedParams = SchedParams()

    def __post_init__(self):
        if not (integer(self.racks) and self.racks > 0) or self.racks > MAX_RACKS:
            raise UsageError(f"--racks takes 1 to {MAX_RACKS:,} racks (more than any cluster has), got {self.racks!r}")
        if not (integer(self.rack_gpus) and self.rack_gpus > 0) or self.rack_gpus > MAX_RACK_GPUS:
            raise UsageError(f"--rack-gpus takes 1 to {MAX_RACK_GPUS} GPUs a rack, got {self.rack_gpus!r}")
        if not (integer(self.gpus_per_node) and self.gpus_per_node > 0) or self.rack_gpus % self.gpus_per_node:
            raise UsageError(f"--rack-gpus {self.rack_gpus} is not a multiple of --gpus-per-node {self.gpus_per_node}")
        if not real(self.reduction) or not 0 <= self.reduction < 1:
            raise UsageError(f"a reduction must lie in [0, 1), got {self.reduction!r}")
        if self.strategy not in STRATEGIES:
            raise UsageError(f"placement {self.strategy!r} is not one of {', '.join(STRATEGIES)}")
        if not isinstance(self.factors, Factors):
            raise UsageError(f"factors must be Factors, got {self.factors!r}")
        if self.efficiency is None:
            object.__setattr__(self, "efficiency", planner())
        if not isinstance(self.efficiency, Curve):
            raise UsageError(f"efficiency must be a Curve, got {self.efficiency!r}")
        if not isinstance(self.sched, SchedParams):
            raise UsageError(f"sched must be SchedParams, got {self.sched!r}")


@dataclass
class Result:
    scenario: Scenario
    start: list
    end: list
    gpus: list
    nodes: list
    orig_nodes: list
    racks: list
    total_gpus: int
    eligible: list       # bool a job: scale-in applies to it (whether or not it lost a node)
    limit: list          # the time limit the scheduler planned each job on, seconds
    work: list = None    # GPU-seconds of the trace's work a job did (goodput's numerator: sim/metrics.py)


def demand(g: int, gpn: int) -> tuple[int, int]:
    """(nodes, GPUs held) for a job asking g GPUs on nodes of gpn."""
    n = -(-g // gpn)
    return (1, g) if n == 1 else (n, n * gpn)


def earliest_start(cl, events, nodes: int, gpus: int, now: float) -> tuple[float, int]:
    """(when a job of `nodes` nodes and `gpus` GPUs can start, what is left over then) as the
    events [(time, [(node, gpus), ...])], in time order, give resources back: whole nodes
    for a multi-node job, GPUs for a single-node one; (inf, 0) when they never suffice."""
    if nodes > 1:
        free, whole = cl.free[:], cl.whole
        for e, given in events:
            for node, g in given:
                free[node] += g
                whole += free[node] == cl.gpn
            if whole >= nodes:
                return max(e, now), whole - nodes
        return math.inf, 0
    avail = cl.free_gpus
    for e, given in events:
        for _, g in given:
            avail += g
        if avail >= gpus:
            return max(e, now), avail - gpus
    return math.inf, 0


def simulate(trace: Trace, sc: Scenario, baseline: Result | None = None, progress=None) -> Result:
    """progress(fraction of the jobs submitted) is told now and then."""
    cl = Cluster(sc.racks, sc.rack_gpus, sc.gpus_per_node)
    sp = sc.sched
    gpn, N = sc.gpus_per_node, len(trace)
    submit, dur0, g0 = trace.submit, trace.duration, trace.gpus
    lim = limits.of(dur0, trace.limits)
    nodes, gpus, dur, orig, work = [0] * N, [0] * N, [0.0] * N, [0] * N, [0.0] * N
    eligible, adjust = [False] * N, [False] * N  # adjust: the transition factor applies at start
    for i in range(N):
        n, g = demand(g0[i], gpn)
        orig[i] = n
        d = dur0[i]
        work[i] = g * d  # at the size it asked for; a job scaled in that does not stretch: below
        eligible[i] = n > 1 and jobs.eligible_type(trace.job_type(i))
        if eligible[i] and sc.reduction > 0:
            n2 = jobs.scaled_nodes(n, sc.reduction)
            if n2 < n:
                if jobs.stretches(trace.state(i)):
                    stretch = n / n2 / sc.efficiency(1 - n2 / n)
                    d *= stretch
                    lim[i] = limits.minutes_up(lim[i] * stretch)
                    adjust[i] = True
                n, g = (n2, n2 * gpn) if n2 > 1 else (1, gpn)
                if not adjust[i]:  # ended at an event: the same time on fewer GPUs did their share
                    work[i] = g * d
        nodes[i], gpus[i], dur[i] = n, g, d
        if g > cl.total_gpus:
            raise ValueError(f"job {trace.ids[i]} needs {g} GPUs, more than the {cl.total_gpus} of {sc.name}")
    on_limits = sp.plan_on == "limits"
    plan = lim if on_limits else dur   # what the scheduler takes a job's length to be
    start, end, racks, pend = [0.0] * N, [0.0] * N, [0] * N, [0.0] * N  # pend: planned end
    alloc = [None] * N
    running = []           # heap of (end, job)
    planned = []           # (planned end, job) of the running jobs, sorted
    ends = backfill.Ends(cl.n_nodes, cl.nodes_per_rack)  # when each busy node will be wholly free, as planned
    ends.watch = math.inf  # its cluster changes only as the running jobs do: reservations kept (backfill._unmoved)
    epilog = sp.epilog
    cg = {}                # nodes completing (a job on them ended, its epilog runs): how many such jobs
    if epilog:
        ends.watch = None  # a completed job's release changes the cluster at no start or end: not watched
    queue = Waiting(gpus)  # waiting jobs, submission order (pops at the head, backfill near it)
    waiting = queue.jobs   # the same jobs as a deque: read at every event, its length at C speed
    nxt, t = 0, 0.0
    due = math.inf         # the next backfill pass, when something changed since the last
    step = max(1, N // 200)
    f, strategy, bucket = sc.factors, sc.strategy, cl.bucket

    def begin(i: int, now: float) -> bool:
        if cg:  # a completing node takes no new job: its free GPUs taken while the job is placed
            held = [(node, v) for node in cg if (v := cl.free[node])]
            for node, v in held:
                cl._take(node, v)
            placed = cl.place(nodes[i], gpus[i], strategy)
            cl.release(held)
        else:
            placed = cl.place(nodes[i], gpus[i], strategy)
        if placed is None:
            return False
        alloc[i], racks[i] = placed
        d = dur[i]
        if adjust[i]:
            was_inter = (baseline.racks[i] > 1) if baseline is not None else orig[i] * gpn > sc.rack_gpus
            now_inter = racks[i] > 1
            if was_inter and not now_inter:
                d /= 1 + f.speedup
            elif now_inter and not was_inter:
                d *= 1 + f.slowdown
            else:
                d /= 1 + f.unchanged
            if on_limits and d > lim[i]:
                lim[i] = limits.minutes_up(d)
        start[i], end[i] = now, now + d
        heapq.heappush(running, (end[i], i))
        pend[i] = now + plan[i] if on_limits else end[i]
        bisect.insort(planned, (pend[i], i))
        ends.add(alloc[i], pend[i])
        return True

    while nxt < N or running:
        t = min(submit[nxt] if nxt < N else math.inf, running[0][0] if running else math.inf, due)
        changed = False
        while running and running[0][0] <= t:
            e, j = heapq.heappop(running)
            if j < 0:  # ~j completed (its epilog is done): its GPUs and nodes come back
                j = ~j
                cl.release(alloc[j])
                for node, _ in alloc[j]:
                    if cg[node] == 1:
                        del cg[node]
                    else:
                        cg[node] -= 1
                alloc[j] = None
                ends.version += 1  # the cluster changed: no reservation of a pass before is kept
                changed = True
                continue
            ends.remove(alloc[j], pend[j])
            del planned[bisect.bisect_left(planned, (pend[j], j))]
            if epilog:  # its nodes complete: out of new jobs, its GPUs held, until e + epilog
                for node, _ in alloc[j]:
                    cg[node] = cg.get(node, 0) + 1
                heapq.heappush(running, (e + epilog, ~j))
            else:
                cl.release(alloc[j])
                alloc[j] = None
            changed = True
        while nxt < N and submit[nxt] <= t:
            queue.append(nxt)
            nxt += 1
            changed = True
            if progress and nxt % step == 0:
                progress(nxt / N)
        # the main scheduler: start the head while it fits (nothing freed, nothing new: it does
        # not); Cluster.fits read here first, as the head mostly does not fit
        while changed and waiting:
            h = waiting[0]
            n = nodes[h]
            if not ((cl.whole >= n) if n > 1 else cl.free_gpus >= gpus[h] and any(bucket[gpus[h]:])) \
                    or not begin(h, t):
                break
            queue.popleft()
        if changed and waiting and due == math.inf:
            due = sp.next_pass(t)
        if t < due:
            continue
        due = math.inf
        if cl.free_gpus == 0:  # no room for anything
            continue
        backfill.run_pass(cl, queue, t, nodes, gpus, plan, planned, alloc, sp, strategy, begin, ends)
    return Result(sc, start, end, gpus, nodes, orig, racks, cl.total_gpus, eligible, lim, work)
