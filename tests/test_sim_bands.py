"""Headlines as bands over the efficiency curves (sim/bands.py, the default report of
simulate), against a hand derivation on a two-job trace."""

import json

import pytest

from transit_launch.sim import bands, reruns
from transit_launch.sim import run as simrun
from transit_launch.sim.efficiency import BAND, Curve, parse
from transit_launch.sim.trace import Trace

H = 3600.0
# flat curves: the per-GPU efficiency kept at any reduction
GOOD, POOR = Curve("good", ((0.0, 1.0), (0.1, 0.8))), Curve("poor", ((0.0, 1.0), (0.1, 0.5)))


def _rows():
    # one rack of four 4-GPU nodes. A: a 4-node training job of 10 h at 0; B: a 2-node
    # evaluation job (never scaled in) of 1 h at 1 h.
    t = Trace(submit=[0.0, H], duration=[10 * H, H], gpus=[16, 8], ids=["A", "B"], types=["pretrain", "evaluation"],
              source="hand")
    scs = simrun.scenarios(1, [0.0, 0.5], None, rack_gpus=16, gpus_per_node=4, efficiency=GOOD)
    base = {}
    reports = simrun.run_all(t, scs, baselines=base)
    other = reruns.rerun(t, scs, reports, base, [("poor", POOR)])
    rows = bands.band([("good", [reports]), ("poor", [other["poor"]])], 1)
    return {r["metric"]: r for r in rows}


def test_band_over_two_curves_by_hand():
    rows = _rows()
    # baseline: A holds all four nodes 0-10 h, B waits 9 h and runs 10-11 h: mean queue
    # 270 min, makespan 11 h. At 50% A runs on 2 nodes for 10 x 4 / 2 / e h (one rack before
    # and after: no transition factor): 25 h at 0.8, 40 h at 0.5; B starts at once on the
    # other two nodes: no queue (-100% with either curve)
    q = rows["queue_mean_min"]
    assert q["by_curve"] == pytest.approx({"good": -1.0, "poor": -1.0}) and q["unit"] == "%"
    # makespan 25 h and 40 h against 11: +127.3% and +263.6%; the band runs from the good
    # curve (lowest) to the poor one (highest)
    m = rows["makespan_h"]
    assert m["by_curve"] == pytest.approx({"good": 25 / 11 - 1, "poor": 40 / 11 - 1}, abs=1e-3)
    assert (m["lowest"], m["highest"]) == ("good", "poor")
    assert m["band"] == pytest.approx([25 / 11 - 1, 40 / 11 - 1], abs=1e-3)
    # jobs/h: 2 jobs over 11 h, 25 h and 40 h: -56% and -72.5%
    assert rows["throughput_jobs_per_h"]["by_curve"] == pytest.approx({"good": 11 / 25 - 1, "poor": 11 / 40 - 1},
                                                                      abs=1e-3)
    # goodput: the work is 16 x 10 + 8 x 1 = 168 GPU-h. Owed, GPUs held x (end - submit):
    # baseline 16 x 10 + 8 x 10 = 240 (0.7); good 8 x 25 + 8 x 1 = 208 (0.8077, +10.8 pt);
    # poor 8 x 40 + 8 = 328 (0.5122, -18.8 pt)
    g = rows["goodput"]
    assert g["unit"] == "pt" and (g["lowest"], g["highest"]) == ("poor", "good")
    assert g["by_curve"] == pytest.approx({"good": 168 / 208 - 0.7, "poor": 168 / 328 - 0.7}, abs=1e-3)
    # no job spans racks here: the traversals' change is absolute (0), not a percentage
    assert rows["rack_traversals"]["unit"] == "abs" and rows["rack_traversals"]["band"] == [0, 0]


def test_band_curves_and_cli(cli):
    # the band: the chosen curve first, then the others of BAND, no curve twice
    assert [label for label, _ in bands.curves("titan-mb8", parse("titan-mb8"))] == \
        ["titan-mb8", "planner", "titan-mb1", "titan-mb16"]
    assert [label for label, _ in bands.curves("linear", parse("linear"))] == ["linear", *BAND]
    # the measured points hold at every reduction
    assert [parse("titan-mb1")(r) for r in (0.2, 0.5, 0.9)] == [0.468] * 3
    rc, out, err = cli("simulate", "--synthetic", "300", "--racks", "4", "--json", "--quiet")
    assert rc == 0, err
    d = json.loads(out)["band"]
    assert [c["label"] for c in d["curves"]] == list(BAND)
    assert {(r["scenario"], r["metric"]) for r in d["rows"]} == {
        (f"4 racks, scale-in {p}%", m) for p in (25, 50) for m, _ in bands.HEADLINES}
    for r in d["rows"]:
        vals = r["by_curve"]
        assert r["band"] == [min(vals.values()), max(vals.values())]
        assert vals[r["lowest"]] == r["band"][0] and vals[r["highest"]] == r["band"][1]
    rc, out, _ = cli("simulate", "--synthetic", "300", "--racks", "4", "--quiet")
    assert "headlines over the efficiency curves" in out and "titan-mb16: 91.6% at 25%, 91.6% at 50%" in out
    rc, out, _ = cli("simulate", "--synthetic", "300", "--racks", "4", "--quiet", "--no-band", "--json")
    assert json.loads(out)["band"]["rows"] == []


def test_band_bad_input(cli):
    for args, why in ((["--efficiency", "titan-mb3"], "--efficiency takes planner, linear, titan-mb1"),
                      (["--node-failures", "0.1", "--efficiency", "titan-mb3"], "--efficiency takes planner")):
        rc, out, err = cli("simulate", "--synthetic", "20", *args)
        assert rc == 2 and why in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_the_replays_never_fork_beside_another_thread(monkeypatch):
    """A fork copies only the forking thread: a lock another thread held stays held in the
    child, which then waits forever (a CI run hung so: pytest-xdist's threads, the band's
    forked pool). With another thread alive and two cores the replays run in this process
    (nothing forked) and give what the one-core path gives. (The fork path itself runs in
    the CLI's single-threaded process: the README's simulate command.)"""
    import threading

    forked = []
    monkeypatch.setattr(reruns.multiprocessing, "get_context", lambda method: forked.append(method))
    monkeypatch.setattr(reruns, "cores", lambda: 1)
    alone = _rows()
    monkeypatch.setattr(reruns, "cores", lambda: 2)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert reruns.threads() > 1
        assert _rows() == alone
    finally:
        stop.set()
        other.join()
    assert forked == []
