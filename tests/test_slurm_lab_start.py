"""The Slurm lab's start-up check (tests/slurm_lab.py) tells a daemon still starting from a
dead one by its pid file alone: no Slurm needed. Issue 52: in loaded CI runs the lab's start
failed with "slurmd-n4 died" twice in a row, its log ending just before "slurmd started on",
where slurmd's create_pidfile() opens the pid file with O_TRUNC and then writes the pid: the
check had read that empty file and taken the daemon for dead."""

import subprocess

import pytest

from tests.slurm_lab import DaemonDied, PortClash, SlurmLab


@pytest.fixture
def fake_lab(tmp_path):
    lab = SlurmLab(tmp_path)
    for d in ("run", "log"):
        (tmp_path / d).mkdir()
    return lab


def test_a_pid_file_not_written_yet_is_a_daemon_starting(fake_lab):
    fake_lab._daemon_failed(["slurmd-n4"])  # none yet
    (fake_lab.lab / "run/slurmd-n4.pid").write_text("")  # opened by create_pidfile(), the pid not written yet
    fake_lab._daemon_failed(["slurmd-n4"])
    (fake_lab.lab / "run/slurmd-n4.pid").write_text("\n")
    fake_lab._daemon_failed(["slurmd-n4"])


def test_a_live_daemon_passes(fake_lab):
    with subprocess.Popen(["sleep", "60"]) as proc:
        try:
            (fake_lab.lab / "run/slurmd-n1.pid").write_text(f"{proc.pid}\n")
            fake_lab._daemon_failed(["slurmd-n1"])
        finally:
            proc.kill()


@pytest.mark.parametrize("how", ["gone", "zombie"])
def test_a_pid_file_of_a_dead_daemon_is_its_death_with_the_reason(fake_lab, how):
    proc = subprocess.Popen(["true"])
    if how == "gone":
        proc.wait()
    else:  # exited, not reaped yet
        while open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
            pass
    try:
        (fake_lab.lab / "run/slurmd-n2.pid").write_text(f"{proc.pid}\n")
        (fake_lab.lab / "log/slurmd-n2.log").write_text("[t] slurmd version 22.05.8 started\n")
        with pytest.raises(DaemonDied, match=f"slurmd-n2 died \\(pid {proc.pid} from its pid file: "
                                             f"{'no such process' if how == 'gone' else 'a zombie'}\\)") as e:
            fake_lab._daemon_failed(["slurmd-n2"])
        assert not e.value.fatal and "slurmd version 22.05.8 started" in str(e.value)
    finally:
        proc.wait()


def test_a_bind_failure_is_a_port_clash_pid_file_or_not(fake_lab):
    (fake_lab.lab / "log/slurmd-n3.log").write_text("[t] fatal: Unable to bind listen port (17002): Address already in use\n")
    with pytest.raises(PortClash):
        fake_lab._daemon_failed(["slurmd-n3"])
    (fake_lab.lab / "run/slurmd-n3.pid").write_text("")
    with pytest.raises(PortClash):
        fake_lab._daemon_failed(["slurmd-n3"])
