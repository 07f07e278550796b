"""The metrics a gain can show in (issue 54): slowdown per job, offered load and the collapse
flag, throughput over the makespan; each against a hand derivation."""

import pytest

from transit_launch.sim import metrics
from transit_launch.sim import run as simrun
from transit_launch.sim.limits import SchedParams
from transit_launch.sim.scheduler import Scenario, simulate
from transit_launch.sim.trace import Trace

EVERY_EVENT = SchedParams(bf_interval=0, bf_resolution=0)


def trace(*jobs):
    """jobs: (submit s, run time s, GPUs, time limit s)"""
    return Trace(submit=[j[0] for j in jobs], duration=[float(j[1]) for j in jobs], gpus=[j[2] for j in jobs],
                 ids=[str(i) for i in range(len(jobs))], limits=[float(j[3]) for j in jobs], source="test")


def test_slowdown_by_hand():
    # tests/test_sim_limits.py's first trace on limits: starts 0, 32, 2 for submits 0, 1, 2
    # and runs 20, 10, 30: waits 0, 31, 0; slowdowns 1, (31 + 10) / 10 = 4.1, 1
    t = trace((0, 20, 24, 120), (1, 10, 32, 60), (2, 30, 8, 60))
    res = simulate(t, Scenario("t", racks=1, gpus_per_node=8, sched=EVERY_EVENT))
    s = metrics.summarize(res, t.submit)
    assert s["slowdown_mean"] == pytest.approx((1 + 4.1 + 1) / 3)
    assert s["slowdown_p95"] == pytest.approx(4.1)


def test_short_jobs_slowdown_is_bounded():
    # a 1-second job that waited 59 s: (59 + 1) / 10 = 6, not 60
    t = trace((0, 59, 32, 60), (0, 1, 32, 60))
    res = simulate(t, Scenario("t", racks=1, gpus_per_node=8, sched=EVERY_EVENT))
    assert res.start == [0, 59]
    assert metrics.summarize(res, t.submit, [1])["slowdown_mean"] == pytest.approx(6.0)


@pytest.mark.parametrize("gap,load,collapsed", [(10, 2.0, True), (40, 0.5, False)])
def test_offered_load_and_collapse(gap, load, collapsed):
    # five whole-rack jobs (32 GPUs, 20 s) every `gap` s on 32 GPUs: 4 gaps over 4 x gap s
    # bring 32 x 20 GPU-s a job: 640 / (gap x 32) = 2.0 at a gap of 10 s, 0.5 at 40 s
    t = trace(*[(k * gap, 20, 32, 60) for k in range(5)])
    a = simrun.run_all(t, simrun.scenarios(1, [0.0], None, gpus_per_node=8))[0]["all"]
    assert a["offered_load"] == pytest.approx(load) and a["collapsed"] is collapsed
    # gap 10: one job at a time, back to back from 0: the last ends at 100, 5 jobs in 100 s;
    # gap 40: each runs at once, the last 160-180
    makespan = 100 if collapsed else 180
    assert a["makespan_h"] == pytest.approx(makespan / 3600, abs=1e-4)
    assert a["throughput_jobs_per_h"] == pytest.approx(5 / (makespan / 3600), rel=1e-3)


def test_collapse_is_flagged_in_the_table(cli, tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("submit_time,duration,gpus\n" + "".join(f"{k * 10},20,32\n" for k in range(5)))
    rc, out, err = cli("simulate", "--trace", str(p), "--racks", "1", "--gpus-per-node", "8", "--reductions", "0",
                       "--quiet")
    assert rc == 0, err
    assert "1 racks, baseline *" in out and "* collapsed: offered load above 1" in out
