"""bench/probes/host_memory_probe.py (run by hand on a GPU): no --out, or a machine without a
GPU, gets one line and exit 2 before anything is allocated."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "bench" / "probes" / "host_memory_probe.py"


def run(*args, tmp_path):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


def test_without_out_one_line(tmp_path):
    res = run(tmp_path=tmp_path)
    assert res.returncode == 2 and res.stderr.strip() == "host_memory_probe: --out FILE is needed (where the result goes)"


def test_without_a_gpu_one_line(tmp_path):
    from tests.conftest import torch_sees_a_gpu
    if torch_sees_a_gpu():
        pytest.skip("a GPU is present: the probe would run")
    res = run("--out", str(tmp_path / "r.json"), tmp_path=tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "GPU" in res.stderr or "PyTorch" in res.stderr
    assert not (tmp_path / "r.json").exists()
