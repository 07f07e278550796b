"""Synthetic traces: sizes, durations tied to size, end states and Poisson arrivals, with
presets shaped like the published GPU traces.

A job's GPU count comes from `sizes`; its duration is lognormal with median
median_duration x GPUs**size_exponent and spread sigma, capped at max_duration (with
size_exponent 0 sizes and durations are independent). Its end state is FAILED with
probability fail_rate, CANCELLED with cancel_rate, else COMPLETED. Arrivals are Poisson at
the rate that makes the offered load (GPU-seconds asked per second over the cluster's
GPUs) equal `load` for a cluster of `cluster_gpus`. A state's probability is tilted by the
job's rank q in (0, 1) by GPU-seconds: rate (t + 1) q^t for a tilt t > 0 (heavy jobs),
rate (|t| + 1) (1 - q)^|t| for t < 0 (light ones), so that both its share of jobs and of
GPU time can match a trace (Kalos' failed jobs are 40% of jobs and 8% of GPU time, its
cancelled 6% and 61%).

Presets (PRESETS) match the ACME repository's cluster_summary.csv (TARGETS): mean GPUs a
job, median and mean duration, GPU-seconds a job (the joint shape: Kalos asks about 8x
mean GPUs x mean duration), the largest job, and the failed and cancelled shares of jobs
and of GPU time. Sizes
are powers of two, 1 GPU with probability SINGLE_GPU_SHARE and 2^k with weights r^k; r,
the duration median, exponent and sigma were fitted to the targets (least squares on the
analytic lognormal mixture), the state tilts on a 200,000-job sample;
tests/test_sim_presets.py checks the generated traces."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from transit_launch.checks import integer, real
from transit_launch.errors import UsageError
from transit_launch.sim.trace import MAX_DURATION, Trace

# The ACME traces hold about a million GPU jobs a cluster, and one million replay in about
# 25 s a scenario here (300 MB); ten million take over 20 minutes for simulate's six
# default scenarios and several GB. A larger count is a typo, not a study: refused at once
# rather than left to run for hours or exhaust memory.
MAX_SYNTHETIC_JOBS = 10_000_000
# cluster_summary.csv publishes the median GPU count (1), not the share of 1-GPU jobs:
# an assumption, above the 0.5 the median needs.
SINGLE_GPU_SHARE = 0.6


@dataclass(frozen=True)
class SynthSpec:
    """Defaults: the generator before presets (sizes up to 128 GPUs, independent of a
    duration of median 1800 s), kept for --synthetic without --preset."""
    sizes: tuple = ((1, 0.45), (2, 0.10), (4, 0.12), (8, 0.15), (16, 0.08), (32, 0.05), (64, 0.03), (128, 0.02))
    median_duration: float = 1800.0  # of a 1-GPU job; of every job when size_exponent is 0
    sigma: float = 1.5
    max_duration: float = 7 * 86400.0
    load: float = 0.8
    cluster_gpus: int = 72 * 32
    size_exponent: float = 0.0
    fail_rate: float = 0.0
    cancel_rate: float = 0.0
    fail_tilt: float = 0.0    # see the module's docstring
    cancel_tilt: float = 0.0
    name: str = ""

    def __post_init__(self):  # the CLI's flags name the fields users set
        if not real(self.load) or not 0 < self.load <= 10:
            # offered load: 0 asks for no work (no arrival rate); above 1 the queue grows without
            # bound, and far above it a simulation only measures that queue
            raise UsageError(f"--load must lie in (0, 10], got {self.load!r}")
        if not real(self.max_duration) or not 1 <= self.max_duration <= MAX_DURATION:
            raise UsageError(f"max_duration must lie in [1, {MAX_DURATION:.0f}] seconds, got {self.max_duration!r}")
        if not real(self.median_duration) or not 1 <= self.median_duration <= self.max_duration:
            raise UsageError(f"--median-duration must lie in [1, {self.max_duration:.0f}] seconds, "
                             f"got {self.median_duration!r}")
        if not real(self.sigma) or not 0 <= self.sigma <= 10:
            raise UsageError(f"sigma must lie in [0, 10], got {self.sigma!r}")
        if not real(self.size_exponent) or not -2 <= self.size_exponent <= 2:
            raise UsageError(f"size_exponent must lie in [-2, 2], got {self.size_exponent!r}")
        if not (real(self.fail_rate) and real(self.cancel_rate) and self.fail_rate >= 0 and self.cancel_rate >= 0
                and self.fail_rate + self.cancel_rate <= 1):
            raise UsageError(f"fail_rate and cancel_rate must be shares summing to at most 1, got "
                             f"{self.fail_rate!r} and {self.cancel_rate!r}")
        if not (real(self.fail_tilt) and real(self.cancel_tilt) and abs(self.fail_tilt) <= 60
                and abs(self.cancel_tilt) <= 60):
            raise UsageError("fail_tilt and cancel_tilt must lie in [-60, 60]")
        if not integer(self.cluster_gpus) or self.cluster_gpus < 1:
            raise UsageError(f"cluster_gpus must be a positive integer, got {self.cluster_gpus!r}")
        if not self.sizes or not all(integer(g) and g > 0 and real(w) and w >= 0 for g, w in self.sizes) \
                or not sum(w for _, w in self.sizes) > 0:
            raise UsageError("sizes must be (GPUs, weight) pairs with positive GPU counts and weights")


def _powers(largest: int, ratio: float) -> tuple:
    k_max = int(math.log2(largest))
    tail = sum(ratio ** k for k in range(1, k_max + 1))
    return ((1, SINGLE_GPU_SHARE),) + tuple((2 ** k, (1 - SINGLE_GPU_SHARE) * ratio ** k / tail)
                                            for k in range(1, k_max + 1))


# cluster_summary.csv: GPU jobs; mean GPUs; median, mean and longest duration (s); GPU-seconds
# a job (completed + cancelled + failed GPU time over GPU jobs); largest job; failed and
# cancelled shares of GPU jobs and of their GPU time.
TARGETS = {
    "kalos": dict(jobs=19907, mean_gpus=26.77, median_duration=124.0, mean_duration=1259.689,
                  gpu_seconds=(1667685146 + 3239202064 + 426292851) / 19907, max_gpus=1024,
                  max_duration=625740.0, fail_rate=0.397, cancel_rate=0.062, fail_gpu_time=0.08,
                  cancel_gpu_time=0.607),
    "seren": dict(jobs=663813, mean_gpus=5.68, median_duration=122.0, mean_duration=1414.335,
                  gpu_seconds=(4560592618 + 14274584510 + 2675447459) / 663813, max_gpus=1024,
                  max_duration=1209604.0, fail_rate=0.429, cancel_rate=0.075, fail_gpu_time=0.124,
                  cancel_gpu_time=0.664),
    "philly": dict(jobs=112956, mean_gpus=1.928, median_duration=874.0, mean_duration=18006.055,
                   gpu_seconds=(2210176414 + 2025326056 + 2659215061) / 112956, max_gpus=128,
                   max_duration=4240676.0, fail_rate=0.305, cancel_rate=0.09, fail_gpu_time=0.386,
                   cancel_gpu_time=0.294),
    "helios": dict(jobs=1580464, mean_gpus=3.716, median_duration=206.0, mean_duration=6651.681,
                   gpu_seconds=(39994296320 + 30715109125 + 7288334702) / 1580464, max_gpus=2048,
                   max_duration=4320009.0, fail_rate=0.155, cancel_rate=0.221, fail_gpu_time=0.093,
                   cancel_gpu_time=0.394),
}
# fitted: size ratio r, 1-GPU duration median (s), size exponent, sigma, fail tilt, cancel tilt
_FIT = {"kalos": (0.7636, 77.6, 0.528, 1.862, -0.297, 9.253), "seren": (0.5331, 97.7, 0.385, 2.174, -0.192, 8.219),
        "philly": (0.2914, 679.9, 0.649, 2.474, 0.274, 2.419), "helios": (0.4544, 181.3, 0.252, 2.661, -0.076, 0.797)}


def preset(name: str, load: float, cluster_gpus: int) -> SynthSpec:
    t = TARGETS[name]
    ratio, median, exponent, sigma, fail_tilt, cancel_tilt = _FIT[name]
    return SynthSpec(sizes=_powers(t["max_gpus"], ratio), median_duration=median, sigma=sigma,
                     max_duration=t["max_duration"], load=load, cluster_gpus=cluster_gpus, size_exponent=exponent,
                     fail_rate=t["fail_rate"], cancel_rate=t["cancel_rate"], fail_tilt=fail_tilt,
                     cancel_tilt=cancel_tilt, name=name)


def _tilted(rate: float, tilt: float, q: float) -> float:
    return rate * (tilt + 1) * q ** tilt if tilt >= 0 else rate * (1 - tilt) * (1 - q) ** -tilt


PRESETS = tuple(TARGETS)


def check_jobs(n) -> None:
    """The synthetic job count's limit (MAX_SYNTHETIC_JOBS), checked before any work."""
    if not integer(n) or not 1 <= n <= MAX_SYNTHETIC_JOBS:
        raise UsageError(f"--synthetic takes 1 to {MAX_SYNTHETIC_JOBS:,} jobs (the ACME traces hold about a "
                         f"million; more would replay for hours), got {n!r}")


def synthetic(n: int, seed: int, spec: SynthSpec = SynthSpec(), progress=None) -> Trace:
    """n jobs drawn from spec; progress(fraction) is told now and then (for 10M jobs this
    takes about a minute)."""
    check_jobs(n)
    tick = progress or (lambda f: None)
    rng = random.Random(seed)
    values = [s for s, _ in spec.sizes]
    weights = [w for _, w in spec.sizes]
    gpus = rng.choices(values, weights, k=n)
    tick(0.1)
    mu = math.log(spec.median_duration)
    beta = spec.size_exponent
    dur = []
    for i in range(n):
        m = mu + beta * math.log(gpus[i]) if beta else mu
        dur.append(min(spec.max_duration, max(1.0, rng.lognormvariate(m, spec.sigma))))
        if i % 262144 == 0:
            tick(0.1 + 0.4 * i / n)
    states = []
    if spec.fail_rate or spec.cancel_rate:
        rank = [0.0] * n
        for k, i in enumerate(sorted(range(n), key=lambda i: gpus[i] * dur[i])):
            rank[i] = (k + 0.5) / n
        for i in range(n):
            failed = min(1.0, _tilted(spec.fail_rate, spec.fail_tilt, rank[i]))
            cancelled = min(1.0, failed + _tilted(spec.cancel_rate, spec.cancel_tilt, rank[i]))
            u = rng.random()
            states.append("FAILED" if u < failed else "CANCELLED" if u < cancelled else "COMPLETED")
    tick(0.6)
    mean_work = sum(g * d for g, d in zip(gpus, dur)) / n
    rate = spec.load * spec.cluster_gpus / mean_work  # jobs per second
    t, submit = 0.0, []
    for i in range(n):
        submit.append(t)
        t += rng.expovariate(rate)
        if i % 262144 == 0:
            tick(0.6 + 0.4 * i / n)
    shape = f" preset={spec.name}" if spec.name else ""
    return Trace(submit=submit, duration=dur, gpus=gpus, ids=[str(i) for i in range(n)], states=states,
                 source=f"synthetic n={n} seed={seed}{shape} load={spec.load}")
