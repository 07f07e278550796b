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
    from tests.conftest import torch_sees_a_gpu
    if torch_sees_a_gpu():
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
    bg = probe.Background(rt, what, host, piece, 2).__enter__()
    deadline = time.monotonic() + 30
    while bg.busy() and time.monotonic() < deadline:  # (its threads are daemons: a failure here leaves them)
        time.sleep(0.005)
    assert not bg.busy(), f"{what} did not end"
    bg.__exit__(None, None, None)
    regs = host // piece if what.startswith("register") or what == "both" else 0
    assert len(rt.registered) == regs and len({p for p, _ in rt.registered}) == regs
    assert sorted(rt.unregistered) == sorted(p for p, _ in rt.registered)
    assert bg.done["registered_gb"] == pytest.approx(regs * piece / 1e9)
    assert bg.done["written_gb"] == (host / 1e9 if what in ("write", "both") else 0)


def test_a_case_that_never_ends_is_killed_and_recorded_and_the_rest_still_run(monkeypatch, tmp_path):
    """Every case's process past --case-timeout is killed and recorded as not finished; what ran
    is saved after each case (a later case that never ends loses nothing)."""
    monkeypatch.syspath_prepend(str(PROBES))
    import fill_stall_probe as probe
    monkeypatch.setattr(probe, "ACTIVITY", "import sys, time\nif sys.argv[2] == 'register': time.sleep(600)\n"
                                           "print('{\"what\": \"%s\"}' % sys.argv[2])")
    a = type("A", (), {"piece_mb": 2, "host_gb": 1, "writers": 1, "case_timeout": 2})()
    out, saved = {}, []
    t0 = time.monotonic()
    probe.stalls(a, out, lambda: saved.append(dict(out)))
    assert time.monotonic() - t0 < 60
    assert out["register"] == {"not_finished_s": 2}
    assert [out[w] for w in ("idle", "write", "register-small", "both")] == \
        [{"what": w} for w in ("idle", "write", "register-small", "both")]
    assert [list(s) for s in saved] == [["idle", "write", "register-small", "register", "both"][:i + 1] for i in range(5)]


def test_a_case_that_dies_says_how(monkeypatch):
    monkeypatch.syspath_prepend(str(PROBES))
    import fill_stall_probe as probe
    res = probe.case(["import sys; sys.stderr.write('boom'); sys.exit(3)"], 30)
    assert res["rc"] == 3 and res["stderr"] == "boom"
