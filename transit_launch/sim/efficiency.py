"""Per-GPU efficiency of a scaled-in job against the same job on all its nodes: a curve
over the reduction actually taken (1 - nodes after / nodes before), piecewise linear
between its points, 1.0 at no reduction, flat past its last point.

A job that gives up a fraction r of its nodes runs n / n' / efficiency(r) times as long
(the placement-transition factors come on top). Curves:
  planner: the planner's predicted efficiency (planning.plan's Candidate.efficiency) for
           Llama3-70B FSDP on H100-80GB, the paper's Figure 7 job, evaluated GPU by GPU
           below its no-offload minimum;
  linear:  1.0 everywhere, the paper's own assumption (time inversely proportional);
  titan-mb1, titan-mb8, titan-mb16: measured points, TorchTitan's streamed optimizer step
           on an H100 against no offloading (bench/RESULTS.md) at 1, 8 and 16 microbatches a
           step: 46.8%, 85.4%, 91.6%. Each was measured at one memory ratio and is applied
           flat, to every reduction a job takes (an assumption: more state moves at 50% fewer
           nodes than at 25%, so the flat point flatters deeper cuts);
  R:E,...: a measured curve, e.g. bench/'s N -> N/2 runs as 0.5:0.9.

BAND: the curves every default report runs (sim/bands.py): the planner's and the three
measured points, which span what a scaled-in job keeps from its worst case (one
microbatch a step: the whole state crosses PCIe for little compute) to its best measured."""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass

from transit_launch.checks import real
from transit_launch.errors import UsageError

PLANNER_MODEL, PLANNER_GPU = "llama3-70b", "h100-80gb"
# (name, efficiency at every reduction, what was measured): bench/RESULTS.md, TorchTitan
# Llama3 with the streamed step (the default) against no offloading, steady step, one H100
MEASURED = (
    ("titan-mb1", 0.468, "TorchTitan streamed step, H100, 1 microbatch a step"),
    ("titan-mb8", 0.854, "the same at 8 microbatches"),
    ("titan-mb16", 0.916, "the same at 16 microbatches"),
)
NAMES = ("planner", "linear") + tuple(m[0] for m in MEASURED)
BAND = ("planner",) + tuple(m[0] for m in MEASURED)
FLAT_FROM = 1e-9  # a measured point holds from the smallest reduction on


@dataclass(frozen=True)
class Curve:
    name: str
    points: tuple = ((0.0, 1.0),)  # (reduction, efficiency), reductions ascending from 0

    def __post_init__(self):
        pts = self.points
        if not pts or pts[0] != (0.0, 1.0) or not all(real(r) and real(e) for r, e in pts) \
                or any(b[0] <= a[0] for a, b in zip(pts, pts[1:])) \
                or not all(0 <= r < 1 and 0 < e <= 10 for r, e in pts):
            raise UsageError(f"an efficiency curve needs reductions ascending in [0, 1) and efficiencies in "
                             f"(0, 10], starting at 0:1, got {pts!r}")

    def __call__(self, reduction: float) -> float:
        pts = self.points
        k = bisect.bisect_right([r for r, _ in pts], reduction)
        if k >= len(pts):
            return pts[-1][1]
        (r0, e0), (r1, e1) = pts[k - 1], pts[k]
        return e0 + (e1 - e0) * (reduction - r0) / (r1 - r0)


LINEAR = Curve("linear")


@functools.cache
def planner() -> Curve:
    from transit_launch.planning.hardware import GPUS
    from transit_launch.planning.models import load_model
    from transit_launch.planning.plan import Request, plan
    # one GPU a "node": the planner then steps GPU by GPU, the finest grid it has
    p = plan(Request(load_model(PLANNER_MODEL), GPUS[PLANNER_GPU], gpus_per_node=1))
    n0 = p.baseline.nodes
    pts = [(0.0, 1.0)] + sorted((1 - c.nodes / n0, c.efficiency) for c in p.options)
    return Curve(f"planner ({PLANNER_MODEL} FSDP, {PLANNER_GPU})", tuple(pts))


def measured(name: str) -> Curve:
    e = next(e for n, e, _ in MEASURED if n == name)
    return Curve(name, ((0.0, 1.0), (FLAT_FROM, e)))


def parse(text: str) -> Curve:
    """--efficiency's value: a name of NAMES, or R:E pairs (0:1 is implied)."""
    if text == "planner":
        return planner()
    if text == "linear":
        return LINEAR
    if text in NAMES:
        return measured(text)
    try:
        pairs = [tuple(float(x) for x in item.split(":")) for item in text.split(",") if item.strip()]
        if not pairs or any(len(p) != 2 for p in pairs):
            raise ValueError
    except ValueError:
        raise UsageError(f"--efficiency takes {', '.join(NAMES)} or reduction:efficiency pairs like 0.25:0.97,0.5:0.9, "
                         f"got {text!r}") from None
    pts = sorted(pairs)
    if pts[0][0] != 0:
        pts = [(0.0, 1.0)] + pts
    return Curve(text, tuple(pts))
