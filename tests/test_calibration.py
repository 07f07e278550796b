"""The planner against measured H200 peaks (bench/results/*/calibration_*.json: the example
trainer's torch.cuda.max_memory_reserved, bench/calibrate.py --measure). Issue 7 asks for
at least four runs within 10%; a change to the estimator's constants that breaks that
fails here, without a GPU.

All six runs are held out: no constant of planning/memory.py was fitted to them (the
backward factors were fitted to TorchTitan's measured mode, tests/fidelity_records.py
FITTED). The 128K-vocabulary run confirmed LOGITS_BYTES_PER_ELEMENT, which is derived from
three fp32 tensors (12 bytes; 13.6 measured with the allocator's rounding), not set by it."""

import json
import re
import sys

import pytest

from tests.conftest import ROOT
from tests.frozen import RESULTS

from tests.example_trainer import planner_estimate, trainer_flags

# Measured with the trainer's nn.RMSNorm (the earlier calibration_2026-11-29.json predates it:
# its hand-written norm kept two fp32 copies of the input, which the planner does not model).
MEASURED = RESULTS / "2026-11-29" / "calibration_2026-11-29b.json"


def runs():
    return [r for r in json.loads(MEASURED.read_text())["runs"] if r["summary"]]


@pytest.mark.parametrize("run", runs(), ids=lambda r: r["name"])
def test_planner_within_five_percent_of_measured_allocation(run):
    """The formula's tensors (total less CUDA context, NCCL and allocator slack) against
    torch.cuda.max_memory_allocated: within 1.7% on all six runs since gradients are counted
    only once created (issue 18). max_memory_reserved sits 19-33% above max_allocated in these
    runs: the caching allocator keeps the loss phase's freed fp32 blocks while backward
    allocates gradients, on an H200 that never ran short. Near capacity the allocator
    frees its cache and retries instead, so the planner's margin over the tensors is
    ALLOCATOR_FRAGMENTATION, not that gap."""
    est, _ = planner_estimate(run["flags"])
    measured = run["summary"]["max_allocated_gb"] * 1e9
    assert abs(est.tensors - measured) <= 0.05 * measured, (est.tensors / 1e9, measured / 1e9)


def test_enough_calibration_points():
    ok = runs()
    assert len(ok) >= 4
    assert {"none", "full"} <= {trainer_flags(r["flags"])["recompute"] for r in ok}
    assert len({trainer_flags(r["flags"])["seq-len"] for r in ok}) >= 2


def test_offload_gate_report_from_recorded_runs(tmp_path):
    """bench/offload.py --report over the recorded gate (bench/results/2026-11-29/offload_*_2026-11-29.json):
    percentages of the reference at the same point, the peers' budget check against the
    transit half's budget, timed-out runs reported with their steps, targets printed."""
    import subprocess
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "offload.py"), "--report",
                          str(ROOT / "bench/results/2026-11-29/offload_transit_2026-11-29.json"),
                          str(ROOT / "bench/results/2026-11-29/offload_peers_2026-11-29.json"), "--markdown",
                          "--plot", str(tmp_path / "curve.png")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    rows = {tuple(c.strip() for c in line.split("|")[1:5]): line for line in res.stdout.splitlines()
            if line.startswith("| 1") or line.startswith("| 3")}
    advise = rows[("12", "196608", "0.97", "advise")]
    assert "| 95.0 |" in advise and "| yes |" in advise
    infinity = rows[("12", "196608", "0.97", "zero-infinity")]
    assert "| 81.5 |" in infinity and "| yes |" in infinity  # 16.64 GB reserved <= 19.00 GB budget
    assert any("fsdp-cpu-offload" in k[3] for k in rows) and "timed out after 3 steps" in res.stdout
    assert "1. pass-through overhead: -0.18%" in res.stdout
    assert "1.17x zero-infinity, 1.09x zero-offload" in res.stdout
    assert (tmp_path / "curve.png").stat().st_size > 10_000


def test_offload_gate_full_curve_verdicts():
    """The whole recorded gate (every 2026-11-29 offload file): a later file's measurement of a
    run replaces an earlier timed-out attempt, and target 3 is judged per point, naming the
    peer that falls short and the peers not measured."""
    import subprocess
    files = [str(ROOT / "bench/results/2026-11-29" / f"offload_{n}_2026-11-29.json")
             for n in ("transit", "peers", "peers_accum1", "peers_accum3", "fsdp_accum12")]
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "offload.py"), "--report", *files],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "timed out after 3 steps" not in res.stdout
    assert "fsdp-cpu-offload (9 measured, cut by timeout)" in res.stdout
    verdicts = {line.split(" ")[1]: line for line in res.stdout.splitlines() if line.startswith("accum ")}
    assert "1.25x fsdp-cpu-offload" in verdicts["1"] and "target 3 NOT met (fsdp-cpu-offload)" in verdicts["1"]
    # the peers added later (2026-11-30) are named as not measured in these files
    assert "target 3 met; not measured: torchao-offload, zenflow, zero-infinity, zero-twinflow" in verdicts["3"]
    assert "6.95x fsdp-cpu-offload" in verdicts["12"]
    assert verdicts["12"].endswith("target 3 met; not measured: torchao-offload, zenflow, zero-twinflow")
    assert "2. at 0.97x the paper's ratio: best transit advise 95.0% of reference: met" in res.stdout


def test_offload_gate_compares_each_run_with_the_reference_of_its_own_lease():
    """Two leases of the same H200 kind gave references of 213 and 247 TFLOPS at 12
    microbatches: a run is judged against the reference in its own file, a file without
    one against the first reference given, and target 3 compares % of reference."""
    import subprocess
    names = ("transit", "peers", "peers_accum1", "peers_accum3", "fsdp_accum12", "zinf_accum3", "transit_ranked",
             "stage")
    files = [str(ROOT / "bench/results/2026-11-29" / f"offload_{n}_2026-11-29.json") for n in names]
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "offload.py"), "--report", *files, "--markdown"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    rows = {tuple(c.strip() for c in line.split("|")[1:5]): [c.strip() for c in line.split("|")[5:8]]
            for line in res.stdout.splitlines() if line.startswith("| ")}
    assert rows[("3", "49152", "3.87", "zero-infinity")] == ["147.9", "246.5", "60.0"]  # its own file's reference
    assert rows[("3", "49152", "3.87", "zero-offload")] == ["158.6", "212.8", "74.5"]   # the first reference
    assert rows[("12", "196608", "0.97", "advise")] == ["237.6", "248.0", "95.8"]
    verdicts = {line.split(" ")[1]: line for line in res.stdout.splitlines() if line.startswith("accum ")}
    assert "1.43x zero-infinity, 1.15x zero-offload; target 3 met" in verdicts["3"]
    assert "advise-stage | timed out after 3 steps" in res.stdout  # the staging attempt at 12, not hidden


def test_offload_report_sets_apart_a_peer_over_the_budget():
    """The 2026-11-30 curve with recomputation: torchao's CPUOffloadOptimizer keeps its fp32
    gradients on the GPU under accumulation, 20.94 GB reserved against the 18.39 GB budget,
    so at 3 microbatches it is shown beside the verdict, not judged; at 1 microbatch it fits
    (offload_gradients) and is 3% faster than advise (target 3 not met)."""
    import subprocess
    names = ("overlap_ac_accum1_3", "overlap_ac_accum12", "peers_ac_accum1")
    files = [str(ROOT / "bench/results/2026-11-30" / f"offload_{n}_2026-11-30.json") for n in names]
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "offload.py"), "--report", *files],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    verdicts = {line.split(" ")[1]: line for line in res.stdout.splitlines() if line.startswith("accum ")}
    assert "0.97x torchao-offload" in verdicts["1"] and "target 3 NOT met (torchao-offload)" in verdicts["1"]
    assert "zero-twinflow over the budget (18.64 GB reserved; 2.26x)" in verdicts["1"]
    assert "torchao-offload over the budget (20.94 GB reserved; 0.96x); target 3 not judged" in verdicts["3"]
    assert "torchao-offload over the budget (20.94 GB reserved; 1.05x)" in verdicts["12"]


def test_offload_report_judges_losses_of_the_deterministic_run():
    """Target 4 from the recorded deterministic run: every transit run bit-identical."""
    import subprocess
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "offload.py"), "--report",
                          str(ROOT / "bench/results/2026-11-29/offload_losses_deterministic_2026-11-29.json")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "4. losses: every transit run within 1e-6 of the reference (2 runs)" in res.stdout
    assert "no peers measured; target 3 not judged" in res.stdout


def test_offload_report_takes_the_later_measurement_of_a_run(tmp_path):
    """A rerun in a later file replaces the earlier measurement of the same run and point;
    a rerun that measured nothing does not replace a measurement."""
    import subprocess
    base = json.loads((ROOT / "bench/results/2026-11-29/offload_peers_2026-11-29.json").read_text())
    zoff = next(r for r in base["runs"] if r["name"] == "zero-offload" and r["accum"] == 12)
    rerun = dict(base, runs=[dict(zoff, tflops=190.0, measured_steps=10, rc=0)])
    failed = dict(base, runs=[dict(zoff, tflops=None, rc="timeout", step_times=[])])
    (tmp_path / "rerun.json").write_text(json.dumps(rerun))
    (tmp_path / "failed.json").write_text(json.dumps(failed))
    files = [str(ROOT / "bench/results/2026-11-29" / f"offload_{n}_2026-11-29.json") for n in ("transit", "peers")]
    files += [str(tmp_path / "rerun.json"), str(tmp_path / "failed.json")]
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "offload.py"), "--report", *files], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    rows = [line for line in res.stdout.splitlines() if " zero-offload" in line and line.startswith("12")]
    assert len(rows) == 1 and "190.0" in rows[0] and "cut by timeout" not in rows[0]


def test_issue20_goals_judged_from_the_recorded_curve():
    """bench/offload.py --report judges issue 20's goals (>= 97% at the paper's ratio, >= 90%
    at 4x it) at the nearest points, on the recorded 2026-11-30 curves: the staged step meets
    both with recomputation and only the 4x goal without; the 2026-11-29 gate met neither."""
    import subprocess
    d = ROOT / "bench" / "results"

    def goals(*names):  # each file in the folder of the date in its name
        res = subprocess.run([sys.executable, str(ROOT / "bench" / "offload.py"), "--report",
                              *[str(d / re.search(r"\d{4}-\d{2}-\d{2}", n)[0] / n) for n in names]], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        return [line for line in res.stdout.splitlines() if line.startswith("issue 20:")]
    D = "_2026-11-30.json"
    ac = goals(f"offload_ring3_ac12{D}", f"offload_ring3_ac{D}")
    assert ac == ["issue 20: >= 97% at 1x the paper's ratio: best transit advise-staged256 97.1% at 0.97x: met",
                  "issue 20: >= 90% at 4x the paper's ratio: best transit advise-staged256 94.3% at 3.87x: met"]
    noac = goals(f"offload_ring3_noac12{D}", f"offload_ring2_noac{D}")
    assert noac[0].endswith("96.3% at 0.97x: NOT met") and noac[1].endswith("93.0% at 3.87x: met")
    old = goals("offload_transit_2026-11-29.json")
    assert old[0].endswith("95.0% at 0.97x: NOT met") and old[1].endswith("at 3.87x: NOT met")
    only = goals(f"offload_ring2_noac{D}")  # 1 and 3 microbatches: no point near the paper's ratio
    assert len(only) == 1 and "at 4x the paper's ratio" in only[0]
