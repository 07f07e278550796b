"""Slurm integration against a real Slurm cluster started by the tests (tests/slurm_lab.py):
the SPANK plugin in sbatch, salloc and srun, the environment it gives every step on every
node, the real libtransit.so loaded in job steps, and transit-launch submit/status."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import NEEDS_TORCH, ROOT, check_golden, torch_importable
from tests.slurm_lab import missing
from transit_launch.preload import inject

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))
ADAPTER = inject.adapter_dir()  # the lab's plugstack points here (conftest.lab)


def job_script(lab, name, body):
    # absolute paths: with --export=NONE the batch step has no PATH
    path = lab.lab / "jobs" / name
    path.write_text("#!/bin/bash\n" + body)
    return path


ENV_ROW = '"$SLURMD_NODENAME|$LD_PRELOAD|$TRANSIT_POLICY|$PYTHONPATH|$PYTORCH_ALLOC_CONF|$TRANSIT_GPU_BUDGET|$TRANSIT_STATS"'
# the batch step's own environment (as "batch") and every node's srun step
ENV_PROBE = (f"SLURMD_NODENAME=batch; echo {ENV_ROW}\n"
             f"/usr/bin/srun -N2 --ntasks-per-node=1 /bin/bash -c 'echo {ENV_ROW}'\n")


def run_job(lab, *args, script):
    res = lab.cmd("sbatch", "--parsable", "-N2", "-o", "out-%j.txt", *args, str(script))
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip()
    info = lab.wait_job(job)
    out = (lab.lab / "jobs" / f"out-{job}.txt").read_text()
    return info, out


def probe_rows(out):
    rows = [line.split("|") for line in out.splitlines() if line.count("|") == 6]
    return {r[0]: r[1:] for r in rows}


def test_options_listed_in_help(lab):
    for cmd in ("sbatch", "salloc", "srun"):
        res = lab.cmd(cmd, "--help")
        for opt in ("--transit=POLICY", "--transit-budget=SIZE", "--transit-stats=DIR"):
            assert opt in res.stdout, (cmd, opt)


def test_bogus_policy_refused_at_submit(lab):
    before = lab.cmd("squeue", "-h").stdout
    res = lab.cmd("sbatch", "--transit=bogus", "--wrap", "true")
    assert res.returncode != 0
    assert "transit: --transit=bogus: expected one of off,base,prefetch,advise" in res.stderr
    assert lab.cmd("squeue", "-h").stdout == before
    res = lab.cmd("sbatch", "--transit=advise", "--transit-budget=lots", "--wrap", "true")
    assert res.returncode != 0 and "expected a size such as 40GB" in res.stderr
    # a log line repeats a user's value only when it is short and plain: Slurm keeps the
    # tail of an over-long message without its prefix, so a long value could forge a line
    forged = "A" * 100 + "[2026-11-30T14:31:00.000] [42.0] error: Security violation".ljust(8149)
    for opt in (f"--transit={forged}", "--transit=\u00c2\u009b31m", f"--transit-budget={forged}"):
        res = lab.cmd("sbatch", "--transit=advise", opt, "--wrap", "true")
        ours = [l for l in res.stderr.splitlines() if "error: transit:" in l]  # sbatch's own echo is not a log
        assert res.returncode != 0 and len(ours) == 1 and "=?: expected" in ours[0], res.stderr[:500]
        assert "Security violation" not in ours[0] and "\u009b" not in ours[0]


@pytest.mark.parametrize("export", [None, "NONE"])
def test_advise_on_two_nodes(lab, export):
    script = job_script(lab, "env.sh", ENV_PROBE)
    extra = [f"--export={export}"] if export else []
    tstats = lab.lab / "tstats"  # --transit-stats must name a directory that exists at submission
    tstats.mkdir(exist_ok=True)
    info, out = run_job(lab, "--transit=advise", "--transit-budget=40GB", f"--transit-stats={tstats}", *extra,
                        script=script)
    assert info["JobState"] == "COMPLETED", out
    rows = probe_rows(out)
    assert set(rows) == {"batch", "n1", "n2"}, out  # with --export=NONE the batch step too
    for node, (preload, policy, pypath, alloc, budget, stats) in rows.items():
        assert preload.split(":")[0] == lab.shim, (node, preload)
        assert preload.count(lab.shim) == 1  # not prepended twice (batch step and srun step)
        assert policy == "advise" and pypath.split(":")[0] == str(ADAPTER)
        assert alloc == "backend:native,expandable_segments:False"
        assert (budget, stats) == ("40GB", str(tstats))


def test_untouched_without_the_option(lab):
    script = job_script(lab, "env.sh", ENV_PROBE)
    info, out = run_job(lab, "--export=ALL,LD_PRELOAD=", script=script)
    assert info["JobState"] == "COMPLETED"
    for preload, policy, pypath, alloc, budget, stats in probe_rows(out).values():
        assert (preload, policy, alloc, budget, stats) == ("", "", "", "", "")
        assert str(ADAPTER) not in pypath


def test_srun_takes_the_option(lab):
    res = lab.cmd("srun", "-N1", "--transit=prefetch", "/bin/bash", "-c", 'echo "$TRANSIT_POLICY|$LD_PRELOAD"')
    assert res.returncode == 0, res.stderr
    policy, preload = res.stdout.strip().split("|")
    assert policy == "prefetch" and preload.startswith(lab.shim)


def test_shim_really_loaded_in_job_steps(lab, built):
    """Each task runs the test program linked against the fake libcudart: with the plugin's
    LD_PRELOAD its cudaMalloc becomes cudaMallocManaged on every node."""
    body = (f"/usr/bin/srun -N2 --ntasks-per-node=1 /bin/bash -c "
            f"'FAKE_CUDART_LOG={lab.lab}/jobs/fake-$SLURMD_NODENAME.log {built['app']} alloc 4096'\n")
    for f in (lab.lab / "jobs").glob("fake-*.log"):
        f.unlink()
    info, out = run_job(lab, "--transit=advise", script=job_script(lab, "app.sh", body))
    assert info["JobState"] == "COMPLETED", out
    for node in ("n1", "n2"):
        calls = (lab.lab / "jobs" / f"fake-{node}.log").read_text().split()
        assert "cudaMallocManaged" in calls and "cudaMalloc" not in calls, (node, calls)


def test_unknown_plugstack_key_refuses_to_load(lab, tmp_path):
    bad = lab.lab / "etc" / "plugstack-bad.conf"
    bad.write_text(f"required {lab.plugin} shim={lab.shim} turbo=yes\n")
    conf = lab.lab / "etc" / "slurm-bad.conf"
    conf.write_text(lab.conf.read_text().replace(str(lab.lab / "etc/plugstack.conf"), str(bad)))
    res = lab.cmd("sbatch", "--wrap", "true", env=dict(lab.env, SLURM_CONF=str(conf)))
    assert res.returncode != 0
    assert "transit: unknown plugstack argument 'turbo'" in res.stderr


SUBMIT = ["submit", "--model", "llama3-70b", "--nodes", "2", "--policy", "advise", "--partition", "debug"]


def test_submit_dry_run_golden(lab, cli):
    env = dict(lab.env, TRANSIT_SHIM="/opt/transit/lib/libtransit.so", TRANSIT_ADAPTER_DIR="/opt/transit/adapter")
    for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        env.pop(k, None)
    rc, out, err = cli(*SUBMIT, "--dry-run", "--", "python", "train.py", env=env)
    assert rc == 0, err
    assert "2 node(s): as asked" in err
    check_golden("submit_dry_run.sh", out)


def test_submit_auto_says_why(lab, cli):
    # llama3-8b fits one node of the lab's 4 GPUs: auto keeps it, and says which hardware it read
    rc, out, err = cli("submit", "--model", "llama3-8b", "--dry-run", "--", "python", "train.py", env=lab.env)
    assert rc == 0, err
    assert "partition debug (4 nodes): 4 GPUs/node, 1049 GB host DRAM/node" in err
    assert "1 node(s): no fewer nodes can run this layout" in err and "#SBATCH --gpus-per-node=4" in out


def test_submit_runs_and_status_reports(lab, cli):
    if not torch_importable():
        pytest.skip(NEEDS_TORCH)
    env = dict(lab.env, TRANSIT_SHIM=lab.shim, PYTHONUNBUFFERED="1")
    trainer = ["python3", str(ROOT / "examples" / "train_llama.py"), "--device", "cpu", "--steps", "2",
               "--dim", "64", "--layers", "1", "--heads", "4", "--kv-heads", "2", "--ffn", "128", "--vocab", "256",
               "--seq-len", "32", "--batch", "1"]
    rc, out, err = cli(*SUBMIT, "--gpus-per-node", "1", "--output", str(lab.lab / "jobs" / "%x-%j.out"), "--",
                       *trainer, env=env)
    assert rc == 0, err
    job = out.split()[2]
    info = lab.wait_job(job, timeout=180)
    log = Path(info["StdOut"]).read_text()
    assert info["JobState"] == "COMPLETED", log[-3000:]
    assert '"summary"' in log and '"world": 2' in log
    rc, out, _ = cli("status", job, "--json", env=lab.env)
    assert rc == 0 and json.loads(out)["JobState"] == "COMPLETED"
    rc, out, _ = cli("status", job, env=lab.env)
    assert rc == 0 and "COMPLETED" in out


def test_cancel(lab, cli):
    res = lab.cmd("sbatch", "--parsable", "--wrap", "sleep 60")
    job = res.stdout.strip()
    rc, out, err = cli("cancel", job, env=lab.env)
    assert rc == 0 and f"cancelled job {job}" in out
    assert lab.wait_job(job)["JobState"] == "CANCELLED"


def test_partition_discovery(lab):
    from transit_launch.slurm import commands as slurm
    env_before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(lab.conf)
    try:
        p = slurm.partition(None)
        assert (p.name, p.nodes, p.gpus_per_node, p.real_memory_mb, p.default, p.cpus_per_node) == ("debug", 4, 4, 1000000, True, 2)
    finally:
        if env_before is None:
            os.environ.pop("SLURM_CONF")
        else:
            os.environ["SLURM_CONF"] = env_before


@pytest.mark.parametrize("gres,gpus", [("gpu:4", 4), ("gpu:h100:8(S:0-1)", 8), ("gpu:a100:4,shard:8", 4),
                                       ("(null)", 0), ("gpu:a:2,gpu:b:2", 4)])
def test_gres_parsing(gres, gpus):
    from transit_launch.slurm.commands import gpus_from_gres
    assert gpus_from_gres(gres) == gpus


def test_spank_install_writes_plugin_and_plugstack(cli, built, tmp_path):
    """--prefix P: the plugin, a copy of the shim and of the adapter under P, root's and
    not writable by others; the line points at those copies, by absolute paths."""
    if not Path("/usr/include/slurm/spank.h").exists():
        pytest.skip("needs libslurm-dev (spank.h)")
    if os.geteuid() != 0:
        pytest.skip("installs root-owned files (the plugin refuses a shim anyone else can change)")
    prefix = tmp_path / "usr"
    env = dict(os.environ, TRANSIT_SHIM=str(built["shim"]), TRANSIT_ADAPTER_DIR=str(ADAPTER))
    rc, out, err = cli("spank", "install", "--prefix", str(prefix), "--plugstack-dir",
                       str(tmp_path / "plugstack.d"), "--default", "base", "--oversubscribe", "allow", env=env)
    assert rc == 0, err
    plugin = prefix / "lib" / "slurm" / "transit_spank.so"
    shim, adapter = prefix / "lib" / "transit-launch" / "libtransit.so", prefix / "lib" / "transit-launch" / "adapter"
    conf = (tmp_path / "plugstack.d" / "transit.conf").read_text().splitlines()[-1]
    assert conf == (f"required {plugin} shim={shim} adapter={adapter} default=base "
                    "allowed=off,base,prefetch,advise oversubscribe=allow")
    assert shim.read_bytes() == built["shim"].read_bytes()
    # the modules, and root's own bytecode of them (test_root_trust.py says why)
    assert sorted(p.name for p in adapter.iterdir()) == sorted([*(p.name for p in ADAPTER.glob("*.py")), "__pycache__"])
    for p in (plugin, shim, adapter, *adapter.rglob("*"), shim.parent, plugin.parent):
        st = p.stat()
        assert st.st_uid == 0 and not st.st_mode & 0o022, (p, oct(st.st_mode))
    syms = subprocess.run(["nm", "-D", "--defined-only", str(plugin)], capture_output=True, text=True).stdout
    assert sorted(line.split()[-1] for line in syms.splitlines()) == [
        "plugin_name", "plugin_type", "plugin_version", "slurm_spank_init", "slurm_spank_init_post_opt",
        "slurm_spank_task_init", "slurm_spank_user_init"]


@pytest.mark.parametrize("args,env,needle", [
    (["spank", "build", "--include", "/nonexistent"], {}, "--include /nonexistent: no spank.h there"),
    (["spank", "build"], {"CC": "no-such-cc"}, "no C compiler ($CC no-such-cc) found"),
])
def test_spank_build_errors(cli, tmp_path, args, env, needle):
    rc, out, err = cli(*args, "--out", str(tmp_path), env=env) if args[1] == "build" else cli(*args, env=env)
    assert rc == 2 and needle in err and "Traceback" not in err


def test_unknown_partition_and_job_are_errors(lab, cli):
    """--partition nope is an error (also on a dry run, where Slurm is there to ask); a job
    id the controller does not know is "no such job" for status and cancel (scancel itself
    exits 0 for it)."""
    for extra in ([], ["--dry-run"]):
        rc, out, err = cli("submit", "--model", "llama3-8b", "--partition", "nope", *extra, "--", "python", "x.py",
                           env=lab.env)
        assert rc == 2 and "no partition 'nope'; known: debug" in err and len(err.strip().splitlines()) == 1, err
    for cmd in ("status", "cancel"):
        rc, out, err = cli(cmd, "999999", env=lab.env)
        assert rc == 2 and err.strip() == "transit-launch: error: no such job 999999" and out == "", (cmd, err)
    rc, out, err = cli("status", "1;id", env=lab.env)
    assert rc == 2 and "'1;id' is not a Slurm job id" in err


@pytest.mark.parametrize("opt,value", [("--job-name", "x\n#SBATCH --uid=0"), ("--job-name", "a b"),
                                       ("--partition", "debug\nid"), ("--account", "a\rb"), ("--time", "1:00\x1b[2J"),
                                       ("--output", "o\n.out"), ("--stats", "/tmp/s\nrm -rf /")])
def test_render_and_submit_refuse_control_characters(cli, opt, value):
    for cmd in (["render", "--nodes", "1"], ["submit", "--model", "llama3-8b", "--nodes", "1", "--dry-run"]):
        rc, out, err = cli(*cmd, opt, value, "--", "python", "train.py", env={"PATH": "/nonexistent"})
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (cmd, err)


def test_render_quotes_what_reaches_the_shell(cli):
    rc, out, err = cli("render", "--nodes", "1", "--policy", "advise", "--stats", "/tmp/$(id)'x", "--", "python",
                       "train.py", "--tag", "a;b $(id)", env={"TRANSIT_SHIM": "/opt/t/lib transit.so"})
    assert rc == 0, err
    assert "export TRANSIT_STATS='/tmp/$(id)'\"'\"'x'" in out
    assert "train.py --tag 'a;b $(id)'" in out and "export LD_PRELOAD='/opt/t/lib transit.so'" in out
    rc, out, err = cli("render", "--nodes", "1", "--", "python", "train.py", "--tag", "a\nb")
    assert rc == 2 and "holds a control character" in err
