"""Nothing a user plants runs as root or as another user (issue 49), attacked the way an
outside review did as unprivileged users:

1. doctor --on-node ran `python -c` on a node as root: a `socket.py` in the caller's
   directory (or in /tmp, where srun goes when that directory is missing) ran as uid 0;
2. sweep --slurm's per-node helpers ran `python -m` from the job's directory, as root;
3. a scale-in job took a transit-JOBID directory another user had made before it (and
   sourced a file from it), and `status` showed that user's forged records;
4. a model card's name reached `#SBATCH --job-name=` unchecked (and --sbatch-arg took
   sbatch's abbreviations of the script's own options);
5. `sweep --restore` killed the process group a journal named before checking whose
   journal it was.
Also the adapter's own modules, which the job's script directory could shadow.

Users: root runs the commands and the jobs; `nobody` plants. The jobs run on the real lab
cluster (tests/slurm_lab.py)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from transit_launch.errors import UsageError
from transit_launch.isolated import transit_launch_argv

NOBODY = 65534
ADAPTER_MODULES = ("transit_api", "transit_step", "transit_streamed", "transit_state_pool", "transit_sparse",
                   "transit_staging", "transit_host", "transit_split", "transit_rules")


def _need_root():
    if os.geteuid() != 0:
        pytest.skip("needs root: the attacks are another user's files against root's commands")


def _plant(d: Path, name: str, marker: Path) -> Path:
    """A module `name` in d that, when imported, appends its importer's uid, Slurm job (- for
    none) and command line to marker (a failure names the process) and then becomes the real
    module (so a process that imports it by mistake still works)."""
    path = d / f"{name}.py"
    path.write_text(
        "import os, sys, sysconfig, importlib.util\n"
        f"with open({str(marker)!r}, 'a') as f: "
        "f.write(f'{os.getuid()} {os.environ.get(\"SLURM_JOB_ID\", \"-\")} {sys.argv!r}\\n')\n"
        f"_p = os.path.join(sysconfig.get_paths()['stdlib'], {name + '.py'!r})\n"
        f"if os.path.exists(_p):\n"
        f"    _s = importlib.util.spec_from_file_location({name!r}, _p); _m = importlib.util.module_from_spec(_s)\n"
        f"    sys.modules[{name!r}] = _m; _s.loader.exec_module(_m)\n")
    return path


def _planted_dir(parent: Path, marker: Path, *names: str) -> Path:
    """A directory of nobody's, mode 0755, holding planted modules."""
    d = parent / "theirs"
    d.mkdir()
    for n in names:
        _plant(d, n, marker)
    for p in [d, *d.iterdir()]:
        os.lchown(p, NOBODY, NOBODY)
    d.chmod(0o755)
    return d


# --- the isolated command itself (no Slurm) ------------------------------------------------


def test_the_isolated_command_imports_nothing_from_its_directory(tmp_path):
    """transit_launch_argv (what every helper and launcher runs) started in a directory
    with a planted socket.py, json.py and transit_launch/: the CLI runs, nothing planted is
    imported. The same command with plain `python -m` imports the plant (the check can fail)."""
    marker = tmp_path / "imported-by"
    d = tmp_path / "theirs"
    d.mkdir()
    for name in ("socket", "json"):
        _plant(d, name, marker)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run(transit_launch_argv("plan", "--model", "llama3-8b", "--json"), cwd=d, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) and not marker.exists(), marker.read_text() if marker.exists() else ""
    # the control: -m puts the directory first on sys.path
    subprocess.run([sys.executable, "-m", "json.tool", "--help"], cwd=d, capture_output=True, timeout=60)
    assert marker.exists(), "the planted json.py was not imported by plain -m: the check above proves nothing"


def test_the_rendered_launcher_is_isolated(cli, tmp_path):
    """The node-loss launcher of a rendered scale-in script (`tl=( ... )`), run by bash in a
    directory with a planted socket.py, runs transit-launch and imports nothing there."""
    card = tmp_path / "tiny.toml"
    from tests.test_node_loss import TINY
    card.write_text(TINY)
    rc, script, err = cli("render", "--model", str(card), "--nodes", "1", "--gpus-per-node", "1",
                          "--on-node-loss", "scale-in", "--", "python3", "train.py")
    assert rc == 0, err
    tl = next(line for line in script.splitlines() if line.startswith("tl=( "))
    assert " -I " in tl and " -m " not in tl, tl
    marker = tmp_path / "imported-by"
    d = tmp_path / "theirs"
    d.mkdir()
    _plant(d, "socket", marker)
    res = subprocess.run(["bash", "-c", f'{tl}\n"${{tl[@]}}" --help'], cwd=d, capture_output=True, text=True,
                         timeout=120, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert res.returncode == 0 and "usage: transit-launch _node-loss" in res.stdout, res.stderr
    assert not marker.exists()


# --- 1. doctor --on-node ---------------------------------------------------------------------


@pytest.mark.parametrize("where", ["callers-directory", "srun-fallback-tmp"])
def test_doctor_on_node_runs_nothing_planted_as_root(lab, tmp_path, where):
    """Root runs `doctor --on-node` in a directory where nobody planted socket.py (or in
    /tmp, where srun goes when the caller's directory is missing on the node): the node's
    checks come back and the plant never ran. The caller itself is started isolated too
    (as the installed console script would be), so only the srun step is under test."""
    _need_root()
    marker = tmp_path / "imported-by"
    tmp_path.chmod(0o755)
    if where == "callers-directory":
        cwd = _planted_dir(tmp_path, marker, "socket", "transit_launch")
        planted = [cwd / "socket.py"]
    else:  # the node's fallback directory, planted for the few seconds of the call
        cwd = Path(tempfile.gettempdir())
        planted = [_plant(cwd, "socket", marker)]
        os.lchown(planted[0], NOBODY, NOBODY)
    try:
        res = subprocess.run(transit_launch_argv("doctor", "--on-node", "--json"), cwd=cwd, capture_output=True,
                             text=True, timeout=180, env={**lab.env, "TRANSIT_SHIM": lab.shim})
    finally:
        if where != "callers-directory":
            for p in planted:
                p.unlink()
    assert res.returncode == 0, res.stderr
    checks = {c["check"]: c for c in json.loads(res.stdout)}
    assert checks["on a compute node"]["node"] in {"n1", "n2", "n3", "n4"}
    # in /tmp the plant is there for every process of the machine: other tests' `python -m
    # transit_launch` runs in /tmp import it too; the doctor's own (its srun step's, or its own) count
    ran = marker.read_text().splitlines() if marker.exists() else []
    ours = [ln for ln in ran if where == "callers-directory" or ln.split()[1] != "-" or "'doctor'" in ln]
    assert not ours, f"the planted module ran (uid, Slurm job, command line): {ours}"


# --- 2. sweep --slurm's helpers ----------------------------------------------------------------


def test_sweep_helpers_run_nothing_planted_on_the_nodes(lab, tmp_path):
    """A root job runs `sweep --slurm` from a directory where nobody planted socket.py: the
    per-node helpers (one srun task per node, as root) import nothing there. The interface
    does not exist, so the helpers' check refuses before any cap: the plant would have run
    in that very check."""
    _need_root()
    marker = tmp_path / "imported-by"
    tmp_path.chmod(0o755)
    work = _planted_dir(tmp_path, marker, "socket")
    out = tmp_path / "out.txt"
    cmd = transit_launch_argv("sweep", "--slurm", "--cap", "tc", "--iface", "nosuch0", "--bandwidths", "100mbit",
                              "--journal", str(tmp_path / "netcap-%n.json"), "--", "true")
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\n{shlex.join(cmd)}\necho \"rc=$?\"\n")
    res = lab.cmd("sbatch", "--parsable", "-N2", f"--chdir={work}", "-o", str(out), str(script))
    assert res.returncode == 0, res.stderr
    lab.wait_job(res.stdout.strip(), timeout=120)
    text = out.read_text()
    assert text.endswith("rc=2\n") and "unknown interface nosuch0" in text, text
    assert not marker.exists(), f"the planted module ran (uid, command line): {marker.read_text()}"


# --- 3. the job's directory ----------------------------------------------------------------


def _tiny_card(d: Path) -> Path:
    from tests.test_node_loss import TINY
    card = d / "tiny.toml"
    card.write_text(TINY)
    card.chmod(0o644)
    return card


def _last_job_id(lab) -> int:
    res = lab.cmd("sbatch", "--parsable", "--hold", "--wrap", "true")
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip()
    lab.cmd("scancel", job)
    return int(job)


@pytest.mark.parametrize("sticky", [True, False], ids=["sticky-shared", "open-shared"])
def test_a_job_directory_made_before_the_job_is_refused(cli, lab, tmp_path, sticky):
    """nobody pre-makes transit-ID (mode 0777) for the next job ids in a shared directory,
    with an attempt.env that runs code and forged transition records; root's scale-in job
    from that directory refuses it in one line before running anything, and `status --json`
    refuses the directory instead of showing the forged records. Without the sticky bit the
    shared directory itself is refused (anyone could swap the job's directory there)."""
    _need_root()
    tmp_path.chmod(0o755)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777 if sticky else 0o777)
    card = _tiny_card(tmp_path)
    marker = tmp_path / "ran-as"
    first = _last_job_id(lab) + 1
    forged = {"action": "scale-in", "restart": 0, "attempt": 1, "lost_nodes": ["n1"], "forged": True}
    for jid in range(first, first + 6):
        d = shared / f"transit-{jid}"
        d.mkdir()
        (d / "attempt.env").write_text(f"id -u > {marker}\n")
        (d / "transitions.jsonl").write_text(json.dumps(forged) + "\n")
        for p in (d, *d.iterdir()):
            os.lchown(p, NOBODY, NOBODY)
            p.chmod(0o777 if p.is_dir() else 0o666)
    rc, script, err = cli("render", "--model", str(card), "--nodes", "1", "--gpus-per-node", "1",
                          "--on-node-loss", "scale-in", "--output", str(tmp_path / "out-%j.txt"),
                          "--", "python3", "train.py")
    assert rc == 0, err
    (tmp_path / "job.sh").write_text(script)
    res = lab.cmd("sbatch", "--parsable", f"--chdir={shared}", str(tmp_path / "job.sh"))
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip()
    assert first <= int(job) < first + 6, (first, job)
    info = lab.wait_job(job, timeout=120)
    out = (tmp_path / f"out-{job}.txt").read_text()
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "2:0", (info, out)
    why = (f"job directory {shared}/transit-{job} exists already and this job did not make it" if sticky else
           f"{shared} can be written by every user and is not sticky")
    assert why in out and out.count("transit-launch: error:") == 1, out
    assert not marker.exists(), f"the planted attempt.env ran as uid {marker.read_text().split()}"
    rc, sout, serr = cli("status", "--json", job, env={"SLURM_CONF": str(lab.conf)})
    # the forged directory is there: refused, not shown
    assert (rc, sout) == (2, "") and serr.count("\n") == 1, (rc, sout, serr)
    assert f"transit-{job} is owned by uid {NOBODY}, not by the job's user (uid 0)" in serr, serr


def test_job_directory_checks(tmp_path):
    """JobDir (no Slurm): made exclusively and private; a directory or file another user
    owns or can write, or a link planted at a record's name, is refused, never read."""
    from transit_launch.slurm.jobdir import JobDir
    d = JobDir(tmp_path / "transit-1", create=True)
    assert stat.S_IMODE(os.stat(tmp_path / "transit-1").st_mode) == 0o700
    d.write("transitions.jsonl", "x\n")
    assert d.read("transitions.jsonl") == "x\n" and d.read("missing") is None
    assert stat.S_IMODE(os.stat(tmp_path / "transit-1" / "transitions.jsonl").st_mode) == 0o600
    with pytest.raises(UsageError, match="exists already and this job did not make it"):
        JobDir(tmp_path / "transit-1", create=True)
    (tmp_path / "secret").write_text("root's\n")
    os.symlink(tmp_path / "secret", tmp_path / "transit-1" / "link.json")
    with pytest.raises(UsageError, match="refusing to read it"):
        d.read("link.json")
    d.close()
    (tmp_path / "transit-1").chmod(0o770)
    with pytest.raises(UsageError, match="can be written by others"):
        JobDir(tmp_path / "transit-1")
    os.symlink(tmp_path / "transit-1", tmp_path / "transit-2")
    with pytest.raises(UsageError, match="refusing to use it"):
        JobDir(tmp_path / "transit-2")
    with pytest.raises(UsageError, match="not by the job's user"):
        JobDir(tmp_path / "transit-1", uid=os.geteuid() + 1)


def test_a_directory_of_another_job_is_refused(tmp_path):
    """A second review: in a group-writable working directory a member could swap the job's
    directory for another of the same user's; the directory names its job."""
    from transit_launch.slurm.jobdir import JobDir
    JobDir(tmp_path / "transit-5", create=True, job="5").close()
    JobDir(tmp_path / "transit-6", create=True, job="6").close()
    os.rename(tmp_path / "transit-6", tmp_path / "transit-6.real")
    os.rename(tmp_path / "transit-5", tmp_path / "transit-6")
    with pytest.raises(UsageError, match="is not job 6's"):
        JobDir(tmp_path / "transit-6", job="6")
    big = JobDir(tmp_path / "transit-6.real", job="6")
    (tmp_path / "transit-6.real" / "transitions.jsonl").write_bytes(b"x" * ((64 << 20) + 1))
    with pytest.raises(UsageError, match="larger than 64 MiB"):
        big.read("transitions.jsonl")
    big.close()


def test_an_output_file_in_a_directory_others_can_write_is_refused(tmp_path, monkeypatch):
    """A second review: a member of a group directory planted links under the next job ids'
    default output names (transit-llama3-8b-N.out) and the victim's job overwrote its own
    .bashrc through them. submit refuses such an output before sbatch; a private directory
    passes."""
    from transit_launch.slurm import script
    shared = tmp_path / "proj"
    shared.mkdir()
    shared.chmod(0o2770)
    monkeypatch.setattr(script, "_kernel_protects", lambda: False)
    why = script.shared_output("%x-%j.out", str(shared))
    assert why and "other users can write" in why and "give --output" in why
    private = tmp_path / "mine"
    private.mkdir(mode=0o700)
    assert script.shared_output(str(private / "%x-%j.out"), str(shared)) is None
    sticky = tmp_path / "scratch"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert script.shared_output("%x-%j.out", str(sticky))  # the kernel's protection is off (stood in)
    monkeypatch.setattr(script, "_kernel_protects", lambda: True)
    assert script.shared_output("%x-%j.out", str(sticky)) is None and script.shared_output("%x-%j.out", str(shared))


def test_submit_refuses_a_shared_output_before_sbatch(cli, lab, tmp_path):
    shared = tmp_path / "proj"
    shared.mkdir()
    shared.chmod(0o2770)
    res = subprocess.run(transit_launch_argv("submit", "--model", "llama3-8b", "--nodes", "1", "--", "true"),
                         cwd=shared, capture_output=True, text=True, timeout=120, env=lab.env)
    assert res.returncode == 2 and res.stderr.count("transit-launch: error:") == 1, res
    assert "other users can write" in res.stderr and not list(shared.iterdir())


def test_control_characters_reach_no_terminal():
    from transit_launch.table import table
    out = table(["field", "value"], [["JobName", "x\x1b]0;owned\x07\x1b[31m"]], "ll")
    assert "\x1b" not in out and "\x07" not in out and "\\x1b]0;owned\\x07" in out


def test_restore_of_a_group_not_ours_is_one_line(monkeypatch):
    """A user's own journal naming another user's process group: the kernel refuses the
    kill (EPERM; stood in for here: the suite runs as root, and the other users cannot run
    its Python), which is one line, not a PermissionError traceback."""
    from transit_launch.netcap import journal as jn
    victim = _victim_group()
    try:
        def refused(pgid, sig):
            raise PermissionError(1, "Operation not permitted")
        monkeypatch.setattr(jn.os, "killpg", refused)
        job = {"pgid": victim.pid, **jn.identity(victim.pid)}
        with pytest.raises(UsageError, match=f"cannot end process group {victim.pid}, which the journal names: it "
                                             "is not yours"):
            jn.end_orphan(job)
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_job_directory_files_of_another_user_are_refused(tmp_path):
    _need_root()
    from transit_launch.slurm.jobdir import JobDir
    d = JobDir(tmp_path / "transit-1", create=True)
    f = tmp_path / "transit-1" / "transitions.jsonl"
    f.write_text("forged\n")
    os.chown(f, NOBODY, NOBODY)
    with pytest.raises(UsageError, match=f"owned by uid {NOBODY}"):
        d.read("transitions.jsonl")
    d.close()


# --- 4. #SBATCH values ---------------------------------------------------------------------------


def test_a_model_cards_name_adds_no_sbatch_option(cli, tmp_path):
    """A card named `m --export=ALL,BASH_ENV=FILE` would have put that option on the
    #SBATCH --job-name line: one line, exit 2, nothing written; with --job-name it renders."""
    from tests.test_node_loss import TINY
    card = tmp_path / "evil.toml"
    card.write_text(TINY.replace('name = "tiny-node-loss"', f'name = "m --export=ALL,BASH_ENV={tmp_path}/x"'))
    out = tmp_path / "job.sh"
    rc, stdout, err = cli("render", "--model", str(card), "--nodes", "1", "--gpus-per-node", "1", "-o", str(out),
                          "--", "python3", "train.py")
    assert (rc, stdout) == (2, "") and err.count("\n") == 1 and not out.exists(), (rc, err)
    assert "the job name 'transit-m --export=" in err and "give --job-name" in err, err
    rc, _, err = cli("render", "--model", str(card), "--nodes", "1", "--gpus-per-node", "1", "--job-name", "mine",
                     "-o", str(out), "--", "python3", "train.py")
    assert rc == 0, err
    assert [ln for ln in out.read_text().splitlines() if ln.startswith("#SBATCH --job-name")] == \
        ["#SBATCH --job-name=mine"]
    assert "--export" not in "".join(ln for ln in out.read_text().splitlines() if ln.startswith("#SBATCH"))


@pytest.mark.parametrize("name", ["1/../../../tmp/mal/leak", "x%j", "a/b"])
def test_a_card_name_names_no_other_file(cli, tmp_path, name):
    """A second review: the default output is %x-%j.out, so a card named with / (or %, or a
    leading dot) put the job's output through a path of the card writer's choosing (a link
    there overwrote the victim's .bashrc, and root's files when root submitted)."""
    from tests.test_node_loss import TINY
    card = tmp_path / "evil.toml"
    card.write_text(TINY.replace('name = "tiny-node-loss"', f'name = "{name}"'))
    rc, out, err = cli("render", "--model", str(card), "--nodes", "1", "--gpus-per-node", "1", "--", "python3", "x")
    assert (rc, out) == (2, "") and err.count("\n") == 1 and "give --job-name" in err, (rc, err)
    for given in (name, ".hidden"):
        rc, out, err = cli("render", "--model", "llama3-8b", "--job-name", given, "--", "python3", "x")
        assert (rc, out) == (2, "") and "a job name is letters, digits" in err, (rc, err)


def test_a_catalog_name_is_the_catalogs_whatever_the_directory_holds(tmp_path):
    """A file named llama3-8b planted in the working directory stood in for the catalog's
    card (plan, render, submit, and the scale-in job's re-plans)."""
    from tests.test_node_loss import TINY
    d = tmp_path / "shared"
    d.mkdir()
    (d / "llama3-8b").write_text(TINY.replace('name = "tiny-node-loss"', 'name = "planted"'))
    res = subprocess.run(transit_launch_argv("plan", "--model", "llama3-8b", "--json"), cwd=d, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["model"] == "llama3-8b" and "planted" not in res.stdout
    from transit_launch.slurm import nodeloss
    from transit_launch.planning.plan import Request, plan
    from transit_launch.planning.models import load_model
    from transit_launch.planning.hardware import gpu_profile
    cwd = os.getcwd()
    os.chdir(d)
    try:
        p = plan(Request(load_model("llama3-8b"), gpu_profile("h100-80gb")))
        flags = nodeloss.plan_flags(nodeloss.NodeLossOptions("scale-in", model="llama3-8b"), p, 2)
    finally:
        os.chdir(cwd)
    assert flags[flags.index("--model") + 1] == "llama3-8b"


def test_forged_records_are_no_json_bomb():
    from transit_launch.slurm import nodeloss
    assert nodeloss.records("[" * 200_000 + "\n" + '{"action": "scale-in"}\n') == [{"action": "scale-in"}]


def test_status_takes_no_owner_or_place_from_free_form_fields(cli, lab, tmp_path):
    """A job's name and comment are its owner's words: ' UserId=... WorkDir=... JobId=...'
    in them made `status --json` read another user's records as this job's."""
    forged = "x UserId=transit-victim(1001) WorkDir=/home/transit-victim/work JobId=4242 JobState=COMPLETED"
    res = lab.cmd("sbatch", "--parsable", "--hold", f"--comment={forged}", f"--job-name={forged}", "--wrap", "true")
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip()
    try:
        rc, out, err = cli("status", "--json", job, env={"SLURM_CONF": str(lab.conf)})
        assert rc == 0, err
        info = json.loads(out)
        assert (info["JobId"], info["UserId"], info["JobState"]) == (job, "root(0)", "PENDING"), info
        assert info["WorkDir"] == str(lab.lab / "jobs") and info["transitions"] == []
    finally:
        lab.cmd("scancel", job)


@pytest.mark.parametrize("arg,names", [
    ("--job-nam=x", "--job-name"), ("--gpus-per-n=1", "--gpus-per-node"), ("--ntasks-per-no=2", "--ntasks-per-node"),
    ("--node=3", "--nodes"), ("--par=debug", "--partition"), ("--ntasks=3", None), ("--gpus=4", None),
    ("--mem-per-cpu=4G", None), ("--gres=gpu:2", None), ("--gre=tmp:1,gpu:a100:2", None)])
def test_sbatch_arg_refuses_what_abbreviates_or_overrides_the_scripts_options(cli, arg, names):
    """sbatch takes any unambiguous prefix of a long option; these each set (or contradict)
    what the script sets itself."""
    rc, out, err = cli("render", "--model", "llama3-8b", "--nodes", "2", f"--sbatch-arg={arg}", "--", "python", "x")
    assert (rc, out) == (2, "") and err.count("\n") == 1, (rc, err)
    assert "transit-launch sets" in err and (names is None or f"abbreviates {names}" in err), err


@pytest.mark.parametrize("arg", ["--qos=high", "--gres=nvme:1", "--gres-flags=enforce-binding", "--nodelist=n1",
                                 "--mail-type=END", "--export=NONE"])
def test_sbatch_arg_keeps_options_of_the_sites_own(cli, arg):
    rc, out, err = cli("render", "--model", "llama3-8b", "--nodes", "2", f"--sbatch-arg={arg}", "--", "python", "x")
    assert rc == 0, err
    assert f"#SBATCH {arg}\n" in out


def test_sbatch_takes_the_abbreviation(lab, tmp_path):
    """The premise of the refusal, on Slurm itself: sbatch sets --job-name from --job-nam."""
    res = lab.cmd("sbatch", "--parsable", "--hold", "--job-nam=abbrev", "--wrap", "true")
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip()
    try:
        assert "JobName=abbrev " in lab.cmd("scontrol", "show", "job", "-o", job).stdout
    finally:
        lab.cmd("scancel", job)


# --- 5. sweep --restore ----------------------------------------------------------------------------


def _victim_group() -> subprocess.Popen:
    """A process group to be protected: a sleep in its own session."""
    return subprocess.Popen(["sleep", "300"], start_new_session=True)


def _journal(path: Path, pgid: int, **job) -> None:
    from transit_launch.netcap import journal as jn
    ident = jn.identity(pgid)
    path.write_text(json.dumps({"version": 2, "host": jn.host_name(), "node": jn.node_name(), "entries": [],
                                "job": {"pgid": pgid, **ident, **job}}))


def _restore(journal: Path):
    return subprocess.run([sys.executable, "-m", "transit_launch", "sweep", "--restore", "--journal", str(journal)],
                          capture_output=True, text=True, timeout=60, cwd=tempfile.gettempdir())


@pytest.mark.parametrize("plant", ["directory", "file", "link", "group-writable"])
def test_restore_acts_on_no_journal_another_user_controls(tmp_path, plant):
    """nobody's journal names a live process group (its start time read from /proc, as the
    review did): root's `sweep --restore` refuses it in one line and the group lives."""
    _need_root()
    victim = _victim_group()
    try:
        tmp_path.chmod(0o755)
        d = tmp_path / "j"
        d.mkdir(mode=0o755)
        target = d / "netcap.json"
        if plant == "link":
            real = tmp_path / "real.json"
            _journal(real, victim.pid)
            target.symlink_to(real)
        else:
            _journal(target, victim.pid)
        if plant == "directory":
            os.chown(d, NOBODY, NOBODY)
        elif plant == "file":
            os.chown(target, NOBODY, NOBODY)
        elif plant == "group-writable":
            target.chmod(0o664)
        res = _restore(target)
        assert res.returncode == 2 and res.stdout == "" and res.stderr.count("\n") == 1, res
        assert "refusing to act on it" in res.stderr or "choose a directory only you can write" in res.stderr
        assert victim.poll() is None, "the process group the journal named was killed"
    finally:
        victim.kill()
        victim.wait()


def test_restore_kills_only_the_recorded_group(tmp_path):
    """A journal of our own: the group is ended when its leader still has the recorded start
    time and user; not when the id now belongs to another process (a start time that
    differs) or the recorded user differs; a journal written on another host is left alone."""
    d = tmp_path / "j"
    d.mkdir(mode=0o700)
    target = d / "netcap.json"
    for job, why in (({"start": "1"}, "reused id"), ({"uid": os.geteuid() + 1}, "another user"),
                     (None, "another host")):
        victim = _victim_group()
        try:
            _journal(target, victim.pid, **(job or {}))
            if job is None:
                data = json.loads(target.read_text())
                target.write_text(json.dumps(dict(data, host="elsewhere")))
            res = _restore(target)
            assert victim.poll() is None, f"{why}: killed ({res.stdout} {res.stderr})"
            if job is None:
                assert res.returncode == 1 and "was written on elsewhere" in res.stdout, res
            else:
                assert res.returncode == 0 and "ended the job" not in res.stdout, res
        finally:
            victim.kill()
            victim.wait()
    victim = _victim_group()
    try:
        _journal(target, victim.pid)
        res = _restore(target)
        assert res.returncode == 0 and f"process group {victim.pid}" in res.stdout, res
        assert victim.wait(timeout=30) == -signal.SIGTERM
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()


def test_a_journal_from_another_host_is_left_for_that_host(tmp_path):
    """Its caps are on that host's NICs and its process group is that host's: `sweep --restore`
    here ends nothing, undoes nothing and keeps the journal byte for byte, saying in one line
    where to run it (docs/security.md: not replayed). On its own host the same journal is
    replayed: the group ended, the entry dropped, the journal gone."""
    d = tmp_path / "j"
    d.mkdir(mode=0o700)
    target = d / "netcap.json"
    # replayed, this entry would be dropped: its namespace does not exist on this host
    entry = {"backend": "tc", "iface": "tsgone52/veth-a", "state": {"root": None}}
    victim = _victim_group()
    try:
        _journal(target, victim.pid)
        here = json.loads(target.read_text())
        target.write_text(json.dumps(dict(here, host="elsewhere", entries=[entry])))
        before = target.read_bytes()
        res = _restore(target)
        assert (res.returncode, res.stderr) == (1, ""), res
        assert res.stdout == (f"ERROR {target} was written on elsewhere: run `transit-launch sweep --restore "
                              f"--journal {target}` there\n")
        assert target.exists() and target.read_bytes() == before and victim.poll() is None
        target.write_text(json.dumps(dict(here, entries=[entry])))
        res = _restore(target)
        assert res.returncode == 0 and f"process group {victim.pid}" in res.stdout, res
        assert "WARNING tc tsgone52/veth-a: network namespace tsgone52 no longer exists" in res.stdout
        assert victim.wait(timeout=30) == -signal.SIGTERM and not target.exists()
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()


# --- the adapter's own modules ---------------------------------------------------------------------


def test_the_adapter_loads_its_modules_from_its_own_directory(tmp_path):
    """The job's script directory is first on sys.path once it runs: modules planted there
    under the adapter's names are not what the adapter loads. sitecustomize imports them
    while site runs, before that directory is on sys.path, so the job's own later import of
    any of the names gets the adapter's too."""
    from transit_launch.preload import inject
    marker = tmp_path / "imported-by"
    d = tmp_path / "job"
    d.mkdir()
    for name in ADAPTER_MODULES:
        _plant(d, name, marker)
    (d / "train.py").write_text(
        "import json, sys\n"
        f"for n in {ADAPTER_MODULES!r}:\n"
        "    __import__(n)\n"
        f"print(json.dumps({{n: sys.modules[n].__file__ for n in {ADAPTER_MODULES!r}}}))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRANSIT_ADAPTER"}
    res = subprocess.run([sys.executable, "train.py"], cwd=d, capture_output=True, text=True, timeout=60,
                         env={**env, "PYTHONPATH": str(inject.adapter_dir())})
    assert res.returncode == 0 and res.stderr == "", res.stderr
    files = json.loads(res.stdout)
    assert {Path(f).resolve().parent for f in files.values()} == {Path(inject.adapter_dir()).resolve()}, files
    assert not marker.exists()
