"""The cluster simulator: hand-computed traces, invariants, loaders and bad input."""

import json

import pytest

from transit_launch.errors import UsageError
from transit_launch.sim import run as simrun
from transit_launch.sim.cluster import Cluster
from transit_launch.sim.efficiency import LINEAR
from transit_launch.sim.limits import SchedParams
from transit_launch.sim.scheduler import Factors, Scenario, simulate
from transit_launch.sim.synth import SynthSpec, preset, synthetic
from transit_launch.sim.trace import Trace, load_csv


def trace(*jobs):
    """jobs: (submit s, duration s, gpus)"""
    return Trace(submit=[j[0] for j in jobs], duration=[float(j[1]) for j in jobs], gpus=[j[2] for j in jobs],
                 ids=[str(i) for i in range(len(jobs))], source="test")


def test_fifo_by_hand():
    # one rack of 4 eight-GPU nodes
    res = simulate(trace((0, 100, 32), (10, 50, 8), (20, 10, 16)), Scenario("t", racks=1, gpus_per_node=8))
    assert res.start == [0, 100, 100]
    assert res.end == [100, 150, 110]


# a scheduler that knows every run time and backfills at every event (the rule alone)
KNOWN_RUNTIMES = SchedParams(plan_on="runtimes", bf_interval=0, bf_resolution=0)


def test_easy_backfill_by_hand():
    res = simulate(trace((0, 100, 24), (1, 10, 32), (2, 50, 8), (3, 200, 8)),
                   Scenario("t", racks=1, gpus_per_node=8, sched=KNOWN_RUNTIMES))
    # j1 (the whole rack) waits for j0: reservation at 100 with nothing extra; j2 ends
    # before it and backfills at 2; j3 would run past 100 and must wait behind j1.
    assert res.start == [0, 100, 2, 110]
    assert res.end == [100, 110, 52, 310]


def test_placement_prefers_one_rack_then_fewest_racks():
    cl = Cluster(racks=3, rack_gpus=32, gpus_per_node=8)
    alloc, racks = cl.place(3, 24)
    assert racks == 1 and {cl.rack_of(n) for n, _ in alloc} == {0}
    alloc, racks = cl.place(5, 40)  # 5 nodes: rack 0 has 1 left, racks 1 and 2 have 4
    assert racks == 2
    assert cl.free_gpus == 96 - 64 and cl.whole == 4


def test_pack_and_spread_single_node_jobs():
    for strategy, same_node in (("pack", True), ("spread", False)):
        cl = Cluster(racks=1, rack_gpus=32, gpus_per_node=8)
        (a, _), (b, _) = cl.place(1, 4, strategy), cl.place(1, 4, strategy)
        assert (a[0][0] == b[0][0]) is same_node
        cl.release(a)
        cl.release(b)
        assert cl.free == [8, 8, 8, 8] and cl.whole == 4


def test_scale_in_durations_and_transitions():
    f = Factors(speedup=0.5, slowdown=0.25, unchanged=0.0)
    e8 = dict(gpus_per_node=8, factors=f, efficiency=LINEAR)  # eight-GPU nodes, four a rack; the paper's 1/n time
    # a 2-node job on one rack shrinks to 1 node: twice as long, placement unchanged (intra)
    t = trace((0, 100, 16))
    base = simulate(t, Scenario("b", racks=2, **e8))
    half = simulate(t, Scenario("h", racks=2, reduction=0.5, **e8), baseline=base)
    assert (half.nodes[0], half.gpus[0]) == (1, 8)
    assert half.end[0] == pytest.approx(200)
    # a 5-node job spans two racks; at 50% it gives up 2.5 -> 3 nodes (halves up), keeps 2 and
    # fits in one rack: 100 * 5/2 / 1.5
    t = trace((0, 100, 40))
    base = simulate(t, Scenario("b", racks=2, **e8))
    assert base.racks[0] == 2
    half = simulate(t, Scenario("h", racks=2, reduction=0.5, **e8), baseline=base)
    assert half.racks[0] == 1 and half.end[0] == pytest.approx(100 * 5 / 2 / 1.5)


def _busy_ok(res):
    events = sorted([(s, g) for s, g in zip(res.start, res.gpus)] + [(e, -g) for e, g in zip(res.end, res.gpus)],
                    key=lambda x: (x[0], x[1]))  # releases first at equal times
    busy = peak = 0
    for _, g in events:
        busy += g
        peak = max(peak, busy)
    return peak <= res.total_gpus


@pytest.mark.parametrize("reduction", [0.0, 0.5])
@pytest.mark.parametrize("strategy", ["pack", "spread"])
def test_invariants_on_a_random_trace(reduction, strategy):
    t = synthetic(3000, seed=7, spec=SynthSpec(cluster_gpus=4 * 32, load=0.95))
    res = simulate(t, Scenario("x", racks=4, reduction=reduction, strategy=strategy))
    assert _busy_ok(res)  # no GPU over-allocated at any time
    assert all(s >= sub - 1e-9 and e > s for s, e, sub in zip(res.start, res.end, t.submit))  # every job ran
    assert all(r >= 1 for r in res.racks)


def test_reduction_zero_equals_baseline_and_seeds_reproduce():
    t = synthetic(2000, seed=3, spec=SynthSpec(cluster_gpus=8 * 32))
    a = simulate(t, Scenario("a", racks=8))
    b = simulate(t, Scenario("b", racks=8, reduction=0.0), baseline=a)
    assert (a.start, a.end, a.racks) == (b.start, b.end, b.racks)
    t2 = synthetic(2000, seed=3, spec=SynthSpec(cluster_gpus=8 * 32))
    assert (t.submit, t.duration, t.gpus) == (t2.submit, t2.duration, t2.gpus)
    assert synthetic(2000, seed=4).gpus != t.gpus


def test_inter_rack_traffic_falls_as_reduction_grows():
    # the paper's Kalos result on 76 racks: -24% and -49% at 25% and 50%
    t = synthetic(5000, seed=1, spec=preset("kalos", load=0.3, cluster_gpus=76 * 32))
    res = simrun.run_all(t, simrun.scenarios(76, [0.0, 0.25, 0.5], None, gpus_per_node=8))
    trav = [r["all"]["rack_traversals"] for r in res]
    assert trav[0] > trav[1] > trav[2]
    assert 0.1 < 1 - trav[1] / trav[0] < 0.4 and 0.35 < 1 - trav[2] / trav[0] < 0.7
    assert res[2]["eligible"]["collapsed_to_one_node"] > 0.2


SEREN_HEAD = "job_id,user,node_num,gpu_num,cpu_num,type,state,submit_time,start_time,end_time,duration,queue,gpu_time"
KALOS_HEAD = SEREN_HEAD + ",mem_per_pod_GB,shared_mem_per_pod,fail_time,stop_time"


def test_seren_loader_filters_and_time_zone(tmp_path):
    p = tmp_path / "seren.csv"
    p.write_text("\n".join([
        SEREN_HEAD,
        "1,u1,1,8,16,Pretrain,COMPLETED,2023-03-01 08:00:00,2023-03-01 08:00:05,2023-03-01 09:00:05,3600,q,8",
        "2,u1,0,0,16,CPU,COMPLETED,2023-03-01 08:00:01,2023-03-01 08:00:05,2023-03-01 09:00:05,3600,q,0",
        "3,u2,2,16,32,SFT,FAILED,not-a-time,2023-03-01 08:00:05,2023-03-01 09:00:05,100,q,16",
        "4,u2,2,16,32,SFT,FAILED,2023-03-01 08:10:00,x,y,0,q,16",
        "5,u3,1,4",
        "6,u3,1,x,1,Eval,COMPLETED,2023-03-01 08:20:00,a,b,60,q,4",
        "7,u3,1,2,4,Eval,COMPLETED,2023-03-01 08:30:00,a,b,60.5,q,2",
    ]))
    t = load_csv(p)
    assert t.source.endswith("(seren)")
    assert t.ids == ["1", "7"] and t.gpus == [8, 2] and t.duration == [3600.0, 60.5]
    assert t.submit == [0.0, 1800.0]
    assert t.epoch.utcoffset().total_seconds() == 8 * 3600 and t.epoch.hour == 8
    assert t.dropped == {"not a GPU job": 1, "unparsable submit time": 1, "zero or negative duration": 1,
                         "short row": 1, "unparsable GPU count": 1}


def test_kalos_loader_utc_and_string_ids(tmp_path):
    p = tmp_path / "kalos.csv"
    p.write_text("\n".join([
        KALOS_HEAD,
        "dlc1q9x,u,4,32,64,Pretrain,COMPLETED,2023-03-01 00:00:00,s,e,7200,q,256,100,10,,",
        "dlc2zz,u,1,8,8,SFT,CANCELLED,2023-03-01 00:05:00,s,e,30,q,8,100,10,,",
    ]))
    t = load_csv(p)
    assert t.source.endswith("(kalos)") and t.ids == ["dlc1q9x", "dlc2zz"]
    assert t.epoch.utcoffset().total_seconds() == 0 and t.submit == [0.0, 300.0]
    seren = tmp_path / "s.csv"  # the same instant written in Seren's UTC+8
    seren.write_text(SEREN_HEAD + "\n1,u,1,8,8,SFT,COMPLETED,2023-03-01 08:00:00,s,e,30,q,8\n")
    assert load_csv(seren).epoch.timestamp() == t.epoch.timestamp()
    with pytest.raises(UsageError, match="has the kalos column set, not seren"):
        load_csv(p, "seren")


def test_generic_loader(tmp_path):
    p = tmp_path / "g.csv"
    p.write_text("submit_time,duration,gpus\n10,100,4\n0,50,16\n5,abc,2\n")
    t = load_csv(p)
    assert t.submit == [0.0, 10.0] and t.gpus == [16, 4] and t.dropped == {"unparsable duration": 1}


def test_missing_columns(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("submit,gpus\n1,2\n")
    with pytest.raises(UsageError, match="missing duration, submit_time"):
        load_csv(p)


def test_job_larger_than_cluster_is_refused_with_count():
    t = trace((0, 10, 8), (1, 10, 512), (2, 10, 600))
    with pytest.raises(UsageError, match=r"2 job\(s\) ask for more GPUs \(up to 600\)"):
        simrun.run_all(t, simrun.scenarios(4, [0.0], None))


def test_cli_table_and_json(cli, tmp_path):
    rc, out, err = cli("simulate", "--synthetic", "3000", "--seed", "2", "--racks", "8", "--reduced-racks", "4")
    assert rc == 0, err
    assert "8 racks, baseline" in out and "4 racks, scale-in 50%" in out and "rack traversals" in out
    rc, out, _ = cli("simulate", "--synthetic", "3000", "--seed", "2", "--racks", "8", "--json")
    d = json.loads(out)
    assert [s["reduction"] for s in d["scenarios"]] == [0.0, 0.25, 0.5]
    assert [(c["scenario"], c["reference"]) for c in d["comparisons"]] == [
        ("8 racks, scale-in 25%", "8 racks, baseline"), ("8 racks, scale-in 50%", "8 racks, baseline")]


@pytest.mark.parametrize("args,needle", [
    (["simulate"], "exactly one of --trace FILE or --synthetic N"),
    (["simulate", "--trace", "/nonexistent.csv"], "cannot read trace /nonexistent.csv"),
    (["simulate", "--synthetic", "10", "--reductions", "1.5"], "reductions must lie in [0, 1)"),
    (["simulate", "--synthetic", "0"], "argument --synthetic: must be a positive integer"),
    (["simulate", "--synthetic", "10", "--gpus-per-node", "6"], "invalid choice"),
])
def test_cli_bad_input(cli, args, needle):
    rc, out, err = cli(*args)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and needle in err


def test_cli_bad_trace_file(cli, tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("a,b\n1,2\n")
    rc, _, err = cli("simulate", "--trace", str(p))
    assert rc == 2 and "unrecognised trace columns" in err and "Traceback" not in err


def test_plot_written(cli, tmp_path):
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (the [plot] extra)")
    png = tmp_path / "fig.png"
    rc, _, err = cli("simulate", "--synthetic", "2000", "--racks", "8", "--plot", str(png))
    assert rc == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


# --- checks in the dataclasses, for Python callers too --------------------------------

@pytest.mark.parametrize("make,needle", [
    (lambda: SynthSpec(load=float("nan")), "--load must lie in (0, 10]"),
    (lambda: SynthSpec(median_duration=0), "--median-duration must lie in [1,"),
    (lambda: SynthSpec(sizes=((0, 1.0),)), "positive GPU counts"),
    (lambda: Factors(unchanged=-1), "--unchanged must lie in [-0.99, 10]"),
    (lambda: Factors(speedup=float("inf")), "--speedup must lie in [0, 10]"),
    (lambda: Scenario("x", racks=0), "--racks takes 1 to 10,000 racks"),
    (lambda: Scenario("x", racks=1, rack_gpus=30), "not a multiple of --gpus-per-node 4"),
    (lambda: Scenario("x", racks=1, reduction=1.0), "a reduction must lie in [0, 1)"),
    (lambda: Scenario("x", racks=1, strategy="random"), "placement 'random' is not one of pack, spread"),
    (lambda: trace((float("nan"), 10, 8)), "submit times must be finite and ascending"),
    (lambda: trace((5, 10, 8), (1, 10, 8)), "submit times must be finite and ascending"),
    (lambda: trace((0, float("inf"), 8)), "durations must lie in"),
    (lambda: trace((0, 10, 2.5)), "GPU counts must be positive integers"),
    (lambda: synthetic(10**8, 0), "--synthetic takes 1 to 10,000,000 jobs"),
])
def test_dataclasses_refuse_bad_values(make, needle):
    with pytest.raises(UsageError) as e:
        make()
    assert needle in str(e.value)


# --- progress ----------------------------------------------------------------------------

class Stream:
    def __init__(self, tty):
        self.tty, self.text = tty, ""

    def isatty(self):
        return self.tty

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def run_progress(tty, enabled=True, patience=0.0):
    from transit_launch.sim.progress import Progress
    now = [0.0]
    s = Stream(tty)
    p = Progress([("generating 10 jobs", 0.5), ("8 racks, baseline", 1.0), ("8 racks, scale-in 50%", 1.0)],
                 stream=s, enabled=enabled, patience=patience, clock=lambda: now[0])
    for k in range(3):
        p.phase(k)
        for f in (0.25, 0.5, 0.75):
            now[0] += 1.0
            p.update(f)
        now[0] += 1.0
    p.close()
    return s.text


def test_progress_coarse_lines_when_not_a_terminal():
    lines = run_progress(tty=False).splitlines()
    assert lines == ["simulate: [1/3] generating 10 jobs: done, 0:04 elapsed, ETA 0:16",
                     "simulate: [2/3] 8 racks, baseline: done, 0:08 elapsed, ETA 0:05",
                     "simulate: [3/3] 8 racks, scale-in 50%: done, 0:12 elapsed"]


def test_progress_redrawn_on_a_terminal_and_cleared():
    text = run_progress(tty=True)
    draws = text.split("\r")
    assert "simulate: [2/3] 8 racks, baseline:  50%, 0:06 elapsed, ETA 0:09\x1b[K" in draws
    assert text.endswith("\r\x1b[K") and "\n" not in text  # the table that follows starts on a clean line


def test_progress_quiet_and_patient():
    assert run_progress(tty=True, enabled=False) == "" and run_progress(tty=False, enabled=False) == ""
    assert run_progress(tty=False, patience=100.0) == ""  # a run shorter than the patience says nothing


def test_cli_progress_lines_and_quiet(monkeypatch, capsys):
    from transit_launch import cli
    from transit_launch.sim import progress
    monkeypatch.setattr(progress, "PATIENCE_S", 0.0)
    assert cli.main(["simulate", "--synthetic", "500", "--racks", "8", "--no-band"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line.split(":")[1] for line in err] == [" [1/4] generating 500 jobs", " [2/4] 8 racks, baseline",
                                                    " [3/4] 8 racks, scale-in 25%", " [4/4] 8 racks, scale-in 50%"]
    # the band's replays follow, the two scale-in scenarios once a curve other than the planner's
    assert cli.main(["simulate", "--synthetic", "500", "--racks", "8", "--efficiency", "linear"]) == 0
    err = [line.split(":")[1] for line in capsys.readouterr().err.splitlines()]
    # (the trace, three scenarios, then two scale-ins for each of the band's four other curves)
    assert len(err) == 4 + 2 * 4 and err[4:6] == [" [5/12] 8 racks, scale-in 25%, planner",
                                                  " [6/12] 8 racks, scale-in 50%, planner"]
    assert err[-1] == " [12/12] 8 racks, scale-in 50%, titan-mb16"
    assert cli.main(["simulate", "--synthetic", "500", "--racks", "8", "--quiet"]) == 0
    assert capsys.readouterr().err == ""
