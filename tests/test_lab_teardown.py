"""An interrupted test run leaves no Slurm lab behind (issue 52: a killed run left munged,
slurmctld and four slurmd running, seen three times). A pytest subprocess starts the
suite's own `lab` fixture, puts a job on it and is ended: by SIGTERM (a timeout's) and
SIGINT (Ctrl-C), whose teardown stops the lab before the run exits, and by SIGKILL, where
nothing of the run's own runs and the lab's watchdog (tests/slurm_lab.py) ends it. Then no
daemon or job process of that lab is alive, its controller's port is free and its directory
is gone. The processes are found here by the pid files and the jobs' SLURM_CONF, not by the
lab's own search."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, SHARED_ENV, shared_root
from tests.slurm_lab import SlurmLab, _lab_processes, missing

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))

# the suite's conftest (its fixtures and hooks) for a test directory outside the suite:
# appended, so that an installed transit_launch still comes first (.ci/test)
CONFTEST = f"""import sys
sys.path.append({str(ROOT)!r})
from tests.conftest import *  # noqa: F401,F403
"""
HOLD = """import os, time
from pathlib import Path

def test_hold(lab):
    job = lab.cmd("sbatch", "--parsable", "-N1", "--wrap", "sleep 600").stdout.strip()
    t0 = time.time()
    while lab.cmd("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() != "RUNNING":
        assert time.time() - t0 < 120, lab.logs()
        time.sleep(0.2)
    Path(os.environ["LAB_READY"]).write_text(str(lab.lab))
    time.sleep(3600)
"""


def _alive(pid: int) -> bool:
    try:  # a zombie holds no port or CPU (this machine's init may not reap them)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (OSError, IndexError):
        return False


def _jobs_of(conf: Path) -> set[int]:
    """Processes whose environment's SLURM_CONF is this lab's (its jobs and their steps)."""
    want = b"SLURM_CONF=" + bytes(conf)
    found = set()
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            if want in Path(f"/proc/{p}/environ").read_bytes().split(b"\0"):
                found.add(int(p))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_an_interrupted_run_leaves_no_lab_running(tmp_path_factory, tmp_path, sig):
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "conftest.py").write_text(CONFTEST)
    (inner / "test_hold.py").write_text(HOLD)
    ready = tmp_path / "ready"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.update(LAB_READY=str(ready), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
               **{SHARED_ENV: str(shared_root(tmp_path_factory))})  # the builds made
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(inner),
                             str(inner / "test_hold.py")], cwd=inner, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # Ctrl-C's default
    try:
        t0 = time.time()
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()[0][-4000:]
            assert time.time() - t0 < 300, "the inner run's lab did not come up"
            time.sleep(0.2)
        lab = Path(ready.read_text())
        daemons = {f.stem: int(f.read_text().strip()) for f in (lab / "run").glob("*.pid")}
        jobs = _jobs_of(lab / "etc" / "slurm.conf")
        port = int(next(ln for ln in (lab / "etc" / "slurm.conf").read_text().splitlines()
                        if ln.startswith("SlurmctldPort=")).split("=")[1])
        assert sorted(daemons) == ["munged", "slurmctld", *(f"slurmd-n{i}" for i in range(1, 5))], daemons
        assert jobs and all(map(_alive, [*daemons.values(), *jobs])), (daemons, jobs)
        proc.send_signal(sig)
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    pids = [*daemons.values(), *jobs]
    try:
        if sig == signal.SIGKILL:  # the watchdog works after the run is gone: give it its time
            t0 = time.time()
            while (any(map(_alive, pids)) or lab.exists()) and time.time() - t0 < 60:
                time.sleep(0.2)
        else:  # the teardown ran before the run exited
            assert "KeyboardInterrupt" in out, out[-4000:]
        assert not [p for p in pids if _alive(p)], (daemons, jobs, out[-4000:])
        assert not lab.exists(), out[-4000:]
        with socket.socket() as s:  # no one listens on slurmctld's port (its closed connections may linger)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()
    finally:  # what a failure found left is not left to the next run
        for p in filter(_alive, pids):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(lab, ignore_errors=True)


def test_stop_after_a_start_that_failed(tmp_path, monkeypatch):
    """stop() after start() failed, before anything ran and after its watchdog began (munged
    refusing to start): no error of its own, and nothing of the lab left, its watchdog
    included."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "munged").write_text("#!/bin/sh\necho 'munged: refusing (the test)' >&2\nexit 1\n")
    (bin_dir / "munged").chmod(0o755)
    for name, path in (("none", str(tmp_path / "nothing")), ("munged", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")):
        lab = SlurmLab(tmp_path / name)
        lab.lab.mkdir()
        monkeypatch.setenv("PATH", path)
        with pytest.raises((OSError, subprocess.CalledProcessError)):
            lab.start()
        lab.stop()
        monkeypatch.undo()
        assert lab._watch is None and not _lab_processes(lab.lab), name  # the watchdog ended too


def test_failure_excerpt_leaves_out_what_every_job_prints():
    """issue 52: a failed lab job's excerpt led with torchrun's warning that closing the
    rendezvous failed after the exit barrier (printed by passing jobs too: 2 of 13 loaded runs),
    and the cause was past the excerpt. Lines from those runs' output."""
    from tests.slurm_lab import failure_excerpt
    benign = ("W1207 14:56:14.138000 31364 site-packages/torch/distributed/elastic/rendezvous/dynamic_rendezvous.py:"
              "1298] The node 'localhost_31364_0' has failed to shutdown the rendezvous '2' due to an error of type "
              "RendezvousConnectionError.\n[titan] 2026-12-07 14:41:22,484 - root - WARNING - Error running lspci: "
              "[Errno 2] No such file or directory: 'lspci', fallback to use device_name\n")
    cause = "[rank1]: RuntimeError: the cause\n"
    got = failure_excerpt(benign + cause + "x" * 50, tail=10, path=Path("/tmp/j.out"))
    assert got.splitlines()[:3] == ["the whole output: /tmp/j.out", "[rank1]: RuntimeError: the cause", "..."]


def test_failure_excerpt_keeps_the_first_errors_where_there_are_many():
    """The first rank's cause comes before the other ranks' reports of it: with more error
    lines than the excerpt holds (40), it keeps the first 40, the cause first; the tail is
    still the output's last characters."""
    from tests.slurm_lab import failure_excerpt
    reports = "".join(f"[rank{r}]: RuntimeError: the store closed\n" for r in range(1, 46))
    got = failure_excerpt("[rank0]: RuntimeError: the cause\n" + reports, tail=5)
    head = got.split("\n...\n")[0].splitlines()
    assert head[0] == "[rank0]: RuntimeError: the cause" and len(head) == 40
    assert head[-1] == "[rank39]: RuntimeError: the store closed" and got.endswith("osed\n")
