"""`simulate`: options in, sim.run's scenarios out."""

from __future__ import annotations

import functools
import json
import sys

from transit_launch.argtypes import finite_float, fractions, number, output_file, positive_int
from transit_launch.errors import UsageError
from transit_launch.output_files import require_matplotlib, write_text_atomically
from transit_launch.planning.hardware import DEFAULT_GPUS_PER_NODE
from transit_launch.sim.scheduler import STRATEGIES
from transit_launch.sim.efficiency import BAND as EFFICIENCY_BAND, NAMES as EFFICIENCY_NAMES
from transit_launch.sim.limits import PLAN_ON, RESERVE_AT
from transit_launch.sim.synth import PRESETS
from transit_launch.sim.tracefile import FORMATS


def cmd_simulate(a, command):
    from transit_launch.sim import bands, compare, reruns as rerunning
    from transit_launch.sim import efficiency
    from transit_launch.sim import run as simrun
    from transit_launch.sim import synth
    from transit_launch.sim import limits, tracefile
    from transit_launch.sim import trace as tr
    from transit_launch.sim.jobsout import JobsOut
    from transit_launch.sim.limits import SchedParams
    from transit_launch.sim.progress import Progress
    from transit_launch.sim.scheduler import Factors
    if bool(a.trace) == bool(a.synthetic):
        raise UsageError("simulate needs exactly one of --trace FILE or --synthetic N")
    if a.node_failures is not None and a.epilog:
        raise UsageError("--epilog is not modelled in the --node-failures replays; leave it out there")
    if a.node_failures is not None and a.scheduler == "slurm":
        raise UsageError("--scheduler slurm places jobs as Slurm's topology/tree, and --node-failures replays place "
                         "them as pack: add --bf-reserve 0 --bf-reserve-at slurm instead")
    _scheduler(a)
    sched = SchedParams(a.bf_max_job_test, a.bf_interval, a.bf_resolution, a.plan_on, a.bf_window * 60,
                        a.bf_reserve, a.bf_reserve_at, a.epilog)
    if a.node_failures is not None:
        return _cmd_failures(a, sched)
    if a.on_node_loss != "both" or a.repair_hours is not None or a.checkpoint_hours is not None \
            or a.restart_minutes is not None:
        raise UsageError("--on-node-loss, --repair-hours, --checkpoint-hours and --restart-minutes model node "
                         "failures; add --node-failures RATE (or llama3)")
    if a.trace and (a.preset or a.median_duration is not None):
        raise UsageError("--preset and --median-duration shape synthetic traces; --trace replays one as it is")
    if a.trace and a.seeds > 1 and a.limit_factor == 1:
        raise UsageError("--seeds with --trace varies the time limits drawn for jobs the trace gives none "
                         "(--limit-factor above 1); with --limit-factor 1 every seed replays the same")
    limits.modelled(tr.Trace(), a.limit_factor, 0)  # the factor's check, before the work
    if a.preset and a.median_duration is not None:
        raise UsageError(f"--preset {a.preset} sets its own durations; leave out --median-duration")
    # Everything that can be refused is refused before the work: the scenarios, the
    # synthetic distributions, the job count and the plot's backend (its path was checked
    # when the options were parsed).
    reductions = [0.0] + [f for f in a.reductions if f > 0]
    scs = simrun.scenarios(a.racks, reductions, a.reduced_racks, rack_gpus=a.rack_gpus,
                           gpus_per_node=a.gpus_per_node, strategy=a.placement,
                           factors=Factors(a.speedup, a.slowdown, a.unchanged),
                           efficiency=efficiency.parse(a.efficiency),
                           sched=sched)
    seeds = list(range(a.seed, a.seed + a.seeds))
    # the band: the scale-in scenarios again with each other curve (sim/bands.py)
    others = [] if a.no_band or not any(sc.reduction for sc in scs) else bands.curves(a.efficiency, scs[0].efficiency)[1:]
    if a.synthetic:
        gpus = a.racks * a.rack_gpus
        median = 1800.0 if a.median_duration is None else a.median_duration
        spec = (synth.preset(a.preset, a.load, gpus) if a.preset else
                synth.SynthSpec(load=a.load, cluster_gpus=gpus, median_duration=median))
        synth.check_jobs(a.synthetic)
        if max(g for g, _ in spec.sizes) > min(sc.racks for sc in scs) * a.rack_gpus:
            raise UsageError(f"{f'--preset {a.preset}' if a.preset else 'the synthetic trace'} has jobs of "
                             f"{max(g for g, _ in spec.sizes)} GPUs, more than "
                             f"{min(sc.racks for sc in scs)} racks of {a.rack_gpus} hold; use more racks")
    if a.plot:
        require_matplotlib("--plot")
    # generating a trace costs about a sixth of one scenario's replay (measured on 1M jobs)
    first = f"generating {a.synthetic:,} jobs" if a.synthetic else f"reading {a.trace}"
    phases = []
    for s in seeds:
        phases += [(first + (f", seed {s}" if len(seeds) > 1 else ""), 0.15)] + [(sc.name, 1.0) for sc in scs]
    for s in seeds:  # the band's replays, collected after every seed's scenarios (sim/reruns.py)
        phases += [(f"{sc.name}, {label}" + (f", seed {s}" if len(seeds) > 1 else ""), 1.0)
                   for label, _ in others for sc in scs if sc.reduction]
    progress = Progress(phases, enabled=not a.quiet)
    runs, loaded = [], None
    reruns = rerunning.Reruns(others) if others else None
    rows_out = JobsOut(a.jobs_out) if a.jobs_out else None
    try:
        for s in seeds:
            progress.phase(progress.k + 1)
            if a.trace:  # read once; each seed draws its own limits (sim/limits.py)
                loaded = loaded or tracefile.load(a.trace, a.format, progress.update)
                trace = loaded
            else:
                trace = synth.synthetic(a.synthetic, s, spec, progress.update)
            trace = limits.modelled(trace, a.limit_factor, s)
            each = (lambda res, s=s, t=trace: rows_out.write(s, res, t.ids, t.submit)) if rows_out else None
            baselines = {}
            runs.append(simrun.run_all(trace, scs, progress, each, baselines))
            if reruns:
                reruns.submit(trace, scs, runs[-1], baselines)
        extra = reruns.collect(progress) if reruns else {}
    finally:
        progress.close()
        if reruns:
            reruns.close()
        if rows_out:
            rows_out.close()
    if a.plot:
        simrun.plot(runs[0], a.plot)
        print(f"transit-launch: wrote {a.plot}", file=sys.stderr)
    if len(seeds) > 1:  # the last seed's trace stands for all of them
        trace.source = trace.source.replace(f"seed={seeds[-1]}", f"seeds={seeds[0]}-{seeds[-1]}")
    comparisons = compare.compare(runs, a.racks)
    means = [compare.mean_report(list(rs)) for rs in zip(*runs)]
    labels = [a.efficiency] + [label for label, _ in others]
    band = bands.band([(a.efficiency, runs)] + list(extra.items()), a.racks) if others else []
    if a.json or a.json_out:
        refs = {}
        for c in comparisons:
            refs.setdefault(c["scenario"], c["reference"])
        out = {"trace": {"source": trace.source, "jobs": len(trace), "dropped": trace.dropped}, "seeds": seeds,
               "efficiency": scs[0].efficiency.name,
               "scheduler": dict(scs[0].sched.reported(), limit_factor=a.limit_factor),
               # the curve at each --reductions value (a job's own reduction is rounded to whole nodes)
               "efficiency_at": {f"{f:g}": round(scs[0].efficiency(f), 4) for f in reductions},
               "scenarios": [{"scenario": m["scenario"], "racks": m["racks"], "reduction": m["reduction"],
                              "reference": refs.get(m["scenario"]), "mean": m, "runs": list(rs)}
                             for m, rs in zip(means, zip(*runs))],
               "comparisons": comparisons,
               # every headline over the curves (sim/bands.py), the --efficiency curve first
               "band": {"curves": [{"label": label, "name": c.name,
                                    "efficiency_at": {f"{f:g}": round(c(f), 4) for f in reductions}}
                                   for label, c in [(a.efficiency, scs[0].efficiency)] + others],
                        "rows": band}}
        if _json(a, out):
            return 0
    print(simrun.text(means, comparisons, trace, seeds, scs[0], a.limit_factor))
    if band:
        print("\n" + bands.legend(a.efficiency, scs[0].efficiency, others, reductions, len(seeds)))
        print(bands.text(band, labels, len(seeds)))
    return 0


def _json(a, out: dict) -> bool:
    """The report as JSON: into --json-out's file, and on stdout for --json (then True: the
    text is not printed)."""
    text = json.dumps(out, indent=2)
    if a.json_out:
        write_text_atomically(a.json_out, text + "\n")
    if a.json:
        print(text)
    return a.json


def _node_failures(text: str) -> float:
    """argparse type of --node-failures: failures per node-day, or llama3 (sim/failures.py)."""
    import argparse
    from transit_launch.sim.failures import LLAMA3_RATE
    if text == "llama3":
        return LLAMA3_RATE
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not 0 <= v <= 10 or v != v:
        raise argparse.ArgumentTypeError(f"{text!r}: give failures per node-day from 0 to 10, or llama3")
    return v


# --scheduler: the options it sets where they are not given (the simulator's defaults, or
# Slurm 22.05's own choices: topology/tree's placement, every tested job reserved as
# bf_job_part_count_reserve=0, reservations at _will_run_test's batched ends; its intervals
# are the simulator's defaults already)
SCHEDULERS = {"simulator": {"placement": "pack", "bf_reserve": 1, "bf_reserve_at": RESERVE_AT[0]},
              "slurm": {"placement": "tree", "bf_reserve": 0, "bf_reserve_at": "slurm"}}


def _scheduler(a) -> None:
    """The options --scheduler sets, where the command line left them unset (None)."""
    for name, value in SCHEDULERS[a.scheduler].items():
        if getattr(a, name) is None:
            setattr(a, name, value)


def _cmd_failures(a, sched):
    """--node-failures: each policy (requeue and wait for the job's nodes, or continue
    scaled-in) replayed on the same trace and the same failures, per seed, by the replay's
    scheduler (sched: its SchedParams)."""
    from transit_launch.sim import bands, efficiency, failures, limits, synth, tracefile
    from transit_launch.sim import run as simrun
    from transit_launch.table import table
    if a.trace and (a.preset or a.seeds > 1):
        raise UsageError("--preset and --seeds shape synthetic traces; --trace replays one as it is")
    f = failures.Failures(a.node_failures, 24.0 if a.repair_hours is None else a.repair_hours,
                          1.0 if a.checkpoint_hours is None else a.checkpoint_hours,
                          (5.0 if a.restart_minutes is None else a.restart_minutes) / 60)
    curve = efficiency.parse(a.efficiency)
    policies = failures.POLICIES if a.on_node_loss == "both" else (a.on_node_loss,)
    # the goodput band: the scale-in policy again with each other curve (sim/bands.py)
    curves = [(a.efficiency, curve)] if a.no_band else bands.curves(a.efficiency, curve)
    goodputs = {pol: {label: [] for label, _ in curves} for pol in policies}
    gpus = a.racks * a.rack_gpus
    rows, out = [], []
    for s in range(a.seed, a.seed + a.seeds):
        if a.trace:
            trace = tracefile.load(a.trace, a.format)
        else:
            spec = (synth.preset(a.preset, a.load, gpus) if a.preset else
                    synth.SynthSpec(load=a.load, cluster_gpus=gpus,
                                    median_duration=1800.0 if a.median_duration is None else a.median_duration))
            synth.check_jobs(a.synthetic)
            trace = synth.synthetic(a.synthetic, s, spec)
        trace = limits.modelled(trace, a.limit_factor, s)
        for pol in policies:
            from dataclasses import replace
            # this policy and seed's replay, given a curve
            replay_with = functools.partial(failures.replay, trace, a.racks, a.rack_gpus, a.gpus_per_node, pol,
                                            replace(f, seed=s), sp=sched)
            r = failures.report(replay_with(curve)) | {"seed": s}
            out.append(r)
            _band_replays(goodputs[pol], r["goodput"], curves, pol == "scale-in", replay_with)
            rows.append([pol + (" *" if r["collapsed"] else ""), str(s), str(r["failures_hitting_jobs"]), str(r["interrupted_jobs"]),
                         f"{r['goodput']:.2%}" if r["goodput"] else "-",
                         f"{r['goodput_held']:.2%}" if r["goodput_held"] else "-", f"{r['held_gpu_h']:,.0f}",
                         f"{r['jct_mean_h']:.2f}", "-" if r["jct_interrupted_mean_h"] is None else
                         f"{r['jct_interrupted_mean_h']:.2f}", "-" if r["other_queue_mean_min"] is None else
                         f"{r['other_queue_mean_min']:.1f}", f"{r['makespan_h']:.1f}"])
    head = {"trace": trace.source, "jobs": len(trace), "failures_per_node_day": f.rate, "repair_h": f.repair_h,
            "checkpoint_h": f.checkpoint_h, "restart_h": f.restart_h, "efficiency": curve.name,
            "scheduler": dict(sched.reported(), limit_factor=a.limit_factor)}
    band = failures.goodput_band(goodputs) if len(curves) > 1 else []
    if _json(a, head | {"runs": out, "band": {"curves": [{"label": label, "name": c.name} for label, c in curves],
                                              "rows": band}}):
        return 0
    print(f"trace: {trace.source}, {len(trace)} GPU jobs; {f.rate:.4g} node failures per node-day, repair "
          f"{f.repair_h:g} h, checkpoints every {f.checkpoint_h:g} h, {f.restart_h * 60:g} min a restart; "
          f"scaled-in efficiency: {curve.name}\n{simrun.scheduler_line(sched, a.limit_factor)}\n")
    print(table(["on node loss", "seed", "failures on jobs", "jobs hit", "goodput", "of held", "GPU-h held",
                 "JCT mean h", "JCT of jobs hit h", "others' queue min", "makespan h"], rows, "llrrrrrrrrr"))
    print("\ngoodput: the trace's work (GPUs x recorded duration) over the GPU-hours the jobs were owed from "
          "submission to end (waiting and down time count); of held: over the GPU-hours they held running; "
          "others' queue: jobs no failure hit")
    collapsed = sorted({f"{r['policy']} (seed {r['seed']})" for r in out if r["collapsed"]})
    if collapsed:
        print(f"* collapsed: offered load above 1 (arrivals x GPU-hours held a job over the GPUs up on average), "
              f"the queue grows without bound and its times and goodput measure the trace's length: "
              f"{', '.join(collapsed)}")
    if band:
        print(f"\ngoodput over the efficiency curves (a curve sets the rate of a job scaled in on the nodes it "
              f"kept; requeue scales none in and reads the same under each; * the --efficiency curve"
              f"{'; means over the seeds' if a.seeds > 1 else ''}):")
        print("\n".join(f"  {label}{' *' if k == 0 else ''}: {bands.about(label, c) or c.name}"
                        for k, (label, c) in enumerate(curves)))
        print(bands.text(band, [label for label, _ in curves], a.seeds, lead=(("on node loss", "policy"),)))
    return 0


def _band_replays(by_curve: dict, chosen, curves: list, reads_curve: bool, replay) -> None:
    """One policy's goodput at one seed by curve (the band's): the --efficiency curve's
    (`chosen`) first, then replay(curve)'s for each other curve where the policy reads the
    curve (scale-in); requeue runs no job on fewer nodes, so its one replay stands for all."""
    from transit_launch.sim.failures import report
    by_curve[curves[0][0]].append(chosen)
    for label, c in curves[1:]:
        by_curve[label].append(report(replay(c))["goodput"] if reads_curve else chosen)


def register(sub):
    sp = sub.add_parser("simulate", help="replay a GPU job trace with and without scale-in")
    src = sp.add_argument_group("trace")
    src.add_argument("--trace", help="ACME Seren/Kalos CSV, a generic CSV with submit_time,duration,gpus (optional "
                                      "job_id,type,state,time_limit), SWF, Helios' cluster_log.csv, Philly's "
                                      "cluster_job_log, or Alibaba PAI's pai_job_table.csv with pai_task_table.csv "
                                      "beside it (docs/simulate.md)")
    src.add_argument("--format", choices=FORMATS, default="auto",
                     help="--trace's format; auto: swf for a name ending in .swf, pai for PAI's table names (or "
                          "their folder), philly for a JSON file, else told apart by the CSV header (default auto)")
    src.add_argument("--synthetic", type=positive_int(), help="generate N jobs instead")
    src.add_argument("--seed", type=int, default=0, help="synthetic: the generator's seed (default 0)")
    src.add_argument("--seeds", type=positive_int(), default=1,
                     help="run seeds --seed .. --seed+N-1 and report means and the range of each change: synthetic "
                          "traces are drawn anew, a --trace's drawn time limits (--limit-factor above 1) (default 1)")
    src.add_argument("--preset", choices=PRESETS,
                     help="synthetic: sizes, durations tied to size, and failure shares shaped like a published trace "
                          "(ACME's cluster_summary.csv); the jobs go up to 1024 GPUs (helios 2048, philly 128)")
    src.add_argument("--load", type=finite_float(), default=0.8,
                     help="synthetic: offered load on the full cluster, in (0, 10] (default 0.8)")
    src.add_argument("--median-duration", type=finite_float(), default=None,
                     help="synthetic without --preset: median job duration in seconds (default 1800)")
    cl = sp.add_argument_group("cluster")
    cl.add_argument("--racks", type=positive_int(), default=72, help="racks in the cluster (default 72)")
    cl.add_argument("--rack-gpus", type=positive_int(), default=32,
                    help="GPUs per rack, a multiple of --gpus-per-node (default 32)")
    cl.add_argument("--gpus-per-node", type=int, choices=(4, 8), default=DEFAULT_GPUS_PER_NODE,
                    help=f"GPUs per node (default {DEFAULT_GPUS_PER_NODE}, as in plan, render and submit; "
                         "the ACME clusters' nodes have 8)")
    cl.add_argument("--placement", choices=STRATEGIES, default=None,
                    help="pack: a job goes to the node or rack with the least free room that fits it; spread: the "
                         "most; tree: as Slurm's topology/tree with racks as leaf switches, the rack with the fewest "
                         "nodes that fit, its first (default pack; tree with --scheduler slurm)")
    cl.add_argument("--reduced-racks", type=positive_int(),
                    help="also run every scenario on a cluster of this many racks")
    sc = sp.add_argument_group("scale-in")
    sc.add_argument("--reductions", type=fractions("--reductions", allow_zero=True), default=[0.25, 0.5],
                    help="node-count reductions for eligible jobs (multi-node training jobs; default 0.25,0.5)")
    sc.add_argument("--efficiency", default="planner", metavar="CURVE",
                    help=f"per-GPU efficiency of a scaled-in job by the reduction it took: {', '.join(EFFICIENCY_NAMES)} "
                         "(linear: 1.0, time inversely proportional to nodes; titan-mbN: TorchTitan's measured step at "
                         "N microbatches, at every reduction) or pairs like 0.5:0.9 (default planner: the planner's "
                         "prediction for Llama3-70B FSDP on H100-80GB); the headline bands add "
                         f"{', '.join(EFFICIENCY_BAND)}")
    sc.add_argument("--no-band", action="store_true",
                    help="run the --efficiency curve alone, without the band of headlines over the other curves "
                         "(faster: the band runs each scale-in scenario, or with --node-failures the scale-in "
                         "policy, once a curve)")
    sc.add_argument("--speedup", type=finite_float(), default=0.5,
                    help="inter-rack -> intra-rack speed-up (paper: 0-1.37; default 0.5)")
    sc.add_argument("--slowdown", type=finite_float(), default=0.275,
                    help="intra-rack -> inter-rack slow-down (paper: 0-0.55; default 0.275)")
    sc.add_argument("--unchanged", type=finite_float(), default=0.0,
                    help="unchanged placement speed-up (paper: -0.05..0.05; default 0)")
    sd = sp.add_argument_group("scheduler (Slurm's sched/backfill; defaults are Slurm's)")
    sd.add_argument("--plan-on", choices=PLAN_ON, default="limits",
                    help="what reservations and backfill plan on: the jobs' time limits, as Slurm does, or their "
                         "run times, which no real scheduler knows (default limits)")
    sd.add_argument("--limit-factor", type=finite_float(), default=1.0,
                    help="a job without a recorded time limit gets its run time times a users' overestimate drawn "
                         "from [1, this] by the seed, rounded up to a minute (default 1.0: the run time)")
    sd.add_argument("--bf-max-job-test", type=positive_int(), default=500,
                    help="jobs a backfill pass tests, the head included (Slurm's bf_max_job_test; default 500)")
    sd.add_argument("--bf-interval", type=finite_float(), default=30.0,
                    help="seconds between backfill passes; 0: at every event (Slurm's bf_interval; default 30)")
    sd.add_argument("--bf-resolution", type=finite_float(), default=60.0,
                    help="seconds to which reservations are rounded down (Slurm's bf_resolution; default 60)")
    sd.add_argument("--bf-window", type=finite_float(), default=1440.0,
                    help="minutes ahead a backfill pass plans: a job that cannot start sooner gets no reservation "
                         "(Slurm's bf_window; default 1440)")
    sd.add_argument("--scheduler", choices=tuple(SCHEDULERS), default="simulator",
                    help="simulator: the defaults below; slurm: as Slurm 22.05 schedules, --placement tree "
                         "--bf-reserve 0 --bf-reserve-at slurm where those are not given (slower: 2,000 synthetic jobs "
                         "take 8-12 s of CPU against 0.6 s; docs/simulate.md) "
                         "(default simulator)")
    sd.add_argument("--bf-reserve", type=number(int, 0, "a non-negative integer"), default=None,
                    help="jobs a backfill pass gives reservations, in queue order; 0: every job it tests, as "
                         "Slurm's bf_job_part_count_reserve=0 (default 1, the head: faster, docs/simulate.md; 0 with "
                         "--scheduler slurm)")
    sd.add_argument("--bf-reserve-at", choices=RESERVE_AT, default=None,
                    help="where a reservation starts: earliest, the earliest time the job fits; slurm, as Slurm's "
                         "_will_run_test, at the last planned end of the batch of running jobs (ends grouped in "
                         "windows of 30 s, then doubling) whose ending lets it fit, on the nodes free then "
                         "(default earliest, docs/simulate.md; slurm with --scheduler slurm)")
    sd.add_argument("--epilog", type=finite_float(), default=0.0, metavar="SECONDS",
                    help="seconds a node takes no new job after a job on it ends, as Slurm keeps a node out while "
                         "the job completes (its epilog); the job's GPUs come back then (default 0: at its end)")
    nf = sp.add_argument_group("node failures")
    nf.add_argument("--node-failures", type=_node_failures, metavar="RATE",
                    help="replay with node failures instead of scale-in at submission: failures per node-day, or "
                         "llama3 (419 unexpected interruptions in 54 days on 16,384 GPUs, 0.0038 per node-day)")
    nf.add_argument("--on-node-loss", choices=("requeue", "scale-in", "both"), default="both",
                    help="with --node-failures: requeue (wait for the job's nodes), scale-in (continue on the "
                         "survivors, scale out when the node returns), or both side by side (default both)")
    nf.add_argument("--repair-hours", type=finite_float(), default=None,
                    help="with --node-failures: hours a failed node is out (default 24)")
    nf.add_argument("--checkpoint-hours", type=finite_float(), default=None,
                    help="with --node-failures: hours between a job's checkpoints (default 1)")
    nf.add_argument("--restart-minutes", type=finite_float(), default=None,
                    help="with --node-failures: downtime of each restart (default 5)")
    sp.add_argument("--plot", type=output_file((".png",)), metavar="FILE.png",
                    help="write a PNG like the paper's Figure 12 (needs matplotlib)")
    sp.add_argument("--jobs-out", type=output_file((".csv",)), metavar="FILE.csv",
                    help="write one row a job, scenario and seed: submit, start, end, nodes, racks, limit, scaled-in")
    sp.add_argument("--quiet", action="store_true",
                    help="no progress on stderr (otherwise: a line redrawn on a terminal, a line per phase elsewhere, "
                         "for runs longer than 2 s)")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.add_argument("--json-out", type=output_file((".json",)), metavar="FILE.json",
                    help="also write what --json prints to this file, beside the text on stdout (one replay "
                         "gives both)")
    sp.set_defaults(func=cmd_simulate)
