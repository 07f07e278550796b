"""The submit flow as a function (slurm/submit.py), in-process against the real lab
cluster: the partition's hardware reaches the planner as numbers, the node count and its
reason come back with the script, and a real submission returns a job id that Slurm runs."""

import os
import shutil
import sys

import pytest

from tests.conftest import NEEDS_TORCH, torch_importable

from transit_launch.errors import UsageError
from transit_launch.planning.hardware import gpu_profile
from transit_launch.planning.models import load_model
from transit_launch.planning.plan import Request
from transit_launch.preload.options import ShimOptions
from transit_launch.slurm.script import JobOptions
from transit_launch.slurm.submit import Submission, submit


@pytest.fixture
def slurm_env(lab, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(lab.conf))
    return lab


def _request(seen):
    def make(gpus_per_node, host_mem, gpu, host_cores):
        seen.append((gpus_per_node, host_mem, gpu, host_cores))
        return Request(card=load_model("llama3-8b"), gpu=gpu_profile(None),
                       gpus_per_node=gpus_per_node or 4, host_mem=host_mem or 2000e9, host_cores=host_cores or 112)
    return make


def test_partition_hardware_reaches_the_planner(slurm_env):
    seen = []
    done = submit(Submission(["python", "train.py"], dry_run=True), _request(seen))
    # gres gpu:4 (no type), RealMemory=1000000 MB as numbers, and the node's 2 CPUs, the job's
    assert seen == [(4, 1_000_000 * 2**20, None, 2)]
    assert done.job_id is None and done.nodes >= 1 and "no fewer nodes can run this layout" in done.why
    assert f"#SBATCH --nodes={done.nodes}" in done.script and "#SBATCH --gpus-per-node=4" in done.script


def test_explicit_nodes_beyond_the_partition_refused(slurm_env):
    with pytest.raises(UsageError, match="the partition has 4 nodes"):
        submit(Submission(["python", "train.py"], nodes=5, dry_run=True), _request([]))


def test_submission_checks_itself():
    with pytest.raises(UsageError, match="needs the training command"):
        Submission([])
    with pytest.raises(UsageError, match="--nodes"):
        Submission(["python"], nodes=0)


def test_real_submission_runs(slurm_env, tmp_path, monkeypatch):
    """The rendered script runs torchrun on the node: PyTorch's own launcher, from this
    Python's torch when no `torchrun` program is on PATH (torch.distributed.run is what the
    console script runs); the job's state is Slurm's."""
    if shutil.which("torchrun") is None:
        if not torch_importable():
            pytest.skip(NEEDS_TORCH + " (the job script runs torchrun)")
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "torchrun").write_text(f'#!/bin/sh\nexec {sys.executable} -m torch.distributed.run "$@"\n')
        (bin_dir / "torchrun").chmod(0o755)
        tmp_path.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")  # sbatch exports it to the job
    done = submit(Submission(["--no-python", "true"], nodes=1, shim=ShimOptions(policy="off"),
                             job=JobOptions(name="flow", output=str(slurm_env.lab / "jobs" / "%x-%j.out"))),
                  _request([]))
    assert done.job_id and done.job_id.isdigit()
    assert done.output == str(slurm_env.lab / "jobs" / f"flow-{done.job_id}.out")
    info = slurm_env.wait_job(done.job_id, timeout=120)
    assert info["JobState"] == "COMPLETED", open(done.output).read()[-2000:]
