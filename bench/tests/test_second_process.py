"""bench/probes/second_process.py (the budget's promise to a site, measured on a GPU by someone
with one): one command with --help; without a GPU, or without the job's command, one
line and exit 2 before anything starts."""

import subprocess
import sys

from tests.conftest import ROOT

SCRIPT = ROOT / "bench" / "probes" / "second_process.py"


def run(*args, tmp_path):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


def test_help_names_every_option(tmp_path):
    res = run("--help", tmp_path=tmp_path)
    assert res.returncode == 0
    for opt in ("--gpu-budget", "--policy", "--after-steps", "--step-mib", "--max-gib", "--timeout", "--out"):
        assert opt in res.stdout


def test_refusals_are_one_line(tmp_path):
    for args, needle in ((["--gpu-budget", "4GB"], "the job's command is missing"),
                         (["--gpu-budget", "4GB", "--after-steps", "0", "--", "true"], "must be positive"),
                         (["--", "true"], "--gpu-budget")):
        res = run(*args, tmp_path=tmp_path)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and needle in res.stderr, res.stderr


def test_without_a_gpu_nothing_starts(tmp_path):
    import pytest
    from tests.conftest import torch_sees_a_gpu
    if torch_sees_a_gpu():
        pytest.skip("a GPU is present: the measurement would run")
    marker = tmp_path / "ran"
    res = run("--gpu-budget", "4GB", "--", "touch", str(marker), tmp_path=tmp_path)
    assert res.returncode == 2 and res.stderr.strip() == "second_process: needs a CUDA GPU"
    assert not marker.exists()
