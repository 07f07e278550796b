"""Issue 34, defect 5: the synthetic presets against the published statistics of their
traces (the ACME repository's cluster_summary.csv, written out here, not read from the
module): a 200,000-job sample of each preset, and the spec's expected GPU-seconds a job
from the lognormal's truncated mean (the heavy tail makes a sample's mean noisy)."""

import math
import statistics

import pytest

from transit_launch.sim import synth

# jobs' mean GPUs, median / mean duration s, GPU-seconds a job, largest job; failed and
# cancelled shares of jobs and of GPU time
PUBLISHED = {
    "kalos": (26.77, 124, 1260, 5_333_180_061 / 19_907, 1024, 0.397, 0.062, 0.080, 0.607),
    "seren": (5.68, 122, 1414, 21_510_624_587 / 663_813, 1024, 0.429, 0.075, 0.124, 0.664),
    "philly": (1.928, 874, 18006, 6_894_717_531 / 112_956, 128, 0.305, 0.090, 0.386, 0.294),
    "helios": (3.716, 206, 6652, 77_997_740_147 / 1_580_464, 2048, 0.155, 0.221, 0.093, 0.394),
}
# Tolerances: medians and mean GPUs 5%; mean duration 15% and the sample's GPU-seconds 40%
# (lognormal sigmas of 1.9-2.7: a 200k sample's mean wanders); the expectation 3%; state
# shares of jobs 0.01, of GPU time 0.1 (they ride on the heaviest jobs).


def _phi(x):
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def expected_gpu_seconds(spec):
    """sum over sizes of p(g) g E[min(D, cap)], D lognormal(ln(m g^beta), sigma)."""
    total, weight = 0.0, sum(w for _, w in spec.sizes)
    for g, w in spec.sizes:
        mu, s, cap = math.log(spec.median_duration) + spec.size_exponent * math.log(g), spec.sigma, spec.max_duration
        z = (math.log(cap) - mu) / s
        total += w / weight * g * (math.exp(mu + s * s / 2) * _phi(z - s) + cap * (1 - _phi(z)))
    return total


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_matches_its_trace(name):
    mean_g, med_d, mean_d, gpu_s, max_g, fail, cancel, fail_t, cancel_t = PUBLISHED[name]
    spec = synth.preset(name, load=0.5, cluster_gpus=76 * 32)
    assert expected_gpu_seconds(spec) == pytest.approx(gpu_s, rel=0.03)
    t = synth.synthetic(200_000, 11, spec)
    g, d = t.gpus, t.duration
    assert statistics.median(g) == 1 and max(g) == max_g
    assert statistics.fmean(g) == pytest.approx(mean_g, rel=0.05)
    assert statistics.median(d) == pytest.approx(med_d, rel=0.05)
    assert statistics.fmean(d) == pytest.approx(mean_d, rel=0.15)
    work = [a * b for a, b in zip(g, d)]
    assert statistics.fmean(work) == pytest.approx(gpu_s, rel=0.4)
    # the joint shape: GPU-seconds far above mean GPUs x mean duration where the trace's are
    assert statistics.fmean(work) / (statistics.fmean(g) * statistics.fmean(d)) > 0.5 * gpu_s / (mean_g * mean_d)
    n, total = len(g), sum(work)
    for state, jobs_share, time_share in (("FAILED", fail, fail_t), ("CANCELLED", cancel, cancel_t)):
        assert t.states.count(state) / n == pytest.approx(jobs_share, abs=0.01)
        assert sum(w for w, s in zip(work, t.states) if s == state) / total == pytest.approx(time_share, abs=0.1)


def test_default_generator_is_unchanged_and_independent():
    # without a preset: sizes up to 128 GPUs, durations of median 1800 s whatever the size
    t = synth.synthetic(50_000, 3)
    assert max(t.gpus) == 128 and t.states == []
    small = [d for g, d in zip(t.gpus, t.duration) if g == 1]
    large = [d for g, d in zip(t.gpus, t.duration) if g >= 32]
    assert statistics.median(small) == pytest.approx(1800, rel=0.05)
    assert statistics.median(large) == pytest.approx(1800, rel=0.1)


def test_cli_preset_and_bad_combinations(cli):
    rc, out, err = cli("simulate", "--synthetic", "2000", "--preset", "kalos", "--racks", "32", "--gpus-per-node", "8",
                       "--quiet")
    assert rc == 0, err
    assert "preset=kalos" in out
    for args, needle in ((["--preset", "kalos", "--racks", "16"], "has jobs of 1024 GPUs, more than 16 racks"),
                         (["--preset", "kalos", "--racks", "32", "--median-duration", "60"], "leave out --median-duration"),
                         (["--preset", "nope"], "invalid choice"),
                         (["--seeds", "0"], "argument --seeds: must be a positive integer"),
                         (["--efficiency", "0.5"], "--efficiency takes planner, linear, titan-mb1"),
                         (["--efficiency", "0.5:0"], "efficiencies in (0, 10]")):
        rc, out, err = cli("simulate", "--synthetic", "100", *args)
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and needle in err, (args, err)
