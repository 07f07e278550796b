"""`render`, `submit`, `status`, `cancel` and `spank`: options in, the Slurm subpackage's
functions called, results printed."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace

from transit_launch.units import n_nodes
from transit_launch.argtypes import number, output_dir, output_file, positive_int, tcp_port
from transit_launch.errors import UsageError
from transit_launch.planning.cli import add_plan_args, request, titan_job
from transit_launch.planning.titan_config import DEFAULT_COMMAND
from transit_launch.rules import POLICIES
from transit_launch.preload.cli import add_shim_args
from transit_launch.slurm import scalein
from transit_launch.preload.options import ShimOptions
from transit_launch.slurm.render import ROUTES
from transit_launch.slurm.script import JobOptions, job_script


def add_job_args(sp):
    g = sp.add_argument_group("job")
    g.add_argument("--job-name", help="Slurm job name (default transit-MODEL, or transit without --model)")
    g.add_argument("--partition", help="Slurm partition (default: the cluster's default partition)")
    g.add_argument("--account", help="Slurm account to charge (default: the user's default account)")
    g.add_argument("--time", help="Slurm time limit, e.g. 04:00:00")
    g.add_argument("--output", default="%x-%j.out", help="Slurm output file (default %%x-%%j.out)")
    g.add_argument("--port", type=tcp_port,
                   help="torchrun's rendezvous port on the head node (default: 29500 plus the job id modulo 1000, "
                        "so jobs sharing a head node do not collide)")
    g.add_argument("--cpus-per-task", type=positive_int(),
                   help="CPUs for each node's torchrun (default: the partition's)")
    g.add_argument("--mem", help="host memory per node, sbatch's syntax: 500G, 256000M, 0 for all (default: the "
                                 "partition's)")
    g.add_argument("--exclusive", action="store_true", help="whole nodes, shared with no other job")
    g.add_argument("--constraint", help="node features the job needs, sbatch's syntax (e.g. h100)")
    g.add_argument("--sbatch-arg", action="append", metavar="OPTION",
                   help="one more #SBATCH line, e.g. --sbatch-arg=--qos=high (repeatable; the options the script "
                        "sets itself are refused)")


def _shim_opts(a) -> ShimOptions:
    return ShimOptions.from_args(a)


def _job_opts(a) -> JobOptions:
    return JobOptions(a.job_name, a.partition, a.account, a.time, a.output, a.port, a.cpus_per_task, a.mem,
                      a.exclusive, a.constraint, tuple(a.sbatch_arg or ()))


def _job_flags(job: JobOptions) -> list[tuple[str, object, object]]:
    """(flag, value, default) of each job option: what sbatch is told."""
    d = JobOptions()
    return [("--job-name", job.name, d.name), ("--partition", job.partition, d.partition),
            ("--account", job.account, d.account), ("--time", job.time, d.time),
            ("--output", job.output, d.output), ("--port", job.port, d.port),
            ("--cpus-per-task", job.cpus_per_task, d.cpus_per_task), ("--mem", job.mem, d.mem),
            ("--exclusive", job.exclusive, d.exclusive), ("--constraint", job.constraint, d.constraint),
            ("--sbatch-arg", job.sbatch_args, d.sbatch_args)]


# No GPU cluster has this many nodes (the largest have about 10-25 thousand): more is a typo
# that would render a script no scheduler accepts.
MAX_JOB_NODES = 100_000


def _nodes_or_auto(text: str) -> int | None:
    """argparse type of submit --nodes: auto (None) or a positive integer."""
    if text == "auto":
        return None
    return number(int, 1, f"auto or a positive integer of at most {MAX_JOB_NODES}", MAX_JOB_NODES)(text)


def _warn(warnings: list[str]) -> None:
    for w in warnings:  # loud: a node count that spills hot data runs many times slower
        print(f"transit-launch: WARNING: {w}", file=sys.stderr)


def cmd_render(a, command):
    from transit_launch.output_files import write_text_atomically
    from transit_launch.planning.choice import explain
    from transit_launch.planning.hardware import DEFAULT_GPUS_PER_NODE
    from transit_launch.planning.plan import plan
    if not command and not a.torchtitan:  # --torchtitan: python -m torchtitan.train by default
        raise UsageError("render needs the training command after --, e.g. -- python train.py")
    p = None
    if a.model or a.torchtitan:
        p = plan(request(a, host_cores=getattr(a, "cpus_per_task", None)))  # the job's CPUs, where given
    elif not (a.nodes or a.local):
        raise UsageError("render needs --model or --torchtitan (to plan the node count) or --nodes")
    if a.local and (a.nodes or 1) != 1:
        raise UsageError(f"--local renders a command for this one machine; --nodes {a.nodes} needs sbatch "
                         "(leave out --local)")
    if a.local:  # the torchrun command has no #SBATCH lines and a standalone rendezvous: they would be lost
        sbatch_only = [flag for flag, v, default in _job_flags(_job_opts(a)) if v != default]
        if sbatch_only:
            raise UsageError(f"--local renders a torchrun command for this machine; {', '.join(sbatch_only)} "
                             f"{'is' if len(sbatch_only) == 1 else 'are'} for sbatch (leave out --local)")
    if a.gpu_budget:  # against the plan's GPU; without a plan, the one --gpu or --gpu-mem names (if any)
        from transit_launch.planning.hardware import gpu_profile
        from transit_launch.preload import inject
        gpu = p.req.gpu if p else None
        if gpu is None and (a.gpu or a.gpu_mem):
            gpu = gpu_profile(a.gpu, a.gpu_mem)
        inject.check_budget(a.gpu_budget, gpu)  # before the warnings below: one line on bad input
    # --local is one node whatever the plan recommends: it is explained (and warned about) as asked
    nodes = 1 if a.local else a.nodes or (p.recommended.nodes if p else 1)
    if p and a.torchtitan:  # before the warnings: a refusal is one line
        from transit_launch.planning.titan_config import runnable
        runnable(p, nodes)
    gpn = p.req.gpus_per_node if p else (a.gpus_per_node or DEFAULT_GPUS_PER_NODE)
    text = job_script(command, p, nodes, gpn, _shim_opts(a), _job_opts(a), local=a.local, titan=titan_job(a),
                      node_loss=scalein.options(a), route=a.inject)
    if p and (a.nodes or a.local):  # after job_script, whose refusals must stay one line
        _warn(explain(p, nodes)[1])
    warnings = []
    if not a.local:  # where it is submitted from is not known here: said, not refused (submit refuses)
        from transit_launch.slurm.script import shared_output
        shared = shared_output(_job_opts(a).output, os.getcwd())
        warnings = [f"if submitted from here, {shared}"] if shared else []
        _warn(warnings)
    if a.out:
        write_text_atomically(a.out, text)
        print(f"transit-launch: wrote {a.out}", file=sys.stderr)
    if a.json:
        from transit_launch.planning.choice import policy_for
        print(json.dumps({"nodes": nodes, "gpus_per_node": gpn, "policy": policy_for(p, nodes, a.policy),
                          "model": p.req.card.name if p else None, "local": a.local, "out": a.out,
                          "script": None if a.out else text, "warnings": warnings}, indent=2))
    elif not a.out:
        sys.stdout.write(text)
    return 0


def cmd_submit(a, command):
    from transit_launch.slurm.submit import Submission, submit
    titan = titan_job(a)  # its command defaults to python -m torchtitan.train
    sub = Submission(command or (list(DEFAULT_COMMAND) if titan else []), a.nodes, _shim_opts(a), _job_opts(a),
                     a.dry_run, titan, gpu_given=a.gpu is not None)
    sub = replace(sub, node_loss=scalein.options(a))
    if a.parsable and (a.json or a.dry_run):  # before the plan and sbatch: one line on bad input
        raise UsageError(f"--parsable prints the job id alone; {'--json' if a.json else 'a --dry-run'} "
                         f"{'prints its own' if a.json else 'has none'}")
    done = submit(sub, lambda gpn, host_mem, gpu, cores: request(a, gpn, host_mem, gpu, cores))
    print(f"transit-launch: {done.hardware}", file=sys.stderr)
    print(f"transit-launch: {done.nodes} node(s): {done.why}", file=sys.stderr)
    _warn(done.warnings)
    if a.json:
        print(json.dumps({"job_id": done.job_id, "nodes": done.nodes, "why": done.why, "hardware": done.hardware,
                          "warnings": done.warnings, "output": done.output, "dry_run": a.dry_run,
                          "script": done.script}, indent=2))
    elif a.parsable:  # as sbatch --parsable: the job id and nothing else on stdout
        print(done.job_id)
    elif a.dry_run:
        sys.stdout.write(done.script)
    else:
        print(f"submitted job {done.job_id} ({n_nodes(done.nodes)}); output: {done.output}")
    return 0


def cmd_status(a, command):
    from transit_launch.slurm import commands
    from transit_launch.table import table
    a.job = _job_id(a, command)
    info = commands.job_info(a.job)
    if a.json:
        if "WorkDir" in info:  # --on-node-loss scale-in: the job's transitions (slurm/scalein.py)
            info["transitions"] = scalein.transitions(info["WorkDir"], info.get("JobId", a.job),
                                                      commands.job_uid(info))
        print(json.dumps(info, indent=2))
        return 0
    keys = ("JobId", "JobName", "JobState", "NumNodes", "NodeList", "ExitCode", "RunTime", "StdOut")
    print(table(["field", "value"], [[k, info[k]] for k in keys if k in info], "ll"))
    return 0


def cmd_cancel(a, command):
    from transit_launch.slurm import commands
    a.job = _job_id(a, command)
    commands.cancel(a.job)
    print(f"cancelled job {a.job}")
    return 0


def cmd_spank(a, command):
    from transit_launch.slurm import spank
    if a.spank_cmd == "build":
        print(f"built {spank.build(a.out, a.include, a.cc)}")
        return 0
    plugin, conf = spank.install(a.prefix, a.plugstack_dir, a.include, a.default, a.allowed, a.oversubscribe, a.cc)
    print(f"installed {plugin}\nwrote {conf}: add `include {conf.parent}/*.conf` to plugstack.conf "
          "if it is not there")
    return 0


JOB_HELP = "the Slurm job id: a positive integer, or an array task such as 123_4"


def _job_id(a, command) -> str:
    """status's and cancel's one job id, given before or after -- (`status -- -1` must be
    checked as the id it is, not reported as a missing argument)."""
    from transit_launch.slurm import commands
    ids = ([a.job] if a.job is not None else []) + command
    if len(ids) != 1:
        raise UsageError(f"{a.cmd} takes one job id, got " + (" ".join(map(repr, ids)) if ids else "none"))
    commands.check_job_id(ids[0])
    return ids[0]


CC_HELP = ("the C compiler (default: $CC, else cc on the system's PATH); as root it must be root's and "
           "changeable by root only, like every other input")


def register(sub):
    from transit_launch.argtypes import Parser
    sp = sub.add_parser("render", help="an sbatch script (or with --local a torchrun command) with the shim injected",
                        usage="transit-launch render [options] -- COMMAND...")
    add_plan_args(sp, model_required=False)
    sp.add_argument("--nodes", type=positive_int(MAX_JOB_NODES),
                    help="node count (default: the plan's recommendation)")
    add_shim_args(sp)
    add_job_args(sp)
    scalein.add_node_loss_args(sp)
    sp.add_argument("--local", action="store_true", help="a single-machine torchrun command instead of sbatch")
    sp.add_argument("--inject", choices=ROUTES, default="auto",
                    help="how the job gets the shim: spank writes #SBATCH --transit=POLICY lines for the SPANK "
                         "plugin, script exports the environment in the script; default auto: spank where "
                         "sbatch here offers --transit, else script (--local and scale-in: script)")
    sp.add_argument("-o", "--out", type=output_file(), help="write to this file instead of stdout")
    sp.add_argument("--json", action="store_true",
                    help="print the node count, policy, warnings and script (unless --out) as JSON")
    sp.set_defaults(func=cmd_render, takes_command=True)

    sp = sub.add_parser("submit", help="plan, render and sbatch a job with the shim injected",
                        usage="transit-launch submit (--model M | --torchtitan JOB.toml) [options] -- COMMAND...")
    add_plan_args(sp)
    sp.add_argument("--nodes", type=_nodes_or_auto, default=None, metavar="N|auto",
                    help="node count, or auto (default): plan's recommendation within the partition (the fewest "
                         "nodes that keep --min-efficiency with host DRAM to spare)")
    add_shim_args(sp)
    add_job_args(sp)
    scalein.add_node_loss_args(sp)
    sp.add_argument("--dry-run", action="store_true", help="print the script instead of submitting it")
    sp.add_argument("--json", action="store_true",
                    help="print the job id, node count, reason, warnings, output file and script as JSON")
    sp.add_argument("--parsable", action="store_true", help="print only the job id, as sbatch --parsable does")
    sp.set_defaults(func=cmd_submit, takes_command=True)

    sp = sub.add_parser("status", help="a Slurm job's state")
    sp.add_argument("job", nargs="?", help=JOB_HELP)
    sp.add_argument("--json", action="store_true", help="every field Slurm reports, as JSON")
    sp.set_defaults(func=cmd_status, takes_command=True)  # `status -- 123`: the id after -- (_job_id)
    sp = sub.add_parser("cancel", help="cancel a Slurm job")
    sp.add_argument("job", nargs="?", help=JOB_HELP)
    sp.set_defaults(func=cmd_cancel, takes_command=True)

    scalein.register(sub)  # _node-loss: what a --on-node-loss scale-in script runs between attempts

    sp = sub.add_parser("spank", help="build or install the SPANK plugin (sbatch --transit=POLICY)")
    sp.set_defaults(func=cmd_spank)
    ssub = sp.add_subparsers(dest="spank_cmd", required=True, parser_class=Parser)
    b = ssub.add_parser("build", help="compile the plugin against the installed spank.h")
    b.add_argument("--out", type=output_dir, default=".",
                   help="directory for transit_spank.so, made if missing in an existing one (default .)")
    b.add_argument("--include", help="directory holding spank.h")
    b.add_argument("--cc", help=CC_HELP)
    i = ssub.add_parser("install", help="build, install and write the plugstack include file")
    i.add_argument("--prefix", default="/usr/local", help="the plugin goes to PREFIX/lib/slurm (default /usr/local)")
    i.add_argument("--plugstack-dir", default="/etc/slurm/plugstack.conf.d",
                   help="directory for transit.conf; plugstack.conf must include it (default %(default)s)")
    i.add_argument("--include", help="directory holding spank.h (checked like the compiler)")
    i.add_argument("--cc", help=CC_HELP)
    i.add_argument("--default", choices=POLICIES, default="off", help="policy when a job asks for none (default off)")
    i.add_argument("--allowed", default=",".join(POLICIES),
                   help="policies users may choose, comma-separated (default %(default)s)")
    i.add_argument("--oversubscribe", choices=("allow", "deny"), default="deny",
                   help="allow: jobs may use real UVM oversubscription (TRANSIT_ALLOW_OVERSUBSCRIBE=1); deny: the "
                        "plugin removes it from every step (default deny)")
