"""bench/sim_speed.py: each command timed in a process of its own (wall, its CPU and peak
memory from wait4, not the other children's), the median of a command's runs, and the
table's verdict against each target."""

import sys

import pytest

import sim_speed


def test_a_run_is_measured_alone_and_the_median_kept(monkeypatch, tmp_path):
    """A child that sleeps 0.2 s and one that spins 0.3 s of CPU: the sleeper's CPU is near
    nothing (a sum over all children would carry the spinner's), the spinner's near its wall."""
    monkeypatch.setattr(sim_speed, "cli", lambda: [sys.executable, "-c"])
    monkeypatch.setattr(sim_speed, "COMMANDS", {
        "spin": (("import time\nt=time.process_time()\nwhile time.process_time()-t<0.3: pass",), 1, 60.0, "spin"),
        "sleep": (("import time; time.sleep(0.2)",), 3, 0.1, "sleep")})
    rows = {r["name"]: r for r in sim_speed.drive(type("A", (), {"only": "spin,sleep"})())}
    assert rows["spin"]["cpu_s"] == pytest.approx(0.3, abs=0.15) and rows["spin"]["wall_s"] >= 0.3
    assert rows["sleep"]["cpu_s"] < 0.15 and 0.2 <= rows["sleep"]["wall_s"] < 1.0 and rows["sleep"]["runs"] == 3
    table = sim_speed.report({"machine": "m", "date": "d", "commit": "c", "rows": [rows["spin"], rows["sleep"]]})
    assert "| spin |" in table and "< 60 s: met |" in table
    assert "(median of 3, max " in table and "< 0.1 s: **not met** |" in table


def test_a_failed_command_stops_the_run(monkeypatch):
    monkeypatch.setattr(sim_speed, "cli", lambda: [sys.executable, "-c"])
    with pytest.raises(SystemExit, match="exited 3"):
        sim_speed.measure(("raise SystemExit(3)",))
