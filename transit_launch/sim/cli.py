"""`simulate`: options in, sim.run's scenarios out."""

from __future__ import annotations

import json
import sys

from transit_launch.argtypes import finite_float, fractions, output_file, positive_int, require_matplotlib
from transit_launch.errors import UsageError
from transit_launch.planning.hardware import DEFAULT_GPUS_PER_NODE
from transit_launch.sim.scheduler import STRATEGIES
from transit_launch.sim.trace import FORMATS


def cmd_simulate(a, command):
    from transit_launch.sim import run as simrun
    from transit_launch.sim import trace as tr
    from transit_launch.sim.progress import Progress
    from transit_launch.sim.scheduler import Factors
    if bool(a.trace) == bool(a.synthetic):
        raise UsageError("simulate needs exactly one of --trace FILE or --synthetic N")
    # Everything that can be refused is refused before the work: the scenarios, the
    # synthetic distributions, the job count and the plot's backend (its path was checked
    # when the options were parsed).
    reductions = [0.0] + [f for f in a.reductions if f > 0]
    scs = simrun.scenarios(a.racks, reductions, a.reduced_racks, rack_gpus=a.rack_gpus,
                           gpus_per_node=a.gpus_per_node, strategy=a.placement,
                           factors=Factors(a.speedup, a.slowdown, a.unchanged))
    if a.synthetic:
        spec = tr.SynthSpec(load=a.load, cluster_gpus=a.racks * a.rack_gpus, median_duration=a.median_duration)
        tr.check_jobs(a.synthetic)
    if a.plot:
        require_matplotlib("--plot")
    # generating a trace costs about a sixth of one scenario's replay (measured on 1M jobs)
    first = (f"generating {a.synthetic:,} jobs" if a.synthetic else f"reading {a.trace}", 0.15)
    progress = Progress([first] + [(sc.name, 1.0) for sc in scs], enabled=not a.quiet)
    progress.phase(0)
    try:
        trace = (tr.load_csv(a.trace, a.format, progress.update) if a.trace else
                 tr.synthetic(a.synthetic, a.seed, spec, progress.update))
        results = simrun.run_all(trace, scs, progress)
    finally:
        progress.close()
    if a.plot:
        simrun.plot(results, a.plot)
        print(f"transit-launch: wrote {a.plot}", file=sys.stderr)
    out = {"trace": {"source": trace.source, "jobs": len(trace), "dropped": trace.dropped}, "scenarios": results}
    print(json.dumps(out, indent=2) if a.json else simrun.text(results, trace))
    return 0


def register(sub):
    sp = sub.add_parser("simulate", help="replay a GPU job trace with and without scale-in")
    src = sp.add_argument_group("trace")
    src.add_argument("--trace", help="ACME Seren/Kalos CSV, or a generic CSV with submit_time,duration,gpus")
    src.add_argument("--format", choices=FORMATS, default="auto")
    src.add_argument("--synthetic", type=positive_int("--synthetic"), help="generate N jobs instead")
    src.add_argument("--seed", type=int, default=0)
    src.add_argument("--load", type=finite_float("--load"), default=0.8,
                     help="synthetic: offered load on the full cluster, in (0, 10] (default 0.8)")
    src.add_argument("--median-duration", type=finite_float("--median-duration"), default=1800.0,
                     help="synthetic: median job duration in seconds (default 1800)")
    cl = sp.add_argument_group("cluster")
    cl.add_argument("--racks", type=positive_int("--racks"), default=72)
    cl.add_argument("--rack-gpus", type=positive_int("--rack-gpus"), default=32)
    cl.add_argument("--gpus-per-node", type=int, choices=(4, 8), default=DEFAULT_GPUS_PER_NODE,
                    help=f"GPUs per node (default {DEFAULT_GPUS_PER_NODE}, as in plan, render and submit; "
                         "the ACME clusters' nodes have 8)")
    cl.add_argument("--placement", choices=STRATEGIES, default="pack")
    cl.add_argument("--reduced-racks", type=positive_int("--reduced-racks"),
                    help="also run every scenario on a cluster of this many racks")
    sc = sp.add_argument_group("scale-in")
    sc.add_argument("--reductions", type=fractions("--reductions", allow_zero=True), default=[0.25, 0.5],
                    help="node-count reductions for eligible (multi-node) jobs (default 0.25,0.5)")
    sc.add_argument("--speedup", type=finite_float("--speedup"), default=0.5,
                    help="inter-rack -> intra-rack speed-up (paper: 0-1.37; default 0.5)")
    sc.add_argument("--slowdown", type=finite_float("--slowdown"), default=0.275,
                    help="intra-rack -> inter-rack slow-down (paper: 0-0.55; default 0.275)")
    sc.add_argument("--unchanged", type=finite_float("--unchanged"), default=0.0,
                    help="unchanged placement speed-up (paper: -0.05..0.05; default 0)")
    sp.add_argument("--plot", type=output_file((".png",)), metavar="FILE.png",
                    help="write a PNG like the paper's Figure 12 (needs matplotlib)")
    sp.add_argument("--quiet", action="store_true",
                    help="no progress on stderr (otherwise: a line redrawn on a terminal, a line per phase elsewhere, "
                         "for runs longer than 2 s)")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_simulate)
