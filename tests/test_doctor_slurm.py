"""doctor's slurm row against the real lab cluster (tests/slurm_lab.py): "ok" when the
controller answers; "no answer", naming the controller slurm.conf gives, when Slurm's
commands are installed but no slurmctld answers them (not "missing": nothing is)."""

import json
import re
import socket


def _conf(lab, tmp_path, **settings) -> str:
    """The lab's slurm.conf with these settings replaced, as a file of its own."""
    text = lab.conf.read_text()
    for key, value in settings.items():
        text, n = re.subn(rf"^{key}=.*$", f"{key}={value}", text, flags=re.M)
        assert n == 1, key
    path = tmp_path / "slurm.conf"
    path.write_text(text)
    return str(path)


def _slurm(cli, conf):
    """(the slurm check of doctor --json, the slurm row of doctor's table)."""
    rc, out, err = cli("doctor", "--json", env={"SLURM_CONF": conf})
    assert rc == 0, err
    check = next(c for c in json.loads(out) if c["check"] == "slurm")
    rc, out, err = cli("doctor", env={"SLURM_CONF": conf})
    assert rc == 0, err
    row = next(line for line in out.splitlines() if line.startswith("slurm "))
    return check, row


def test_a_controller_that_answers_is_ok(cli, lab):
    check, row = _slurm(cli, str(lab.conf))
    version = lab.cmd("sinfo", "--version").stdout.strip()
    assert check["ok"] and "status" not in check
    assert check["detail"] == f"{version}, partitions debug*: sbatch, srun, squeue, scontrol, sinfo, sacct, scancel"
    assert row.split()[1] == "ok"


def test_a_controller_that_does_not_answer_is_named(cli, lab, tmp_path):
    with socket.socket() as held:  # bound, never listening: a connection to it is refused, and nobody takes it
        held.bind(("127.0.0.1", 0))
        conf = _conf(lab, tmp_path, SlurmctldHost="ctl-gone(127.0.0.1)", SlurmctldPort=held.getsockname()[1])
        check, row = _slurm(cli, conf)
    assert not check["ok"] and check["status"] == "no answer", check
    assert check["detail"] == "Slurm's commands are installed, but slurmctld at ctl-gone did not answer", check
    assert re.match(r"slurm +no answer +Slurm's commands are installed, but slurmctld at ctl-gone did not answer$",
                    row), row


def test_why_the_controller_did_not_answer_is_said(cli, lab, tmp_path):
    """The lab's own slurmctld, but munged is not where this slurm.conf looks for it: the
    request cannot be signed, and Slurm's last word says so."""
    conf = _conf(lab, tmp_path, AuthInfo=f"socket={tmp_path}/no-munged/munge.socket.2")
    check, row = _slurm(cli, conf)
    assert not check["ok"] and check["status"] == "no answer", check
    assert check["detail"].startswith(f"Slurm's commands are installed, but slurmctld at {lab.host} did not answer: "
                                      "scontrol: error: "), check
    assert "authentication error" in check["detail"] and check["detail"] in row
