"""bench/probes/fill_stall_probe.py (run by hand on a GPU): bad sizes, and a machine without a
GPU, get one line and exit 2 before anything is allocated; its bounded activities end on their
own (a stand-in registration, a CPU host: what the probe's threads do, not what CUDA answers)."""

import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

PROBES = ROOT / "bench" / "probes"


def run(*args, tmp_path):
    return subprocess.run([sys.executable, str(PROBES / "fill_stall_probe.py"), *args], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)


@pytest.mark.parametrize("args", [["--host-gb", "0"], ["--case-timeout", "0"], ["--piece-mb", "4096", "--host-gb", "2"],
                                  ["--copy-mb", "300", "--vmm-piece-mb", "64"], ["--writers", "x"]])
def test_bad_sizes_are_one_line(args, tmp_path):
    res = run(*args, tmp_path=tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith("fill_stall_probe: "), res.stderr


def test_without_a_gpu_one_line(tmp_path):
    from tests.conftest import torch_importable
    if torch_importable():
        import torch
        if torch.cuda.is_available():
            pytest.skip("a GPU is present: the probe would run")
    res = run(tmp_path=tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "GPU" in res.stderr or "PyTorch" in res.stderr


class StandIn:
    """cudaHostRegister as a 10 ms call; every region must be registered once and unregistered after."""

    def __init__(self):
        self.registered, self.unregistered = [], []

    def cudaHostRegister(self, p, n, flags):
        time.sleep(0.01)
        self.registered.append((p.value, n))
        return 0

    def cudaHostUnregister(self, p):
        self.unregistered.append(p.value)
        return 0

    def cudaGetLastError(self):
        return 0


@pytest.mark.parametrize("what", ["idle", "write", "register", "register-small", "both"])
def test_each_activity_is_bounded_and_gives_back_what_it_registered(what, monkeypatch):
    monkeypatch.syspath_prepend(str(PROBES))
    import fill_stall_probe as probe
    rt, host = StandIn(), 256 << 20
    piece = (64 << 20) if what == "register-small" else 128 << 20
    with probe.Background(rt, what, host, piece, 2) as bg:
        deadline = time.monotonic() + 30
        while bg.busy():
            assert time.monotonic() < deadline, f"{what} did not end"
            time.sleep(0.005)
    regs = host // piece if what.startswith("register") or what == "both" else 0
    assert len(rt.registered) == regs and len({p for p, _ in rt.registered}) == regs
    assert sorted(rt.unregistered) == sorted(p for p, _ in rt.registered)
    assert bg.done["registered_gb"] == pytest.approx(regs * piece / 1e9)
    assert bg.done["written_gb"] == (host / 1e9 if what in ("write", "both") else 0)
