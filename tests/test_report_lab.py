"""On the real Slurm lab (tests/slurm_lab.py, the SPANK plugin in its plugstack): `report`
reads a Slurm job's --transit-stats directory, and a script `render` writes for the plugin
(#SBATCH --transit=..., found by `sbatch --help`) runs with the shim's environment and
leaves the plan's prediction beside the ranks' stats. Each task runs the test program
linked against the fake libcudart (tests/fakecuda) under the plugin's LD_PRELOAD."""

import json
import os

import pytest

from tests.slurm_lab import missing
from transit_launch.preload import inject

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))
GB = 10**9


def _stats_dir(tmp_path):
    d = tmp_path / "stats"
    d.mkdir()
    os.chmod(tmp_path, 0o755)
    return d


def _done(lab, res):
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().split(";")[0]
    info = lab.wait_job(job, timeout=120)
    out = (lab.lab / "jobs" / f"report-{job}.txt").read_text()
    assert info["JobState"] == "COMPLETED", out
    return out


def test_report_reads_a_slurm_jobs_stats_directory(lab, built, cli, tmp_path):
    """Four ranks, two a node, under --transit-budget=3GB: each allocates 1+1+2 GB and the
    2 GB one is placed on the host (2 GB on the GPU, 2 GB offloaded, per rank)."""
    d = _stats_dir(tmp_path)
    body = (f"#!/bin/bash\n/usr/bin/srun -N2 --ntasks-per-node=2 /bin/bash -c "
            f"'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID {built['app']} alloc {GB} {GB} {2 * GB}'\n")
    script = lab.lab / "jobs" / "report.sh"
    script.write_text(body)
    _done(lab, lab.cmd("sbatch", "--parsable", "-N2", "--ntasks-per-node=2", "-o", "report-%j.txt", "--transit=advise",
                       "--transit-budget=3GB", f"--transit-stats={d}", str(script)))
    rc, out, err = cli("report", "--json", str(d))
    assert rc == 0, err
    r = json.loads(out)
    assert [(x["rank"], x["local_rank"], x["node"]) for x in r["ranks"]] == [
        (0, 0, "n1"), (1, 1, "n1"), (2, 0, "n2"), (3, 1, "n2")]
    assert all((x["policy"], x["budget_gb"], x["on_gpu_peak_gb"], x["offloaded_gb"], x["budget_held"]) ==
               ("advise", 3.0, 2.0, 2.0, True) for x in r["ranks"]), r["ranks"]
    assert [(n["node"], n["ranks"], n["offloaded_gb"]) for n in r["nodes"]] == [("n1", 2, 4.0), ("n2", 2, 4.0)]
    rc, text, err = cli("report", str(d))
    assert rc == 0 and "n2" in text and "No plan's prediction" in text, err


def test_a_rendered_transit_script_runs_under_the_plugin(lab, built, cli, tmp_path):
    """render finds the plugin in the lab's sbatch (--inject auto) and writes #SBATCH
    --transit= lines instead of export lines; submitted, every rank gets the plugin's shim,
    adapter, policy, budget and stats, and report sets the plan beside the ranks."""
    d = _stats_dir(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    row = "$SLURMD_NODENAME|$LD_PRELOAD|$PYTHONPATH|$TRANSIT_POLICY|$TRANSIT_GPU_BUDGET|$TRANSIT_STATS|$TRANSIT_LOG"
    torchrun = bin_dir / "torchrun"  # the rank torchrun would start: the fake program, under the step's environment
    torchrun.write_text(f'#!/bin/bash\necho "ROW|{row}"\nRANK=$SLURM_PROCID exec {built["app"]} alloc '
                        f'{30 * GB} {30 * GB}\n')
    torchrun.chmod(0o755)
    env = dict(lab.env, PATH=f"{bin_dir}:{os.environ['PATH']}", TRANSIT_SHIM="/nonexistent/libtransit.so")
    rc, script, err = cli("render", "--model", "llama3-8b", "--nodes", "2", "--gpus-per-node", "2", "--policy",
                          "advise", "--gpu-budget", "40GB", "--stats", str(d), "--log", "info",
                          "--output", str(lab.lab / "jobs" / "report-%j.txt"), "--", "python", "train.py", env=env)
    assert rc == 0, err
    assert "#SBATCH --transit=advise\n#SBATCH --transit-budget=40GB\n" in script
    assert "LD_PRELOAD" not in script and "/nonexistent" not in script  # the site's shim, not the renderer's
    path = lab.lab / "jobs" / "rendered.sh"
    path.write_text(script)
    out = _done(lab, lab.cmd("sbatch", "--parsable", str(path), env=env))
    rows = [line.split("|")[1:] for line in out.splitlines() if line.startswith("ROW|")]
    assert sorted(r[0] for r in rows) == ["n1", "n2"], out
    for _node, preload, pypath, policy, budget, stats, log in rows:
        assert preload.split(":")[0] == lab.shim and pypath.split(":")[0] == str(inject.adapter_dir()), rows
        assert (policy, budget, stats, log) == ("advise", "40GB", str(d), "info"), rows
    rc, out, err = cli("report", "--json", str(d))
    assert rc == 0, err
    r = json.loads(out)
    assert [(x["rank"], x["node"], x["on_gpu_peak_gb"], x["offloaded_gb"]) for x in r["ranks"]] == [
        (0, "n1", 30.0, 30.0), (1, "n2", 30.0, 30.0)]
    assert (r["plan"]["nodes"], r["plan"]["gpus"], r["plan"]["policy"]) == (2, 4, "advise")
    assert f"offload {r['plan']['offload_gb_per_gpu']:.1f} GB per GPU" in script
