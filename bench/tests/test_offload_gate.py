"""bench/offload.py's gate (its runs, its refusals, its per-point budgets) without a GPU."""

import importlib
import sys

import pytest


def test_the_gate_runs_the_step_modes_with_their_switch(monkeypatch):
    """bench/offload.py: advise-plain and advise-host are advise under the gate's budget with
    TRANSIT_OVERLAP_STEP=0 and host; advise-plain is part of the transit set."""
    monkeypatch.setattr(sys, "argv", ["offload.py"])
    offload = importlib.import_module("offload")
    assert offload.variant("advise-plain") == ("advise", {"TRANSIT_OVERLAP_STEP": "0"})
    assert offload.variant("advise-host") == ("advise", {"TRANSIT_OVERLAP_STEP": "host"})
    assert offload.variant("advise") == ("advise", {}) and offload.variant("zero-offload") == (None, {})
    assert "advise-plain" in offload.expand("transit")
    assert offload.expand("reference,advise-host,zenflow") == ["reference", "advise-host", "zenflow"]


@pytest.mark.parametrize("bad", ["advise-hots", "zero-offlaod", "advise-", "Reference",
                                 "advise-stage", "advise-serial", "advise-green16", "advise-overlap",
                                 "advise-staged256"])
def test_the_gate_refuses_a_misspelt_run(monkeypatch, capsys, bad):
    """A misspelt variant ran the plain policy, and a misspelt peer the reference, under the
    name asked for: one line and exit 2 instead. So are the retired experiments' runs
    (docs/retired-experiments.md): their switches do nothing now."""
    monkeypatch.setattr(sys, "argv", ["offload.py"])
    offload = importlib.import_module("offload")
    with pytest.raises(SystemExit) as e:
        offload.expand(f"reference,{bad}")
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1


def test_the_gate_budgets_each_point_from_its_own_reference(monkeypatch, tmp_path):
    """Issue 20 defines the budget as the run's peak reserved less the optimizer state: the
    3-microbatch point holds more gradients than the 1-microbatch one, so each point's transit
    runs get the budget of the reference measured at that point (not the first point's)."""
    monkeypatch.setattr(sys, "argv", ["offload.py"])
    offload = importlib.import_module("offload")
    seen = []

    def fake(a, name, accum, budget, meter):
        seen.append((name, accum, budget))
        return {"name": name, "accum": accum, "rc": 0, "params": 10**9, "policy": "none",
                "max_reserved_gb": {1: 26.42, 3: 27.16}[accum]}
    monkeypatch.setattr(offload, "run_one", fake)
    monkeypatch.setattr(offload, "GpuMeter", None)  # no NVML here: the meter is skipped
    args = ["--set", "reference,advise", "--accum", "1,3", "--out", str(tmp_path / "o.json")]
    monkeypatch.setattr(sys, "argv", ["offload.py", *args])
    res = offload.measure(offload.parse())
    assert [s for s in seen if s[0] == "advise"] == [("advise", 1, 18_420_000_000), ("advise", 3, 19_160_000_000)]
    assert res["budgets"] == {"1": 18_420_000_000, "3": 19_160_000_000}
    monkeypatch.setattr(sys, "argv", ["offload.py", *args, "--budget", "5"])
    seen.clear()
    offload.measure(offload.parse())
    assert [s[2] for s in seen if s[0] == "advise"] == [5, 5]
