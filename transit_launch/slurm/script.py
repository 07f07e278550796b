"""The job a plan becomes: an sbatch script (or a local torchrun command) with the shim
injected. Shared by `render` and the submit flow."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from transit_launch.checks import integer
from transit_launch.errors import UsageError
from transit_launch.planning.choice import policy_for
from transit_launch.shim import inject
from transit_launch.shim.options import ShimOptions
from transit_launch.slurm.render import render


# sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds (sbatch(1)), or UNLIMITED/INFINITE.
_SLURM_TIME = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|unlimited|infinite", re.IGNORECASE)
# what an #SBATCH line cannot hold: it would end the line, or split or quote the value
_SBATCH_UNSAFE = re.compile(r"[\s\"'\x00-\x1f\x7f]")
_SLURM_MEM = re.compile(r"\d+[KMGT]?", re.IGNORECASE)
_SBATCH_OPTION = re.compile(r"--[a-z][a-z0-9-]*(=[^\s\"'\x00-\x1f\x7f]+)?")
# what the rendered script decides itself: a site line must not contradict the plan
_OURS = {"--nodes": "--nodes, from the plan", "--ntasks-per-node": "one torchrun per node",
         "--gpus-per-node": "--gpus-per-node", "--job-name": "--job-name", "--output": "--output",
         "--partition": "--partition", "--account": "--account", "--time": "--time", "--mem": "--mem",
         "--cpus-per-task": "--cpus-per-task", "--exclusive": "--exclusive", "--constraint": "--constraint"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class JobOptions:
    """What sbatch is told besides the node count. The values go on #SBATCH lines, which
    sbatch splits at whitespace and which a newline would end: control characters,
    whitespace and quotes are refused."""
    name: str | None = None
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    output: str = "%x-%j.out"
    port: int = 29500
    cpus_per_task: int | None = None
    mem: str | None = None          # sbatch's --mem: a number with K, M, G or T (M when none); 0: all
    exclusive: bool = False
    constraint: str | None = None
    sbatch_args: tuple[str, ...] = ()  # the site's own #SBATCH lines, each one option

    def __post_init__(self):  # sbatch would refuse these only once the job is submitted
        for flag, v in (("--partition", self.partition), ("--account", self.account), ("--output", self.output)):
            if v is not None and not v.strip():
                raise UsageError(f"{flag} is empty")
        for flag, v in (("--job-name", self.name), ("--partition", self.partition), ("--account", self.account),
                        ("--time", self.time), ("--output", self.output)):
            if v is not None and (not v or _SBATCH_UNSAFE.search(v)):
                raise UsageError(f"{flag} {v!r}: an #SBATCH value cannot be empty or hold whitespace, quotes or "
                                 "control characters")
        if not integer(self.port) or not 1 <= self.port <= 65535:
            raise UsageError(f"--port must be a TCP port from 1 to 65535, got {self.port!r}")
        if self.time is not None and not _SLURM_TIME.fullmatch(self.time):
            raise UsageError(f"--time {self.time!r} is not a Slurm time limit (e.g. 30, 04:00:00, 2-00:00:00)")
        if self.cpus_per_task is not None and (not integer(self.cpus_per_task) or self.cpus_per_task < 1):
            raise UsageError(f"--cpus-per-task must be a positive whole number, got {self.cpus_per_task!r}")
        if self.mem is not None and not _SLURM_MEM.fullmatch(self.mem):
            raise UsageError(f"--mem {self.mem!r} is not sbatch's memory size (e.g. 500G, 256000M, or 0 for all of "
                             "a node's memory)")
        if self.constraint is not None and (not self.constraint or _SBATCH_UNSAFE.search(self.constraint)):
            raise UsageError(f"--constraint {self.constraint!r}: an #SBATCH value cannot be empty or hold "
                             "whitespace, quotes or control characters")
        for arg in self.sbatch_args:
            opt = arg.split("=", 1)[0]
            if not _SBATCH_OPTION.fullmatch(arg):
                raise UsageError(f"--sbatch-arg {arg!r}: give one sbatch option as --name or --name=value, with no "
                                 "whitespace, quotes or control characters")
            if opt in _OURS:
                raise UsageError(f"--sbatch-arg {opt}: transit-launch sets {opt} itself ({_OURS[opt]})")


def job_name(p, job: JobOptions) -> str:
    return job.name or (f"transit-{p.req.card.name}" if p else "transit")


def job_script(command: list[str], p, nodes: int, gpus_per_node: int, shim_opts: ShimOptions,
               job: JobOptions, local: bool = False, titan=None, node_loss=None) -> str:
    """The sbatch script (local: the torchrun line) for `nodes` nodes of plan p (or None);
    titan (a TitanJob, planned by p): the command gets the config and the layout's overrides."""
    from transit_launch.planning import report
    from transit_launch.slurm import nodeloss
    if node_loss is not None:  # a nodeloss.NodeLossOptions (--on-node-loss)
        nodeloss.check(node_loss, p, nodes, local, titan)
    if titan is not None:
        from transit_launch.planning.titan_config import job_command
        command = job_command(titan, command, p, nodes)
    policy = policy_for(p, nodes, shim_opts.policy)
    inject.check_off(policy, shim_opts.overlap, shim_opts.gpu_budget)  # also when the plan chose off for these nodes
    if p:
        inject.check_budget(shim_opts.gpu_budget, p.req.gpu)
    shim = inject.shim_path() if policy != "off" else None
    adapter = inject.adapter_dir() if shim else None
    env = shim_opts.env(policy)
    ctx = dict(shim=shim, adapter=adapter, env=env, policy=policy, gpus_per_node=gpus_per_node, command=command)
    if policy != "off" and shim is None:
        from transit_launch.shim.inject import shim_missing_reason
        print(f"transit-launch: warning: libtransit.so is not installed ({shim_missing_reason()}); "
              f"the job will run without the shim", file=sys.stderr)
    if local:
        return render("local.j2", **ctx)
    summary = f"{p.req.card.name} on {nodes} node(s), policy {policy}" if p else f"{nodes} node(s), policy {policy}"
    return render("sbatch.j2", nodes=nodes, job_name=job_name(p, job), partition=job.partition,
                  account=job.account, time=job.time, output=job.output, port=job.port,
                  cpus_per_task=job.cpus_per_task, mem=job.mem, exclusive=job.exclusive, constraint=job.constraint,
                  sbatch_args=job.sbatch_args,
                  plan_lines=report.plan_comment(p, nodes) if p else [], summary=summary, **ctx,
                  **nodeloss.template_context(node_loss, p, nodes, shim_opts, job.port, shim, adapter))
