"""The submit flow as one function: the partition's hardware, the plan, the node count,
the script, sbatch. The CLI only turns options into a Submission."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from transit_launch.errors import UsageError
from transit_launch.slurm import commands
from transit_launch.slurm.script import JobOptions, ShimOptions, job_name, job_script


@dataclass(frozen=True)
class Submission:
    command: list[str]
    nodes: int | None = None          # None: auto (the fewest that fit host DRAM)
    shim: ShimOptions = field(default_factory=ShimOptions)
    job: JobOptions = field(default_factory=JobOptions)
    dry_run: bool = False

    def __post_init__(self):
        if not self.command:
            raise UsageError("submit needs the training command after --, e.g. -- python train.py")
        if self.nodes is not None and self.nodes < 1:
            raise UsageError(f"--nodes must be a positive integer or auto, got {self.nodes}")


@dataclass
class Submitted:
    nodes: int
    why: str
    script: str
    job_id: str | None = None   # None on a dry run
    output: str | None = None   # the job's output file, absolute


def submit(sub: Submission, make_request, gpus_per_node: int | None = None) -> Submitted:
    """make_request(gpus_per_node, host_mem) -> plan.Request: the planner's request once the
    partition's hardware is known (explicit options win over it)."""
    from transit_launch.planning.plan import auto_nodes, plan
    part = None
    try:
        part = commands.partition(sub.job.partition)
    except commands.NoSlurm:  # a dry run renders without Slurm; an unknown partition is an error
        if not sub.dry_run:
            raise
    if part and not part.gpus_per_node:
        raise UsageError(f"partition {part.name} has no GPUs (no gpu GRES on its nodes)")
    p = plan(make_request(part.gpus_per_node if part else None,
                          part.real_memory_mb * 2**20 if part else None))
    max_nodes = part.nodes if part else 10**6
    if sub.nodes is None:
        nodes, why = auto_nodes(p, max_nodes)
    elif sub.nodes > max_nodes:
        raise UsageError(f"--nodes {sub.nodes}: the partition has {max_nodes} nodes")
    else:
        nodes, why = sub.nodes, "as asked"
    script = job_script(sub.command, p, nodes, p.req.gpus_per_node, sub.shim, sub.job)
    if sub.dry_run:
        return Submitted(nodes, why, script)
    job = commands.submit(script)
    out = sub.job.output.replace("%x", job_name(p, sub.job)).replace("%j", job)
    return Submitted(nodes, why, script, job, os.path.abspath(out))
