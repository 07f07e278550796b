"""The job a plan becomes: an sbatch script (or a local torchrun command) with the shim
injected. Shared by `render` and the submit flow."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from transit_launch.checks import integer
from transit_launch.errors import UsageError
from transit_launch.planning.choice import policy_for
from transit_launch.preload import inject
from transit_launch.preload.options import ShimOptions
from transit_launch.slurm.render import render


# sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds (sbatch(1)), or UNLIMITED/INFINITE.
# re.ASCII: \d is 0-9 only (a full-width ３0 passed, and sbatch refused the script)
_SLURM_TIME = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|unlimited|infinite", re.IGNORECASE | re.ASCII)
# what an #SBATCH line cannot hold: it would end the line, or split or quote the value
_SBATCH_UNSAFE = re.compile(r"[\s\"'#\\\x00-\x1f\x7f]")
_SLURM_MEM = re.compile(r"\d+[KMGT]?", re.IGNORECASE | re.ASCII)
_SBATCH_OPTION = re.compile(r"--[a-z][a-z0-9-]*(=[^\s\"'#\\\x00-\x1f\x7f]+)?")
# what the rendered script decides itself: a site line must not contradict the plan. With
# the options that would change the same request another way (--ntasks, --gpus, --gres,
# memory or CPUs per CPU/GPU; --gres only where it names GPUs, _SBATCH_GRES_GPU).
_OURS = {"--nodes": "--nodes, from the plan", "--ntasks-per-node": "one torchrun per node",
         "--ntasks": "one torchrun per node", "--gpus-per-node": "--gpus-per-node", "--gpus": "--gpus-per-node",
         "--job-name": "--job-name", "--output": "--output",
         "--partition": "--partition", "--account": "--account", "--time": "--time", "--mem": "--mem",
         "--mem-per-cpu": "--mem", "--mem-per-gpu": "--mem", "--cpus-per-task": "--cpus-per-task",
         "--cpus-per-gpu": "--cpus-per-task", "--exclusive": "--exclusive", "--constraint": "--constraint",
         # the SPANK plugin's options: render writes them where it takes that route (--inject)
         "--transit": "--policy", "--transit-budget": "--gpu-budget", "--transit-stats": "--stats"}


def ours(opt: str) -> str | None:
    """Which of the script's own options `opt` would set, or None. sbatch (getopt_long)
    takes any unambiguous prefix of a long option (--job-nam= is --job-name=), so a prefix
    of one of ours counts as ours: refused whether or not sbatch would find it ambiguous."""
    hit = next((o for o in _OURS if o.startswith(opt)), None) if len(opt) > 2 else None
    return None if hit is None else _OURS[opt] if opt in _OURS else f"{opt} abbreviates {hit}: {_OURS[hit]}"


_SBATCH_GRES_GPU = re.compile(r"--gres?=(.*,)?gpu\b")  # --gres (or its unambiguous prefix) asking for GPUs


# a job name: Slurm puts it in file names (%x in --output), so no / (a path), no % (another
# pattern) and no leading dot
_JOB_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")


def job_name_value(flag: str, v: str | None) -> None:
    """THE check of a job name, the user's or the card's: an #SBATCH value that is also a
    file name (the default --output is %x-%j.out)."""
    sbatch_value(flag, v)
    if v is not None and not _JOB_NAME.fullmatch(v):
        raise UsageError(f"{flag} {v!r}: a job name is letters, digits and . _ + - (Slurm puts it in the output "
                         "file's name), not starting with a dot")


def sbatch_value(flag: str, v: str | None) -> None:
    """THE check of a value that goes on an #SBATCH line (a job name included): sbatch splits
    those lines at whitespace and reads quotes, and a newline would end the line, so a value
    with any of them could add options of its own; it ends a value at an unescaped '#' and
    drops a '\\', so the job would get another value than the one checked."""
    if v is None:
        return
    if not v.strip():
        raise UsageError(f"{flag} is empty")
    if _SBATCH_UNSAFE.search(v):
        raise UsageError(f"{flag} {v!r}: an #SBATCH value cannot hold whitespace, quotes, '#', '\\' or control "
                         "characters")


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
    port: int | None = None         # torchrun's rendezvous port; None: rdzv_port_expr's, from the job id
    cpus_per_task: int | None = None
    mem: str | None = None          # sbatch's --mem: a number with K, M, G or T (M when none); 0: all
    exclusive: bool = False
    constraint: str | None = None
    sbatch_args: tuple[str, ...] = ()  # the site's own #SBATCH lines, each one option

    def __post_init__(self):  # sbatch would refuse these only once the job is submitted
        job_name_value("--job-name", self.name)
        for flag, v in (("--partition", self.partition), ("--account", self.account), ("--time", self.time),
                        ("--output", self.output), ("--constraint", self.constraint)):
            sbatch_value(flag, v)
        if self.port is not None and (not integer(self.port) or not 1 <= self.port <= 65535):
            raise UsageError(f"--port must be a TCP port from 1 to 65535, got {self.port!r}")
        if self.time is not None and not _SLURM_TIME.fullmatch(self.time):
            raise UsageError(f"--time {self.time!r} is not a Slurm time limit (e.g. 30, 04:00:00, 2-00:00:00)")
        if self.cpus_per_task is not None and (not integer(self.cpus_per_task) or self.cpus_per_task < 1):
            raise UsageError(f"--cpus-per-task must be a positive whole number, got {self.cpus_per_task!r}")
        if self.mem is not None and not _SLURM_MEM.fullmatch(self.mem):
            raise UsageError(f"--mem {self.mem!r} is not sbatch's memory size (e.g. 500G, 256000M, or 0 for all of "
                             "a node's memory)")
        for arg in self.sbatch_args:
            opt = arg.split("=", 1)[0]
            if not _SBATCH_OPTION.fullmatch(arg):
                raise UsageError(f"--sbatch-arg {arg!r}: give one sbatch option as --name or --name=value, with no "
                                 "whitespace, quotes or control characters")
            why = ours(opt) or ("--gpus-per-node" if _SBATCH_GRES_GPU.match(arg) else None)
            if why:
                raise UsageError(f"--sbatch-arg {opt}: transit-launch sets {opt} itself ({why})" if opt in _OURS
                                 else f"--sbatch-arg {opt}: transit-launch sets this itself ({why})")


def _kernel_protects() -> bool:
    """Whether the kernel refuses, in sticky directories others can write, to follow a link
    or open a file another user owns (fs.protected_symlinks and fs.protected_regular)."""
    try:
        return all(int(open(f"/proc/sys/fs/protected_{k}").read()) >= 1 for k in ("symlinks", "regular"))
    except (OSError, ValueError):
        return False


def shared_output(output: str, cwd: str) -> str | None:
    """Why another user could choose where the job's output goes, or None: its directory
    (the working directory for a relative --output) can be written by others. Slurm opens
    the file as the job's user and follows a link planted under its guessable name
    (%x-%j.out: the next job ids), so a group directory let a member overwrite a victim's
    files with the job's output."""
    import os
    import stat
    d = os.path.dirname(os.path.join(cwd, output)) or cwd
    if "%" in d:
        return None  # a pattern in the directory: Slurm's to expand, not ours to check
    try:
        st = os.stat(d)
    except OSError:
        return None
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (st.st_mode & stat.S_ISVTX and _kernel_protects()):
        return (f"the job's output {output!r} would go into {d}, which other users can write (a link they plant "
                f"under its name would be followed): give --output in a directory only you can write")
    return None


# torchrun's rendezvous port when --port is not given: one of RDZV_PORT_SPAN ports from
# RDZV_PORT_BASE (torchrun's default), picked by the job id, so that two jobs whose head
# nodes are one machine do not both take 29500. Below Linux's ephemeral range (32768 up).
RDZV_PORT_BASE, RDZV_PORT_SPAN = 29500, 1000


def rdzv_port(job_id: int, attempt: int = 0, port: int | None = None) -> int:
    """The rendezvous port of a job's attempt: --port + attempt, else from the job id."""
    if port is not None:
        return port + attempt
    return RDZV_PORT_BASE + (job_id + attempt) % RDZV_PORT_SPAN


def rdzv_port_expr(port: int | None) -> str:
    """rdzv_port in the batch script's shell (attempt 0): the same rule as rdzv_port."""
    return str(port) if port is not None else f"$(( {RDZV_PORT_BASE} + SLURM_JOB_ID % {RDZV_PORT_SPAN} ))"


MEM_HEADROOM = 0.05  # over the plan's host memory per node in the job's --mem: allocator and page-cache slack


def planned_mem(p, nodes: int) -> int | None:
    """The host memory a node of the plan's job at `nodes` needs, in MiB (what --mem asks
    for): what the plan costed (the offloaded state, its pinned second copy where the step
    needs one, each rank's own memory) and MEM_HEADROOM; None without a layout there."""
    import math
    c = p.at(nodes) if p else None
    return math.ceil(c.host_per_node * (1 + MEM_HEADROOM) / 2**20) if c else None


def job_name(p, job: JobOptions) -> str:
    """--job-name, else transit-CARD: a card's name comes from a file, so it is checked as
    any other #SBATCH value."""
    if job.name:
        return job.name
    name = f"transit-{p.req.card.name}" if p else "transit"
    try:
        job_name_value("the job name", name)
    except UsageError as e:
        raise UsageError(f"{e} (it comes from the model card's name; give --job-name)") from None
    return name


def mem_mib(text: str) -> int:
    """sbatch's --mem in MiB (a number with K, M, G or T; M when none; 0: all of a node's)."""
    scale = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2}
    unit = text[-1].upper() if text[-1].isalpha() else "M"
    return int(int(text.rstrip("KMGTkmgt")) * scale[unit])


def short_mem(job: JobOptions, planned: int | None) -> str | None:
    """A warning when --mem gives a node less host memory than the plan costed, or None."""
    if job.mem is None or planned is None or job.mem.rstrip("KMGTkmgt") == "0" or mem_mib(job.mem) >= planned:
        return None
    return (f"--mem {job.mem} is less than the {planned} MiB a node of this plan needs (offloaded state and each "
            "rank's own memory): a site that enforces memory limits kills the job")


def prediction(p, nodes: int, policy: str) -> dict | None:
    """What the plan predicts for the job at `nodes` nodes (TRANSIT_PLAN's JSON: the shim's
    reports carry it for `report`), or None without a planned option there."""
    c = p.at(nodes) if p else None
    if c is None:
        return None
    off = policy == "off"
    return {"version": 1, "model": p.req.card.name, "nodes": nodes, "gpus": c.layout.gpus, "gpu": p.req.gpu.name,
            "policy": policy, "per_gpu_total_gb": round(c.est.total / 1e9, 2),
            "offload_gb_per_gpu": 0.0 if off else round(c.offload / 1e9, 2),
            "predicted_efficiency": c.efficiency, "predicted_warm_up_s": round(c.warm_up_s, 1)}


def check_command(command: list[str]) -> None:
    """The training command after --: a first word that is empty or blank runs nothing."""
    if command and not command[0].strip():
        raise UsageError("the command after -- starts with an empty word: give the program to run, e.g. -- python "
                         "train.py")


def job_script(command: list[str], p, nodes: int, gpus_per_node: int, shim_opts: ShimOptions,
               job: JobOptions, local: bool = False, titan=None, node_loss=None, route: str = "script") -> str:
    """The sbatch script (local: the torchrun line) for `nodes` nodes of plan p (or None);
    titan (a TitanJob, planned by p): the command gets the config and the layout's overrides;
    route (render.ROUTES): the script exports the shim's environment, or #SBATCH --transit=
    lines have the SPANK plugin set it on the nodes."""
    from transit_launch.slurm.render import spank_route
    from transit_launch.planning import report
    from transit_launch.slurm import nodeloss
    check_command(command)
    if node_loss is not None:  # a nodeloss.NodeLossOptions (--on-node-loss)
        nodeloss.check(node_loss, p, nodes, local, titan)
    if titan is not None:
        from transit_launch.planning.titan_config import job_command
        command = job_command(titan, command, p, nodes)
    policy = policy_for(p, nodes, shim_opts.policy)
    if p and shim_opts.gpu_budget is None and policy != "off" and p.req.gpu.memory < p.req.gpu.physical:
        # --gpu-mem planned a smaller GPU than the part: the job's budget is the same number
        from dataclasses import replace
        shim_opts = replace(shim_opts, gpu_budget=int(p.req.gpu.memory))
    inject.check_off(policy, shim_opts.overlap, shim_opts.gpu_budget)  # also when the plan chose off for these nodes
    if p:
        inject.check_budget(shim_opts.gpu_budget, p.req.gpu)
    spank = spank_route(route, local, node_loss is not None and node_loss.scale_in)
    if spank:
        sbatch_value("--stats", shim_opts.stats)  # it goes on an #SBATCH line
    shim = inject.shim_path() if policy != "off" and not spank else None
    adapter = inject.adapter_dir() if shim else None
    env = shim_opts.job_env(policy, shim=shim, adapter=adapter, plugin=spank, plan=prediction(p, nodes, policy))
    ctx = dict(shim=shim, adapter=adapter, env_lines=env.exports(), env_prefix=env.prefix(), policy=policy,
               transit_options=list(env.sbatch), gpus_per_node=gpus_per_node, command=command)
    if policy != "off" and shim is None and not spank:
        from transit_launch.preload.inject import shim_missing_reason
        print(f"transit-launch: warning: libtransit.so is not installed ({shim_missing_reason()}); "
              f"the job will run without the shim", file=sys.stderr)
    if p and policy == "off" and p.at(nodes) and report.off_overflow(p, p.at(nodes)):
        print(f"transit-launch: WARNING: {nodes} node(s): {report.off_overflow(p, p.at(nodes))} "
              "(leave out --policy off)", file=sys.stderr)
    if local:
        return render("local.j2", **ctx)
    summary = f"{p.req.card.name} on {nodes} node(s), policy {policy}" if p else f"{nodes} node(s), policy {policy}"
    planned = planned_mem(p, nodes)
    mem = job.mem if job.mem is not None else (f"{planned}M" if planned else None)
    short = short_mem(job, planned)
    if short:
        print(f"transit-launch: WARNING: {short}", file=sys.stderr)
    return render("sbatch.j2", nodes=nodes, job_name=job_name(p, job), partition=job.partition,
                  account=job.account, time=job.time, output=job.output, rdzv_port=rdzv_port_expr(job.port),
                  cpus_per_task=job.cpus_per_task, mem=mem, exclusive=job.exclusive, constraint=job.constraint,
                  sbatch_args=job.sbatch_args, saved_lines=inject.JobEnv.save_lines(),
                  plan_lines=report.plan_comment(p, nodes, policy) if p else [], summary=summary, **ctx,
                  **nodeloss.template_context(node_loss, p, nodes, shim_opts, job.port, shim, adapter))
