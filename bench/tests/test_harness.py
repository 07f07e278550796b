"""The harness of `python3 -m bench`: the suites are well-formed data (every script they run
exists, every placeholder is known, no literal budget), lanes fold onto one GPU, a run
writes its logs, manifest and index entry, a run made elsewhere is filed, and the move of
the flat results rewrites references idempotently."""

import json
import re
import subprocess
import sys
from string import Formatter

import pytest

from bench.harness import cli, date_results, index, runner
from bench.harness.suites import SUITES, Step, Suite
from tests.conftest import ROOT

KNOWN = {"out", "gpus", "half", "twice", "gpu"}


@pytest.mark.parametrize("suite", SUITES.values(), ids=lambda s: s.name)
def test_suites_are_well_formed(suite):
    assert suite.measures and suite.minutes > 0 and suite.steps
    assert len({s.name for s in suite.steps}) == len(suite.steps)
    for s in suite.steps:
        script = next((a for a in s.argv if a.endswith((".py", ".sh"))), None)
        if script:
            assert (ROOT / script).is_file(), script
            assert not script.startswith("bench/probes/"), "probes run by hand, not in suites"
        fields = {f for a in (*s.argv, *s.env.values()) for _, f, _, _ in Formatter().parse(a) if f}
        assert fields <= KNOWN | set(suite.derive), fields
        assert s.lane in (0, 1, None) and s.timeout > 0
        # budgets come from the planner or a reference run, never as a byte count
        assert not [a for a in s.argv if re.fullmatch(r"\d{9,}B?", a)]


@pytest.mark.parametrize("name", SUITES)
def test_dry_run_of_every_suite(name):
    res = subprocess.run([sys.executable, "-m", "bench", name, "--dry-run"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    assert all(f"[{s.name}]" in res.stdout for s in SUITES[name].steps)


def test_list_and_refusals():
    res = subprocess.run([sys.executable, "-m", "bench", "--list"], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0 and all(name in res.stdout for name in SUITES)
    for args, msg in [(["nosuch"], "unknown suite"), (["scale-in", "--gpus", "1"], "needs 2 GPU"),
                      (["gate", "--only", "nostep", "--dry-run"], "has no step")]:
        res = subprocess.run([sys.executable, "-m", "bench", *args], capture_output=True, text=True, cwd=ROOT)
        assert res.returncode == 2 and msg in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_lanes_run_side_by_side_or_fold_onto_one_gpu():
    a, b, c = Step("a", ("x",), 1, 0), Step("b", ("x",), 1, 1), Step("c", ("x",), 1, None)
    assert runner.groups([a, b, c, a]) == [[a, b], [c], [a]]
    assert runner.lanes([a, b], 2) == [(0, [a]), (1, [b])]
    assert runner.lanes([a, b], 1) == [(0, [a, b])]
    assert runner.lanes([c], 2) == [(None, [c])]


def test_a_run_writes_logs_and_its_manifest_and_a_timeout_is_a_failure(tmp_path):
    py = "python3"
    suite = Suite("t", "a test", (Step("hello", (py, "-c", "print('out is {out}')"), 30, 0, 0),
                                  Step("pinned", (py, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"), 30,
                                       0, 0),
                                  Step("slow", (py, "-c", "import time; time.sleep(30)"), 1, 1, 0),
                                  Step("env", (py, "-c", "import os; print(os.environ['X'])"), 30, None, 0,
                                       {"X": "{half}"})), minutes=1)
    res = runner.run(suite, suite.steps, 2, dict(__import__("os").environ), tmp_path, dry_run=False)
    assert {r["step"]: r["rc"] for r in res} == {"hello": 0, "pinned": 0, "slow": "timeout", "env": 0}
    assert (tmp_path / "hello.log").read_text() == f"out is {tmp_path}\n"
    # lane 0's step on lane 0's half of the cores (set by the parent after the spawn)
    assert (tmp_path / "pinned.log").read_text() == f"{sorted(runner.cores(0, 2))}\n"
    assert (tmp_path / "env.log").read_text() == "1\n"


def test_index_entries_and_filing_a_run_made_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setattr(index, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(index, "INDEX", tmp_path / "results" / "INDEX.md")
    run = tmp_path / "device-out"
    run.mkdir()
    (run / "x.json").write_text("{}")
    e = index.Entry(date="2026-12-03", suite="plan", command="python3 -m bench plan --out x", commit="abc")
    index.write_manifest(run, e)
    assert cli.file_in(run) == 0 and cli.file_in(run) == 0  # the second lands in plan-2
    text = index.INDEX.read_text()
    assert text.startswith("# bench/results") and text.count("## 2026-12-03 plan") == 2
    assert "`2026-12-03/plan/x.json`" in text and "`2026-12-03/plan-2/x.json`" in text
    assert json.loads((tmp_path / "results" / "2026-12-03" / "plan" / "run.json").read_text())["commit"] == "abc"
    assert cli.file_in(tmp_path / "nothing") == 2


def test_the_move_rewrites_references_once():
    text = ('bench/results/offload_peers_2026-11-29.json, `bench/results/titan_steps_accum{16,1}_stream_2026-12-02.json`'
            ' ROOT / "bench" / "results" / "calibration_2026-11-29b.json", ROOT / "bench/results" / f"o_{n}_2026-11-30.json"')
    once = date_results.rewrite(text)
    assert once == ('bench/results/2026-11-29/offload_peers_2026-11-29.json, '
                    '`bench/results/2026-12-02/titan_steps_accum{16,1}_stream_2026-12-02.json`'
                    ' ROOT / "bench" / "results" / "2026-11-29" / "calibration_2026-11-29b.json", '
                    'ROOT / "bench/results/2026-11-30" / f"o_{n}_2026-11-30.json"')
    assert date_results.rewrite(once) == once


def test_commit_is_read_without_git(tmp_path):
    (tmp_path / ".git" / "refs" / "heads").mkdir(parents=True)
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / ".git" / "refs" / "heads" / "main").write_text("0123456789abcdef\n")
    assert index.commit(tmp_path) == "0123456789ab"
    assert index.commit(tmp_path / "none") == "unknown"


def test_the_commit_given_in_the_command_wins_over_the_copys_git(tmp_path, monkeypatch):
    """The device keeps an older .git than the tree it is sent: BENCH_COMMIT names the one run."""
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("fedcba9876543210\n")
    monkeypatch.setenv("BENCH_COMMIT", "a84df3172996afb8")
    assert index.commit(tmp_path) == "a84df3172996"
    monkeypatch.delenv("BENCH_COMMIT")
    assert index.commit(tmp_path) == "fedcba987654"
