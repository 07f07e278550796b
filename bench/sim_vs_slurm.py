"""The simulator against Slurm itself (issue 54), at bench size: a trace of 120 jobs
replayed on a lab cluster and through `simulate`'s scheduler (the machinery is
tests/sim_replay.py's, which the lab test shares), compared job by job.

    python3 bench/sim_vs_slurm.py [--jobs 120] [--seed 1] [--load 1.3] --json run.json   # root, Slurm; ~16 min
    python3 bench/sim_vs_slurm.py --from-json run.json    # the table again, without the lab
    python3 bench/sim_vs_slurm.py --from-json run.json --placement tree   # the simulator placing as Slurm does
    python3 bench/sim_vs_slurm.py --from-json run.json --bf-reserve-at slurm   # reserving as Slurm does
    python3 bench/sim_vs_slurm.py --phases A.json B.json ...   # every rule over the 30 pass phases
    python3 bench/sim_vs_slurm.py --phases A.json ... --instants   # the same, on the submissions' instants

prints the table docs/simulate.md quotes."""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.sim_replay import Lab, Replay, compress, in_sim, instants, on_slurm, pairs_in_order, summary  # noqa: E402
from transit_launch.sim.limits import RESERVE_AT, SchedParams  # noqa: E402
from transit_launch.sim.scheduler import STRATEGIES  # noqa: E402
from transit_launch.sim.trace import Trace  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Phased(SchedParams):
    """The scheduler's parameters with the backfill passes `phase` seconds past each multiple
    of bf_interval (Slurm's run on its own clock: 16 s and 11 s past on the recorded runs);
    reservations and Slurm's batches of ends keep their absolute grids."""
    phase: float = 0.0

    def next_pass(self, t: float) -> float:
        b = self.bf_interval
        return t if not b else math.ceil((t - self.phase) / b - 1e-9) * b + self.phase


@dataclasses.dataclass(frozen=True)
class BenchLab(Lab):
    """The lab with the simulator's placement for it (Slurm's own is topology/tree's: `tree`),
    where its reservations start (--bf-reserve-at) and its passes' phase."""
    placement: str = "pack"
    reserve_at: str = "earliest"
    phase: float = 0.0
    epilog: float = 0.0  # seconds a node stays out of new jobs after a job on it ends (--epilog)

    def scenario(self, plan_on: str = "limits"):
        sc = super().scenario(plan_on)
        sched = dataclasses.replace(sc.sched, bf_reserve_at=self.reserve_at, epilog=self.epilog)
        if self.phase:
            sched = Phased(**vars(sched), phase=self.phase)
        return dataclasses.replace(sc, strategy=self.placement, sched=sched)


BENCH_LAB = BenchLab(racks=4, nodes_per_rack=4, gpus_per_node=8, bf_interval=30, bf_resolution=60)  # Slurm's defaults


def report(shape: Lab, trace: Trace, slurm: Replay, near: float = 60.0) -> str:
    """The table docs/simulate.md quotes: Slurm, then the simulator on limits and on run
    times, on the submit times Slurm recorded; `near`: a start within this of Slurm's counts
    as the same (a backfill pass every 30 s, and Slurm's own delays)."""
    rows = [("Slurm 22.05", summary(slurm), 1.0, 1.0)]
    for plan_on in ("limits", "runtimes"):
        sim = in_sim(shape, trace, slurm.submit, plan_on)
        close = sum(abs(a - b) <= near for a, b in zip(sim.start, slurm.start)) / len(trace)
        rows.append((f"simulate --plan-on {plan_on}", summary(sim), pairs_in_order(slurm, sim), close))
    placed = f"; simulate --placement {shape.placement}" if getattr(shape, "placement", "pack") != "pack" else ""
    if getattr(shape, "reserve_at", "earliest") != "earliest":
        placed += f"; simulate --bf-reserve-at {shape.reserve_at}"
    out = [f"{len(trace)} jobs ({trace.source}), {shape.racks} racks x {shape.nodes_per_rack} nodes x "
           f"{shape.gpus_per_node} GPUs; {shape.sched_params()}{placed}", "",
           "| replay | mean queue s | median queue s | makespan s | rack traversals | job pairs in Slurm's start "
           f"order | jobs started within {near:.0f} s of Slurm |", "|---|---|---|---|---|---|---|"]
    for name, s, agree, close in rows:
        out.append(f"| {name} | {s['queue_mean_s']:.1f} | {s['queue_median_s']:.1f} | {s['makespan_s']:.0f} | "
                   f"{s['traversals']} | {agree:.0%} | {close:.0%} |")
    return "\n".join(out)


def load(path: str) -> tuple[Trace, Replay]:
    """A recorded run (--json's file): its trace and Slurm's replay."""
    import json
    d = json.loads(Path(path).read_text())
    submit, duration, gpus, lim = d["trace"]
    trace = Trace(submit=submit, duration=duration, gpus=gpus, ids=[str(i) for i in range(len(gpus))],
                  limits=lim, source=d.get("source", path))
    return trace, Replay(**d["slurm"])


def slurm_phase(r: Replay, interval: int = 30) -> int:
    """The phase of Slurm's backfill passes in a replay: the seconds past a multiple of
    bf_interval at which most jobs that waited (more than 1 s) started (Slurm's passes run
    every bf_interval on its own clock; the other starts follow job ends)."""
    waited = [int(s) % interval for s, b in zip(r.start, r.submit) if s - b > 1]
    return max(range(interval), key=waited.count) if waited else 0


def sim_run(shape: Lab, trace: Trace, slurm: Replay, at_instants: bool = False) -> Replay:
    """The simulator on Slurm's submit times: its whole-second stamps, or (at_instants) the
    instants the driver submitted at (tests/sim_replay.instants), the result then stamped as
    Slurm stamps (its submit stamps, starts and ends floored to whole seconds), so that both
    queues are measured alike."""
    if not at_instants:
        return in_sim(shape, trace, slurm.submit)
    r = in_sim(shape, trace, instants(trace, slurm))
    return Replay(submit=list(slurm.submit), start=[math.floor(x + 1e-9) for x in r.start],
                  end=[math.floor(x + 1e-9) for x in r.end], racks=r.racks)


def phases(paths: list, rules: list, interval: int = 30, at_instants: bool = False, epilog: float = 0.0) -> str:
    """Each rule (placement, reserve_at) on each recorded run, at every pass phase 0 ..
    interval - 1 s past a multiple of bf_interval, on Slurm's submit times (or instants) and
    on limits: the mean over the phases of the mean queue (against Slurm's) and of the rack
    traversals, each with its band (the lowest and highest phase), and the figures at Slurm's
    own phase (slurm_phase). A cell is marked `in` when Slurm's figures lie inside both bands
    and the phase-mean queue is within 15% of Slurm's."""
    runs = [(Path(p).stem, *load(p)) for p in paths]
    head = ["| rule | " + " | ".join(f"{name} (Slurm {statistics.fmean(w):.1f} s, {sum(k - 1 for k in r.racks)}; "
                                      f"phase {slurm_phase(r, interval)})"
                                      for name, _, r in runs for w in [[s - b for s, b in zip(r.start, r.submit)]])
            + " |", "|---|" + "---|" * len(runs)]
    out = []
    for placement, reserve_at in rules:
        cells = []
        for _, trace, slurm in runs:
            ref = summary(slurm)
            got = [summary(sim_run(dataclasses.replace(BENCH_LAB, placement=placement, reserve_at=reserve_at,
                                                       phase=float(ph), epilog=epilog), trace, slurm, at_instants))
                   for ph in range(interval)]
            q = [g["queue_mean_s"] / ref["queue_mean_s"] - 1 for g in got]
            t = [g["traversals"] for g in got]
            own = slurm_phase(slurm, interval)
            inside = min(q) <= 0 <= max(q) and min(t) <= ref["traversals"] <= max(t) and abs(statistics.fmean(q)) <= 0.15
            cells.append(f"{statistics.fmean(q):+.1%} [{min(q):+.0%}, {max(q):+.0%}], {statistics.fmean(t):.1f} "
                         f"[{min(t)}, {max(t)}]{' in' if inside else ''} (own phase: {q[own]:+.1%}, {t[own]})")
        out.append(f"| `--placement {placement} --bf-reserve-at {reserve_at}` | " + " | ".join(cells) + " |")
    return "\n".join(head + out)


def on_lab(shape: Lab, trace: Trace, json_path: str | None, name: str) -> int:
    """The trace replayed on a lab cluster of `shape` (tests/slurm_lab.py), written to
    json_path when given (the --json format: the trace and Slurm's replay), and report()'s
    table printed: the exit status (2, said on stderr, where this machine cannot run the
    lab)."""
    import json
    from tests.slurm_lab import SlurmLab, missing
    why = missing()
    if why:
        print(f"{name}: {why}", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="transit-simcheck-"))
    lab = SlurmLab(root, nodes=shape.nodes, gpus=shape.gpus_per_node, cpus=shape.gpus_per_node,
                   sched=shape.sched_params(), switches=shape.racks)
    try:
        lab.start()
        slurm = on_slurm(lab, shape, trace, timeout=3600)
    finally:
        lab.stop()
        shutil.rmtree(root, ignore_errors=True)
    if json_path:
        Path(json_path).write_text(json.dumps({"source": trace.source, "trace": [trace.submit, trace.duration,
                                                                                  trace.gpus, trace.limits],
                                               "slurm": vars(slurm)}, indent=1))
    print(report(shape, trace, slurm))
    return 0


def main(argv=None) -> int:
    from transit_launch.sim import synth
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=120)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--compress", type=float, default=10.0,
                   help="real seconds a lab second (default 10: the median job of 15 min runs 90 s)")
    p.add_argument("--load", type=float, default=1.3)
    p.add_argument("--json", help="also write the trace and Slurm's replay here")
    p.add_argument("--from-json", help="the table again from such a file, without the lab")
    p.add_argument("--placement", choices=STRATEGIES, default="pack",
                   help="the simulator's placement (default pack; Slurm's topology/tree: tree)")
    p.add_argument("--bf-reserve-at", choices=RESERVE_AT, default="earliest",
                   help="where the simulator's reservations start (default earliest; Slurm's own: slurm)")
    p.add_argument("--phases", nargs="+", metavar="RUN.json",
                   help="instead: every placement and --bf-reserve-at on these recorded runs over the 30 pass "
                        "phases (the table bench/LOG.md's issue-54 sections give)")
    p.add_argument("--instants", action="store_true",
                   help="with --phases: the simulator on the instants the jobs went in (tests/sim_replay.instants), "
                        "not Slurm's whole-second stamps")
    p.add_argument("--epilog", type=float, default=0.0,
                   help="the simulator's --epilog: seconds a node takes no new job after a job on it ends (default 0)")
    a = p.parse_args(argv)
    shape = dataclasses.replace(BENCH_LAB, placement=a.placement, reserve_at=a.bf_reserve_at, epilog=a.epilog)
    if a.phases:
        print(phases(a.phases, [(pl, at) for pl in ("pack", "tree") for at in RESERVE_AT], at_instants=a.instants,
                     epilog=a.epilog))
        return 0
    if a.from_json:
        print(report(shape, *load(a.from_json)))
        return 0
    spec = synth.preset("kalos", a.load, shape.nodes * shape.gpus_per_node)
    # Kalos' job sizes up to 8 nodes; durations of minutes (median 15 min, at most an hour) so
    # that compressed they stay above Slurm's one-minute limit unit
    spec = synth.SynthSpec(sizes=tuple((g, w) for g, w in spec.sizes if g <= 64), median_duration=900.0, sigma=0.8,
                           max_duration=3600.0, load=a.load, cluster_gpus=shape.nodes * shape.gpus_per_node,
                           name="kalos-sized")
    trace = compress(synth.synthetic(a.jobs, a.seed, spec), a.compress, random.Random(a.seed))
    return on_lab(shape, trace, a.json, "sim_vs_slurm")


if __name__ == "__main__":
    sys.exit(main())
