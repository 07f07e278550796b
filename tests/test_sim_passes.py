"""The simulator's shortcuts for speed (issue 54) keep their plain meaning: a cluster's counts
after whole-node takes and releases by set operations are the counts of its free GPUs, the
queue's fitting jobs with a bound on the bisection are the same jobs, a reservation kept
from an earlier pass is the one worked out again (and the changes that move it are the ones
that change its free nodes), and whole replays with the pass as it runs
are those with a plain pass (every tested job in queue order, no shortcut)."""

import dataclasses
import math
import random

import pytest

from transit_launch.sim import backfill, limits, synth
from transit_launch.sim.cluster import Cluster
from transit_launch.sim.limits import SchedParams
from transit_launch.sim.scheduler import Scenario, simulate
from transit_launch.sim.waiting import Waiting

from tests import sim_plain


def recount(cl: Cluster) -> dict:
    """What every count of the cluster should be, from its free GPUs alone."""
    gpn, npr = cl.gpn, cl.nodes_per_rack
    count = [[0] * cl.racks for _ in range(gpn + 1)]
    for node, v in enumerate(cl.free):
        count[v][node // npr] += 1
    return {"bucket": [{k for k, v in enumerate(cl.free) if v == g} for g in range(gpn + 1)],
            "rack_whole": [{k for k in range(r * npr, (r + 1) * npr) if cl.free[k] == gpn} for r in range(cl.racks)],
            "whole": cl.free.count(gpn), "free_gpus": sum(cl.free), "rack_count": count}


@pytest.mark.parametrize("seed", range(20))
def test_the_counts_follow_the_free_gpus(seed):
    rng = random.Random(seed)
    gpn, npr = rng.choice((4, 8)), rng.choice((1, 2, 4, 8))
    cl = Cluster(rng.randrange(1, 7), npr * gpn, gpn)
    running = []
    for _ in range(300):
        if running and rng.random() < 0.45:
            cl.release(running.pop(rng.randrange(len(running))))
        else:
            n = rng.choice((1, 1, 2, 3, npr + 1))
            placed = cl.place(n, rng.randrange(1, gpn + 1) if n == 1 else n * gpn,
                              rng.choice(("pack", "spread", "tree")))
            if placed is not None:
                running.append(placed[0])
        assert {k: getattr(cl, k) for k in ("bucket", "rack_whole", "whole", "free_gpus", "rack_count")} == recount(cl)


@pytest.mark.parametrize("seed", range(10))
def test_fitting_within_a_bound_is_the_same(seed):
    rng = random.Random(seed)
    gpus = [rng.choice((1, 2, 4, 8, 16, 32)) for _ in range(3000)]
    q = Waiting(gpus)
    for j in range(len(gpus)):
        q.append(j)
    for j in rng.sample(range(len(gpus)), 1000):
        q.remove(j)
    for tested in (1, 50, 500, 5000):
        last = q.last_tested(tested)
        for most in (0, 1, 8, 32):
            assert q.fitting(most, last, tested) == q.fitting(most, last)


@pytest.mark.parametrize("spec,factor", [(synth.preset("kalos", 1.2, 32 * 32), 1.0),
                                         (synth.SynthSpec(load=1.0, cluster_gpus=32 * 32), 1.0),
                                         (synth.SynthSpec(load=1.0, cluster_gpus=32 * 32), 4.0)])
def test_a_reservation_kept_across_passes_is_the_one_worked_out_again(spec, factor, monkeypatch):
    """backfill._unmoved keeps a pass's first reservation when the jobs started and ended since
    change nothing of it: the replay is the same when it is worked out every time. With limits
    up to 4x the run times (factor 4) jobs end well before their planned ends, so nodes come
    free before a kept reservation's start: the case where it must be worked out again."""
    t = limits.modelled(synth.synthetic(4000, 3, spec), factor, 3)
    sc = Scenario("t", racks=32)
    kept = simulate(t, sc)
    would, real = [], backfill._unmoved
    monkeypatch.setattr(backfill, "_unmoved", lambda *a: would.append(real(*a)) or False)
    again = simulate(t, sc)
    assert any(would)  # kept some
    assert (again.start, again.end, again.racks) == (kept.start, kept.end, kept.racks)


def _free_by(ends: backfill.Ends, s: float) -> set:
    """The nodes wholly free by s: running nothing, or nothing planned to end after s."""
    return {node for node, planned in enumerate(ends.per_node) if not planned or planned[-1] <= s}


@pytest.mark.parametrize("seed", range(20))
def test_a_watched_start_is_moved_by_exactly_the_changes_of_its_free_nodes(seed):
    """backfill.Ends.moved, which _unmoved reads: a single start or end sets it iff it changes
    which nodes are wholly free by the watched time; while it stays unset, those nodes are the
    ones of the time the watch began."""
    rng = random.Random(seed)
    cl = Cluster(rng.randrange(1, 5), 4 * rng.choice((4, 8)), rng.choice((4, 8)))
    ends = backfill.Ends(cl.n_nodes, cl.nodes_per_rack)
    running = []
    for step in range(400):
        if step % 25 == 0:  # a new reservation's start is watched
            ends.watch, ends.moved = float(rng.randrange(10, 40)), False
            then = _free_by(ends, ends.watch)
        before, was = _free_by(ends, ends.watch), ends.moved
        if running and rng.random() < 0.45:
            alloc, end = running.pop(rng.randrange(len(running)))
            cl.release(alloc)
            ends.remove(alloc, end)
        else:
            n = rng.choice((1, 1, 2, cl.nodes_per_rack + 1))
            placed = cl.place(n, rng.randrange(1, cl.gpn + 1) if n == 1 else n * cl.gpn, "pack")
            if placed is None:
                continue
            end = float(rng.randrange(1, 50))
            ends.add(placed[0], end)
            running.append((placed[0], end))
        if not was:
            assert ends.moved == (_free_by(ends, ends.watch) != before)
        if not ends.moved:
            assert _free_by(ends, ends.watch) == then


def plain_pass(cl, queue, now, nodes, gpus, plan, planned, alloc, sp, strategy, begin, ends=None):
    """A backfill pass as docs/simulate.md states it, with none of backfill._tests' shortcuts
    (the fitting jobs' index, failed lengths, dead GPU counts, the room off the reservations
    kept by how many a window meets, reservations worked out late or kept across passes):
    the first bf_max_job_test jobs in queue order; each starts now if it fits on the nodes no
    reservation holds over its window [now, now + planned length] (a reservation holds a
    window that reaches its start and that it has not ended by); else, while the pass has
    given fewer than bf_reserve reservations (0: no limit), it gets one at its earliest start
    within bf_window on the nodes the earlier ones leave it (backfill.reservation, which walks
    every running job), rounded down to bf_resolution and held a resolution at least. Under
    bf_reserve_at slurm a whole-node job it starts is held in the map too, over its window
    rounded (Slurm's _bf_reserve_running), and counts against no bf_reserve; its reservations
    are tests/sim_plain.py's."""
    resv, started = [], []
    cap, running = sp.bf_reserve or math.inf, 0
    for j in list(queue)[:sp.bf_max_job_test]:
        length = plan[j]
        blocked = set().union(*(held for rs, re, held in resv if rs <= now + length and re > now))
        taken = [(node, cl.free[node]) for node in blocked if cl.free[node]]
        for node, v in taken:
            cl._take(node, v)
        ok = begin(j, now)
        if taken:
            cl.release(taken)
        if ok:
            started.append(j)
            if sp.bf_reserve_at == "slurm" and nodes[j] > 1:
                rs = sp.reservation(now)
                resv.append((rs, max(sp.reservation(now + length), rs + sp.bf_resolution),
                             frozenset(node for node, _ in alloc[j])))
                running += 1
        elif len(resv) - running < cap:
            if sp.bf_reserve_at == "slurm":
                s, chosen = sim_plain.slurm_reservation(cl, planned, alloc, resv, nodes[j], gpus[j], length, now,
                                                        now + sp.bf_window, strategy, sp)
            else:
                s, chosen = backfill.reservation(cl, planned, alloc, resv, nodes[j], gpus[j], length, now,
                                                 now + sp.bf_window, strategy)
            if chosen is not None:
                rs = sp.reservation(s)
                resv.append((rs, max(sp.reservation(s + length), rs + sp.bf_resolution), frozenset(chosen)))
    for j in started:
        queue.remove(j)


def random_replay(seed: int):
    """A small random cluster, trace and scheduler settings (every placement, reservations for
    1 to every tested job, passes at every event or every 30 s, a short window, limits above
    run times): (trace, scenario)."""
    rng = random.Random(seed)
    gpn = rng.choice((4, 8))
    racks = rng.randrange(2, 7)
    spec = synth.SynthSpec(load=rng.choice((0.9, 1.2, 1.6)), cluster_gpus=racks * 32,
                           sizes=((1, 0.4), (2, 0.1), (gpn, 0.15), (2 * gpn, 0.15), (4 * gpn, 0.1), (32, 0.1)),
                           median_duration=rng.choice((600.0, 1800.0)))
    t = limits.modelled(synth.synthetic(rng.randrange(300, 700), seed, spec), rng.choice((1.0, 3.0)), seed)
    sched = SchedParams(bf_max_job_test=rng.choice((5, 40, 500)), bf_interval=rng.choice((0, 30)),
                        bf_resolution=rng.choice((0, 60)), bf_window=rng.choice((3600.0, 86400.0)),
                        bf_reserve=rng.choice((0, 1, 3)), plan_on=rng.choice(("limits", "limits", "runtimes")))
    sc = Scenario("t", racks=racks, gpus_per_node=gpn, strategy=rng.choice(("pack", "spread", "tree")), sched=sched)
    return t, sc


@pytest.mark.parametrize("seed", range(40))
def test_the_pass_starts_what_a_plain_pass_starts(seed, monkeypatch):
    """Whole replays, the pass as it runs against plain_pass, on random_replay's clusters:
    the same start, end and racks for every job."""
    t, sc = random_replay(seed)
    sched = sc.sched
    fast = simulate(t, sc)
    monkeypatch.setattr(backfill, "run_pass", plain_pass)
    plain = simulate(t, sc)
    assert (fast.start, fast.end, fast.racks) == (plain.start, plain.end, plain.racks), (sc, sched)


@pytest.mark.parametrize("seed", range(20))
def test_slurms_reservations_start_what_a_plain_pass_starts(seed, monkeypatch):
    """The same with reservations placed as Slurm's (--bf-reserve-at slurm), where the pass
    works a pending reservation out before the next job starts and keeps none across passes
    (the batches of ends move with every running job): plain_pass at each job's turn, with
    Slurm's rule written plainly (tests/sim_plain.py: no memo, no kept bounds, the running jobs
    given back one at a time), starts the same jobs at the same times on the same racks."""
    t, sc = random_replay(seed)
    sc = dataclasses.replace(sc, sched=dataclasses.replace(sc.sched, bf_reserve_at="slurm"))
    fast = simulate(t, sc)
    monkeypatch.setattr(backfill, "run_pass", plain_pass)
    plain = simulate(t, sc)
    assert (fast.start, fast.end, fast.racks) == (plain.start, plain.end, plain.racks), sc
