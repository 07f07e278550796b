"""`doctor --on-node` on the real lab cluster (issue 28): the checks run on a compute
node through srun, with the shim path a job rendered here would name."""

import json
import re
import socket


def _env(lab, **more):
    return {"SLURM_CONF": str(lab.conf), **more}


def test_the_checks_run_on_a_node_with_the_jobs_shim_path(cli, lab):
    rc, out, err = cli("doctor", "--on-node", "--json", env=_env(lab, TRANSIT_SHIM=lab.shim), timeout=180)
    assert rc == 0, err
    checks = {c["check"]: c for c in json.loads(out)}
    head = checks.pop("on a compute node")
    assert head["ok"] and head["node"] in {"n1", "n2", "n3", "n4"}, head  # Slurm's node name: srun ran it there
    shim = checks[f"{head['node']}: shim"]
    assert shim["ok"] and shim["path"] == lab.shim, shim
    assert all(k.startswith(head["node"] + ": ") for k in checks)


def test_a_shim_path_missing_on_the_node_is_said(cli, lab, tmp_path):
    gone = tmp_path / "nowhere" / "libtransit.so"
    rc, out, err = cli("doctor", "--on-node", env=_env(lab, TRANSIT_SHIM=str(gone)), timeout=180)
    assert rc == 0, err
    row = next(line for line in out.splitlines() if ": shim " in line)
    assert "missing" in row and f"TRANSIT_SHIM points to {gone}, which does not exist" in row


def test_a_partition_that_does_not_exist_fails_in_one_line(cli, lab):
    """Nothing was checked: the exit code says so (it was 0, with one failed row)."""
    for fmt in ([], ["--json"]):
        rc, out, err = cli("doctor", "--on-node", *fmt, "--partition", "nosuch", env=_env(lab), timeout=180)
        assert (rc, out) == (2, ""), (rc, out, err)
        assert err == ("transit-launch: error: doctor --on-node checked no node: srun could not start a step: "
                       "srun: error: Unable to allocate resources: Invalid partition name specified\n"), err


def test_a_controller_that_does_not_answer_fails_in_one_line(cli, lab, tmp_path):
    with socket.socket() as held:  # bound, never listening: srun's connection is refused
        held.bind(("127.0.0.1", 0))
        conf = tmp_path / "slurm.conf"
        # MessageTimeout=1: srun tries the refused connection for that many seconds, not Slurm's default 10
        conf.write_text(re.sub(r"^SlurmctldPort=.*$", f"SlurmctldPort={held.getsockname()[1]}\nMessageTimeout=1",
                               lab.conf.read_text(), flags=re.M))
        rc, out, err = cli("doctor", "--on-node", env={"SLURM_CONF": str(conf)}, timeout=180)
    assert (rc, out) == (2, ""), (rc, out, err)
    assert err == ("transit-launch: error: doctor --on-node checked no node: srun could not start a step: srun: error: "
                   "Unable to allocate resources: Unable to contact slurm controller (connect failure)\n"), err


def test_without_srun_or_without_on_node_the_options_are_refused(cli, tmp_path):
    rc, out, err = cli("doctor", "--on-node", env={"PATH": str(tmp_path)})
    assert (rc, out, err.strip()) == (2, "", "transit-launch: error: doctor --on-node needs Slurm's srun on PATH")
    rc, _, err = cli("doctor", "--partition", "gpu")
    assert rc == 2 and err.count("\n") == 1 and "without --on-node doctor checks this machine" in err
