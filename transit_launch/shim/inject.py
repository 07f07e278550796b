"""The environment that loads the shim into a training process.

Used by `render` (sbatch scripts and local torchrun commands) and `run`. The shim is
found at $TRANSIT_SHIM, else inside the installed package (transit_launch/shim/lib/); the
framework hint adapter (a sitecustomize module) at $TRANSIT_ADAPTER_DIR, else
transit_launch/adapter/, which runs inside the job's own Python and imports nothing
of transit_launch (tests/test_rules.py checks). The adapter is only injected together with the shim.
"""

from __future__ import annotations

import os
from pathlib import Path

from transit_launch.rules import ALLOC_CONF, ENV, POLICIES, format_size  # noqa: F401  (re-exported for callers)
# NVLink multicast (NVLS) must stay off on shared machines: these values turn it off in
# NCCL, PyTorch and NVSHMEM; the job's own settings of them are passed through.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
PASS_THROUGH = tuple(MULTICAST_OFF)

_PKG = Path(__file__).resolve().parent


def shim_path() -> Path | None:
    """$TRANSIT_SHIM wins and is not checked (a site path on the compute nodes may not
    exist where the script is rendered); set empty it disables the shim."""
    if ENV["SHIM"] in os.environ:
        return Path(os.environ[ENV["SHIM"]]) if os.environ[ENV["SHIM"]] else None
    built = _PKG / "lib" / "libtransit.so"
    return built if built.is_file() else None


def shim_missing_reason() -> str:
    """Why shim_path() found none, in words for a warning or doctor's row."""
    if os.environ.get(ENV["SHIM"]) == "":
        return f"{ENV['SHIM']} is set empty, which disables it"
    why = _PKG / "lib" / "BUILD_SKIPPED"
    if why.is_file():
        return why.read_text().strip()
    return "no build of it in this installation; reinstall with `pip install .` where CUDA headers exist"


def adapter_dir() -> Path | None:
    env = os.environ.get(ENV["ADAPTER_DIR"])
    if env:
        return Path(env)
    d = _PKG.parent / "adapter"  # transit_launch/adapter: the code that runs inside the job
    return d if (d / "sitecustomize.py").is_file() else None


def shim_env(policy: str, gpu_budget: int | None = None, stats: str | None = None,
             log: str | None = None, environ: dict | None = None, overlap: str | None = None) -> dict[str, str]:
    """Variables to export (LD_PRELOAD and PYTHONPATH are prepended by the caller's shell
    or by `prepend`, so what the job already had is kept)."""
    environ = os.environ if environ is None else environ
    env = {ENV["POLICY"]: policy}
    if overlap:
        env[ENV["OVERLAP_STEP"]] = overlap
    if gpu_budget:  # with its unit: the shim refuses a bare number (rules.py)
        env[ENV["GPU_BUDGET"]] = format_size(gpu_budget)
    if stats:
        env[ENV["STATS"]] = stats
    if log:
        env[ENV["LOG"]] = log
    env["PYTORCH_ALLOC_CONF"] = ALLOC_CONF
    env["PYTORCH_CUDA_ALLOC_CONF"] = ALLOC_CONF
    for k in PASS_THROUGH:
        if k in environ:
            env[k] = environ[k]
    return env


def check_budget(gpu_budget: int | None, gpu) -> None:
    """A budget emulates a smaller GPU: more than the GPU the job is planned for (a
    hardware.GPU: --gpu, --gpu-mem or the default profile) is a typo. The floor is the
    argument type's (argtypes.gpu_budget)."""
    if gpu_budget and gpu is not None and gpu_budget > gpu.memory:
        from transit_launch.errors import UsageError
        raise UsageError(f"--gpu-budget {format_size(gpu_budget)} is more than the GPU has: {gpu.name} has "
                         f"{gpu.memory / 1e9:.2f} GB (a budget emulates a smaller GPU; --gpu names the GPU)")


def check_off(policy: str, overlap: str | None, gpu_budget: int | None = None) -> None:
    """Under policy off what the shim would do is not done, so an option for it would be
    ignored: the overlap runs in the hint adapter, which only the active policies load, and
    the budget is kept by the shim's placement, which off passes through."""
    if policy != "off":
        return
    from transit_launch.errors import UsageError
    if overlap:
        raise UsageError(f"--overlap {overlap} needs a shim policy other than off (the adapter that runs it is "
                         "loaded with the shim's policy)")
    if gpu_budget:
        raise UsageError(f"--gpu-budget {format_size(gpu_budget)} needs a shim policy other than off (off passes "
                         "every allocation through, so no budget is kept): give --policy")


def prepend(var: str, value: str, environ: dict) -> str:
    old = environ.get(var, "")
    return f"{value}:{old}" if old else value
