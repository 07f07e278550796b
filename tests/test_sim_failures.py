"""Node failures in the simulator (sim/failures.py, simulate --node-failures), against a
hand derivation on a two-job trace."""

import json

import pytest

from transit_launch.sim.efficiency import Curve
from transit_launch.sim.failures import LLAMA3_RATE, Failures, replay, report
from transit_launch.sim.trace import Trace

H = 3600.0


def test_requeue_against_scale_in_by_hand():
    # one rack of four 4-GPU nodes. A: 4 nodes for 10 h from t=0; B: 1 node for 2 h from
    # t=3 h. Node 0 fails at 2.5 h and is back at 5.5 h; checkpoints every hour, 0.1 h a
    # restart; a job on 3 of its 4 nodes runs at 3/4 x 0.8 (the curve's 25% point).
    t = Trace(submit=[0.0, 3 * H], duration=[10 * H, 2 * H], gpus=[16, 4], ids=["A", "B"], source="hand", types=[],
              states=[])
    f = Failures(rate=0, repair_h=3, checkpoint_h=1, restart_h=0.1, times=((2.5 * H, 0),))
    curve = Curve("hand", ((0.0, 1.0), (0.25, 0.8)))
    rq = replay(t, 1, 16, 4, "requeue", f, curve)
    si = replay(t, 1, 16, 4, "scale-in", f, curve)
    # requeue: A keeps its 2 h checkpoint (8 h left) and waits for 4 nodes; B fits the
    # 3 free ones before node 0 is back (3 + 2 <= 5.5: backfilled at once); A restarts at
    # 5.5 h, 0.1 h of downtime, 8 h of work: ends 13.6 h
    assert [e / H for e in rq.end] == pytest.approx([13.6, 5.0]) and rq.start[1] == 3 * H
    # scale-in: A continues on 3 nodes from 2.6 h at 0.6 of its rate: 2.9 h x 0.6 = 1.74 h
    # done when node 0 returns at 5.5 h; back on 4 from 5.6 h, 6.26 h left: ends 11.86 h.
    # B has no node until A ends (node 0 goes back to A): it starts at 11.86 h
    assert [e / H for e in si.end] == pytest.approx([11.86, 13.86]) and si.start[1] / H == pytest.approx(11.86)
    # GPU-hours held: requeue A 16 x 2.5 + 16 x 8.1, B 4 x 2 = 177.6; scale-in A 16 x 2.5 +
    # 12 x 3.0 + 16 x 6.36, B 8 = 185.76; the work is 16 x 10 + 4 x 2 = 168
    r, s = report(rq), report(si)
    assert (r["held_gpu_h"], s["held_gpu_h"], r["useful_gpu_h"]) == pytest.approx((177.6, 185.76, 168.0))
    assert r["goodput_held"] == pytest.approx(168 / 177.6, abs=1e-4)
    assert s["goodput_held"] == pytest.approx(168 / 185.76, abs=1e-4)
    # GPU-hours owed, submission to end: requeue A 16 x 13.6 = 217.6, B 4 x (5 - 3) = 8:
    # 225.6, goodput 168 / 225.6 = 0.7447; scale-in A 16 x 11.86 = 189.76, B 4 x (13.86 - 3)
    # = 43.44 (its 8.86 h wait counts): 233.2, goodput 168 / 233.2 = 0.7204
    assert (r["owed_gpu_h"], s["owed_gpu_h"]) == pytest.approx((225.6, 233.2))
    assert (r["goodput"], s["goodput"]) == pytest.approx((0.7447, 0.7204), abs=1e-4)
    # the other job (B): no wait under requeue, 8.86 h under scale-in
    assert (r["other_queue_mean_min"], s["other_queue_mean_min"]) == pytest.approx((0.0, 8.86 * 60))
    assert (r["jct_interrupted_mean_h"], s["jct_interrupted_mean_h"]) == pytest.approx((13.6, 11.86))


def test_a_job_that_is_not_eligible_requeues_under_scale_in():
    # an evaluation job holds no optimizer state to offload (sim/jobs.py): it requeues either way
    t = Trace(submit=[0.0], duration=[10 * H], gpus=[16], ids=["A"], source="hand", types=["evaluation"], states=[])
    f = Failures(rate=0, repair_h=3, checkpoint_h=1, restart_h=0.1, times=((2.5 * H, 0),))
    assert replay(t, 1, 16, 4, "scale-in", f, Curve("x")).end[0] / H == pytest.approx(13.6)


def test_llama3_rate_and_cli(cli):
    assert LLAMA3_RATE == pytest.approx(419 / (2048 * 54))  # per node-day: 0.0038, a node MTBF of 264 days
    rc, out, err = cli("simulate", "--synthetic", "300", "--racks", "4", "--node-failures", "0.05", "--json",
                       "--quiet")
    assert rc == 0, err
    d = json.loads(out)
    assert [r["policy"] for r in d["runs"]] == ["requeue", "scale-in"] and d["failures_per_node_day"] == 0.05
    assert all(r["failures_hitting_jobs"] > 0 and 0 < r["goodput"] <= r["goodput_held"] <= 1 for r in d["runs"])
    rc, _, err = cli("simulate", "--synthetic", "10", "--repair-hours", "2")
    assert rc == 2 and "add --node-failures" in err
    rc, _, err = cli("simulate", "--synthetic", "10", "--node-failures", "lots")
    assert rc == 2 and "failures per node-day" in err and "Traceback" not in err


# Two failures of one job, by hand. One rack of four 4-GPU nodes, job A: 4 nodes for 10 h
# from t=0; checkpoints every hour of a run (counted from its start, restart downtime
# included), 0.1 h a restart, nodes back 3 h after failing; scale-in runs 3/4 x 0.8 on 3
# nodes and 2/4 x 0.6 on 2. A second failure is where a run began with a restart: its
# checkpoints hold 0.1 h less work than the wall time since it began.
CURVE2 = Curve("hand", ((0.0, 1.0), (0.25, 0.8), (0.5, 0.6)))
ONE_JOB = {"submit": [0.0], "duration": [10 * H], "gpus": [16], "ids": ["A"], "source": "hand", "types": [],
           "states": []}


def test_a_job_that_fails_twice_requeues_twice_by_hand():
    # node 0 fails at 2.5 h (back 5.5 h), node 1 at 8 h (back 11 h).
    # 1st: 2 h checkpointed, 8 h left; held 16 x 2.5 = 40. Restarts at 5.5 h on 4 nodes.
    # 2nd at 8 h: the run began 5.5 h, progress from 5.6 h; its checkpoint at 7.5 h holds
    #   7.5 - 5.6 = 1.9 h (not 2 h): 6.1 h left; held 16 x 2.5 = 40.
    # Restarts at 11 h (node 1 back), 0.1 h down + 6.1 h: ends 17.2 h; held 16 x 6.2 = 99.2.
    # held 179.2 GPU-h, useful 16 x 10 = 160, 160 / 179.2 = 0.8929 of held; owed 16 x 17.2
    # = 275.2 (the 3 h waits for nodes 0 and 1 count): goodput 160 / 275.2 = 0.5814
    f = Failures(rate=0, repair_h=3, checkpoint_h=1, restart_h=0.1, times=((2.5 * H, 0), (8.0 * H, 1)))
    o = replay(Trace(**ONE_JOB), 1, 16, 4, "requeue", f, CURVE2)
    assert o.end[0] / H == pytest.approx(17.2) and o.start[0] == 0.0
    r = report(o)
    assert (r["failures_hitting_jobs"], r["interrupted_jobs"]) == (2, 1)
    assert (r["held_gpu_h"], r["useful_gpu_h"], r["goodput_held"]) == pytest.approx((179.2, 160.0, 0.8929))
    assert (r["owed_gpu_h"], r["goodput"]) == pytest.approx((275.2, 0.5814))
    assert (r["jct_interrupted_mean_h"], r["makespan_h"]) == pytest.approx((17.2, 17.2))


def test_a_job_that_fails_twice_scales_in_twice_by_hand():
    # node 0 fails at 2.5 h (back 5.5 h), node 1 at 4.25 h (back 7.25 h), all times in h.
    # 2.5: 2 h checkpointed, 8 left; held 16 x 2.5 = 40; on 3 nodes at 0.6 from 2.6.
    # 4.25: the run began 2.5, its checkpoint at 3.5 holds (3.5 - 2.6) x 0.6 = 0.54:
    #   7.46 left; held 12 x 1.75 = 21; on 2 nodes at 0.3 from 4.35.
    # 5.5 (node 0 back): checkpoint of (5.5 - 4.35) x 0.3 = 0.345: 7.115 left; held 8 x 1.25
    #   = 10; on 3 nodes at 0.6 from 5.6.
    # 7.25 (node 1 back): (7.25 - 5.6) x 0.6 = 0.99: 6.125 left; held 12 x 1.75 = 21; on 4
    #   nodes from 7.35: ends 13.475; held 16 x 6.225 = 99.6.
    # held 40 + 21 + 10 + 21 + 99.6 = 191.6, 160 / 191.6 = 0.8351 of held; owed 16 x
    # 13.475 = 215.6 (the GPUs of the down nodes count): goodput 160 / 215.6 = 0.7421
    f = Failures(rate=0, repair_h=3, checkpoint_h=1, restart_h=0.1, times=((2.5 * H, 0), (4.25 * H, 1)))
    o = replay(Trace(**ONE_JOB), 1, 16, 4, "scale-in", f, CURVE2)
    assert o.end[0] / H == pytest.approx(13.475)
    r = report(o)
    assert (r["failures_hitting_jobs"], r["interrupted_jobs"]) == (2, 1)
    assert (r["held_gpu_h"], r["useful_gpu_h"], r["goodput_held"]) == pytest.approx((191.6, 160.0, 0.8351))
    assert (r["owed_gpu_h"], r["goodput"]) == pytest.approx((215.6, 0.7421))


def test_a_scaled_in_job_that_loses_its_last_other_node_requeues_by_hand():
    # A: 2 nodes (8 GPUs) for 10 h, a rack of two nodes; node 0 fails at 2.5 h (back 5.5 h),
    # node 1 at 4.25 h (back 7.25 h). 2.5: 2 h kept, 8 left; held 8 x 2.5 = 20; on 1 node
    # at 1/2 x 0.6 = 0.3 from 2.6. 4.25: checkpoint at 3.5 holds 0.9 x 0.3 = 0.27: 7.73
    # left; held 4 x 1.75 = 7; no node left: requeued, node 0 goes back to the pool at 5.5,
    # A starts on both at 7.25: ends 7.35 + 7.73 = 15.08; held 8 x 7.83 = 62.64.
    # held 89.64, useful 80, 0.8925 of held; owed 8 x 15.08 = 120.64: goodput 0.6631
    t = Trace(**{**ONE_JOB, "gpus": [8]})
    f = Failures(rate=0, repair_h=3, checkpoint_h=1, restart_h=0.1, times=((2.5 * H, 0), (4.25 * H, 1)))
    r = report(replay(t, 1, 8, 4, "scale-in", f, CURVE2))
    assert (r["failures_hitting_jobs"], r["jct_interrupted_mean_h"]) == (2, pytest.approx(15.08))
    assert (r["held_gpu_h"], r["useful_gpu_h"], r["goodput_held"]) == pytest.approx((89.64, 80.0, 0.8925))
    assert (r["owed_gpu_h"], r["goodput"]) == pytest.approx((120.64, 0.6631))


def test_goodput_counts_the_queue():
    # No failure. One rack of four 4-GPU nodes; A and B each want all 16 GPUs for 10 h, both
    # submitted at 0: A runs 0-10 h, B waits 10 h and runs 10-20 h. Held 16 x 10 x 2 = 320,
    # all of it work: 100% of held. Owed A 16 x 10 = 160, B 16 x 20 = 320: goodput 320 / 480
    # = 0.6667; a queue that grows drives it down where the held figure stays at 100%.
    t = Trace(submit=[0.0, 0.0], duration=[10 * H, 10 * H], gpus=[16, 16], ids=["A", "B"], source="hand", types=[],
              states=[])
    r = report(replay(t, 1, 16, 4, "requeue", Failures(rate=0), Curve("x")))
    assert (r["held_gpu_h"], r["owed_gpu_h"], r["useful_gpu_h"]) == pytest.approx((320.0, 480.0, 320.0))
    assert (r["goodput_held"], r["goodput"]) == pytest.approx((1.0, 0.6667), abs=1e-4)


def test_failures_go_through_the_backfill_on_limits_by_hand():
    # The trace of test_requeue_against_scale_in_by_hand, but B asks 3 h (it runs 2). Under
    # requeue A (4 nodes, 2 h checkpointed, 8 h left) waits for node 0, back at 5.5 h: the
    # backfill pass at 3 h gives A a reservation of all four nodes from 5.5 h. B's window on
    # its limit, 3 h to 6 h, reaches into it: B may not start, where on run times (3 h to 5 h)
    # it backfilled. A restarts at 5.5 h (0.1 h down, 8 h of work): ends 13.6 h; B then
    # runs 13.6 h to 15.6 h.
    t = Trace(submit=[0.0, 3 * H], duration=[10 * H, 2 * H], gpus=[16, 4], ids=["A", "B"], source="hand",
              limits=[10 * H, 3 * H])
    f = Failures(rate=0, repair_h=3, checkpoint_h=1, restart_h=0.1, times=((2.5 * H, 0),))
    curve = Curve("hand", ((0.0, 1.0), (0.25, 0.8)))
    o = replay(t, 1, 16, 4, "requeue", f, curve)
    assert [e / H for e in o.end] == pytest.approx([13.6, 15.6]) and o.start[1] / H == pytest.approx(13.6)
    # the work 16 x 10 + 4 x 2 = 168 GPU-h; held A 16 x 2.5 + 16 x 8.1 = 169.6, B 8: 177.6
    # (0.9459 of held); owed A 16 x 13.6 = 217.6, B 4 x (15.6 - 3) = 50.4: 268, goodput
    # 168 / 268 = 0.6269, where B's backfill on run times gave 0.7447
    r = report(o)
    assert (r["held_gpu_h"], r["owed_gpu_h"]) == pytest.approx((177.6, 268.0))
    assert (r["goodput_held"], r["goodput"]) == pytest.approx((0.9459, 0.6269), abs=1e-4)
    from transit_launch.sim.limits import SchedParams
    assert replay(t, 1, 16, 4, "requeue", f, curve, SchedParams(plan_on="runtimes")).start[1] == 3 * H
    # offered load: 1 arrival gap of 3 h, 177.6 / 2 = 88.8 GPU-h held a job, 16 GPUs always
    # up (no failure rate): 88.8 / 3 / 16 = 1.85, above 1: collapsed, as the 0.63 goodput says
    assert (r["availability"], r["offered_load"], r["collapsed"]) == (1.0, pytest.approx(1.85), True)



def test_a_job_slowed_past_its_limit_is_planned_to_its_expected_end_by_hand():
    """One rack of three 8-GPU nodes. A: 2 nodes, 1 h (limit 1 h) from 0; B: 2 nodes, 0.5 h
    from 0.2 h; C: 1 node, 1 h (limit 1 h) from 0.25 h. Node 0 fails at 0.1 h (back at
    3.1 h): A, no checkpoint yet, keeps node 1 and runs from 0.2 h at 1/2 x 0.8 (the curve's
    50% point) of its rate: its hour of work ends at 0.2 + 2.5 = 2.7 h, past the 1 h its limit
    gives. B, at the head, waits for two nodes: node 2 and A's, reserved from A's expected end
    (2.7 h), not its limit's (1 h); so C (0.25 h to 1.25 h, on node 2) backfills at once. B
    runs 2.7 h to 3.2 h on nodes 1 and 2. Planned on A's limit, C would wait for node 0 (3.1 h)."""
    t = Trace(submit=[0.0, 0.2 * H, 0.25 * H], duration=[1 * H, 0.5 * H, 1 * H], gpus=[16, 16, 8], ids=["A", "B", "C"],
              source="hand", limits=[1 * H, 0.5 * H, 1 * H])
    f = Failures(rate=0, repair_h=3, checkpoint_h=1, restart_h=0.1, times=((0.1 * H, 0),))
    o = replay(t, 1, 24, 8, "scale-in", f, Curve("hand", ((0.0, 1.0), (0.5, 0.8))))
    assert [s / H for s in o.start] == pytest.approx([0.0, 2.7, 0.25])
    assert [e / H for e in o.end] == pytest.approx([2.7, 3.2, 1.25])



def test_a_node_a_scaled_in_job_waits_for_is_planned_for_reservations_by_hand():
    """One rack of three 8-GPU nodes; checkpoints every hour, 0.1 h a restart; a job on 1 of
    its 2 nodes runs at 1/2 x 0.8 (the curve's 50% point) = 0.4 of its rate. A: 2 nodes
    (0 and 1), 1 h from 0. Node 0 fails at 0.1 h: A, no checkpoint yet (its first at 1 h),
    keeps node 1 with its hour of work and runs from 0.2 h at 0.4: it ends at 0.2 + 1 / 0.4
    = 2.7 h, planned there too (its limit, 1 h, is past: 0.1 h + 156 min). A waits for node 0.

    Node 0 back at 3.1 h (repair_h 3): A has ended by then, so node 0 goes back to the pool
    at its repair and is planned free at max(3.1, A's 2.7) = 3.1 h. B: all 3 nodes, 0.5 h,
    from 0.2 h: reserved from 3.1 h (node 2 now, node 1 at 2.7, node 0 at 3.1). C: 1 node,
    10 h, from 0.25 h: its window 0.25 to 10.25 h holds node 2, the only free one, into B's
    reservation: C may not backfill. B runs 3.1 to 3.6 h, C 3.6 to 13.6 h: the same as
    under requeue (A requeues with its hour left, restarts at once on nodes 1 and 2 and ends
    at 0.1 + 0.1 + 1 = 1.2 h; B waits for node 0 at 3.1 h). With node 0 planned nowhere
    while A ran, B got no reservation and C backfilled at 0.25 h: B started at 10.25 h."""
    t = Trace(submit=[0.0, 0.2 * H, 0.25 * H], duration=[1 * H, 0.5 * H, 10 * H], gpus=[16, 24, 8],
              ids=["A", "B", "C"], source="hand")
    curve = Curve("hand", ((0.0, 1.0), (0.5, 0.8)))
    f = Failures(rate=0, repair_h=3, checkpoint_h=1, restart_h=0.1, times=((0.1 * H, 0),))
    for policy, a_end in (("scale-in", 2.7), ("requeue", 1.2)):
        o = replay(t, 1, 24, 8, policy, f, curve)
        assert [s / H for s in o.start] == pytest.approx([0.0, 3.1, 3.6]), policy
        assert [e / H for e in o.end] == pytest.approx([a_end, 3.6, 13.6]), policy
    # Node 0 back at 1.1 h (repair_h 1), while A still runs: A takes it back. Until then
    # node 0 is planned free with A, at max(1.1, 2.7) = 2.7 h, not at its repair (A holds it
    # from 1.1 h). B as in test_a_job_slowed_past_its_limit_is_planned_to_its_expected_end_by_hand
    # (2 nodes, 0.5 h, from 0.2 h; C 1 node, 1 h, from 0.25 h): B is reserved from 2.7 h, so
    # C (0.25 to 1.25 h on node 2) backfills at once; planned at its repair, node 0 would
    # have given B a reservation from 1.1 h on nodes 0 and 2 and held C back. At 1.1 h A
    # checkpoints (1.1 - 0.2) x 0.4 = 0.36 h of work, 0.64 h left, restarts on both nodes
    # and ends at 1.2 + 0.64 = 1.84 h; B runs 1.84 to 2.34 h.
    t = Trace(submit=[0.0, 0.2 * H, 0.25 * H], duration=[1 * H, 0.5 * H, 1 * H], gpus=[16, 16, 8], ids=["A", "B", "C"],
              source="hand", limits=[1 * H, 0.5 * H, 1 * H])
    f = Failures(rate=0, repair_h=1, checkpoint_h=1, restart_h=0.1, times=((0.1 * H, 0),))
    o = replay(t, 1, 24, 8, "scale-in", f, curve)
    assert [s / H for s in o.start] == pytest.approx([0.0, 1.84, 0.25])
    assert [e / H for e in o.end] == pytest.approx([1.84, 2.34, 1.25])


def test_a_waited_for_node_follows_its_job_s_new_plan_by_hand():
    """One rack of five 4-GPU nodes; CURVE2: 3 of 4 nodes run at 0.6, 2 of 4 at 0.3.
    A: 4 nodes (0-3), 1 h (limit 1 h) from 0. Node 0 fails at 0.1 h (back 3.1 h): no
    checkpoint, A on 3 nodes from 0.2 h at 0.6, planned to 0.2 + 1 / 0.6 = 1.8667 h; node 0
    planned free at max(3.1, 1.8667) = 3.1 h. Node 1 fails at 0.3 h (back 3.3 h): the run
    since 0.1 h made no checkpoint, A on 2 nodes from 0.4 h at 0.3, planned to 0.4 + 1 / 0.3
    = 3.7333 h; node 1 planned at max(3.3, 3.7333) = 3.7333 h, and node 0, which A still
    takes back, follows A's new plan: max(3.1, 3.7333) = 3.7333 h. B: 2 nodes, 0.5 h, from
    0.5 h: node 4 now and the next at 3.7333 h: reserved from 3.7333 h. C: 1 node, 3 h, from
    0.6 h: its window ends at 3.6 h, before B's reservation: C backfills on node 4 at once
    (had node 0 kept its 3.1 h, B would be reserved on nodes 0 and 4 from 3.1 h and C held).
    At 3.1 h A takes node 0 back: (3.1 - 0.4) x 0.3 = 0.81 h done, 0.19 h left, on 3 nodes
    from 3.2 h at 0.6; at 3.3 h node 1: (3.3 - 3.2) x 0.6 = 0.06 h done, 0.13 h left, on 4
    from 3.4 h: A ends at 3.53 h, and B starts then on its nodes (node 4 is C's to 3.6 h),
    to 4.03 h."""
    t = Trace(submit=[0.0, 0.5 * H, 0.6 * H], duration=[1 * H, 0.5 * H, 3 * H], gpus=[16, 8, 4], ids=["A", "B", "C"],
              source="hand", limits=[1 * H, 0.5 * H, 3 * H])
    f = Failures(rate=0, repair_h=3, checkpoint_h=1, restart_h=0.1, times=((0.1 * H, 0), (0.3 * H, 1)))
    o = replay(t, 1, 20, 4, "scale-in", f, CURVE2)
    assert [s / H for s in o.start] == pytest.approx([0.0, 3.53, 0.6])
    assert [e / H for e in o.end] == pytest.approx([3.53, 4.03, 3.6])

def test_availability_and_collapse_by_hand():
    # a node fails once a day on average and is out 24 h: up 1 / (1 + 1 x 24 / 24) = half the
    # time. Three jobs 10 h apart holding 120 GPU-h in all (40 a job) on 16 GPUs: 0.1 arrivals
    # an hour x 40 / (16 x 0.5) = 0.5, not collapsed; with a node up a fifth of the time
    # (rate 4 a day, 24 h repairs) 0.1 x 40 / 3.2 = 1.25: collapsed
    from transit_launch.sim.failures import Outcome
    t = Trace(submit=[0.0], duration=[H], gpus=[4], ids=["A"], source="hand")
    assert replay(t, 1, 16, 4, "requeue", Failures(rate=1, repair_h=24), Curve("x")).availability == 0.5
    o = Outcome("requeue", [0.0, 10 * H, 20 * H], [0.0] * 3, [H, 11 * H, 21 * H], [False] * 3, 120.0, 120.0, 0, 16,
                120.0, 0.5)
    assert (report(o)["offered_load"], report(o)["collapsed"]) == (pytest.approx(0.5), False)
    o.availability = 0.2
    assert (report(o)["offered_load"], report(o)["collapsed"]) == (pytest.approx(1.25), True)


def test_goodput_band_over_curves_and_seeds_by_hand():
    # The trace of test_requeue_against_scale_in_by_hand under two curves, at two "seeds":
    # one with node 0 failing at 2.5 h, one with no failure. All times in h.
    # Failure, scale-in at 3/4 x 0.8 (curve a): A ends 11.86, B 13.86 (that test): owed
    #   16 x 11.86 + 4 x 10.86 = 233.2, goodput 168 / 233.2 = 0.7204.
    # Failure, scale-in at 3/4 x 0.6 = 0.45 (curve b): 8 h left at 2.5; (5.5 - 2.6) x 0.45 =
    #   1.305 done when node 0 returns: 6.695 left from 5.6, A ends 12.295, B runs to
    #   14.295: owed 16 x 12.295 + 4 x 11.295 = 241.9, goodput 168 / 241.9 = 0.6945.
    # No failure: A 0-10, B 10-12 under either curve: owed 160 + 4 x 9 = 196: 0.8571.
    # Requeue never runs a job on fewer nodes: 0.7447 (failure) and 0.8571 under both.
    # Band of scale-in: means a (0.7204 + 0.8571) / 2 = 0.78875, b (0.6945 + 0.8571) / 2 =
    # 0.7758: b..a; the seeds' range 0.6945..0.8571. Requeue's: flat at (0.7447 + 0.8571) / 2.
    from transit_launch.sim.failures import goodput_band
    t = Trace(submit=[0.0, 3 * H], duration=[10 * H, 2 * H], gpus=[16, 4], ids=["A", "B"], source="hand", types=[],
              states=[])
    curves = {"a": Curve("a", ((0.0, 1.0), (0.25, 0.8))), "b": Curve("b", ((0.0, 1.0), (0.25, 0.6)))}
    seeds = [Failures(rate=0, repair_h=3, checkpoint_h=1, restart_h=0.1, times=((2.5 * H, 0),)),
             Failures(rate=0, repair_h=3, checkpoint_h=1, restart_h=0.1)]
    goodputs = {pol: {label: [report(replay(t, 1, 16, 4, pol, f, c))["goodput"] for f in seeds]
                      for label, c in curves.items()} for pol in ("requeue", "scale-in")}
    assert goodputs["scale-in"] == {"a": pytest.approx([0.7204, 0.8571], abs=1e-4),
                                    "b": pytest.approx([0.6945, 0.8571], abs=1e-4)}
    assert goodputs["requeue"]["a"] == goodputs["requeue"]["b"] == pytest.approx([0.7447, 0.8571], abs=1e-4)
    rows = {r["policy"]: r for r in goodput_band(goodputs)}
    si = rows["scale-in"]
    assert (si["metric"], si["unit"], si["lowest"], si["highest"]) == ("goodput", "share", "b", "a")
    assert si["by_curve"] == {"a": pytest.approx(0.7888, abs=1e-4), "b": pytest.approx(0.7758, abs=1e-4)}
    assert si["band"] == [si["by_curve"]["b"], si["by_curve"]["a"]]
    assert si["seeds"] == pytest.approx([0.6945, 0.8571], abs=1e-4)
    rq = rows["requeue"]
    assert rq["band"] == [pytest.approx(0.8009, abs=1e-4)] * 2 and rq["seeds"] == pytest.approx([0.7447, 0.8571],
                                                                                                  abs=1e-4)


def test_goodput_band_in_the_cli(cli):
    # each curve's column is the goodput a run with that --efficiency curve alone gives;
    # requeue reads no curve (flat); --no-band leaves the rows out
    args = ("simulate", "--synthetic", "300", "--racks", "4", "--node-failures", "0.05", "--quiet", "--seeds", "2")
    rc, out, err = cli(*args, "--json")
    assert rc == 0, err
    d = json.loads(out)["band"]
    labels = [c["label"] for c in d["curves"]]
    assert labels == ["planner", "titan-mb1", "titan-mb8", "titan-mb16"]
    rows = {r["policy"]: r for r in d["rows"]}
    assert len(set(rows["requeue"]["by_curve"].values())) == 1
    rc, alone, err = cli(*args, "--json", "--no-band", "--on-node-loss", "scale-in", "--efficiency", "titan-mb1")
    got = [r["goodput"] for r in json.loads(alone)["runs"]]
    assert json.loads(alone)["band"]["rows"] == []
    assert rows["scale-in"]["by_curve"]["titan-mb1"] == round(sum(got) / 2, 4)
    assert rows["scale-in"]["seeds"][0] <= min(got) and max(got) <= rows["scale-in"]["seeds"][1]
    rc, text, _ = cli(*args)
    assert "goodput over the efficiency curves" in text and "seeds' range" in text


def test_nodes_up_together_by_hand():
    """The binomial tail: 4 nodes up half the time are all up 1/16 of it, at least 3 of them
    5/16 (4 ways for 3, 1 for 4); no failures, always; none needed, always."""
    from transit_launch.sim.failures import up_together
    assert up_together(4, 4, 0.5) == pytest.approx(1 / 16)
    assert up_together(4, 3, 0.5) == pytest.approx(5 / 16)
    assert up_together(256, 256, 1.0) == up_together(8, 0, 0.3) == 1.0


def test_a_job_whose_nodes_are_rarely_all_up_is_refused_in_one_line(cli):
    """A 4,000-job Kalos trace on 32 racks of 4-GPU nodes has a job of all 256 nodes; at 0.05
    failures a node-day and 24 h repairs a node is up 1 / 1.05 = 95.2% of the time and all 256
    at once 0.952^256 = 3.8e-6 of it: the replay would wait for simulated years (it ran past
    7 minutes), so it is refused at once. At 0.02 (0.980^256 = 6.3e-3) it runs."""
    args = ("simulate", "--synthetic", "4000", "--preset", "kalos", "--load", "1.2", "--racks", "32", "--quiet")
    rc, out, err = cli(*args, "--node-failures", "0.05")
    assert (rc, out) == (2, "") and err.count("\n") == 1, err
    assert "needs 256 of the cluster's 256 nodes up at once" in err and "95.2%" in err and "3.8e-06" in err
    rc, out, err = cli(*args, "--node-failures", "0.02", "--no-band", "--on-node-loss", "requeue", "--json")
    assert rc == 0, err
