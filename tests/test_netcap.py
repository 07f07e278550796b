"""No NIC cap outlives its sweep, tried the way things go wrong: real network namespaces
and tc as root, and the Slurm lab for sweeps over an allocation.

- scancel of a Slurm sweep: each node's holding task restores its own node;
- a node that cannot confirm its restore (its task SIGKILLed) is reported as such, never
  as restored, and a plain `sweep --restore` finds its per-node journal and restores it;
- a second SIGTERM while the job ignores TERM ends the job's group at once, and three
  quick SIGTERMs during a slow `tc qdisc del` do not interrupt the restore;
- after kill -9 of the sweep, `sweep --restore` ends the job it left running;
- a journal entry for a namespace that no longer exists is dropped with a warning;
- the journal's temporary file is never a planted link, and a directory others can
  write is refused."""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.test_sweep import NETNS_SCRIPT, netns_only, pair, qdiscs, standins, sweep_cmd  # noqa: F401 (fixture)

TC = "/usr/sbin/tc"


HANG = 600  # seconds: a guard against a hung test, never a bound on how fast something must be


def _wait(cond, what="condition", proc=None):
    """Polls until cond() holds; fails at once when proc (the sweep) ended first, and only
    after HANG seconds otherwise (the machine's speed decides nothing)."""
    t0 = time.monotonic()
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the sweep ended (exit {proc.returncode}) before {what}")
        if time.monotonic() - t0 > HANG:
            raise AssertionError(f"hung waiting for {what}")
        time.sleep(0.1)


def frozen_clock(tmp_path):
    """A PYTHONPATH entry whose sitecustomize stops time.time() in the sweep's process: its
    10 s grace before it kills a job that ignores SIGTERM never runs out, so only the second
    signal can end such a job, however slow the machine."""
    d = tmp_path / "frozen-clock"
    d.mkdir()
    (d / "sitecustomize.py").write_text("import time\n_t = time.time()\ntime.time = lambda: _t\n")
    return str(d)


def capped(ns, dev):
    return any(q["kind"] == "tbf" for q in qdiscs(ns, dev))


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def _restore(journal_spec, env=None):
    return subprocess.run([sys.executable, "-m", "transit_launch", "sweep", "--restore", "--journal", journal_spec],
                          capture_output=True, text=True, cwd=tempfile.gettempdir(), env=env, timeout=60)


# --- local sweeps ------------------------------------------------------------------------


@netns_only
def test_signals_end_the_job_and_never_interrupt_the_restore(pair, tmp_path):
    """The job ignores SIGTERM: with the sweep's clock stopped (its grace never runs out),
    a second SIGTERM is what kills its group. Then tc qdisc del waits for the test (a
    wrapper holds it until a file appears): three SIGTERMs sent during it change nothing:
    no traceback, the caps are gone, so is the journal. Events, not timings."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker, go = tmp_path / "del-started", tmp_path / "del-go"
    (bin_dir / "tc").write_text(f'#!/bin/bash\ncase "$*" in *"qdisc del"*) touch {marker}; '
                                f'while [ ! -e {go} ]; do sleep 0.05; done;; esac\nexec {TC} "$@"\n')
    (bin_dir / "tc").chmod(0o755)
    env = dict(pair, PATH=f"{bin_dir}:{os.environ['PATH']}",
               PYTHONPATH=os.pathsep.join(filter(None, [frozen_clock(tmp_path), os.environ.get("PYTHONPATH")])))
    pidfile, terms = tmp_path / "job.pid", tmp_path / "job.terms"
    # the job notes each SIGTERM and lives on; its child ignores it (and so sleeps on). The child
    # writes its own pid once its trap is set: written by the parent after the fork, a SIGTERM
    # could reach the child before its trap (seen under load)
    job = ["bash", "-c", f"trap 'echo TERM >> {terms}' TERM; echo $$ > {pidfile}; "
                         f"(trap '' TERM; echo $BASHPID >> {pidfile}; exec sleep 120) & while :; do wait; done"]
    journal = tmp_path / "j.json"
    proc = subprocess.Popen(sweep_cmd(pair, journal, "--bandwidths", "50mbit", job=job), env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait(lambda: capped(pair["NS_A"], "veth-a") and pidfile.exists() and len(pidfile.read_text().split()) == 2,
              what="the cap and the job", proc=proc)
        pids = [int(p) for p in pidfile.read_text().split()]
        proc.send_signal(signal.SIGTERM)
        _wait(lambda: terms.exists(), what="the job's SIGTERM", proc=proc)  # the sweep passed it on
        assert all(_alive(p) for p in pids)  # the job ignores TERM (its child sleeps on)
        proc.send_signal(signal.SIGTERM)  # the second one: SIGKILL to the job's group (the grace never ends)
        _wait(lambda: marker.exists(), what="the restore's tc qdisc del", proc=proc)
        assert not any(_alive(p) for p in pids)  # the job was ended before the restore began
        for _ in range(3):  # during the restore, which waits for `go`
            proc.send_signal(signal.SIGTERM)
        go.touch()
        out, err = proc.communicate(timeout=HANG)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in pidfile.read_text().split() if pidfile.exists() else ():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)  # a failed test leaves no job sleeping on
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted by SIGTERM; every cap was restored" in out, (out, err)
    assert not capped(pair["NS_A"], "veth-a") and not capped(pair["NS_B"], "veth-b")
    assert not journal.exists() and not list(tmp_path.glob(".j.json*"))


@netns_only
def test_restore_ends_the_job_a_killed_sweep_left(pair, tmp_path):
    journal = tmp_path / "j.json"
    pidfile = tmp_path / "job.pid"
    job = ["bash", "-c", f"echo $$ > {pidfile}; exec sleep 120"]
    proc = subprocess.Popen(sweep_cmd(pair, journal, "--bandwidths", "50mbit", job=job), env=pair, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait(lambda: capped(pair["NS_A"], "veth-a") and pidfile.exists() and pidfile.read_text().strip(),
              what="the cap and the job", proc=proc)
    finally:
        proc.kill()  # kill -9: the sweep cannot clean up, the job (own session) lives on
        proc.wait()
    job_pid = int(pidfile.read_text())
    assert _alive(job_pid) and json.loads(journal.read_text())["job"]["pgid"] == job_pid
    res = _restore(str(journal))
    assert res.returncode == 0, res.stderr
    assert f"ended the job the sweep left running (process group {job_pid})" in res.stdout
    _wait(lambda: not _alive(job_pid), what="the job's end")
    assert not capped(pair["NS_A"], "veth-a") and not journal.exists()


def test_entry_for_a_vanished_namespace_is_dropped(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root (ip netns)")
    journal = tmp_path / "netcap-x.json"
    journal.write_text(json.dumps([{"backend": "tc", "iface": "tsgone0/veth-a", "state": {"root": None}}]))
    res = _restore(str(journal))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "WARNING tc tsgone0/veth-a: network namespace tsgone0 no longer exists; dropped its journal entry" \
        in res.stdout
    assert not journal.exists()
    res = _restore(str(journal))
    assert res.returncode == 0 and res.stdout.strip() == "nothing to restore"


def test_journal_temp_file_never_follows_a_planted_link(tmp_path):
    """As root: in a directory only root can write, a link planted where the temporary
    file goes (even with the name the writer will try first) is not followed; a directory
    others can write is refused before anything is written."""
    from transit_launch.errors import UsageError
    from transit_launch.netcap.backends import Iface
    from transit_launch.netcap.journal import Journal
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    safe = tmp_path / "safe"
    safe.mkdir(mode=0o700)
    (safe / "j.tmp").symlink_to(victim)  # the name the journal's temporary file once had
    for attempt in range(3):  # and the names it has now, pid included
        (safe / f".j.json.{os.getpid()}.{attempt}.tmp").symlink_to(victim)
    j = Journal(safe / "j.json")
    j.record("tc", Iface("veth-a", "ns"), {"root": None})
    assert victim.read_text() == "precious\n"
    assert j.entries() == [{"backend": "tc", "iface": "ns/veth-a", "state": {"root": None}}]
    assert not (safe / "j.json").is_symlink()
    open_dir = tmp_path / "world"
    open_dir.mkdir()
    os.chmod(open_dir, 0o1777)
    with pytest.raises(UsageError, match="is writable by others"):
        Journal(open_dir / "j.json").record("tc", Iface("veth-a", "ns"), {"root": None})
    assert list(open_dir.iterdir()) == []


def test_sweep_refuses_a_journal_in_a_directory_others_can_write(cli, tmp_path):
    env, log = standins(tmp_path)
    open_dir = tmp_path / "world"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    rc, out, err = cli("sweep", "--cap", "mlnx_qos", "--iface", "lo", "--bandwidths", "400", "--journal",
                       str(open_dir / "j.json"), "--metric-regex", r"t: ([0-9.]+)", "--", "true", env=env)
    assert rc == 2 and "is writable by others" in err and len(err.strip().splitlines()) == 1, err
    calls = log.read_text().splitlines() if log.exists() else []
    assert not [c for c in calls if " -r " in c]  # nothing was capped


def test_a_restore_reads_nothing_after_the_holding_step_ended(monkeypatch):
    """The holding step's output ended (srun closed it) with one of two nodes' rows, srun not
    yet reaped: the restore says the other node did not confirm, and reads no more of the
    ended output (it used to wait 20 s more for rows that could not come: the lab's
    unconfirmed-restore test waited that out whenever srun closed its output before it exited)."""
    from transit_launch.netcap.backends import Backend
    from transit_launch.netcap.capper import SlurmCapper

    class Lines:
        def __init__(self, items):
            self.items = list(items)

        def get(self, timeout=None):
            assert self.items, "read the holding step's output after it ended"
            return self.items.pop(0)

    class Srun:  # closed its output, not yet exited
        stdin, returncode = io.StringIO(), None

        def poll(self):
            return self.returncode

        def send_signal(self, sig):
            pass

        def wait(self, timeout=None):
            self.returncode = 1
            return 1

    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    cap = SlurmCapper(Backend(), "n1=veth-a,n2=veth-b", None)
    cap.hold, cap.err, cap.ended = Srun(), ["srun: error: n2: task 1: Killed"], False
    cap.lines = Lines([json.dumps({"node": "n1", "restored": ["veth-a"], "errors": []}), None])
    errors = cap.restore()
    assert errors == ["1 of 2 nodes did not confirm their restore (srun: error: n2: task 1: Killed); their "
                      "journals are left for `transit-launch sweep --restore`"], errors


# --- sweeps over a Slurm allocation ---------------------------------------------------------


def _slurm_sweep(lab, pair, tmp_path, job, name):
    from tests.slurm_lab import missing
    if missing():
        pytest.skip(missing())
    ns_a, ns_b = pair["NS_A"], pair["NS_B"]
    spec = tmp_path / "netcap-%n.json"
    sweep = (f"{sys.executable} -m transit_launch sweep --slurm --cap tc --iface n1={ns_a}/veth-a,n2={ns_b}/veth-b "
             f"--bandwidths 50mbit --journal {spec} -- {job}")
    out = tmp_path / f"{name}.txt"
    res = lab.cmd("sbatch", "--parsable", "-N2", "-o", str(out), "--wrap", sweep, env=dict(lab.env, **pair))
    assert res.returncode == 0, res.stderr
    return res.stdout.strip(), out, spec


def _holder(node):
    """The pid of the `netcap hold` task on a node."""
    for p in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (p / "cmdline").read_bytes().split(b"\0")
            if b"netcap" in cmd and b"hold" in cmd and f"SLURMD_NODENAME={node}".encode() in \
                    (p / "environ").read_bytes().split(b"\0"):
                return int(p.name)
        except OSError:
            continue
    return None


@netns_only
def test_scancel_restores_every_node(lab, pair, tmp_path):
    job, out, spec = _slurm_sweep(lab, pair, tmp_path, "sleep 120", "scancel")
    _wait(lambda: capped(pair["NS_A"], "veth-a") and capped(pair["NS_B"], "veth-b"), what="caps on both nodes")
    assert lab.cmd("scancel", job).returncode == 0
    assert lab.wait_job(job)["JobState"] == "CANCELLED"
    _wait(lambda: not capped(pair["NS_A"], "veth-a") and not capped(pair["NS_B"], "veth-b"),
          what="both nodes restored by their own tasks")
    assert not list(tmp_path.glob("netcap-*.json")), out.read_text()
    text = out.read_text()
    assert "RESTORE ERRORS" not in text, text  # both nodes' own tasks restored (waited for above)
    res = _restore(str(spec))
    assert res.returncode == 0 and res.stdout.strip() == "nothing to restore"


@netns_only
def test_unconfirmed_restore_is_reported_and_restore_finds_the_node(lab, pair, tmp_path):
    """n2's holding task is SIGKILLed: the sweep reports n2's restore as unconfirmed (and
    claims nothing), n2's cap and journal stay, and a plain `sweep --restore` with the
    per-node spec finds that journal and restores n2."""
    job, out, spec = _slurm_sweep(lab, pair, tmp_path, "sleep 4", "killed")
    _wait(lambda: capped(pair["NS_A"], "veth-a") and capped(pair["NS_B"], "veth-b") and _holder("n2"),
          what="caps on both nodes")
    os.kill(_holder("n2"), signal.SIGKILL)
    info = lab.wait_job(job, timeout=90)
    text = out.read_text()
    assert info["JobState"] == "FAILED", text  # the sweep exits 1 on a restore error
    assert "RESTORE ERRORS" in text and "1 of 2 nodes did not confirm their restore" in text, text
    assert "every cap was restored" not in text
    assert not capped(pair["NS_A"], "veth-a") and capped(pair["NS_B"], "veth-b")
    assert [p.name for p in tmp_path.glob("netcap-*.json")] == ["netcap-n2.json"]
    res = _restore(str(spec))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"tc {pair['NS_B']}/veth-b" in res.stdout
    assert not capped(pair["NS_B"], "veth-b") and not list(tmp_path.glob("netcap-*.json"))
