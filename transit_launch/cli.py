"""Command line: parses, dispatches, and turns bad input into one line and exit code 2."""

from __future__ import annotations

import argparse
import json
import os
import sys

from transit_launch import __version__
from transit_launch.errors import UsageError
from transit_launch.units import parse_size


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints usage + message)
        raise UsageError(message)


def _number(cast, what, minimum, desc):
    """argparse type: cast(text) >= minimum, else one clear line."""
    def conv(text):
        try:
            v = cast(text)
        except ValueError:
            v = None
        if v is None or v < minimum:
            raise argparse.ArgumentTypeError(f"{what} must be {desc}, got {text!r}")
        return v
    return conv


def _positive_int(what):
    return _number(int, what, 1, "a positive integer")


def _fractions(flag, allow_zero=False):
    """Comma-separated fractions: in (0, 1), or [0, 1) with allow_zero."""
    def conv(text):
        try:
            vals = [float(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} takes fractions like 0.25,0.5, got {text!r}") from None
        low_ok = (lambda v: v >= 0) if allow_zero else (lambda v: v > 0)
        if not vals or any(not (low_ok(v) and v < 1) for v in vals):
            span = "must lie in [0, 1)" if allow_zero else "fractions must lie strictly between 0 and 1"
            raise argparse.ArgumentTypeError(f"{flag} {span}, got {text!r}")
        return vals
    return conv


def _add_plan_args(p, model_required=True):
    from transit_launch.hardware import GPUS
    from transit_launch.plan import PRESETS
    g = p.add_argument_group("model and layout")
    g.add_argument("--model", required=model_required,
                   help="catalog name (see `transit-launch models`), a model card .toml or a HF config.json")
    g.add_argument("--parallel", choices=PRESETS, default=None,
                   help="parallelism preset (default fsdp; explicit --tp/--pp/--ep refine it)")
    g.add_argument("--tp", type=_positive_int("--tp"))
    g.add_argument("--pp", type=_positive_int("--pp"))
    g.add_argument("--ep", type=_positive_int("--ep"))
    g.add_argument("--seq-len", type=_positive_int("--seq-len"), default=8192)
    g.add_argument("--local-batch", type=_positive_int("--local-batch"), default=1,
                   help="sequences per data-parallel rank per microstep (microbatches under PP)")
    g.add_argument("--global-batch", type=_positive_int("--global-batch"),
                   help="sequences per optimizer step; only node counts whose data-parallel degree divides it are valid")
    g.add_argument("--precision", choices=("mixed", "bf16"), default="mixed",
                   help="mixed: fp32 params/grads/Adam with bf16 compute (TorchTitan default); bf16: everything bf16")
    g.add_argument("--recompute", choices=("full", "none"), default="full")
    h = p.add_argument_group("hardware")
    h.add_argument("--gpu", default=None, help=f"GPU profile: {', '.join(GPUS)} (default h100-80gb)")
    h.add_argument("--gpu-mem", help="GPU memory size, overriding the profile's (e.g. 40GB)")
    h.add_argument("--gpus-per-node", type=_positive_int("--gpus-per-node"), default=None,
                   help="GPUs per node (default 4)")
    h.add_argument("--host-mem", help="host DRAM per node (default 2000GB)")
    p.add_argument("--scale-in", type=_fractions("--scale-in"), metavar="FRACTIONS",
                   help="node reductions to show, e.g. 0.25,0.5 (default: every valid node count below the minimum)")
    p.add_argument("--min-efficiency", type=float, default=0.9,
                   help="predicted per-GPU efficiency the recommendation must keep (default 0.9)")


def _request(a):
    from transit_launch.hardware import gpu_profile
    from transit_launch.models import load_model
    from transit_launch.plan import DEFAULT_HOST_MEM, Request
    card = load_model(a.model)
    gpu = gpu_profile(a.gpu, parse_size(a.gpu_mem, "--gpu-mem") if a.gpu_mem else None)
    parallel = a.parallel or ("fsdp+ep" if a.ep else "tp+pp" if a.pp else "fsdp+tp" if a.tp else "fsdp")
    if not 0 < a.min_efficiency <= 1:
        raise UsageError(f"--min-efficiency must lie in (0, 1], got {a.min_efficiency}")
    return Request(card=card, gpu=gpu, gpus_per_node=a.gpus_per_node or 4,
                   host_mem=parse_size(a.host_mem, "--host-mem") if a.host_mem else DEFAULT_HOST_MEM,
                   parallel=parallel, tp=a.tp, pp=a.pp, ep=a.ep, seq_len=a.seq_len,
                   local_batch=a.local_batch, global_batch=a.global_batch, precision=a.precision,
                   recompute=a.recompute, scale_in=tuple(a.scale_in) if a.scale_in else None,
                   min_efficiency=a.min_efficiency)


def cmd_plan(a):
    from transit_launch import report
    from transit_launch.plan import plan
    p = plan(_request(a))
    print(json.dumps(report.plan_json(p), indent=2) if a.json else report.plan_text(p))
    return 0


def cmd_models(a):
    from transit_launch import report
    from transit_launch.models import catalog
    cards = catalog()
    print(json.dumps([c.summary() for c in cards.values()], indent=2) if a.json else report.models_text(cards))
    return 0


def _script(a, command, p, nodes, policy):
    """The sbatch script (or with --local the torchrun line) for `nodes` nodes."""
    from transit_launch import doctor, inject, report
    from transit_launch.render import render
    policy = policy or ("advise" if p and nodes < p.baseline.nodes else "off")
    gpn = a.gpus_per_node or 4
    shim = inject.shim_path() if policy != "off" else None
    adapter = inject.adapter_dir() if shim else None
    env = inject.shim_env(policy, parse_size(a.gpu_budget, "--gpu-budget") if a.gpu_budget else None,
                          a.stats, a.log)
    ctx = dict(shim=shim, adapter=adapter, env=env, policy=policy, gpus_per_node=gpn, command=command)
    if policy != "off" and shim is None:
        print(f"transit-launch: warning: libtransit.so is not installed ({doctor.shim_missing_reason()}); "
              f"the job will run without the shim", file=sys.stderr)
    if getattr(a, "local", False):
        return render("local.j2", **ctx)
    name = a.job_name or (f"transit-{p.req.card.name}" if p else "transit")
    summary = f"{p.req.card.name} on {nodes} node(s), policy {policy}" if p else f"{nodes} node(s), policy {policy}"
    return render("sbatch.j2", nodes=nodes, job_name=name, partition=a.partition, account=a.account, time=a.time,
                  output=a.output, port=a.port, plan_lines=report.plan_comment(p, nodes) if p else [],
                  summary=summary, **ctx)


def cmd_render(a, command):
    from transit_launch.plan import plan
    if not command:
        raise UsageError("render needs the training command after --, e.g. -- python train.py")
    p = None
    if a.model:
        p = plan(_request(a))
    elif not (a.nodes or a.local):
        raise UsageError("render needs --model (to plan the node count) or --nodes")
    nodes = a.nodes or (p.recommended.nodes if p else 1)
    text = _script(a, command, p, nodes, a.policy)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
        print(f"wrote {a.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_submit(a, command):
    from transit_launch import slurm
    from transit_launch.plan import auto_nodes, plan
    if not command:
        raise UsageError("submit needs the training command after --, e.g. -- python train.py")
    part = None
    try:
        part = slurm.partition(a.partition)
    except UsageError:
        if not a.dry_run:
            raise
    if part:
        if not part.gpus_per_node:
            raise UsageError(f"partition {part.name} has no GPUs (no gpu GRES on its nodes)")
        a.gpus_per_node = a.gpus_per_node or part.gpus_per_node
        a.host_mem = a.host_mem or f"{part.real_memory_mb}MiB"
    p = plan(_request(a))
    max_nodes = part.nodes if part else 10**6
    if a.nodes in (None, "auto"):
        nodes, why = auto_nodes(p, max_nodes)
    else:
        try:
            nodes = int(a.nodes)
        except ValueError:
            raise UsageError(f"--nodes takes a number or auto, got {a.nodes!r}") from None
        if nodes < 1 or nodes > max_nodes:
            raise UsageError(f"--nodes {nodes}: the partition has {max_nodes} nodes")
        why = "as asked"
    script = _script(a, command, p, nodes, a.policy)
    print(f"transit-launch: {nodes} node(s): {why}", file=sys.stderr)
    if a.dry_run:
        sys.stdout.write(script)
        return 0
    job = slurm.submit(script)
    out = a.output.replace("%x", a.job_name or f"transit-{p.req.card.name}").replace("%j", job)
    print(f"submitted job {job} ({nodes} nodes); output: {os.path.abspath(out)}")
    return 0


def cmd_status(a):
    from transit_launch import slurm
    from transit_launch.table import table
    info = slurm.job_info(a.job)
    if a.json:
        print(json.dumps(info, indent=2))
        return 0
    keys = ("JobId", "JobName", "JobState", "NumNodes", "NodeList", "ExitCode", "RunTime", "StdOut")
    print(table(["field", "value"], [[k, info[k]] for k in keys if k in info], "ll"))
    return 0


def cmd_cancel(a):
    from transit_launch import slurm
    slurm.cancel(a.job)
    print(f"cancelled job {a.job}")
    return 0


def cmd_spank(a):
    from transit_launch import spank
    if a.spank_cmd == "build":
        print(f"built {spank.build(a.out, a.include)}")
        return 0
    plugin, conf = spank.install(a.prefix, a.plugstack_dir, a.include, a.default, a.allowed, a.oversubscribe)
    print(f"installed {plugin}\nwrote {conf}: add `include {conf.parent}/*.conf` to plugstack.conf "
          "if it is not there")
    return 0


def cmd_run(a, command):
    from transit_launch import run as runmod
    budget = parse_size(a.gpu_budget, "--gpu-budget") if a.gpu_budget else None
    rc, stats = runmod.run(command, a.policy, budget, a.stats, a.log)
    summ = runmod.summary(stats)
    if a.json:
        print(json.dumps(summ | {"returncode": rc}, indent=2))
    else:
        print(runmod.summary_text(summ), file=sys.stderr)
    return rc


def cmd_simulate(a):
    from transit_launch.sim import run as simrun
    from transit_launch.sim import trace as tr
    from transit_launch.sim.scheduler import Factors
    if bool(a.trace) == bool(a.synthetic):
        raise UsageError("simulate needs exactly one of --trace FILE or --synthetic N")
    if a.rack_gpus % a.gpus_per_node:
        raise UsageError(f"--rack-gpus {a.rack_gpus} is not a multiple of --gpus-per-node {a.gpus_per_node}")
    if a.trace:
        trace = tr.load_csv(a.trace, a.format)
    else:
        trace = tr.synthetic(a.synthetic, a.seed, tr.SynthSpec(load=a.load, cluster_gpus=a.racks * a.rack_gpus,
                                                               median_duration=a.median_duration))
    reductions = [0.0] + [f for f in a.reductions if f > 0]
    scs = simrun.scenarios(a.racks, reductions, a.reduced_racks, rack_gpus=a.rack_gpus,
                           gpus_per_node=a.gpus_per_node, strategy=a.placement,
                           factors=Factors(a.speedup, a.slowdown, a.unchanged))
    results = simrun.run_all(trace, scs, progress=len(trace) >= 100_000 and not a.quiet)
    if a.plot:
        simrun.plot(results, a.plot)
    out = {"trace": {"source": trace.source, "jobs": len(trace), "dropped": trace.dropped}, "scenarios": results}
    print(json.dumps(out, indent=2) if a.json else simrun.text(results, trace))
    return 0


_nonneg_float = _number(float, "the value", 0.0, "a non-negative number")


def cmd_sweep(a, command):
    from transit_launch import netcap, sweep
    journal = netcap.Journal(netcap.journal_path(a.journal))
    if a.restore:
        done = netcap.restore_journal(journal)
        for line in done or ["nothing to restore"]:
            print(line)
        return 1 if any(line.startswith("ERROR") for line in done) else 0
    if not command:
        raise UsageError("sweep needs the job after --, e.g. -- python examples/train_llama.py --device cpu")
    if not a.bandwidths or not a.iface:
        raise UsageError("sweep needs --bandwidths and --iface")
    bws = [netcap.parse_bandwidth(b) for b in a.bandwidths.split(",") if b.strip()]
    if len(set(bws)) < len(bws):
        raise UsageError("--bandwidths lists a bandwidth twice")
    be = netcap.backend(a.cap)
    if a.metric_regex:
        import re
        try:
            groups = re.compile(a.metric_regex).groups
        except re.error as e:
            raise UsageError(f"--metric-regex: {e}") from None
        if groups < 1:
            raise UsageError("--metric-regex needs one group that captures the number")
    slurm_mode = a.slurm or int(os.environ.get("SLURM_JOB_NUM_NODES") or 0) > 1
    if slurm_mode:
        if not os.environ.get("SLURM_JOB_ID"):
            raise UsageError("--slurm runs inside a Slurm allocation (sbatch/salloc)")
        capper = netcap.SlurmCapper(be, a.iface, a.journal, sys.executable)
        capper.check(bws)
    else:
        ifaces = netcap.ifaces_for_node(a.iface, netcap.node_name())
        if not ifaces:
            raise UsageError(f"--iface {a.iface}: no interface for this node ({netcap.node_name()})")
        netcap.check_ready(be, ifaces, bws, journal)
        capper = netcap.Capper(be, ifaces, journal)
    report = sweep.sweep(capper, bws, command, a.repeat, a.timeout, a.metric_regex, a.fail_fast)
    if a.plot:
        sweep.plot(report, a.plot)
    print(json.dumps(report, indent=2) if a.json else sweep.text(report))
    if report["interrupted"]:
        return 130
    return 1 if report["restore_errors"] or not report["rho"] and len(bws) > 1 else 0


def cmd_netcap(a):
    """The per-node helper of sweeps under Slurm: one JSON line per call."""
    from transit_launch import netcap
    print(json.dumps(netcap.node_action(a.action, a.cap, a.iface, a.bandwidth, a.journal)))
    return 0


def cmd_doctor(a):
    from transit_launch import doctor, report
    checks = doctor.run_checks()
    print(json.dumps(checks, indent=2, default=str) if a.json else report.doctor_text(checks))
    return 0


def _add_shim_args(sp):
    from transit_launch.inject import POLICIES
    g = sp.add_argument_group("shim")
    g.add_argument("--policy", choices=POLICIES,
                   help="shim policy (default: advise below the no-offload minimum, off otherwise)")
    g.add_argument("--gpu-budget", help="TRANSIT_GPU_BUDGET: managed bytes the shim lets reside on each GPU")
    g.add_argument("--stats", help="TRANSIT_STATS: directory (or file) for the shim's per-rank stats JSON")
    g.add_argument("--log", choices=("error", "warn", "info", "debug"), help="TRANSIT_LOG level")


def _add_job_args(sp):
    g = sp.add_argument_group("job")
    g.add_argument("--job-name")
    g.add_argument("--partition")
    g.add_argument("--account")
    g.add_argument("--time", help="Slurm time limit, e.g. 04:00:00")
    g.add_argument("--output", default="%x-%j.out", help="Slurm output file (default %%x-%%j.out)")
    g.add_argument("--port", type=_positive_int("--port"), default=29500, help="rendezvous port on the head node")


def build_parser():
    from transit_launch.inject import POLICIES
    p = _Parser(prog="transit-launch", description="Transparent scale-in for PyTorch training on Slurm.")
    p.add_argument("--version", action="version", version=f"transit-launch {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    sp = sub.add_parser("plan", help="per-GPU memory, minimum nodes without offloading, scale-in options")
    _add_plan_args(sp)
    sp.add_argument("--json", action="store_true", help="machine-readable output")

    sp = sub.add_parser("models", help="the model catalog")
    sp.add_argument("--json", action="store_true")

    sp = sub.add_parser("render", help="an sbatch script (or with --local a torchrun command) with the shim injected",
                        usage="transit-launch render [options] -- COMMAND...")
    _add_plan_args(sp, model_required=False)
    sp.add_argument("--nodes", type=_positive_int("--nodes"), help="node count (default: the plan's recommendation)")
    _add_shim_args(sp)
    _add_job_args(sp)
    sp.add_argument("--local", action="store_true", help="a single-machine torchrun command instead of sbatch")
    sp.add_argument("-o", "--out", help="write to this file instead of stdout")

    sp = sub.add_parser("submit", help="plan, render and sbatch a job with the shim injected",
                        usage="transit-launch submit --model M [options] -- COMMAND...")
    _add_plan_args(sp)
    sp.add_argument("--nodes", default="auto", help="node count, or auto: the fewest that fit host DRAM (default)")
    _add_shim_args(sp)
    _add_job_args(sp)
    sp.add_argument("--dry-run", action="store_true", help="print the script instead of submitting it")

    sp = sub.add_parser("status", help="a Slurm job's state")
    sp.add_argument("job")
    sp.add_argument("--json", action="store_true")
    sp = sub.add_parser("cancel", help="cancel a Slurm job")
    sp.add_argument("job")

    sp = sub.add_parser("spank", help="build or install the SPANK plugin (sbatch --transit=POLICY)")
    ssub = sp.add_subparsers(dest="spank_cmd", required=True, parser_class=_Parser)
    b = ssub.add_parser("build", help="compile the plugin against the installed spank.h")
    b.add_argument("--out", default=".", help="directory for transit_spank.so (default .)")
    b.add_argument("--include", help="directory holding spank.h")
    i = ssub.add_parser("install", help="build, install and write the plugstack include file")
    i.add_argument("--prefix", default="/usr/local", help="the plugin goes to PREFIX/lib/slurm (default /usr/local)")
    i.add_argument("--plugstack-dir", default="/etc/slurm/plugstack.conf.d")
    i.add_argument("--include", help="directory holding spank.h")
    i.add_argument("--default", choices=POLICIES, default="off", help="policy when a job asks for none")
    i.add_argument("--allowed", default="off,base,prefetch,advise", help="policies users may choose")
    i.add_argument("--oversubscribe", choices=("allow", "deny"), default="deny",
                   help="allow: real UVM oversubscription (TRANSIT_ALLOW_OVERSUBSCRIBE=1)")

    sp = sub.add_parser("run", help="run a command here with the shim injected, then summarize its stats",
                        usage="transit-launch run [--policy P] [--gpu-budget SIZE] -- COMMAND...")
    sp.add_argument("--policy", choices=POLICIES, default="advise")
    sp.add_argument("--gpu-budget", help="TRANSIT_GPU_BUDGET: managed bytes the shim lets reside on the GPU (e.g. 40GB)")
    sp.add_argument("--stats", help="directory (or file) for the shim's stats JSON (default: a temporary directory)")
    sp.add_argument("--log", choices=("error", "warn", "info", "debug"), help="TRANSIT_LOG level")
    sp.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")

    sp = sub.add_parser("simulate", help="replay a GPU job trace with and without scale-in")
    src = sp.add_argument_group("trace")
    src.add_argument("--trace", help="ACME Seren/Kalos CSV, or a generic CSV with submit_time,duration,gpus")
    src.add_argument("--format", choices=("auto", "seren", "kalos", "generic"), default="auto")
    src.add_argument("--synthetic", type=_positive_int("--synthetic"), help="generate N jobs instead")
    src.add_argument("--seed", type=int, default=0)
    src.add_argument("--load", type=_nonneg_float, default=0.8,
                     help="synthetic: offered load on the full cluster (default 0.8)")
    src.add_argument("--median-duration", type=_nonneg_float, default=1800.0,
                     help="synthetic: median job duration in seconds (default 1800)")
    cl = sp.add_argument_group("cluster")
    cl.add_argument("--racks", type=_positive_int("--racks"), default=72)
    cl.add_argument("--rack-gpus", type=_positive_int("--rack-gpus"), default=32)
    cl.add_argument("--gpus-per-node", type=int, choices=(4, 8), default=8)
    cl.add_argument("--placement", choices=("pack", "spread"), default="pack")
    cl.add_argument("--reduced-racks", type=_positive_int("--reduced-racks"),
                    help="also run every scenario on a cluster of this many racks")
    sc = sp.add_argument_group("scale-in")
    sc.add_argument("--reductions", type=_fractions("--reductions", allow_zero=True), default=[0.25, 0.5],
                    help="node-count reductions for eligible (multi-node) jobs (default 0.25,0.5)")
    sc.add_argument("--speedup", type=_nonneg_float, default=0.5,
                    help="inter-rack -> intra-rack speed-up (paper: 0-1.37; default 0.5)")
    sc.add_argument("--slowdown", type=_nonneg_float, default=0.275,
                    help="intra-rack -> inter-rack slow-down (paper: 0-0.55; default 0.275)")
    sc.add_argument("--unchanged", type=float, default=0.0,
                    help="unchanged placement speed-up (paper: -0.05..0.05; default 0)")
    sp.add_argument("--plot", help="write a PNG like the paper's Figure 12 (needs matplotlib)")
    sp.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    sp.add_argument("--json", action="store_true")

    sp = sub.add_parser("sweep", help="run a job under NIC bandwidth caps and compute rho",
                        usage="transit-launch sweep --bandwidths 400,100 --cap tc --iface IFACE -- COMMAND...")
    sp.add_argument("--bandwidths", help="comma-separated, Gbit/s unless a unit is given (400,100 or 1000mbit,100mbit)")
    sp.add_argument("--cap", choices=("mlnx_qos", "dcb", "tc"), default="tc")
    sp.add_argument("--iface", help="IFACE[,IFACE...]; NETNS/IFACE for an interface inside a network namespace")
    sp.add_argument("--repeat", type=_positive_int("--repeat"), default=1)
    sp.add_argument("--timeout", type=_nonneg_float, help="seconds one run may take")
    sp.add_argument("--metric-regex", help="throughput from the job's stdout: a regex whose first group is the number")
    sp.add_argument("--fail-fast", action="store_true", help="stop at the first failed run")
    sp.add_argument("--journal", help="restore journal, %%n = node name "
                                      "(default ~/.local/state/transit-launch/netcap-NODE.json)")
    sp.add_argument("--restore", action="store_true", help="undo the caps a crashed sweep left, then exit")
    sp.add_argument("--slurm", action="store_true",
                    help="cap every node of the Slurm allocation (default when the allocation has several nodes)")
    sp.add_argument("--plot", help="write a PNG (needs matplotlib)")
    sp.add_argument("--json", action="store_true")

    sp = sub.add_parser("netcap", help="per-node cap helper that sweeps run under Slurm")
    sp.add_argument("action", choices=("check", "apply", "restore", "counters"))
    sp.add_argument("--cap", choices=("mlnx_qos", "dcb", "tc"), required=True)
    sp.add_argument("--iface", required=True, help="IFACE[,IFACE...]; NODE=IFACE for one node only")
    sp.add_argument("--bandwidth")
    sp.add_argument("--journal")

    sp = sub.add_parser("doctor", help="what this machine has: GPU, managed memory, host memory, shim, Slurm")
    sp.add_argument("--json", action="store_true")
    return p


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    command = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1:]
    try:
        a = build_parser().parse_args(argv)
        if a.cmd == "render":
            return cmd_render(a, command)
        if a.cmd == "run":
            return cmd_run(a, command)
        if a.cmd == "submit":
            return cmd_submit(a, command)
        if a.cmd == "sweep":
            return cmd_sweep(a, command)
        if command:
            raise UsageError(f"{a.cmd} takes no command after --")
        return {"plan": cmd_plan, "models": cmd_models, "doctor": cmd_doctor, "simulate": cmd_simulate,
                "status": cmd_status, "cancel": cmd_cancel, "spank": cmd_spank, "netcap": cmd_netcap}[a.cmd](a)
    except UsageError as e:
        print(f"transit-launch: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("transit-launch: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
