"""bench/offload.py's gate (its runs, its refusals, its per-point budgets) and issue 20's GPU
probes (bench/probes/state_paths.py, memory_streams.py, step_timeline.py) without a GPU."""

import importlib
import subprocess
import sys

import pytest

from tests.conftest import NEEDS_TORCH, ROOT, torch_importable

needs_torch = pytest.mark.skipif(not torch_importable(), reason=NEEDS_TORCH)  # only the probes' own runs


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


@pytest.mark.parametrize("script,args", [("state_paths.py", []), ("state_paths.py", ["--params", "0"]),
                                         ("memory_streams.py", ["--out", "x.json", "--", "--steps", "1"]),
                                         ("step_timeline.py", ["--", "--steps", "1"]),
                                         ("step_timeline.py", ["--step", "1"])])
@needs_torch
def test_gpu_benches_say_one_line_without_a_gpu(script, args, tmp_path):
    """bench/probes/state_paths.py, memory_streams.py and step_timeline.py (issue 20's measurements)
    refuse bad arguments and a machine without a GPU with one line and exit 2, not a traceback."""
    import torch
    if torch.cuda.is_available() and args[1:2] not in (["0"], ["1"]):
        pytest.skip("a GPU is present: the bench would run")
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "probes" / script), *args],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "Traceback" not in res.stderr


def test_step_timeline_summary_of_a_trace(monkeypatch):
    """bench/probes/step_timeline.py's reduction of a Chrome trace: the compute stream (the most
    kernel time), its idle gaps, and each copy direction's bytes, rate and time beside compute."""
    tl = importlib.import_module("step_timeline")

    def ev(cat, name, ts, dur, stream, **args):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"stream": stream, **args}}
    trace = {"traceEvents": [
        ev("kernel", "gemm", 0, 10000, 7), ev("kernel", "gemm", 12000, 8000, 7),
        ev("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 5000, 3000, 9, bytes=150_000_000),
        ev("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 9000, 5000, 11, bytes=250_000_000),
        ev("kernel", "adam", 14000, 500, 13), {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5}]}
    res = tl.summarize(trace)
    assert res["compute_stream"] == "7" and res["window_ms"] == 20.0
    assert res["compute_busy_ms"] == 18.0 and res["compute_idle_ms"] == 2.0 and res["compute_gaps_over_1ms"] == [2.0]
    htod, dtoh = res["copies"]["htod"], res["copies"]["dtoh"]
    assert (htod["bytes"], htod["busy_ms"], htod["beside_compute_ms"], htod["gb_per_s"]) == (150_000_000, 3.0, 3.0, 50.0)
    assert (dtoh["busy_ms"], dtoh["beside_compute_ms"], dtoh["gb_per_s"]) == (5.0, 3.0, 50.0)
    assert tl.summarize({"traceEvents": trace["traceEvents"][-1:]}) == {"error": "no GPU events in the trace"}
