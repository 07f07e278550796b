"""The submit flow as one function: the partition's hardware, the plan, the node count,
the script, sbatch. The CLI only turns options into a Submission."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from transit_launch.checks import integer
from transit_launch.errors import UsageError
from transit_launch.slurm import commands
from transit_launch.preload.options import ShimOptions
from transit_launch.slurm.script import JobOptions, job_name, job_script, planned_mem, shared_output
from transit_launch.units import gb, n_nodes


@dataclass(frozen=True)
class Submission:
    command: list[str]
    nodes: int | None = None          # None: auto (plan's recommendation within the partition)
    shim: ShimOptions = field(default_factory=ShimOptions)
    job: JobOptions = field(default_factory=JobOptions)
    dry_run: bool = False
    titan: object = None              # a planning.titan_config.TitanJob: the layout goes to TorchTitan
    node_loss: object = None          # a slurm.nodeloss.NodeLossOptions (--on-node-loss)
    gpu_given: bool = False           # --gpu was given: it wins over the partition's GPU type

    def __post_init__(self):
        if not self.command:
            raise UsageError("submit needs the training command after --, e.g. -- python train.py")
        if self.nodes is not None and (not integer(self.nodes) or self.nodes < 1):
            raise UsageError(f"--nodes must be a positive integer or auto, got {self.nodes}")


@dataclass
class Submitted:
    nodes: int
    why: str
    script: str
    hardware: str               # what the plan assumed, and where it came from
    warnings: list[str] = field(default_factory=list)  # a chosen --nodes that spills, overfills DRAM, ...
    job_id: str | None = None   # None on a dry run
    output: str | None = None   # the job's output file, absolute


def submit(sub: Submission, make_request) -> Submitted:
    """make_request(gpus_per_node, host_mem, gpu, host_cores) -> plan.Request: the planner's
    request once the partition's hardware and the job's CPUs are known (explicit options win).
    The node count is plan's recommendation within the partition's nodes (planning.choice
    decides for plan, render and submit alike), or the one asked for, explained."""
    from transit_launch.planning.choice import explain
    from transit_launch.planning.plan import MAX_NODES, plan
    part, no_part = None, ""
    try:
        part = commands.partition(sub.job.partition)
    except commands.NoSlurm as e:  # a dry run renders without Slurm; an unknown partition is an error
        if not sub.dry_run:
            raise
        no_part = str(e)
    if part and not part.gpus_per_node:
        raise UsageError(f"partition {part.name} has no GPUs (no gpu GRES on its nodes)")
    host_mem = part.real_memory_mb * 2**20 if part else None
    sub_warnings = []
    if part and part.real_memory_mb < 1024:  # Slurm's default RealMemory is 1 (MB): not configured
        host_mem = None
        sub_warnings.append(f"partition {part.name}'s nodes report RealMemory={part.real_memory_mb} MB (Slurm's "
                            "default when slurm.conf sets none): the plan assumes --host-mem or its default, and the "
                            "job's --mem cannot be checked against the nodes")
    if part and sub.job.cpus_per_task is None and part.cpus_per_node > 1:
        # one task a node runs every rank and the host-side work: all of the node's cores, not Slurm's one
        sub = replace(sub, job=replace(sub.job, cpus_per_task=part.cpus_per_node))
    if part and sub.nodes is not None and sub.nodes > part.nodes:
        raise UsageError(f"--nodes {sub.nodes}: the partition has {n_nodes(part.nodes)} ({part.name})")
    gpu = None
    if part and part.gpu_types and not sub.gpu_given:  # the partition's GPU, unless --gpu said (--gpu-mem resizes it)
        if len(part.gpu_types) > 1:
            raise UsageError(f"partition {part.name} has GPUs of several types ({', '.join(part.gpu_types)}): give "
                             "--gpu, and a --constraint that picks those nodes")
        from transit_launch.planning.hardware import gpu_from_gres_type
        gpu = gpu_from_gres_type(part.gpu_types[0])
    req = make_request(part.gpus_per_node if part else None, host_mem, gpu, sub.job.cpus_per_task)
    if part and sub.nodes is None:
        # auto searches the partition's nodes only; a count the user chose is planned as
        # `plan` would and explained (with warnings), not refused for the partition's sake
        req = replace(req, max_nodes=min(part.nodes, MAX_NODES))
    p = plan(req)
    if sub.nodes is None:
        nodes, why, warnings = p.recommended.nodes, p.reason, []
    else:
        nodes = sub.nodes
        why, warnings = explain(p, nodes)
    script = job_script(sub.command, p, nodes, p.req.gpus_per_node, sub.shim, sub.job, titan=sub.titan,
                        node_loss=sub.node_loss)
    mem = planned_mem(p, nodes)
    if part and host_mem and sub.job.mem is None and mem and mem > part.real_memory_mb:
        short = (f"the job needs {mem} MiB of host memory per node (the plan's {mem / 1024:.1f} GiB: offloaded "
                 f"state and each rank's own), more than partition {part.name}'s nodes have "
                 f"(RealMemory={part.real_memory_mb} MB); fewer GPUs a node, more nodes, or --mem to override")
        if not sub.dry_run:  # sbatch would refuse it, or the job would never start
            raise UsageError(short)
        sub_warnings.append(short)
    done = Submitted(nodes, why, script, _hardware(p.req, part, no_part), sub_warnings + warnings)
    if sub.dry_run:
        return done
    shared = shared_output(sub.job.output, os.getcwd())
    if shared:
        raise UsageError(shared)
    done.job_id = commands.submit(script)
    out = sub.job.output.replace("%x", job_name(p, sub.job)).replace("%j", done.job_id)
    done.output = os.path.abspath(out)
    return done


def _hardware(req, part, no_part: str) -> str:
    """One line: the hardware the plan assumed, so a dry run off the cluster says it guessed."""
    hw = (f"{req.gpus_per_node} GPUs/node, {gb(req.host_mem):.0f} GB host DRAM/node, "
          f"{req.gpu.name} ({gb(req.gpu.memory):.1f} GB)")
    if part:
        return f"partition {part.name} ({n_nodes(part.nodes)}): {hw}"
    return (f"assumed {hw}: no Slurm partition was read ({no_part}); --gpus-per-node, --host-mem and --gpu "
            "set them")
