"""Where a reservation starts and which nodes it holds (issue 54, `--bf-reserve-at`): the
earliest time the job fits (earliest, the default) or Slurm 22.05's rule (slurm): its
_will_run_test (src/plugins/select/cons_common/job_test.c) gives the running jobs back in
batches of planned ends, the first up to the first end rounded up to a multiple of 30 s plus
30 s, each later one up to that time plus the window doubled (and doubled again until the
next end is inside), and the job starts at the last end of the first batch after which it
fits, on the nodes free then; backfill.c's _attempt_backfill tests it again from
`later_start` (the first end of a reservation in its way that frees a node) when that start
is past it, and from that start when its nodes meet a reservation over its own window.

Every expectation below is derived by hand. Nodes of 8 GPUs; `pack` places; nN is node N."""

import pytest

from transit_launch.errors import UsageError
from transit_launch.sim import backfill
from transit_launch.sim.cluster import Cluster
from transit_launch.sim.limits import SchedParams
from transit_launch.sim.scheduler import Scenario, simulate
from transit_launch.sim.trace import Trace

EXACT = SchedParams(bf_resolution=0)


def running(racks: int, nodes_per_rack: int, busy: list):
    """A cluster with one whole-node job a (node, planned end) of `busy`, and the pass's
    planned ends [(end, job)] and allocations."""
    cl = Cluster(racks, nodes_per_rack * 8, 8)
    planned, alloc = [], []
    for k, (node, end) in enumerate(busy):
        cl._take(node, 8)
        alloc.append([(node, 8)])
        planned.append((float(end), k))
    return cl, sorted(planned), alloc


def both(racks, nodes_per_rack, busy, resv, n, length, now):
    cl, planned, alloc = running(racks, nodes_per_rack, busy)
    g = 8 * n
    earliest = backfill.reservation(cl, planned, alloc, resv, n, g, length, now, now + 86400, "pack")
    slurm = backfill.slurm_reservation(cl, planned, alloc, resv, n, g, length, now, now + 86400, "pack", EXACT)
    return earliest, slurm


def test_a_batch_of_ends_keeps_a_two_node_job_in_one_rack():
    """Racks of 2 nodes (n0 n1 | n2 n3); n0 busy to 100, n1 to 140, n2 to 200, n3 free; a
    2-node job at 30. Earliest: at 100 n0 and n3 are free, a node in each rack: (100, n0 n3).
    Slurm: the first end, 100, rounded up to 120; the first batch takes every end up to 150:
    100 and 140 (200 is past it). Then n0, n1 and n3 are free; pack takes the rack that holds
    two, rack 0: (140, n0 n1), no rack traversal."""
    assert both(2, 2, [(0, 100), (1, 140), (2, 200)], [], 2, 60, 30) == ((100, [0, 3]), (140, [0, 1]))


def test_windows_double_from_the_first_end():
    """One rack of 4 nodes, busy to 100, 160, 250 and 300; a 3-node job at 0. Earliest: the
    third node free, 250. Slurm: 100 rounded up to 120; batch 1 up to 120 + 30 = 150: 100
    alone (1 node). The window doubles to 60: 160 is within 180; batch 2 up to 180: 160 (2
    nodes). Doubled to 120: 250 is past 240, doubled again to 240: batch 3 up to 360 takes 250
    and 300; the job fits at the batch's last end, 300, on n0 n1 n2 (the rack's lowest)."""
    assert both(1, 4, [(0, 100), (1, 160), (2, 250), (3, 300)], [], 3, 60, 0) == \
        ((250, [0, 1, 2]), (300, [0, 1, 2]))


def test_a_start_past_later_start_is_tested_again_from_there():
    """Racks of 2 nodes; n0 busy to 100, n1 to 145, n2 to 1000, n3 free but reserved over
    [60, 120) for an earlier job; a one-node job of 60 s at 30. Earliest: its window from 30
    reaches the reservation's start (60): n3 is held; n0 free at 100, and a window from there
    meets the reservation, which holds n3 alone: (100, n0). Slurm, from 30: n3 left out
    (held over [30, 90]); later_start 120 (the reservation's end frees n3). Batch 1 up to
    150: 100 and 145, n0 and n1 free: (145, n0), past 120: again from 120, where the window
    [120, 180] meets no reservation: it fits on the GPUs free now, n3, so at 120: (120, n3)."""
    assert both(2, 2, [(0, 100), (1, 145), (2, 1000)], [(60, 120, frozenset({3}))], 1, 60, 30) == \
        ((100, [0]), (120, [3]))


def test_nodes_that_meet_a_reservation_are_tested_again_from_their_start():
    """Racks of 2 nodes; n0 busy to 100, n1 to 145, n2 and n3 to 1000; n0 reserved over [200,
    260); a one-node job of 60 s at 30. Earliest: at 100 n0 is free and the window [100, 160]
    does not reach 200: (100, n0). Slurm, from 30: the window [30, 90] meets no reservation;
    batch 1 up to 150 frees n0 and n1: (145, n0), whose window [145, 205) meets the
    reservation on n0: again from 145. Now n0 is left out (held over [145, 205]) and its job
    passed over; the first end is n1's, 145, rounded up to 150: batch 1 up to 180 frees n1:
    (145, n1)."""
    assert both(2, 2, [(0, 100), (1, 145), (2, 1000), (3, 1000)], [(200, 260, frozenset({0}))], 1, 60, 30) == \
        ((100, [0]), (145, [1]))


# (submit s, run s, GPUs, limit s) on 2 racks of 2 nodes, Slurm's defaults (passes every 30 s,
# reservations rounded down to 60 s, the head's alone)
JOBS = [(0, 100, 8, 100),   # J0 n0 to 100
        (0, 140, 8, 140),   # J1 n1 to 140
        (0, 200, 8, 200),   # J2 n2 to 200
        (1, 60, 16, 60),    # H: two nodes, the head from 1 (n3 alone is free)
        (2, 100, 8, 100)]   # X: one node
# earliest: the pass at 30 reserves H from 100 on n0 and n3 (the first test above), [60, 120)
#   rounded; X's window [30, 130] reaches 60 and n3 is held: X waits. At 100 J0 ends and the
#   main scheduler starts H on n0 and n3; at 140 J1 ends and X, now the head, starts on n1.
EARLIEST = [0, 0, 0, 100, 140]
# slurm: the pass at 30 reserves H from 140 on n0 n1 ([120, 180) rounded): X's window reaches
#   120 but n3 is not held: X starts at 30 on n3 (to 130). At 100 J0 ends: H has one node. The
#   pass at 120 reserves H again (first end X's 130, rounded up to 150; the batch up to 180:
#   130, 140); nothing else waits. At 130 X ends: n0 and n3 are free and H starts.
SLURM = [0, 0, 0, 130, 30]


def starts(at: str) -> list:
    t = Trace(submit=[j[0] for j in JOBS], duration=[float(j[1]) for j in JOBS], gpus=[j[2] for j in JOBS],
              ids=[str(i) for i in range(len(JOBS))], limits=[float(j[3]) for j in JOBS], source="test")
    return simulate(t, Scenario("t", racks=2, rack_gpus=16, gpus_per_node=8,
                                sched=SchedParams(bf_reserve_at=at))).start


def test_the_two_rules_start_different_jobs_first():
    assert starts("earliest") == EARLIEST
    assert starts("slurm") == SLURM


def test_the_option():
    with pytest.raises(UsageError) as e:
        SchedParams(bf_reserve_at="latest")
    assert "--bf-reserve-at 'latest' is not one of earliest, slurm" in str(e.value)
    # the report names it only where it is not the default (a default run's report as before)
    assert "bf_reserve_at" not in SchedParams().reported()
    assert SchedParams(bf_reserve_at="slurm").reported()["bf_reserve_at"] == "slurm"
    from transit_launch.sim.run import scheduler_line
    assert "reserving for the head at Slurm's batched job ends," in scheduler_line(SchedParams(bf_reserve_at="slurm"), 1)
    assert "batched" not in scheduler_line(SchedParams(), 1)


# (submit s, run s, GPUs, limit s) on one rack of 4 nodes (n0-n3), Slurm's defaults but every
# job tested reserved (bf_reserve 0), reservations as Slurm's: a whole-node job the pass starts
# goes into the pass's map as Slurm's backfill puts it there (backfill.c: _start_job, then
# _bf_reserve_running), its nodes held from the map's start to its planned end, both rounded
# down to bf_resolution: a later job's window that reaches that span leaves them out.
RUNNING = [(40, 180, 8, 180),  # A: n0, planned end 220
           (40, 120, 4, 120),  # B: 4 GPUs of n1 (pack: the fullest that fits; n0 is full), planned end 160
           (61, 60, 32, 60),   # R: 4 nodes, the head
           (62, 60, 16, 60),   # J: 2 nodes
           (63, 60, 24, 60),   # K: 3 nodes
           (64, 60, 4, 60)]    # X: 4 GPUs
# The first pass is at 90 (the queue forms at 61). R: 2 whole nodes now; the first end, B's 160,
#   rounded up to 180: batch 1 up to 210 frees n1 (3 nodes); the window doubles to 60 and A's
#   220 is inside 240: batch 2 frees n0: R at 220 on n0-n3, held over [180, 240) rounded.
# J: its window [90, 150] does not reach 180: it starts at 90 on n2 n3, planned end 150.
# K, without J in the map: its window [90, 150] meets no reservation; J's 150 rounded up to 180
#   opens batch 1, up to 210: J's 150 and B's 160 (A's 220 is past it): n1 n2 n3 at 160, held
#   over [120, 180) rounded. X's window [90, 150] reaches 120: n1, where its 4 GPUs are free,
#   is held, and X waits until K and R have run: at 280 beside K (R from 220 to 280).
# K, with J in the map over [60, 120) (floor(90) to floor(150)): its window [90, 150] meets it,
#   n2 n3 are left out and J passed over; B's 160 opens batch 1 (n1 alone), A's 220 batch 2
#   (n0 n1): no 3 nodes. later_start is the map's 120, where n2 n3 come back: from 120 the
#   window [120, 180] reaches R's 180, which holds all four: nothing; from R's end, 240: J's
#   batch (150, 160) fits n1 n2 n3, at 240 (after the start it was tested from), held over
#   [240, 300). X's window [90, 150] reaches neither R nor K: it starts at 90 on n1.
SLURM_MAP_OFF = [40, 40, 220, 90, 280, 280]
SLURM_MAP_ON = [40, 40, 220, 90, 280, 90]


def test_a_whole_node_job_the_pass_starts_holds_its_nodes_in_the_map():
    t = Trace(submit=[j[0] for j in RUNNING], duration=[float(j[1]) for j in RUNNING],
              gpus=[j[2] for j in RUNNING], ids=[str(i) for i in range(len(RUNNING))],
              limits=[float(j[3]) for j in RUNNING], source="test")
    sc = Scenario("t", racks=1, rack_gpus=32, gpus_per_node=8, sched=SchedParams(bf_reserve=0, bf_reserve_at="slurm"))
    assert simulate(t, sc).start == SLURM_MAP_ON


def test_scheduler_slurm_is_slurms_three_choices(capsys):
    """--scheduler slurm: --placement tree --bf-reserve 0 --bf-reserve-at slurm where those are
    not given (an option given keeps its value); refused with --node-failures, whose replays
    place as pack."""
    from transit_launch import cli

    def out(*args):
        assert cli.main(["simulate", "--synthetic", "200", "--racks", "4", "--reductions", "0", "--json", *args]) == 0
        return capsys.readouterr().out

    assert out("--scheduler", "slurm") == out("--placement", "tree", "--bf-reserve", "0", "--bf-reserve-at", "slurm")
    assert out("--scheduler", "slurm", "--bf-reserve", "1") == \
        out("--placement", "tree", "--bf-reserve", "1", "--bf-reserve-at", "slurm")
    assert out("--scheduler", "simulator") == out()
    assert cli.main(["simulate", "--synthetic", "200", "--racks", "4", "--scheduler", "slurm",
                     "--node-failures", "0.5"]) != 0
    assert "--node-failures replays place them as pack" in capsys.readouterr().err


def random_pass_state(rng):
    """A random cluster with running jobs (one-node jobs sharing nodes, multi-node jobs on whole
    nodes) and their planned ends [(end, job)] sorted, at a pass at `now`."""
    gpn, npr = rng.choice((4, 8)), rng.choice((1, 2, 4, 8))
    cl = Cluster(rng.randrange(1, 7), npr * gpn, gpn)
    now = rng.choice((1000.0, 1020.0, 1037.5))
    planned, alloc = [], []
    for _ in range(rng.randrange(0, 6 * cl.n_nodes)):
        n = rng.choice((1, 1, 1, 2, 3, npr + 1))
        placed = cl.place(n, rng.randrange(1, gpn + 1) if n == 1 else n * gpn, rng.choice(("pack", "spread", "tree")))
        if placed is None:
            continue
        end = now + rng.choice((rng.randrange(1, 400) * 10, rng.randrange(1, 4000) + 0.5, 30 * rng.randrange(1, 200)))
        planned.append((end, len(alloc)))
        alloc.append(placed[0])
    return cl, sorted(planned), alloc, now


@pytest.mark.parametrize("seed", range(60))
def test_slurm_reservations_are_the_plain_rules(seed):
    """backfill.slurm_reservation (its memo shared through a pass, its kept bounds, its batches
    found by bisect) against tests/sim_plain.py's plain rule on random passes: each tested job
    in turn, its reservation added as the pass adds it, now and then a started whole-node job's
    span (_bf_reserve_running) or one of no length. The same start and nodes every time."""
    import random

    from tests.sim_plain import slurm_reservation as plain

    rng = random.Random(seed)
    cl, planned, alloc, now = random_pass_state(rng)
    sp = SchedParams(bf_resolution=rng.choice((0, 60)), bf_reserve=0, bf_reserve_at="slurm")
    strategy = rng.choice(("tree", "tree", "pack", "spread"))
    horizon = now + rng.choice((3600.0, 86400.0))
    resv, memo = [], {}
    for _ in range(rng.randrange(5, 40)):
        if rng.random() < 0.15 and alloc:  # a whole-node job the pass started: its nodes to its end
            rs = sp.reservation(now)
            held = frozenset(rng.sample(range(cl.n_nodes), rng.randrange(2, min(5, cl.n_nodes + 1))))
            resv.append((rs, max(sp.reservation(now + rng.randrange(60, 3000)), rs + sp.bf_resolution), held))
            continue
        if rng.random() < 0.05 and not sp.bf_resolution:  # one of no length (a plan of 0 s): it holds no span
            t = now + rng.randrange(0, 3000)
            resv.append((t, t, frozenset(rng.sample(range(cl.n_nodes), 1))))
            continue
        n = rng.choice((1, 1, 2, 3, cl.nodes_per_rack, cl.nodes_per_rack + 1))
        n = min(n, cl.n_nodes)
        g = rng.randrange(1, cl.gpn + 1) if n == 1 else n * cl.gpn
        length = float(rng.choice((60, 300, 1800, 7200, rng.randrange(60, 20000))))
        want = plain(cl, planned, alloc, resv, n, g, length, now, horizon, strategy, sp)
        assert backfill.slurm_reservation(cl, planned, alloc, resv, n, g, length, now, horizon, strategy, sp) == want
        assert backfill.slurm_reservation(cl, planned, alloc, resv, n, g, length, now, horizon, strategy, sp,
                                          memo) == want
        s, chosen = want
        if chosen is not None:
            rs = sp.reservation(s)
            resv.append((rs, max(sp.reservation(s + length), rs + sp.bf_resolution), frozenset(chosen)))


@pytest.mark.parametrize("seed", range(20))
def test_a_slide_joins_the_spans_of_each_window(seed):
    """backfill._Slide, a retry's spans joined from the ones before (lo and hi only grow),
    against every window's spans joined anew."""
    import functools
    import operator
    import random

    rng = random.Random(seed)
    bounds = backfill._Bounds([])
    bounds.span[:] = [rng.getrandbits(12) for _ in range(rng.randrange(0, 40))]
    slide, lo, hi = backfill._Slide(bounds), 0, 0
    for _ in range(30):
        lo = min(lo + rng.choice((0, 0, 1, 2, 7)), len(bounds.span))
        hi = min(max(hi + rng.choice((0, 1, 3, 9)), lo), len(bounds.span))
        assert slide.joined(lo, hi) == functools.reduce(operator.or_, bounds.span[lo:hi], 0)
