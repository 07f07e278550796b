"""`simulate`: options in, sim.run's scenarios out."""

from __future__ import annotations

import json

from transit_launch.argtypes import fractions, nonneg_float, positive_int
from transit_launch.errors import UsageError


def cmd_simulate(a, command):
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


def register(sub):
    sp = sub.add_parser("simulate", help="replay a GPU job trace with and without scale-in")
    src = sp.add_argument_group("trace")
    src.add_argument("--trace", help="ACME Seren/Kalos CSV, or a generic CSV with submit_time,duration,gpus")
    src.add_argument("--format", choices=("auto", "seren", "kalos", "generic"), default="auto")
    src.add_argument("--synthetic", type=positive_int("--synthetic"), help="generate N jobs instead")
    src.add_argument("--seed", type=int, default=0)
    src.add_argument("--load", type=nonneg_float, default=0.8,
                     help="synthetic: offered load on the full cluster (default 0.8)")
    src.add_argument("--median-duration", type=nonneg_float, default=1800.0,
                     help="synthetic: median job duration in seconds (default 1800)")
    cl = sp.add_argument_group("cluster")
    cl.add_argument("--racks", type=positive_int("--racks"), default=72)
    cl.add_argument("--rack-gpus", type=positive_int("--rack-gpus"), default=32)
    cl.add_argument("--gpus-per-node", type=int, choices=(4, 8), default=8)
    cl.add_argument("--placement", choices=("pack", "spread"), default="pack")
    cl.add_argument("--reduced-racks", type=positive_int("--reduced-racks"),
                    help="also run every scenario on a cluster of this many racks")
    sc = sp.add_argument_group("scale-in")
    sc.add_argument("--reductions", type=fractions("--reductions", allow_zero=True), default=[0.25, 0.5],
                    help="node-count reductions for eligible (multi-node) jobs (default 0.25,0.5)")
    sc.add_argument("--speedup", type=nonneg_float, default=0.5,
                    help="inter-rack -> intra-rack speed-up (paper: 0-1.37; default 0.5)")
    sc.add_argument("--slowdown", type=nonneg_float, default=0.275,
                    help="intra-rack -> inter-rack slow-down (paper: 0-0.55; default 0.275)")
    sc.add_argument("--unchanged", type=float, default=0.0,
                    help="unchanged placement speed-up (paper: -0.05..0.05; default 0)")
    sp.add_argument("--plot", help="write a PNG like the paper's Figure 12 (needs matplotlib)")
    sp.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_simulate)
