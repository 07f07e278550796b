"""A third outside check of the simulator against Slurm 22.05 (issue 54): a trace made by a
process unlike the project's two (Kalos-sized Poisson, bench/sim_vs_slurm.py) and the
helper's (bursts of 25, bench/results/INDEX.md), replayed on the lab, with each job's nodes
recorded this time (tests/sim_replay.Replay.nodes), so that the simulator's node choices can
be compared with Slurm's job by job.

    python3 bench/probes/sim_vs_slurm_waves.py --json run.json      # root, Debian's Slurm; ~15 min
    python3 bench/probes/sim_vs_slurm_waves.py --dry                # the trace's figures, no lab
    python3 bench/sim_vs_slurm.py --from-json run.json              # the table, without the lab

The trace (seed 7 unless told), in real time before the 10x compression:
- arrivals: a Poisson process whose rate swings as 1 + 0.9 sin(2 pi t / 2400 s) (waves,
  drawn by thinning), at the rate that gives the offered load (default 1.4) over the
  submissions;
- sizes: 1 / 2 / 4 / 8 / 16 / 24 / 48 GPUs at 30 / 15 / 15 / 10 / 10 / 10 / 10 % (24 and 48:
  3 and 6 whole nodes, so more than a rack of 4 nodes takes two racks);
- run times: Weibull of shape 0.7 and scale 12 min, kept within 3 to 60 min;
- limits: a user's request, the first of 10, 15, 20, 30, 45, 60, 90, 120 min at or above
  the run time times uniform(1, 2.5), compressed with the run time and rounded up to a
  whole minute (Slurm's unit).
The lab is bench/sim_vs_slurm.py's (4 racks x 4 nodes x 8 GPUs, bf_interval 30,
bf_resolution 60); the file is bench/sim_vs_slurm.py's --json format, with Slurm's nodes."""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.sim_vs_slurm import BENCH_LAB, on_lab  # noqa: E402
from transit_launch.sim.trace import Trace  # noqa: E402

SIZES = ((1, 30), (2, 15), (4, 15), (8, 10), (16, 10), (24, 10), (48, 10))
REQUESTS_MIN = (10, 15, 20, 30, 45, 60, 90, 120)
PERIOD_S, SWING = 2400.0, 0.9


def waves(jobs: int, seed: int, load: float, gpus: int, compress: float = 10.0) -> Trace:
    """The trace above, compressed `compress` times (lab seconds; limits whole minutes)."""
    rng = random.Random(seed)
    sizes, weights = zip(*SIZES)
    g = [rng.choices(sizes, weights)[0] for _ in range(jobs)]
    run = [min(3600.0, max(180.0, rng.weibullvariate(720.0, 0.7))) for _ in range(jobs)]
    mean_gpu_s = sum(a * b for a, b in zip(g, run)) / jobs
    rate = load * gpus / mean_gpu_s  # jobs a second on average over the waves
    t, submit = 0.0, []
    while len(submit) < jobs:  # thinning: candidates at the peak rate, kept at rate(t) / peak
        t += rng.expovariate(rate * (1 + SWING))
        if rng.random() * (1 + SWING) <= 1 + SWING * math.sin(2 * math.pi * t / PERIOD_S):
            submit.append(t)
    submit = [s - submit[0] for s in submit]
    limits = []
    for d in run:
        want = d * rng.uniform(1.0, 2.5) / 60
        req = next((m for m in REQUESTS_MIN if m >= want), REQUESTS_MIN[-1])
        limits.append(max(1, math.ceil(req / compress - 1e-9)) * 60.0)
    return Trace(submit=[s / compress for s in submit], duration=[max(1.0, round(d / compress)) for d in run],
                 gpus=g, ids=[str(i) for i in range(jobs)], limits=limits,
                 source=f"waves seed {seed}, load {load:g} / {compress:g}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=110)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--load", type=float, default=1.4)
    p.add_argument("--json", help="write the trace and Slurm's replay here")
    p.add_argument("--dry", action="store_true", help="print the trace's figures and stop (no lab)")
    a = p.parse_args(argv)
    shape = BENCH_LAB
    trace = waves(a.jobs, a.seed, a.load, shape.nodes * shape.gpus_per_node)
    span = trace.submit[-1]
    work = sum(d * g for d, g in zip(trace.duration, trace.gpus))
    print(f"{len(trace)} jobs over {span:.0f} s, offered load {work / span / (shape.nodes * shape.gpus_per_node):.2f}, "
          f"run times {min(trace.duration):.0f}-{max(trace.duration):.0f} s, limits "
          f"{min(trace.limits) / 60:.0f}-{max(trace.limits) / 60:.0f} min")
    if a.dry:
        return 0
    return on_lab(shape, trace, a.json, "sim_vs_slurm_waves")


if __name__ == "__main__":
    sys.exit(main())
