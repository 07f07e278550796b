"""The planner against measured H200 peaks (bench/results/calibration_*.json: the example
trainer's torch.cuda.max_memory_reserved, bench/calibrate.py --measure). Issue 7 asks for
at least four runs within 10%; a change to the estimator's constants that breaks that
fails here, without a GPU."""

import json
import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import calibrate  # noqa: E402
import common  # noqa: E402

MEASURED = ROOT / "bench" / "results" / "calibration_2026-11-29.json"
# Measured before the trainer's RMSNorm became nn.RMSNorm (TorchTitan's): the old norm kept
# two fp32 copies of its input for backward, 12 bytes of hidden a token a layer more than
# the planner models; without recompute that is 1.8 GB here. To be measured again.
STALE = {"0.5B s8192 b1 no-recompute"}


def runs():
    return [r for r in json.loads(MEASURED.read_text())["runs"] if r["summary"]]


@pytest.mark.parametrize("run", [r for r in runs() if r["name"] not in STALE], ids=lambda r: r["name"])
def test_planner_within_ten_percent_of_measured_peak(run):
    _, predicted = calibrate.predict(run["flags"])
    measured = run["summary"]["max_reserved_gb"] * 1e9
    assert abs(predicted - measured) <= 0.10 * measured, (predicted / 1e9, measured / 1e9)


def test_enough_calibration_points():
    ok = [r for r in runs() if r["name"] not in STALE]
    assert len(ok) >= 4
    assert {"none", "full"} <= {common.trainer_flags(r["flags"])["recompute"] for r in ok}
    assert len({common.trainer_flags(r["flags"])["seq-len"] for r in ok}) >= 2


def test_offload_gate_report_from_recorded_runs(tmp_path):
    """bench/offload.py --report over the recorded gate (bench/results/offload_*_2026-11-29.json):
    percentages of the reference at the same point, the peers' budget check against the
    transit half's budget, timed-out runs reported with their steps, targets printed."""
    import subprocess
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "offload.py"), "--report",
                          str(ROOT / "bench/results/offload_transit_2026-11-29.json"),
                          str(ROOT / "bench/results/offload_peers_2026-11-29.json"), "--markdown",
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
