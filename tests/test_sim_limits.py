"""Time limits apart from run times, and Slurm's backfill parameters (issue 54): small traces
derived by hand. Every cluster here is one rack of four 8-GPU nodes (32 GPUs); a job of
24 GPUs takes three whole nodes, one of 32 the whole rack, one of 8 a node."""

import pytest

from transit_launch.errors import UsageError
from transit_launch.sim import limits
from transit_launch.sim.efficiency import LINEAR
from transit_launch.sim.limits import SchedParams
from transit_launch.sim.scheduler import Scenario, simulate
from transit_launch.sim.trace import Trace

EVERY_EVENT = dict(bf_interval=0, bf_resolution=0)  # the planning rule alone, no pass interval or rounding
ON_LIMITS = SchedParams(**EVERY_EVENT)
ON_RUNTIMES = SchedParams(plan_on="runtimes", **EVERY_EVENT)


def trace(*jobs):
    """jobs: (submit s, run time s, GPUs, time limit s or 0 for the model)"""
    return Trace(submit=[j[0] for j in jobs], duration=[float(j[1]) for j in jobs], gpus=[j[2] for j in jobs],
                 ids=[str(i) for i in range(len(jobs))], limits=[float(j[3]) for j in jobs], source="test")


def starts(t, sched, **kw):
    return simulate(t, Scenario("t", racks=1, gpus_per_node=8, sched=sched, **kw)).start


def test_backfill_fires_on_limits_but_not_on_runtimes():
    # J0 takes 3 nodes (runs 20 s, limit 2 min); J1 wants all 4 nodes and heads the queue
    # from t=1; J2 (1 node, runs 30 s, limit 1 min) arrives at 2.
    # On limits: J1's reservation is J0's planned end 0 + 120 = 120 with no node to spare;
    #   J2's limit ends at 2 + 60 = 62 <= 120: it backfills at 2 (to 32). J0 really ends at
    #   20, but J2 holds a node until 32: J1 starts at 32.
    # On run times: the reservation is J0's end, 20; J2 would end at 32 > 20: it waits.
    #   J1 starts at 20 (to 30), J2 at 30.
    t = trace((0, 20, 24, 120), (1, 10, 32, 60), (2, 30, 8, 60))
    assert starts(t, ON_LIMITS) == [0, 32, 2]
    assert starts(t, ON_RUNTIMES) == [0, 20, 30]


def test_backfill_fires_on_runtimes_but_not_on_limits():
    # J0 (3 nodes) runs 50 s of a 1-minute limit; J1 (4 nodes) heads the queue; J2 (1 node)
    # runs 20 s, limit 1 min.
    # On run times: the reservation is 50; J2 ends at 22 <= 50: backfilled at 2. J1 at 50.
    # On limits: the reservation is 0 + 60 = 60; J2's limit ends at 62 > 60 and no node is
    #   spare: it waits. J0 ends at 50: J1 starts at 50 (to 60), J2 at 60.
    t = trace((0, 50, 24, 60), (1, 10, 32, 60), (2, 20, 8, 60))
    assert starts(t, ON_RUNTIMES) == [0, 50, 2]
    assert starts(t, ON_LIMITS) == [0, 50, 60]


def test_backfill_interval_delays_the_pass():
    # The first trace with passes every 30 s: J2 arrives at 2 but the next pass is at 30.
    # J0 ends at 20 and the main scheduler starts the head J1 on all 4 nodes (to 30); at 30
    # J1 ends and J2, now the head, starts: no backfill at all.
    t = trace((0, 20, 24, 120), (1, 10, 32, 60), (2, 30, 8, 60))
    assert starts(t, SchedParams(bf_interval=30, bf_resolution=0)) == [0, 20, 30]


def test_backfill_resolution_rounds_the_reservation_down():
    # J0 (3 nodes, limit 2 min) starts at 10: J1's reservation is 130. J2 (1 node, limit
    # 1 min) arrives at 65 and would end by 125.
    # Exact (resolution 0): 125 <= 130: backfilled at 65 (to 95); J0 ends at 110, J1 starts.
    # Resolution 60: the reservation is 120; 125 > 120: J2 waits for J1 (110 to 120).
    t = trace((10, 100, 24, 120), (11, 10, 32, 60), (65, 30, 8, 60))
    assert starts(t, SchedParams(bf_interval=0, bf_resolution=0)) == [10, 110, 65]
    assert starts(t, SchedParams(bf_interval=0, bf_resolution=60)) == [10, 110, 120]


def test_backfill_window_counts_the_head():
    # J1 (4 nodes) waits for J0 (reservation 120). J2 (limit 10 min) cannot backfill; J3
    # (limit 1 min, ends by 63) can, if the pass tests it: with bf_max_job_test 3 (J1, J2,
    # J3) it starts at 3; with 2 it is never tested and starts after J1, beside J2, at 110.
    t = trace((0, 100, 24, 120), (1, 10, 32, 60), (2, 500, 8, 600), (3, 30, 8, 60))
    assert starts(t, SchedParams(bf_max_job_test=3, **EVERY_EVENT)) == [0, 100, 110, 3]
    assert starts(t, SchedParams(bf_max_job_test=2, **EVERY_EVENT)) == [0, 100, 110, 110]


def test_limit_model():
    # the run time or a recorded limit, the larger, rounded up to a minute: 100 -> 120,
    # 61 -> 120, 1 -> 60; 500 recorded -> 540; 20 recorded under a run of 30 -> 60
    assert limits.of([100, 61, 1, 30], [0, 0, 500, 20]) == [120, 120, 540, 60]
    assert limits.of([100], []) == [120]  # a trace without limits


def test_modelled_limits_are_drawn_overestimates():
    t = trace((0, 100, 8, 0), (1, 200, 8, 500), *[(2, 1000, 8, 0)] * 50)
    same = limits.modelled(t, 1.0, seed=5).limits
    assert same[0] == 100 and same[1] == 500 and same[2] == 1000  # factor 1: the run time; recorded kept
    a, b = limits.modelled(t, 3.0, seed=1).limits, limits.modelled(t, 3.0, seed=2).limits
    assert a == limits.modelled(t, 3.0, seed=1).limits and a != b  # a seed is one draw
    assert a[1] == b[1] == 500
    drawn = a[2:] + b[2:]
    assert all(1000 <= x <= 3000 for x in drawn) and max(drawn) > 2500 and min(drawn) < 1500  # uniform on [1, 3]


def test_modelled_limits_change_what_backfills():
    # No recorded limits: J0 runs 50 s; J2 runs 20 s. With factor 1 their limits are the
    # run times rounded up, 60 and 60: the second trace on limits, J2 waits (starts at 60).
    # Give J0 a recorded limit of 180 (as a drawn overestimate of 3.6 would): J2 ends by
    # 2 + 60 = 62 <= 180 and backfills at 2.
    t = trace((0, 50, 24, 0), (1, 10, 32, 0), (2, 20, 8, 0))
    assert starts(limits.modelled(t, 1.0, 0), ON_LIMITS) == [0, 50, 60]
    assert starts(trace((0, 50, 24, 180), (1, 10, 32, 0), (2, 20, 8, 0)), ON_LIMITS) == [0, 50, 2]


def test_a_scaled_in_job_limit_stretches_with_it():
    # 4 nodes -> 2 at 50% (linear efficiency): run time 100 -> 200, limit 120 -> 240
    res = simulate(trace((0, 100, 32, 0)), Scenario("h", racks=1, gpus_per_node=8, reduction=0.5, efficiency=LINEAR,
                                                    sched=ON_LIMITS))
    assert res.nodes == [2] and res.end == [200] and res.limit == [240]


@pytest.mark.parametrize("kw,needle", [
    (dict(bf_max_job_test=0), "--bf-max-job-test takes 1 to"),
    (dict(bf_interval=-1), "--bf-interval takes 0 to 86400"),
    (dict(bf_resolution=float("nan")), "--bf-resolution takes 0 to 86400"),
    (dict(plan_on="oracle"), "--plan-on 'oracle' is not one of limits, runtimes"),
])
def test_bad_parameters(kw, needle):
    with pytest.raises(UsageError) as e:
        SchedParams(**kw)
    assert needle in str(e.value)


def test_trace_limits_checked():
    with pytest.raises(UsageError, match="trace limits must be empty or one non-negative number"):
        Trace(submit=[0.0], duration=[1.0], gpus=[1], ids=["a"], limits=[-5.0])


def test_a_single_node_head_reserves_one_node():
    # Six jobs fill the rack at 0 (pack: lowest node first): n0 holds j0 (4 GPUs, limit 60)
    # and j1 (4 GPUs, runs 110, limit 120), n1 j2 (limit 60) and j3 (long), n2 j4 (8 GPUs,
    # long), n3 j5 (4 GPUs, long): 4 GPUs free, on n3. H (8 GPUs, one node) heads the queue
    # at 1: no node reaches 8 free GPUs at 60 (n0 and n1 each get 4 back) but n0 does at
    # 120: H's reservation is n0 at 120. C (4 GPUs, runs 90, limit 100) arrives at 2 and
    # ends by 102 <= 120: it backfills on n3 at 2. j1 ends at 110: H starts on n0.
    # (Counting GPUs instead, 8 are back at 60, so C's 102 ran past the reservation with
    # none to spare: it waited to 50 and then took n0's free half, holding H to 140.)
    jobs = [(0, 50, 4, 60), (0, 110, 4, 120), (0, 50, 4, 60), (0, 1000, 4, 1020), (0, 1000, 8, 1020),
            (0, 1000, 4, 1020), (1, 10, 8, 60), (2, 90, 4, 100)]
    assert starts(trace(*jobs), ON_LIMITS)[6:] == [110, 2]
