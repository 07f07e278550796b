"""The job a plan becomes: an sbatch script (or a local torchrun command) with the shim
injected. Shared by `render` and the submit flow."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from transit_launch.shim import inject
from transit_launch.slurm.render import render


@dataclass(frozen=True)
class JobOptions:
    """What sbatch is told besides the node count."""
    name: str | None = None
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    output: str = "%x-%j.out"
    port: int = 29500


@dataclass(frozen=True)
class ShimOptions:
    """What the shim is told (TRANSIT_*); policy None: advise below the no-offload minimum."""
    policy: str | None = None
    gpu_budget: int | None = None
    stats: str | None = None
    log: str | None = None


def policy_for(p, nodes: int, policy: str | None) -> str:
    return policy or ("advise" if p and nodes < p.baseline.nodes else "off")


def job_name(p, job: JobOptions) -> str:
    return job.name or (f"transit-{p.req.card.name}" if p else "transit")


def job_script(command: list[str], p, nodes: int, gpus_per_node: int, shim_opts: ShimOptions,
               job: JobOptions, local: bool = False) -> str:
    """The sbatch script (local: the torchrun line) for `nodes` nodes of plan p (or None)."""
    from transit_launch.planning import report
    policy = policy_for(p, nodes, shim_opts.policy)
    shim = inject.shim_path() if policy != "off" else None
    adapter = inject.adapter_dir() if shim else None
    env = inject.shim_env(policy, shim_opts.gpu_budget, shim_opts.stats, shim_opts.log)
    ctx = dict(shim=shim, adapter=adapter, env=env, policy=policy, gpus_per_node=gpus_per_node, command=command)
    if policy != "off" and shim is None:
        from transit_launch.doctor import shim_missing_reason
        print(f"transit-launch: warning: libtransit.so is not installed ({shim_missing_reason()}); "
              f"the job will run without the shim", file=sys.stderr)
    if local:
        return render("local.j2", **ctx)
    summary = f"{p.req.card.name} on {nodes} node(s), policy {policy}" if p else f"{nodes} node(s), policy {policy}"
    return render("sbatch.j2", nodes=nodes, job_name=job_name(p, job), partition=job.partition,
                  account=job.account, time=job.time, output=job.output, port=job.port,
                  plan_lines=report.plan_comment(p, nodes) if p else [], summary=summary, **ctx)
