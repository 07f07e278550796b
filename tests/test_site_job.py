"""The job a site runs is the job the plan costed (issue 51): its host memory and CPUs, on
the real lab cluster (tests/slurm_lab.py: 4 nodes of 2 CPUs, RealMemory=1000000 MB under
config_overrides) and against fake sinfo outputs for the partitions the lab cannot be."""

import json
import re
import subprocess

from tests.test_cli import fake_slurm
from transit_launch.isolated import transit_launch_argv
from transit_launch.planning.hardware import gpu_profile
from transit_launch.planning.models import load_model
from transit_launch.planning.plan import Request, plan

TRAIN = ["--", "python", "train.py"]


def _host_mib(model, nodes, gpus_per_node, host_mem):
    """The plan's host memory per node at `nodes`, in MiB with the 5% headroom: what --mem asks."""
    p = plan(Request(load_model(model), gpu_profile("h100-80gb"), gpus_per_node=gpus_per_node, host_mem=host_mem))
    return -(-int(p.at(nodes).host_per_node * 1.05) // 2**20)


def test_a_submitted_job_asks_for_the_memory_and_cpus_the_plan_costed(lab, tmp_path):
    """scontrol's view of the submitted job: MinMemoryNode is the plan's host memory per node
    (offloaded state and each rank's own, 5% headroom), and the one task a node has every CPU
    of the node (Slurm's default is one: eight ranks and the host-side work on one core)."""
    d = tmp_path / "work"
    d.mkdir(mode=0o700)
    res = subprocess.run(transit_launch_argv("submit", "--model", "llama3-8b", "--nodes", "1", "--output",
                                             str(d / "%x-%j.out"), "--", "true"),
                         cwd=d, capture_output=True, text=True, timeout=120, env=lab.env)
    assert res.returncode == 0, res.stderr
    job = res.stdout.split()[2]
    info = lab.cmd("scontrol", "show", "job", "-o", job).stdout
    lab.wait_job(job, timeout=120)
    want = _host_mib("llama3-8b", 1, 4, 1_000_000 * 2**20)
    assert f"MinMemoryNode={want}M" in info or f"MinMemoryNode={want / 1024:g}G" in info, (want, info)
    assert re.search(r"\bCPUs/Task=2\b", info), info


def test_a_node_too_small_for_the_plans_memory_is_refused(cli, tmp_path):
    """Nodes of 64 GB and a 70B model on one node: the plan's host memory is more than they
    have; submit says so in one line (sbatch would refuse it, or the job never start), and a
    dry run shows the script with the same line as a warning."""
    sinfo = ('#!/bin/sh\ncase "$*" in\n  *--version*) echo "slurm 22.05.8" ;;\n'
             '  *-N*) for n in 1 2; do echo "gpu*|n$n|gpu:4|65536|64"; done ;;\n  *) echo "gpu*" ;;\nesac\n')
    env = fake_slurm(tmp_path, sinfo)
    rc, out, err = cli("submit", "--model", "llama3-70b", "--nodes", "2", *TRAIN, env=env)
    assert (rc, out) == (2, "") and err.count("transit-launch: error:") == 1, (rc, err)
    last = err.strip().splitlines()[-1]
    assert "of host memory per node" in last and "(RealMemory=65536 MB)" in last
    rc, out, err = cli("submit", "--model", "llama3-70b", "--nodes", "2", "--dry-run", *TRAIN, env=env)
    assert rc == 0 and "WARNING: the job needs" in err and "#SBATCH --cpus-per-task=64\n" in out


def test_unconfigured_real_memory_is_said_not_mistaken_for_an_option(cli, tmp_path):
    """Slurm's default RealMemory is 1 MB: submit said "--host-mem must be at least 1GiB", an
    option nobody gave. Now the plan assumes its default and says why."""
    sinfo = ('#!/bin/sh\ncase "$*" in\n  *--version*) echo "slurm 22.05.8" ;;\n'
             '  *-N*) for n in 1 2 3 4; do echo "gpu*|n$n|gpu:4|1|32"; done ;;\n  *) echo "gpu*" ;;\nesac\n')
    rc, out, err = cli("submit", "--model", "llama3-8b", "--dry-run", *TRAIN, env=fake_slurm(tmp_path, sinfo))
    assert rc == 0, err
    assert "--host-mem must be" not in err and "report RealMemory=1 MB (Slurm's default when slurm.conf sets none)" in err
    assert re.search(r"#SBATCH --mem=\d+M\n", out)


def test_render_asks_for_the_plans_memory_and_an_explicit_mem_wins(cli):
    rc, out, err = cli("render", "--model", "llama3-70b", "--nodes", "3", *TRAIN)
    assert rc == 0, err
    assert f"#SBATCH --mem={_host_mib('llama3-70b', 3, 4, 2000e9)}M\n" in out
    rc, out, err = cli("render", "--model", "llama3-70b", "--nodes", "3", "--mem", "500G", *TRAIN)
    assert rc == 0 and "#SBATCH --mem=500G\n" in out and out.count("--mem") == 1
    rc, out, err = cli("render", "--nodes", "2", *TRAIN)  # no plan: nothing to cost
    assert rc == 0 and "--mem" not in out


def test_partitions_report_their_cpus(tmp_path, monkeypatch):
    from transit_launch.slurm import commands
    sinfo = ('#!/bin/sh\necho "gpu*|n1|gpu:a100:8|1000000|128"\necho "gpu*|n2|gpu:a100:8|1000000|96"\n'
             'echo "cpu|c1|(null)|500000|64"\n')
    env = fake_slurm(tmp_path, sinfo)
    monkeypatch.setenv("PATH", env["PATH"])
    parts = {p.name: p for p in commands.partitions()}
    assert (parts["gpu"].cpus_per_node, parts["gpu"].gpus_per_node, parts["cpu"].cpus_per_node) == (96, 8, 64)
    assert json.dumps(parts["gpu"].real_memory_mb) == "1000000"


def _typed_sinfo(gres):
    return ('#!/bin/sh\ncase "$*" in\n  *--version*) echo "slurm 22.05.8" ;;\n'
            f'  *-N*) for n in 1 2 3 4 5 6 7 8; do echo "gpu*|n$n|{gres}|1907348|64"; done ;;\n'
            '  *) echo "gpu*" ;;\nesac\n')


def test_the_partitions_gpu_type_is_the_plans(cli, tmp_path):
    """sinfo's gpu:a100_80gb:8 plans an A100 80GB (it planned an H100, said only on stderr);
    --gpu wins; a type without its size, an unknown type and a mix are one line each."""
    env = fake_slurm(tmp_path, _typed_sinfo("gpu:a100_80gb:8(S:0-1)"))
    rc, out, err = cli("submit", "--model", "llama3-70b", "--dry-run", *TRAIN, env=env)
    assert rc == 0 and "8 GPUs/node, 2000 GB host DRAM/node, a100-80gb (85.9 GB)" in err, err
    assert "Plan: llama3-70b, fsdp, a100-80gb" in out
    rc, out, err = cli("submit", "--model", "llama3-70b", "--dry-run", "--gpu", "h100-80gb", *TRAIN, env=env)
    assert rc == 0 and "h100-80gb (85.5 GB)" in err
    for gres, why in (("gpu:a100:8", "does not say whether they have 40 GB or 80 GB: give --gpu"),
                      ("gpu:l40s:8", "none of the known ones"), ("gpu:a100_40gb:4,gpu:h100:4", "several types")):
        d = tmp_path / gres.replace(":", "_").replace(",", "_")
        d.mkdir()
        env = fake_slurm(d, _typed_sinfo(gres))
        rc, out, err = cli("submit", "--model", "llama3-70b", "--dry-run", *TRAIN, env=env)
        assert (rc, out) == (2, "") and why in err and err.count("transit-launch: error:") == 1, (gres, err)


def test_gres_types():
    from transit_launch.planning.hardware import gpu_from_gres_type
    assert [gpu_from_gres_type(t) for t in ("h100", "H100", "nvidia_h100_80gb_hbm3", "h100_94gb", "h200",
                                            "a100-sxm4-40gb", "nvidia_a100-sxm4-80gb")] == \
        ["h100-80gb", "h100-80gb", "h100-80gb", "h100-94gb", "h200-141gb", "a100-40gb", "a100-80gb"]


def _line(out, start):
    return next((ln for ln in out.splitlines() if ln.startswith(start)), None)


def test_one_budget_the_plan_assumes_and_the_job_gets(cli):
    """--gpu-mem 60GB planned a 60 GB GPU but the job got no budget (the full GPU); --gpu-budget
    60GB set the budget but planned the full GPU. Either one now sets both; both, different,
    are one line; a budget or a memory above the named GPU's is refused."""
    rendered = {}
    for flag in ("--gpu-mem", "--gpu-budget"):
        rc, out, err = cli("render", "--model", "llama3-70b", flag, "60GB", *TRAIN)
        assert rc == 0, err
        assert _line(out, "export TRANSIT_GPU_BUDGET=") == "export TRANSIT_GPU_BUDGET=60GB", (flag, out)
        rendered[flag] = _line(out, "#SBATCH --nodes=")
    rc, plan_out, _ = cli("plan", "--model", "llama3-70b", "--gpu-mem", "60GB", "--json")
    nodes = json.loads(plan_out)["recommended"]["nodes"]
    assert rendered == {"--gpu-mem": f"#SBATCH --nodes={nodes}", "--gpu-budget": f"#SBATCH --nodes={nodes}"}
    for args, why in ((["--gpu-mem", "60GB", "--gpu-budget", "50GB"], "differ"),
                      (["--gpu", "h100-80gb", "--gpu-mem", "200GB"], "--gpu-mem 200GB is more than h100-80gb has"),
                      (["--gpu-budget", "100GB"], "--gpu-budget 100GB is more than the GPU has")):
        rc, out, err = cli("render", "--model", "llama3-70b", *args, *TRAIN)
        assert (rc, out) == (2, "") and err.count("\n") == 1 and why in err, (args, err)
    rc, out, err = cli("plan", "--model", "llama3-8b", "--gpu-mem", "200GB")  # no --gpu: a custom GPU, as before
    assert rc == 0 and "custom-200GB" in out, err


def test_submit_json_and_parsable_name_the_job_slurm_has(lab, tmp_path):
    """--parsable prints the job id alone (as sbatch --parsable); --json the id, node count,
    output file and script: both are jobs scontrol knows, with that output file."""
    d = tmp_path / "work"
    d.mkdir(mode=0o700)
    args = ["submit", "--model", "llama3-8b", "--nodes", "1", "--output", str(d / "%x-%j.out")]
    res = subprocess.run(transit_launch_argv(*args, "--parsable", "--", "true"), cwd=d, capture_output=True,
                         text=True, timeout=120, env=lab.env)
    assert res.returncode == 0, res.stderr
    assert re.fullmatch(r"\d+\n", res.stdout), res.stdout
    first = res.stdout.strip()
    res = subprocess.run(transit_launch_argv(*args, "--json", "--", "true"), cwd=d, capture_output=True, text=True,
                         timeout=120, env=lab.env)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["job_id"] != first and out["nodes"] == 1 and out["dry_run"] is False
    for job in (first, out["job_id"]):
        info = lab.cmd("scontrol", "show", "job", "-o", job).stdout
        assert f"JobId={job} " in info
    assert f"StdOut={out['output']}" in lab.cmd("scontrol", "show", "job", "-o", out["job_id"]).stdout
    assert out["output"] == str(d / f"transit-llama3-8b-{out['job_id']}.out")
    assert out["script"].startswith("#!/bin/bash\n") and "#SBATCH --nodes=1\n" in out["script"]
    for job in (first, out["job_id"]):
        lab.wait_job(job, timeout=120)


def test_render_json_and_parsable_misuse(cli):
    rc, out, err = cli("render", "--model", "llama3-70b", "--json", *TRAIN)
    assert rc == 0, err
    d = json.loads(out)
    assert (d["nodes"], d["policy"], d["gpus_per_node"]) == (3, "advise", 4)
    assert "--rdzv-endpoint" in d["script"] and d["out"] is None
    for extra in (["--dry-run"], ["--json"]):
        rc, out, err = cli("submit", "--model", "llama3-70b", "--parsable", *extra, *TRAIN)
        assert rc == 2 and out == "" and err.count("\n") == 1 and "--parsable" in err


def test_special_files_are_not_replaced_and_closed_stdout_is_one_line(cli, tmp_path):
    """-o onto a pipe (or, as root, /dev/null) renamed a regular file over it; a closed standard
    output was a traceback. (A FIFO here: a regression must not replace a device of the machine.)"""
    import os
    import stat
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    rc, out, err = cli("render", "--model", "llama3-70b", "-o", str(fifo), *TRAIN)
    assert rc == 2 and err.count("\n") == 1 and "is not a regular file" in err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    res = subprocess.run(transit_launch_argv("plan", "--model", "llama3-70b"), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, timeout=60, close_fds=True,
                         preexec_fn=lambda: os.close(1))
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "standard output is closed" in res.stderr


def test_mem_below_the_plan_is_warned_and_an_empty_command_refused(cli):
    rc, out, err = cli("render", "--model", "llama3-70b", "--mem", "1G", *TRAIN)
    assert rc == 0 and "#SBATCH --mem=1G\n" in out
    [warn] = [ln for ln in err.splitlines() if "--mem" in ln]
    want = _host_mib("llama3-70b", 3, 4, 2000 * 10**9)  # the plan's 3 nodes at the default 2000 GB a node
    assert f"less than the {want} MiB a node of this plan needs" in warn
    rc, out, err = cli("render", "--model", "llama3-70b", "--mem", "0", *TRAIN)  # 0: all of a node's
    assert rc == 0 and "--mem" not in err
    for cmd in ("render", "submit"):
        rc, out, err = cli(cmd, "--model", "llama3-70b", *(["--dry-run"] if cmd == "submit" else []), "--", "")
        assert rc == 2 and out == "" and err.count("\n") == 1 and "empty word" in err, err


def test_the_host_steps_cpu_share_is_planned_on_the_jobs_cores(cli, tmp_path):
    """--overlap host: the plan's CPU update runs on the cores the job gets: the partition's
    (32 a node here), an explicit --cpus-per-task, or --host-cores over both; the job's plan
    (TRANSIT_PLAN) is `plan`'s at those cores, and fewer cores predict less."""
    sinfo = ('#!/bin/sh\ncase "$*" in\n  *--version*) echo "slurm 22.05.8" ;;\n'
             '  *-N*) for n in 1 2 3 4 5 6; do echo "gpu*|n$n|gpu:h100:4|1907348|32"; done ;;\n  *) echo "gpu*" ;;\nesac\n')
    env = fake_slurm(tmp_path, sinfo)
    got, want = {}, {}
    for extra, cores in (([], "32"), (["--cpus-per-task", "8"], "8"), (["--cpus-per-task", "8", "--host-cores", "64"], "64")):
        rc, out, err = cli("submit", "--model", "llama3-70b", "--overlap", "host", "--nodes", "3", "--dry-run",
                           *extra, *TRAIN, env=env)
        assert rc == 0, err
        got[cores] = json.loads(_line(out, "export TRANSIT_PLAN=").split("=", 1)[1].strip("'"))["predicted_efficiency"]
        rc, out, err = cli("plan", "--model", "llama3-70b", "--overlap", "host", "--gpus-per-node", "4",
                           "--host-mem", "1907348MiB", "--host-cores", cores, "--json")
        assert rc == 0, err
        want[cores] = next(o["predicted_efficiency"] for o in json.loads(out)["options"] if o["nodes"] == 3)
    assert got == want and got["8"] < got["32"] < got["64"]
