"""Node failures in a trace replay: what a lost node costs a job that requeues and waits
for as many nodes as it had, against one that continues scaled-in on the nodes it still
has (at the planner's efficiency) and scales back out when its node returns
(--on-node-loss scale-in of render and submit).

Failures: every node fails as a Poisson process of `rate` per node-day, busy or idle (a
failure is a hardware or system event, not a job's); a failed node is out for `repair_h`
hours, then returns. The rate's default comes from Meta's Llama 3 paper (Dubey et al.
2024, "The Llama 3 Herd of Models", section 3.3.4): 419 unexpected interruptions in 54
days of pre-training on 16,384 H100 GPUs (2,048 nodes of 8), about 78% hardware-related;
counted as node failures that is 419 / (2,048 x 54) = 0.0038 per node-day, a node MTBF of
about 264 days. The other numbers are assumptions, each a Failures field: repair_h (a node
out for hardware triage), checkpoint_h (progress since the last checkpoint is lost) and
restart_h (the downtime of each restart: detecting the loss, re-launching, loading the
checkpoint; the lab cluster measured about 10-15 s, a large job takes minutes).

A job that loses a node loses its work since the last checkpoint (checkpoints every
checkpoint_h of its run since it last started) and then:
  requeue:  frees its other nodes and goes back into the queue in its submission place,
            waiting for all of its nodes again (Slurm's requeue);
  scale-in: an eligible job (sim/jobs.py: multi-node training) keeps its other nodes and
            runs at n'/n x efficiency(1 - n'/n) of its full rate (sim/efficiency.py) after
            restart_h; when the failed node returns it takes it back (a checkpoint at that
            moment, then restart_h). A one-node job, or one not eligible, requeues.
Scheduling: the replay's own (sim/scheduler.py, sim/backfill.py): FIFO, the main scheduler
starting the head at every event, and Slurm's backfill passes every bf_interval over the
first bf_max_job_test jobs, reserving specific nodes for the first bf_reserve, planned on
time limits (sim/limits.py) or run times (SchedParams). A requeued job goes back in its
submission place and asks its full limit again, as Slurm's requeue does (on run times:
what it has left, its restart included). A running job is planned to end at its start
plus its limit; one that a lost node slows past that, at its expected end rounded up to a
minute (the replay never kills a job at its limit). A failed node comes back, for the
reservations, at its repair time; one that a scaled-in job waits for (the job takes it back
at its repair if it still runs, and holds it to its end) at the later of its repair and
that job's planned end, following the job's plan as that changes (another node lost or
taken back); from its repair the job's own plan holds it. No placement transition factors:
jobs run as recorded at their full size, placed as `pack` places them."""

from __future__ import annotations

import bisect
import heapq
import math
import random
import statistics
from dataclasses import dataclass

from transit_launch.checks import real
from transit_launch.errors import UsageError
from transit_launch.sim import backfill, bands, jobs, limits
from transit_launch.sim.cluster import Cluster
from transit_launch.sim.efficiency import Curve
from transit_launch.sim.limits import SchedParams
from transit_launch.sim.scheduler import demand
from transit_launch.sim.trace import Trace
from transit_launch.sim.waiting import Waiting

LLAMA3_RATE = 419 / (16_384 / 8 * 54)  # failures per node-day, Llama 3 paper (see above)
POLICIES = ("requeue", "scale-in")
DAY = 86_400.0


@dataclass(frozen=True)
class Failures:
    rate: float = LLAMA3_RATE       # failures per node-day
    repair_h: float = 24.0          # assumption: a failed node is back after a day of triage and repair
    checkpoint_h: float = 1.0       # assumption: checkpoints every hour of a run
    restart_h: float = 5 / 60       # assumption: 5 minutes from the loss to the first step again
    seed: int = 0
    times: tuple = ()               # explicit (time s, node) failures instead of the Poisson draw (tests)

    def __post_init__(self):
        for name in ("rate", "repair_h", "checkpoint_h", "restart_h"):
            v = getattr(self, name)
            if not real(v) or v < 0 or (name == "checkpoint_h" and v == 0):
                raise UsageError(f"--{name.replace('_', '-')} must be a non-negative number"
                                 f"{' above 0' if name == 'checkpoint_h' else ''}, got {v!r}")

    @property
    def availability(self) -> float:
        """The share of its time a node is up: up for 1 / rate days on average, then down
        repair_h (MTBF / (MTBF + repair); 1 without failures)."""
        return 1 / (1 + self.rate * self.repair_h / 24)


@dataclass
class Outcome:
    policy: str
    submit: list
    start: list          # first start
    end: list
    interrupted: list    # bool: the job lost a node at least once
    useful_gpu_h: float  # the trace's work: GPUs x recorded duration, summed over the jobs
    held_gpu_h: float    # GPU-hours the jobs held (lost work, restarts and slower scaled-in time included)
    failures: int        # failures that hit a running job
    total_gpus: int
    owed_gpu_h: float = 0.0  # GPU-hours from each job's submission to its end: waiting and down time included
    availability: float = 1.0  # the share of its time a node is up: MTBF / (MTBF + repair), 1 without a rate


# A job is refused when the nodes it needs are up together less often than this: it would wait
# at the head of the queue (as on a real cluster) for about repair time / this, which the
# replay would simulate event by event for simulated years.
MIN_UP_TOGETHER = 1e-3


def up_together(nodes: int, need: int, up: float) -> float:
    """The probability that at least `need` of `nodes` independent nodes, each up a share `up`
    of the time, are up at once (the binomial tail, summed in logs)."""
    if up >= 1 or need <= 0:
        return 1.0
    if up <= 0:
        return 0.0
    lu, ld = math.log(up), math.log1p(-up)
    return min(1.0, sum(math.exp(math.lgamma(nodes + 1) - math.lgamma(k + 1) - math.lgamma(nodes - k + 1)
                                 + k * lu + (nodes - k) * ld) for k in range(need, nodes + 1)))


def _refuse_unlikely_widths(trace: Trace, n0: list, nodes: int, f: Failures) -> None:
    """One line, before the replay, for the widest job whose nodes are rarely all up at once."""
    if not n0 or not f.rate:
        return
    i = max(range(len(n0)), key=lambda j: n0[j])
    up = f.availability
    p = up_together(nodes, n0[i], up)
    if p < MIN_UP_TOGETHER:
        raise UsageError(f"job {trace.ids[i]} needs {n0[i]} of the cluster's {nodes} nodes up at once: at "
                         f"{f.rate:g} failures a node-day and {f.repair_h:g} h repairs a node is up "
                         f"{100 * up:.1f}% of the time, and {n0[i]} together {p:.1e} of it, so the job would wait "
                         "for years of simulated time; give more racks, fewer failures or shorter repairs")


def replay(trace: Trace, racks: int, rack_gpus: int, gpus_per_node: int, policy: str, f: Failures,
           efficiency: Curve, sp: SchedParams | None = None) -> Outcome:
    if policy not in POLICIES:
        raise UsageError(f"--on-node-loss {policy!r} is not one of {', '.join(POLICIES)}")
    sp = SchedParams() if sp is None else sp
    cl = Cluster(racks, rack_gpus, gpus_per_node)
    gpn, N = gpus_per_node, len(trace)
    n0, g0 = [0] * N, [0] * N
    for i in range(N):
        n0[i], g0[i] = demand(trace.gpus[i], gpn)
        if g0[i] > cl.total_gpus:
            raise UsageError(f"job {trace.ids[i]} needs {g0[i]} GPUs, more than the cluster's {cl.total_gpus}")
    _refuse_unlikely_widths(trace, n0, cl.total_gpus // gpn, f)
    elig = [n0[i] > 1 and jobs.eligible_type(trace.job_type(i)) for i in range(N)]
    left = [float(d) for d in trace.duration]   # work left, in seconds at the full size
    lim = limits.of(trace.duration, trace.limits)
    on_limits = sp.plan_on == "limits"
    plan = lim[:] if on_limits else left[:]     # what a queued job's window is planned on
    # the running jobs' planned ends, sorted, and a down node's return as job N + node
    # (its GPUs, all taken, come back at its repair): sim/backfill.py reads both
    planned: list = []
    pend: list = [None] * (N + cl.n_nodes)
    # the same plans by node (when each busy node is wholly free), for the backfill's
    # reservations; planned_on: the allocation each plan was made with, to take it out again
    # after the allocation changed (a node lost or taken back)
    ends = backfill.Ends(cl.n_nodes, cl.nodes_per_rack)
    planned_on: list = [None] * (N + cl.n_nodes)
    back = [0.0] * cl.n_nodes                   # when a down node is repaired
    first = [None] * N
    end = [math.inf] * N
    alloc = [None] * (N + cl.n_nodes)           # [(node, gpus)] while running; a down node's own GPUs
    run_start = [0.0] * N                       # when the current run (since the last (re)start) began
    seg = [0.0] * N                             # when progress at `rate` began (after a restart's downtime)
    rate = [1.0] * N
    held_since = [0.0] * N
    began = [0.0] * N                           # when the job last started (its limit runs from there)
    interrupted = [False] * N
    on_node: dict[int, set] = {}
    down = [False] * cl.n_nodes
    waits_for: dict[int, int] = {}              # failed node -> the scaled-in job that takes it back
    held = 0.0
    hits = 0
    ckpt, restart = f.checkpoint_h * 3600, f.restart_h * 3600
    rng = random.Random(f.seed)
    explicit = sorted(f.times)
    total_rate = f.rate * cl.n_nodes / DAY       # failures per second, the whole cluster

    def draw(now: float):
        if f.times:
            return explicit.pop(0) if explicit else (math.inf, -1)
        if total_rate <= 0:
            return math.inf, -1
        return now + rng.expovariate(total_rate), rng.randrange(cl.n_nodes)

    nxt_fail = draw(0.0)
    repairs: list = []                          # heap of (time back, node)
    running: list = []                          # heap of (end, job); stale entries skipped
    queue = Waiting(g0)                         # waiting jobs, sorted by index (submission order)
    nxt = 0

    def progress(i: int, now: float) -> float:
        return max(0.0, now - seg[i]) * rate[i]

    def account(i: int, now: float) -> None:
        nonlocal held
        held += sum(g for _, g in alloc[i]) * (now - held_since[i])
        held_since[i] = now

    def unplan(i: int) -> None:
        if pend[i] is not None:
            del planned[bisect.bisect_left(planned, (pend[i], i))]
            ends.remove(planned_on[i], pend[i])
            pend[i] = planned_on[i] = None

    def replan(i: int, when: float) -> None:
        unplan(i)
        pend[i] = when
        bisect.insort(planned, (when, i))
        planned_on[i] = list(alloc[i])  # a copy: a scaled-in job's allocation grows in place
        ends.add(planned_on[i], when)

    def set_run(i: int, now: float, delay: float) -> None:
        nodes = len(alloc[i]) if n0[i] > 1 else 1
        rate[i] = 1.0 if nodes == n0[i] else nodes / n0[i] * efficiency(1 - nodes / n0[i])
        seg[i] = now + delay
        end[i] = seg[i] + left[i] / rate[i]
        heapq.heappush(running, (end[i], i))
        if on_limits:  # its limit from its (re)start; past it, its expected end to the minute
            replan(i, max(began[i] + lim[i], now + limits.minutes_up(end[i] - now)))
        else:
            replan(i, end[i])
        for x in [k for k, j in waits_for.items() if j == i]:
            down_until(x)  # the down nodes it takes back follow its new plan

    def down_until(x: int) -> None:
        """Node x, down, is planned free at its repair, or, when a scaled-in job waits for it
        (and takes it back at its repair if it still runs), at the later of its repair and
        that job's planned end."""
        alloc[N + x] = [(x, gpn)]
        i = waits_for.get(x)
        replan(N + x, back[x] if i is None else max(back[x], pend[i]))

    def begin(i: int, now: float) -> bool:
        placed = cl.place(n0[i], g0[i], "pack")
        if placed is None:
            return False
        alloc[i] = placed[0]
        for node, _ in alloc[i]:
            on_node.setdefault(node, set()).add(i)
        if first[i] is None:
            first[i] = now
        run_start[i] = held_since[i] = began[i] = now
        set_run(i, now, restart if interrupted[i] else 0.0)
        return True

    def drop(i: int, nodes) -> None:
        for node in nodes:
            on_node.get(node, set()).discard(i)

    def fail(x: int, now: float) -> None:
        nonlocal hits
        if down[x]:
            return
        down[x] = True
        back[x] = now + f.repair_h * 3600
        heapq.heappush(repairs, (back[x], x))
        for i in sorted(on_node.get(x, ())):
            hits += 1
            interrupted[i] = True
            account(i, now)
            done = progress(i, now)
            # work kept: what the last checkpoint of this run holds (checkpoints every
            # `ckpt` seconds of the run; the restart's downtime makes none)
            kept = min(done, max(0.0, math.floor((now - run_start[i]) / ckpt) * ckpt - (seg[i] - run_start[i]))
                       * rate[i])
            left[i] = max(0.0, left[i] - kept)
            mine = [(node, g) for node, g in alloc[i] if node != x]
            if policy == "scale-in" and elig[i] and mine:
                alloc[i] = mine
                drop(i, [x])
                waits_for[x] = i
                run_start[i] = now
                set_run(i, now, restart)
                continue
            cl.release(mine)      # requeue: the job's other nodes go back to the pool
            drop(i, [node for node, _ in alloc[i]])
            alloc[i] = None
            end[i] = math.inf
            unplan(i)
            release_waits(i)
            if not on_limits:
                plan[i] = left[i] + restart
            queue.insort(i)
        # the node's free GPUs are out with it; the failed jobs' GPUs there stay taken
        if cl.free[x]:
            cl._take(x, cl.free[x])
        on_node.pop(x, None)
        down_until(x)

    def release_waits(i: int) -> None:
        """Job i ended or requeued: the down nodes it waited for go back to the pool when repaired."""
        for node in [k for k, j in waits_for.items() if j == i]:
            del waits_for[node]
            down_until(node)

    def repaired(x: int, now: float) -> None:
        down[x] = False
        unplan(N + x)
        alloc[N + x] = None
        i = waits_for.pop(x, None)
        if i is not None and alloc[i] is not None:  # scale back out: a checkpoint now, then a restart
            account(i, now)
            left[i] = max(0.0, left[i] - progress(i, now))
            alloc[i].append((x, gpn))
            on_node.setdefault(x, set()).add(i)
            run_start[i] = now
            set_run(i, now, restart)
            return
        cl.release([(x, gpn)])

    due = math.inf  # the next backfill pass, when something changed since the last
    while nxt < N or queue or running:
        t = min(trace.submit[nxt] if nxt < N else math.inf, running[0][0] if running else math.inf,
                nxt_fail[0], repairs[0][0] if repairs else math.inf, due)
        if t == math.inf:
            break
        changed = False
        while running and running[0][0] <= t:
            e, j = heapq.heappop(running)
            if alloc[j] is None or e != end[j]:
                continue  # stale: the job was requeued or changed its size since
            account(j, e)
            cl.release(alloc[j])
            drop(j, [node for node, _ in alloc[j]])
            alloc[j] = None
            unplan(j)
            left[j] = 0.0
            release_waits(j)
            changed = True
        while repairs and repairs[0][0] <= t:
            repaired(heapq.heappop(repairs)[1], t)
            changed = True
        while nxt_fail[0] <= t:
            fail(nxt_fail[1], t)
            nxt_fail = draw(t)
            changed = True
        while nxt < N and trace.submit[nxt] <= t:
            queue.append(nxt)  # after every waiting job: those were submitted before it
            nxt += 1
            changed = True
        # the main scheduler: start the head while it fits
        while changed and queue and begin(queue[0], t):
            queue.popleft()
        if changed and queue and due == math.inf:
            due = sp.next_pass(t)
        if t < due:
            continue
        due = math.inf
        if cl.free_gpus == 0:
            continue
        backfill.run_pass(cl, queue, t, n0, g0, plan, planned, alloc, sp, "pack", begin, ends)
    useful = sum(g0[i] * trace.duration[i] for i in range(N)) / 3600
    owed = sum(g0[i] * (end[i] - trace.submit[i]) for i in range(N)) / 3600
    return Outcome(policy, list(trace.submit), first, end, interrupted, useful, held / 3600, hits, cl.total_gpus,
                   owed, f.availability)


def report(o: Outcome) -> dict:
    """Goodput: the trace's work over the GPU-hours the jobs were owed from submission to end
    (their GPUs x (end - submit)): queue waiting, waiting for a repaired node, lost work,
    restarts and slower scaled-in time all count against it, so a run whose queue grows
    reads low. goodput_held: the same work over the GPU-hours the jobs held (running only:
    blind to waiting and down time). Completion times, and queue times of the jobs no
    failure touched (the other jobs).

    Offered load, as sim/metrics.py's: the arrival rate times the GPU-hours a job held, over
    the GPUs that are up on average (the cluster's times the nodes' availability); above 1
    the queue grows without bound and the run is `collapsed`: its queue times and goodput
    then measure the trace's length."""
    n = len(o.submit)
    window_h = (max(o.submit) - min(o.submit)) / 3600 if n else 0.0
    load = (n - 1) / window_h * (o.held_gpu_h / n) / (o.total_gpus * o.availability) if window_h else None
    jct = [(o.end[i] - o.submit[i]) / 3600 for i in range(n)]
    hit = [i for i in range(n) if o.interrupted[i]]
    others = [i for i in range(n) if not o.interrupted[i]]

    def mean(xs):
        return round(sum(xs) / len(xs), 4) if xs else None
    return {"policy": o.policy, "jobs": n, "failures_hitting_jobs": o.failures, "interrupted_jobs": len(hit),
            "useful_gpu_h": round(o.useful_gpu_h, 2), "held_gpu_h": round(o.held_gpu_h, 2),
            "owed_gpu_h": round(o.owed_gpu_h, 2),
            "goodput": round(o.useful_gpu_h / o.owed_gpu_h, 4) if o.owed_gpu_h else None,
            "goodput_held": round(o.useful_gpu_h / o.held_gpu_h, 4) if o.held_gpu_h else None,
            "jct_mean_h": mean(jct), "jct_interrupted_mean_h": mean([jct[i] for i in hit]),
            "makespan_h": round((max(o.end) - min(o.submit)) / 3600, 4) if n else None,
            "other_queue_mean_min": mean([(o.start[i] - o.submit[i]) / 60 for i in others]),
            "availability": round(o.availability, 4), "offered_load": None if load is None else round(load, 4),
            "collapsed": bool(load and load > 1)}


def goodput_band(goodputs: dict[str, dict[str, list]]) -> list[dict]:
    """The goodput of each policy as a band over the efficiency curves (sim/bands.py, as the
    scale-in report's headlines): goodputs[policy][curve label] is its goodput at each seed,
    the --efficiency curve first. A policy whose goodput is missing at a seed (no GPU-hour
    owed) has no row."""
    rows = []
    for policy, by_curve in goodputs.items():
        if any(v is None for vals in by_curve.values() for v in vals):
            continue
        means = {label: round(statistics.fmean(vals), 4) for label, vals in by_curve.items()}
        ranges = [[min(vals), max(vals)] for vals in by_curve.values()]
        rows.append({"policy": policy, "metric": "goodput", "label": "goodput", "unit": "share"}
                    | bands.spread(means, ranges))
    return rows
