"""bench/offload.py --report over the recorded gate (bench/results/2026-11-29 and 2026-11-30's
offload_*.json): percentages of the reference at each point, the peers' budget check, the
targets' verdicts, issue 20's goals. (The gate's runs themselves: test_offload_gate.py.)"""

import json
import subprocess
import sys

from tests.conftest import ROOT

RESULTS = ROOT / "bench" / "results"


def records(day, *names):
    """bench/results/DAY/offload_NAME_DAY.json for each name."""
    return [RESULTS / day / f"offload_{n}_{day}.json" for n in names]


def report(*args):
    """What `python3 bench/offload.py --report ARGS` prints (it must succeed)."""
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "offload.py"), "--report", *map(str, args)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout


def verdicts(out):
    """The verdict line of each point, by its microbatch count."""
    return {line.split(" ")[1]: line for line in out.splitlines() if line.startswith("accum ")}


def test_offload_gate_report_from_recorded_runs(tmp_path):
    """The 2026-11-29 gate's transit and peers files: percentages of the reference at the same
    point, the peers' budget check against the transit half's budget, timed-out runs reported
    with their steps, targets printed."""
    out = report(*records("2026-11-29", "transit", "peers"), "--markdown", "--plot", tmp_path / "curve.png")
    rows = {tuple(c.strip() for c in line.split("|")[1:5]): line for line in out.splitlines()
            if line.startswith("| 1") or line.startswith("| 3")}
    advise = rows[("12", "196608", "0.97", "advise")]
    assert "| 95.0 |" in advise and "| yes |" in advise
    infinity = rows[("12", "196608", "0.97", "zero-infinity")]
    assert "| 81.5 |" in infinity and "| yes |" in infinity  # 16.64 GB reserved <= 19.00 GB budget
    assert any("fsdp-cpu-offload" in k[3] for k in rows) and "timed out after 3 steps" in out
    assert "1. pass-through overhead: -0.18%" in out
    assert "1.17x zero-infinity, 1.09x zero-offload" in out
    assert (tmp_path / "curve.png").stat().st_size > 10_000


def test_offload_gate_full_curve_verdicts():
    """The whole recorded gate (every 2026-11-29 offload file): a later file's measurement of a
    run replaces an earlier timed-out attempt, and target 3 is judged per point, naming the
    peer that falls short and the peers not measured."""
    out = report(*records("2026-11-29", "transit", "peers", "peers_accum1", "peers_accum3", "fsdp_accum12"))
    assert "timed out after 3 steps" not in out
    assert "fsdp-cpu-offload (9 measured, cut by timeout)" in out
    v = verdicts(out)
    assert "1.25x fsdp-cpu-offload" in v["1"] and "target 3 NOT met (fsdp-cpu-offload)" in v["1"]
    # the peers added later (2026-11-30) are named as not measured in these files
    assert "target 3 met; not measured: torchao-offload, zenflow, zero-infinity, zero-twinflow" in v["3"]
    assert "6.95x fsdp-cpu-offload" in v["12"]
    assert v["12"].endswith("target 3 met; not measured: torchao-offload, zenflow, zero-twinflow")
    assert "2. at 0.97x the paper's ratio: best transit advise 95.0% of reference: met" in out


def test_offload_gate_compares_each_run_with_the_reference_of_its_own_lease():
    """Two leases of the same H200 kind gave references of 213 and 247 TFLOPS at 12
    microbatches: a run is judged against the reference in its own file, a file without
    one against the first reference given, and target 3 compares % of reference."""
    out = report(*records("2026-11-29", "transit", "peers", "peers_accum1", "peers_accum3", "fsdp_accum12",
                          "zinf_accum3", "transit_ranked", "stage"), "--markdown")
    rows = {tuple(c.strip() for c in line.split("|")[1:5]): [c.strip() for c in line.split("|")[5:8]]
            for line in out.splitlines() if line.startswith("| ")}
    assert rows[("3", "49152", "3.87", "zero-infinity")] == ["147.9", "246.5", "60.0"]  # its own file's reference
    assert rows[("3", "49152", "3.87", "zero-offload")] == ["158.6", "212.8", "74.5"]   # the first reference
    assert rows[("12", "196608", "0.97", "advise")] == ["237.6", "248.0", "95.8"]
    assert "1.43x zero-infinity, 1.15x zero-offload; target 3 met" in verdicts(out)["3"]
    assert "advise-stage | timed out after 3 steps" in out  # the staging attempt at 12, not hidden


def test_offload_report_sets_apart_a_peer_over_the_budget():
    """The 2026-11-30 curve with recomputation: torchao's CPUOffloadOptimizer keeps its fp32
    gradients on the GPU under accumulation, 20.94 GB reserved against the 18.39 GB budget,
    so at 3 microbatches it is shown beside the verdict, not judged; at 1 microbatch it fits
    (offload_gradients) and is 3% faster than advise (target 3 not met)."""
    v = verdicts(report(*records("2026-11-30", "overlap_ac_accum1_3", "overlap_ac_accum12", "peers_ac_accum1")))
    assert "0.97x torchao-offload" in v["1"] and "target 3 NOT met (torchao-offload)" in v["1"]
    assert "zero-twinflow over the budget (18.64 GB reserved; 2.26x)" in v["1"]
    assert "torchao-offload over the budget (20.94 GB reserved; 0.96x); target 3 not judged" in v["3"]
    assert "torchao-offload over the budget (20.94 GB reserved; 1.05x)" in v["12"]


def test_offload_report_judges_losses_of_the_deterministic_run():
    """Target 4 from the recorded deterministic run: every transit run bit-identical."""
    out = report(*records("2026-11-29", "losses_deterministic"))
    assert "4. losses: every transit run within 1e-6 of the reference (2 runs)" in out
    assert "no peers measured; target 3 not judged" in out


def test_offload_report_takes_the_later_measurement_of_a_run(tmp_path):
    """A rerun in a later file replaces the earlier measurement of the same run and point;
    a rerun that measured nothing does not replace a measurement."""
    gate = records("2026-11-29", "transit", "peers")
    base = json.loads(gate[1].read_text())
    zoff = next(r for r in base["runs"] if r["name"] == "zero-offload" and r["accum"] == 12)
    rerun = dict(base, runs=[dict(zoff, tflops=190.0, measured_steps=10, rc=0)])
    failed = dict(base, runs=[dict(zoff, tflops=None, rc="timeout", step_times=[])])
    (tmp_path / "rerun.json").write_text(json.dumps(rerun))
    (tmp_path / "failed.json").write_text(json.dumps(failed))
    out = report(*gate, tmp_path / "rerun.json", tmp_path / "failed.json")
    rows = [line for line in out.splitlines() if " zero-offload" in line and line.startswith("12")]
    assert len(rows) == 1 and "190.0" in rows[0] and "cut by timeout" not in rows[0]


def test_issue20_goals_judged_from_the_recorded_curve():
    """bench/offload.py --report judges issue 20's goals (>= 97% at the paper's ratio, >= 90%
    at 4x it) at the nearest points, on the recorded 2026-11-30 curves: the staged step meets
    both with recomputation and only the 4x goal without; the 2026-11-29 gate met neither."""
    def goals(day, *names):
        return [line for line in report(*records(day, *names)).splitlines() if line.startswith("issue 20:")]
    ac = goals("2026-11-30", "ring3_ac12", "ring3_ac")
    assert ac == ["issue 20: >= 97% at 1x the paper's ratio: best transit advise-staged256 97.1% at 0.97x: met",
                  "issue 20: >= 90% at 4x the paper's ratio: best transit advise-staged256 94.3% at 3.87x: met"]
    noac = goals("2026-11-30", "ring3_noac12", "ring2_noac")
    assert noac[0].endswith("96.3% at 0.97x: NOT met") and noac[1].endswith("93.0% at 3.87x: met")
    old = goals("2026-11-29", "transit")
    assert old[0].endswith("95.0% at 0.97x: NOT met") and old[1].endswith("at 3.87x: NOT met")
    only = goals("2026-11-30", "ring2_noac")  # 1 and 3 microbatches: no point near the paper's ratio
    assert len(only) == 1 and "at 4x the paper's ratio" in only[0]
