"""The "shapes" suite and bench/offload.py's advise-plain without a GPU: advise-plain is advise
with TRANSIT_OVERLAP_STEP=0 (advise alone keeps its default, the streamed step), the suite's
steps parse as offload.py's arguments and hand the trainer its shape with --clip, every run
on lane 0, and --report takes the new name like the others."""

import importlib
import json
import sys

import pytest

from bench.harness.suites import SHAPE_POINTS, SHAPES, SUITES
from transit_launch.rules import ENV


@pytest.fixture
def offload(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["offload.py"])
    return importlib.import_module("offload")


def test_advise_plain_is_advise_without_a_step_mode(offload):
    assert offload.variant("advise-plain") == ("advise", {ENV["OVERLAP_STEP"]: "0"})
    assert offload.variant("advise") == ("advise", {})  # the default: the streamed step
    assert offload.expand("reference,advise,advise-plain") == ["reference", "advise", "advise-plain"]


def shape_steps():
    suite = SUITES["shapes"]
    return [s for s in suite.steps if s.lane is not None]


def test_the_suite_runs_each_shape_on_one_gpu():
    suite = SUITES["shapes"]
    assert suite.gpus == 1 and suite.lanes == 1
    runs = shape_steps()
    assert [s.name for s in runs] == ["wide", "wide-16-8-2", "wide-ffn", "wide-ffn-16-8-2"]
    assert all(s.lane == 0 for s in runs)
    reports = [s for s in suite.steps if s.lane is None]
    assert {s.name for s in reports} == {f"report-{s.name}" for s in runs} and all(s.gpus == 0 for s in reports)
    # issue 27's points, each at most once per shape: 1, 2, 8 and 16 microbatches (and 4)
    for shape in SHAPES:
        points = [int(x) for s in runs if shape_of(s) == shape for x in accum_of(s).split(",")]
        assert sorted(points) == [1, 2, 4, 8, 16], (shape, points)
    # each step outlasts its deadline plus one run's timeout, and fits one 10-minute device call
    # (with the harness's setup) even if its last run took its whole timeout
    for s in runs:
        argv = list(s.argv)
        deadline, per_run = float(argv[argv.index("--deadline") + 1]), int(argv[argv.index("--timeout") + 1])
        assert deadline + per_run <= s.timeout <= 9 * 60
    # each report reads the file its run writes
    for s in runs:
        out = s.argv[s.argv.index("--out") + 1]
        report = next(r for r in reports if r.name == f"report-{s.name}")
        assert report.argv[report.argv.index("--report") + 1] == out


def shape_of(step):
    return {name + point[0]: name for name, points in SHAPE_POINTS.items() for point in points}[step.name]


def accum_of(step):
    return step.argv[list(step.argv).index("--accum") + 1]


@pytest.mark.parametrize("step", shape_steps(), ids=lambda s: s.name)
def test_each_shape_hands_the_trainer_its_flags(offload, monkeypatch, tmp_path, step):
    argv = [a.format(gpu=0, out=tmp_path) for a in step.argv]
    assert argv[:2] == ["python3", "bench/offload.py"]
    monkeypatch.setattr(sys, "argv", argv[1:])
    a = offload.parse()
    assert offload.expand(a.set) == ["reference", "advise", "advise-plain"]
    shape = shape_of(step)
    assert a.accum in [p[1] for p in SHAPE_POINTS[shape]] and (a.steps, a.warmup, a.budget) == (8, 3, 0)
    seen = []

    def fake_run(cmd, run_env, timeout, pin):
        seen.append((cmd, run_env))
        step_line = {"step": 1, "loss": 1.0, "step_time": 1.0, "t_end": 0.0, "tflops": 1.0, "grad_norm": 2.0,
                     "max_reserved_gb": 40.0}
        return json.dumps(step_line) + "\n", "", 0
    monkeypatch.setattr(offload, "run", fake_run)
    for name in ("reference", "advise", "advise-plain"):
        offload.run_one(a, name, 4, 10**10 if name != "reference" else None, None)
    trainer = seen[0][0]
    assert trainer[trainer.index("--clip") + 1] == "1.0"
    for flag, value in zip(SHAPES[shape].split()[::2], SHAPES[shape].split()[1::2]):
        if flag.startswith("--") and not value.startswith("--"):
            assert trainer[trainer.index(flag) + 1] == value
    assert ("--tie-embeddings" in trainer) == (shape == "wide")
    mode = [e.get(ENV["OVERLAP_STEP"]) for _, e in seen]
    assert mode == [None, None, "0"]  # reference, advise (its default), advise-plain
    assert "--policy" in seen[1][0] and seen[1][0][seen[1][0].index("--policy") + 1] == "advise"


def test_the_report_takes_advise_plain(offload, monkeypatch, tmp_path, capsys):
    params = 966_750_208

    def run(name, accum, tflops, losses):
        r = {"name": name, "accum": accum, "policy": offload.variant(name)[0] or "none", "rc": 0, "wall_s": 30.0,
             "budget_bytes": None, "losses": losses, "step_times": [1.0] * 8, "measured_steps": 5,
             "median_step_s": 1.0, "spread": 0.01, "tflops": tflops, "tokens_per_step": 8192 * accum,
             "max_reserved_gb": 40.0, "params": params, "flop_params": params, "host_peak_rss_gb": 20.0}
        if name != "reference":
            r["budget_bytes"] = 30 * 10**9
            r["shim"] = {"device_placed_peak_bytes": 29 * 10**9}
        return r
    runs = [run("reference", 4, 300.0, [9.0, 8.0]), run("advise", 4, 270.0, [9.0, 8.0]),
            run("advise-plain", 4, 240.0, [9.0, 8.0]), run("reference", 1, 250.0, [9.0, 8.5]),
            run("advise", 1, 200.0, [9.0, 8.5]), run("advise-plain", 1, 150.0, [9.0, 8.6])]
    f = tmp_path / "shapes_wide.json"
    f.write_text(json.dumps({"seq_len": 4096, "batch": 2, "runs": runs, "budgets": {"4": 30 * 10**9, "1": 30 * 10**9},
                             "budget_bytes": None}))
    monkeypatch.setattr(sys, "argv", ["offload.py", "--report", str(f), "--markdown"])
    offload.report(offload.parse())
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "advise-plain" in line]
    assert len(rows) == 2 and all("| yes |" in r for r in rows)
    assert "| 80.0 |" in rows[0] or "| 80.0 |" in rows[1]  # 240 of 300 TFLOPS at 4 microbatches
    assert "best transit advise 90.0% of reference" in out
    assert "4. losses: advise-plain at accum 1 differs by" in out
