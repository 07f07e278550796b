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
    assert r["goodput"] == pytest.approx(168 / 177.6, abs=1e-4) and s["goodput"] == pytest.approx(168 / 185.76,
                                                                                                     abs=1e-4)
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
    assert all(r["failures_hitting_jobs"] > 0 and 0 < r["goodput"] <= 1 for r in d["runs"])
    rc, _, err = cli("simulate", "--synthetic", "10", "--repair-hours", "2")
    assert rc == 2 and "add --node-failures" in err
    rc, _, err = cli("simulate", "--synthetic", "10", "--node-failures", "lots")
    assert rc == 2 and "failures per node-day" in err and "Traceback" not in err
