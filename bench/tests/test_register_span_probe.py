"""bench/probes/register_span_probe.py (run by hand on a GPU): its options, and one line with
exit 2 for bad ones or where no GPU can answer, before any memory is taken."""

import subprocess
import sys

from tests.conftest import ROOT

SCRIPT = ROOT / "bench" / "probes" / "register_span_probe.py"


def run(*args, tmp_path):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


def test_help_names_every_option(tmp_path):
    res = run("--help", tmp_path=tmp_path)
    assert res.returncode == 0
    for opt in ("--piece-mb", "--copy-mb", "--pieces", "--writers", "--out"):
        assert opt in res.stdout


def test_refusals_are_one_line(tmp_path):
    for args in (["--copy-mb", "0"], ["--piece-mb", "256", "--copy-mb", "512"], ["--piece-mb", "1023"],
                 ["--pieces", "-1"], ["--pieces", "abc"], ["--bogus"]):
        res = run(*args, tmp_path=tmp_path)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, (args, res.stderr)


def test_without_a_gpu_it_says_so_in_one_line(tmp_path):
    import pytest
    from tests.conftest import torch_importable
    if torch_importable():
        import torch
        if torch.cuda.is_available():
            pytest.skip("a GPU is present: the probe would run")
    res = run("--out", str(tmp_path / "out.json"), tmp_path=tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "register_span_probe:" in res.stderr
    assert not (tmp_path / "out.json").exists()
