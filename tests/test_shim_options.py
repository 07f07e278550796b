"""The shim's options (transit_launch/preload/options.py): the one object run, render and submit
build from their arguments; what it refuses, and the environment it gives a job."""

import pytest

from transit_launch.errors import UsageError
from transit_launch.preload.options import ShimOptions


@pytest.mark.parametrize("kw,needle", [
    (dict(policy="fast"), "--policy 'fast' is not one of off, base, prefetch, advise"),
    (dict(log="loud"), "--log 'loud' is not one of error, warn, info, debug"),
    (dict(overlap="yes"), "--overlap 'yes' is not one of 0, stream, host"),
    (dict(overlap="serial"), "--overlap 'serial' is retired (docs/retired-experiments.md): the modes are 0, stream, "
                             "host"),  # said as the CLI says it
    (dict(overlap="staged"), "--overlap 'staged' is retired (docs/retired-experiments.md): the modes are 0, stream, "
                             "host"),
    (dict(gpu_budget=0), "--gpu-budget 0 is not a positive number of bytes"),
    (dict(gpu_budget=True), "--gpu-budget True is not a positive number of bytes"),
    (dict(stats="/tmp/a\nb"), "a path with control characters"),
])
def test_bad_options_are_one_usage_error(kw, needle):
    with pytest.raises(UsageError) as e:
        ShimOptions(**kw)
    assert needle in str(e.value) and "\n" not in str(e.value).replace("\\n", "")


def test_the_environment_names_each_option_as_the_shim_reads_it():
    opts = ShimOptions(policy="advise", gpu_budget=40 * 10**9, stats="/s", log="info", overlap="stream")
    env = opts.job_env(environ={}).variables
    assert {k: v for k, v in env.items() if k.startswith("TRANSIT_")} == {
        "TRANSIT_POLICY": "advise", "TRANSIT_GPU_BUDGET": "40GB", "TRANSIT_STATS": "/s", "TRANSIT_LOG": "info",
        "TRANSIT_OVERLAP_STEP": "stream"}
    # a plan's policy and run's own stats directory override the object's
    env = opts.job_env(policy="off", stats="/tmp/x", environ={}).variables
    assert env["TRANSIT_POLICY"] == "off" and env["TRANSIT_STATS"] == "/tmp/x"
    assert ShimOptions().job_env(policy="base", environ={}).variables.keys() >= {"TRANSIT_POLICY", "PYTORCH_ALLOC_CONF"}
    assert "TRANSIT_GPU_BUDGET" not in ShimOptions().job_env(policy="base", environ={}).variables
