"""The SPANK plugin as a security boundary, on the real Slurm lab (tests/slurm_lab.py):
what a user sets cannot widen what the site's plugstack line allows. Each job batches
several attacks, one probe row per step:

- oversubscribe=deny: TRANSIT_ALLOW_OVERSUBSCRIBE exported at submit, inside the script
  before srun, and through srun --export, is gone in every step;
- values that did not come through the plugin's option checks do not count: SPANK_TRANSIT_*
  exported at submit are ignored, SLURM_SPANK_TRANSIT_* exported at submit are overwritten,
  and ones exported inside the script (and forged _SLURM_SPANK_OPTION_* values) go
  through the option checks on the node, which refuse bad ones;
- LD_PRELOAD keeps the user's entries with the shim first, exactly once, at any length,
  space- or colon-separated; --transit=off in a step takes the shim out again;
- a site default=advise line written by `spank install --prefix`: --transit=off injects
  nothing and leaves the user's PYTORCH_ALLOC_CONF; without the option the installed copy
  of the shim is injected, and oversubscribe=allow sets the variable;
- bad plugstack lines fail sbatch with one line of the plugin's; bad --transit-budget
  values fail at submission."""

import os
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.slurm_lab import missing
from transit_launch.preload import inject

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))
ADAPTER = str(inject.adapter_dir())
ROW = ('echo "ROW|$0|$SLURMD_NODENAME|$LD_PRELOAD|$TRANSIT_POLICY|$PYTHONPATH|$PYTORCH_ALLOC_CONF|'
       '$TRANSIT_GPU_BUDGET|$TRANSIT_STATS|${TRANSIT_ALLOW_OVERSUBSCRIBE-unset}"')
FIELDS = ("tag", "node", "preload", "policy", "pypath", "alloc", "budget", "stats", "allow")
SRUN = "/usr/bin/srun"


def script(lab, name, body):
    path = lab.lab / "jobs" / name
    path.write_text(f"#!/bin/bash\nrow='{ROW}'\n/bin/bash -c \"$row\" batch\n{body}")
    return path


def submit(lab, *args, env=None):
    # stderr in a file of its own. slurmstepd forwards a task's stdout in messages of at most
    # 1024 bytes (the "long" row is 10 kB) and writes its own errors (the plugin's, from every
    # step after the script exports a bad SLURM_SPANK_TRANSIT_STATS) to the step's stderr; it
    # reads the two pipes apart, so when it gets to them late (under load) both are full and
    # stderr's lines go out between the row's pieces. srun appends both to the job's file in
    # that order: in one file the row was cut after a piece (a row without its last fields)
    res = lab.cmd("sbatch", "--parsable", "-o", "out-%j.txt", "-e", "err-%j.txt", *args, env=env)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def rows_of(lab, job):
    """The job's probe rows (its stdout), and its stdout and stderr for messages."""
    info = lab.wait_job(job, timeout=120)
    out, err = ((lab.lab / "jobs" / f"{kind}-{job}.txt").read_text() for kind in ("out", "err"))
    assert info["JobState"] == "COMPLETED", out + err
    rows = [dict(zip(FIELDS, line.split("|")[1:])) for line in out.splitlines() if line.startswith("ROW|")]
    assert all(len(r) == len(FIELDS) for r in rows), out + err  # each row whole, as its step wrote it
    return rows, out + "\n--- stderr\n" + err


def entries(preload):
    return [e for e in preload.replace(" ", ":").split(":") if e]


def test_user_cannot_widen_the_site_policy(lab):
    body = f"""{SRUN} -N2 --ntasks-per-node=1 /bin/bash -c "$row" plain
export TRANSIT_ALLOW_OVERSUBSCRIBE=1 SLURM_SPANK_TRANSIT_GPU_BUDGET=1e99 SPANK_TRANSIT_STATS=/etc/evil
export SLURM_SPANK_TRANSIT_STATS=$'/x\\ny'
{SRUN} -N2 --ntasks-per-node=1 /bin/bash -c "$row" exported
{SRUN} -N1 --export=ALL,TRANSIT_ALLOW_OVERSUBSCRIBE=1 /bin/bash -c "$row" srun-export
{SRUN} -N1 --export=NONE /bin/bash -c "$row" srun-none
_SLURM_SPANK_OPTION_transit_transit=bogus _SLURM_SPANK_OPTION_transit_transit_budget=nan \\
    {SRUN} -N1 /bin/bash -c "$row" forged
SLURM_SPANK_TRANSIT_POLICY=bogus {SRUN} -N1 /bin/bash -c "$row" forged-job-env
{SRUN} -N1 --transit=off /bin/bash -c "$row" off
LD_PRELOAD="libm.so.6 libdl.so.2:{lab.shim}" {SRUN} -N1 /bin/bash -c "$row" spaces
LD_PRELOAD="$(printf 'libm.so.6:%.0s' {{1..1000}})libdl.so.2" {SRUN} -N1 /bin/bash -c "$row" long
"""
    env = dict(lab.env, TRANSIT_ALLOW_OVERSUBSCRIBE="1", SPANK_TRANSIT_GPU_BUDGET="abc",
               SPANK_TRANSIT_STATS="/etc/evil", SLURM_SPANK_TRANSIT_STATS="/etc/evil2")
    job = submit(lab, "-N2", "--transit=advise", "--transit-budget=40GB",
                 "--export=ALL,SLURM_SPANK_TRANSIT_STATS=/etc/evil3,TRANSIT_ALLOW_OVERSUBSCRIBE=1",
                 str(script(lab, "widen.sh", body)), env=env)
    rows, out = rows_of(lab, job)
    tags = [r["tag"] for r in rows]
    assert sorted(set(tags)) == sorted(["batch", "plain", "exported", "srun-export", "srun-none", "forged",
                                        "forged-job-env", "off", "spaces", "long"]), out
    assert tags.count("plain") == tags.count("exported") == 2
    for r in rows:
        assert r["allow"] == "unset", r  # oversubscribe=deny, whoever set it
        if r["tag"] == "off":
            assert lab.shim not in entries(r["preload"]) and ADAPTER not in r["pypath"].split(":"), r
            continue
        pre = entries(r["preload"])
        assert pre[0] == lab.shim and pre.count(lab.shim) == 1, r
        assert r["policy"] == "advise" and r["budget"] == "40GB", r  # forged values refused on the node
        assert r["stats"] == "", r  # no SPANK_TRANSIT_STATS, no exported or --export'ed SLURM_SPANK_TRANSIT_STATS
        assert r["pypath"].split(":")[0] == ADAPTER, r
    by = {r["tag"]: r for r in rows}
    assert by["spaces"]["preload"] == f"{lab.shim}:libm.so.6:libdl.so.2"
    assert entries(by["long"]["preload"]) == [lab.shim, *["libm.so.6"] * 1000, "libdl.so.2"]
    assert len(by["long"]["preload"]) > 8192


@contextmanager
def site_line(lab, line):
    """The lab's plugstack.conf replaced for a test (sbatch and every new slurmstepd read it)."""
    conf = lab.lab / "etc" / "plugstack.conf"
    old = conf.read_text()
    lab.write_plugstack(line)
    try:
        yield
    finally:
        conf.write_text(old)


def test_installed_default_advise_and_off(lab, cli, built, tmp_path):
    """`spank install --prefix` with default=advise oversubscribe=allow is the site's line:
    a job without the option gets the installed copy of the shim; --transit=off gets
    nothing, also in srun steps, and the user's own variables stay."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    prefix = tmp_path / "site"
    env = dict(os.environ, TRANSIT_SHIM=str(built["shim"]), TRANSIT_ADAPTER_DIR=ADAPTER)
    rc, out, err = cli("spank", "install", "--prefix", str(prefix), "--plugstack-dir", str(tmp_path / "conf"),
                       "--default", "advise", "--oversubscribe", "allow", env=env)
    assert rc == 0, err
    line = (tmp_path / "conf" / "transit.conf").read_text().splitlines()[-1]
    shim = str(prefix / "lib" / "transit-launch" / "libtransit.so")
    body = f'{SRUN} -N1 /bin/bash -c "$row" step\n'
    user = dict(lab.env, LD_PRELOAD="libm.so.6", PYTORCH_ALLOC_CONF="mine", PYTHONPATH="/mine")
    with site_line(lab, line):
        off = submit(lab, "-N1", "--transit=off", str(script(lab, "off.sh", body)), env=user)
        dflt = submit(lab, "-N1", str(script(lab, "default.sh", body)), env=user)
        rows_off, out_off = rows_of(lab, off)
        rows_dflt, out_dflt = rows_of(lab, dflt)
    assert [r["tag"] for r in rows_off] == ["batch", "step"], out_off
    for r in rows_off:
        assert (r["preload"], r["pypath"], r["alloc"], r["policy"]) == ("libm.so.6", "/mine", "mine", ""), r
    assert [r["tag"] for r in rows_dflt] == ["batch", "step"], out_dflt
    for r in rows_dflt:
        assert r["preload"] == f"{shim}:libm.so.6" and r["policy"] == "advise" and r["allow"] == "1", r
        assert r["pypath"] == f"{prefix}/lib/transit-launch/adapter:/mine", r
        assert r["alloc"] == "backend:native,expandable_segments:False", r


def _alt_conf(lab, name, line):
    plug = lab.lab / "etc" / f"plugstack-{name}.conf"
    plug.write_text(line + "\n")
    conf = lab.lab / "etc" / f"slurm-{name}.conf"
    conf.write_text(lab.conf.read_text().replace(str(lab.lab / "etc/plugstack.conf"), str(plug)))
    return dict(lab.env, SLURM_CONF=str(conf))


def test_bad_plugstack_lines_fail_sbatch_with_one_line(lab, tmp_path):
    """What sbatch says with each bad line: the plugin's one line (Slurm adds its own)."""
    os.chmod(tmp_path, 0o755)
    writable = tmp_path / "libtransit.so"
    writable.write_bytes(Path(lab.shim).read_bytes())
    os.chmod(writable, 0o666)
    cases = {
        "dup": (f"shim={lab.shim} oversubscribe=deny oversubscribe=allow", "oversubscribe= is given twice"),
        "relative": ("shim=lib/libtransit.so", "shim=lib/libtransit.so: not an absolute path"),
        "missing": ("shim=/nonexistent/libtransit.so", "/nonexistent does not exist"),
        "writable": (f"shim={writable}", f"{writable} is writable by group or others"),
        "noshim": ("default=off", "gives no shim=PATH"),
    }
    for name, (args, needle) in cases.items():
        res = lab.cmd("sbatch", "--wrap", "true", env=_alt_conf(lab, name, f"required {lab.plugin} {args}"))
        ours = [line for line in res.stderr.splitlines() if "transit:" in line]
        assert res.returncode != 0 and len(ours) == 1 and needle in ours[0], (name, res.stderr)


@pytest.mark.parametrize("value", ["1e99", "nan", "inf", "1e-300", "0x10GB", "-5GB", "40GB\n#x"])
def test_budget_outside_the_grammar_refused_at_submit(lab, value):
    res = lab.cmd("sbatch", "--transit=advise", f"--transit-budget={value}", "--wrap", "true")
    assert res.returncode != 0 and "expected a size such as 40GB" in res.stderr, res.stderr


@pytest.mark.parametrize("value, said", [("999TB", "is above 1TiB"), ("256MB", "is below 512MiB")])
def test_budget_no_gpu_has_refused_at_submit(lab, cli, value, said):
    """The plugin cannot know the node's GPU at submit time: a budget above what any GPU has
    (rules.GPU_BUDGET_MAX, a typo such as 999TB for 99GB) is refused there, as the CLI
    refuses it, instead of reaching the job as the shim's warning on its node."""
    res = lab.cmd("sbatch", "--transit=advise", f"--transit-budget={value}", "--wrap", "true")
    ours = [line for line in res.stderr.splitlines() if "transit:" in line]
    assert res.returncode != 0 and len(ours) == 1 and said in ours[0], res.stderr
    rc, out, err = cli("run", "--gpu-budget", value, "--", "true")
    assert rc == 2 and out == "" and err.count("\n") == 1 and said in err, err


def test_cli_budget_outside_the_grammar_refused(cli):
    for value in ("1e99", "nan", "0x10GB"):
        rc, out, err = cli("render", "--nodes", "1", "--gpu-budget", value, "--", "python", "train.py")
        assert rc == 2 and "Traceback" not in err and value in err, err


def test_salloc_the_same(lab):
    """salloc hands the options to the allocation's steps like sbatch, and overwrites the
    SLURM_SPANK_TRANSIT_* a user exported; without the option nothing is injected."""
    env = dict(lab.env, TRANSIT_ALLOW_OVERSUBSCRIBE="1", SLURM_SPANK_TRANSIT_STATS="/etc/evil",
               SLURM_SPANK_TRANSIT_POLICY="advise")
    rows = {}
    for tag, extra in (("on", ["--transit=prefetch"]), ("none", [])):
        res = lab.cmd("salloc", "-N1", *extra, SRUN, "/bin/bash", "-c", ROW, tag, env=env, timeout=60)
        assert res.returncode == 0, res.stderr
        rows[tag] = dict(zip(FIELDS, res.stdout.strip().split("|")[1:]))
    assert entries(rows["on"]["preload"]) == [lab.shim] and rows["on"]["policy"] == "prefetch", rows
    assert rows["none"]["preload"] == "" and rows["none"]["policy"] == "", rows
    assert all(r["stats"] == "" and r["allow"] == "unset" for r in rows.values()), rows
