"""The environment that loads the shim into a training process: THE builder of it (job_env),
and its forms (the process's environment, the script's export lines, a command's prefix,
a scale-in attempt's lines, or the SPANK plugin's #SBATCH options).

Used by `render` (sbatch scripts and local torchrun commands), `run` and the scale-in
attempts; tests/test_job_env.py fails on a second builder. The shim is
found at $TRANSIT_SHIM, else inside the installed package (transit_launch/preload/lib/); the
framework hint adapter (a sitecustomize module) at $TRANSIT_ADAPTER_DIR, else
transit_launch/adapter/, which runs inside the job's own Python and imports nothing
of transit_launch (tests/test_rules.py checks). The adapter is only injected together with the shim.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from transit_launch.rules import (ALLOC_CONF, ENV, JOB_ENV, PLUGIN_OPTIONS, POLICIES,  # noqa: F401  (re-exported)
                                  format_size)
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
    env[JOB_ENV["ALLOC_CONF"]] = ALLOC_CONF
    env[JOB_ENV["CUDA_ALLOC_CONF"]] = ALLOC_CONF
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


# The shim's own variables a later scale-in attempt must not inherit when its policy leaves
# them out (TRANSIT_POLICY is always set).
_OPTIONAL = tuple(ENV[k] for k in ("GPU_BUDGET", "STATS", "LOG", "OVERLAP_STEP", "PLAN"))
# where the sbatch script keeps the job's own LD_PRELOAD and PYTHONPATH, so that scale-in
# attempts do not stack the shim (save_lines writes them, attempt_lines reads them)
_SAVED = {JOB_ENV["PRELOAD"]: "base_preload", JOB_ENV["ADAPTER_PATH"]: "base_pythonpath"}


@dataclass(frozen=True)
class JobEnv:
    """A job's environment: variables set as they are, entries put first in path lists
    (LD_PRELOAD: the shim; PYTHONPATH: the adapter; what the job had stays after them),
    and on the plugin route the #SBATCH options by which the SPANK plugin sets the rest on
    the node (`--transit=POLICY`, ...)."""
    variables: dict[str, str]
    first: dict[str, str] = field(default_factory=dict)
    sbatch: tuple[str, ...] = ()

    def apply(self, environ: dict) -> dict:
        """The environment a process starts with (`run`)."""
        env = dict(environ, **self.variables)
        for var, entry in self.first.items():
            env[var] = prepend(var, entry, env)
        return env

    def _words(self) -> list[str]:
        return ([f"{var}={shlex.quote(entry)}${{{var}:+:${var}}}" for var, entry in self.first.items()]
                + [f"{k}={shlex.quote(v)}" for k, v in self.variables.items()])

    def exports(self) -> list[str]:
        """The sbatch script's lines (srun --export=ALL hands them to every task)."""
        return [f"export {w}" for w in self._words()]

    def prefix(self) -> str:
        """Assignments before a command on one line (render --local's torchrun)."""
        return "".join(f"{w} " for w in self._words())

    @staticmethod
    def save_lines() -> list[str]:
        """The scale-in script's copy of the job's own path lists, before any attempt."""
        return [f"{base}=${{{var}:-}}" for var, base in _SAVED.items()]

    def attempt_lines(self) -> list[str]:
        """A scale-in attempt's lines: its policy's variables, the shim's others unset, and
        each path list rebuilt from the job's own (save_lines), so attempts do not stack."""
        out = [f"unset {k}" for k in _OPTIONAL if k not in self.variables]
        out += [f"export {k}={shlex.quote(v)}" for k, v in self.variables.items()]
        for var, base in _SAVED.items():
            if var in self.first:
                out.append(f'export {var}={shlex.quote(self.first[var])}"${{{base}:+:${base}}}"')
            else:
                out.append(f'if [ -n "${base}" ]; then export {var}="${base}"; else unset {var}; fi')
        return out


def job_env(policy: str, gpu_budget: int | None = None, stats: str | None = None, log: str | None = None,
            overlap: str | None = None, shim: Path | str | None = None, adapter: Path | str | None = None,
            environ: dict | None = None, plugin: bool = False, plan: dict | None = None) -> JobEnv:
    """THE job environment of a policy and the shim's options: the shim (None: not loaded)
    first in LD_PRELOAD, the adapter's directory (only with the shim) first in PYTHONPATH,
    and shim_env's variables. plugin: the SPANK plugin loads the shim and sets the policy,
    the budget, the stats path and the allocator's settings on the node (spank/remote.c)
    from #SBATCH options; the script exports only the rest (log, overlap, pass-through).
    plan: the plan's prediction, which the shim copies into each rank's stats report."""
    variables = shim_env(policy, gpu_budget, stats, log, environ=environ, overlap=overlap)
    if plan and policy != "off":
        variables[ENV["PLAN"]] = json.dumps(plan, sort_keys=True)
    if plugin:
        opts = tuple(f"--{opt}={variables.pop(ENV[k])}" for k, opt in PLUGIN_OPTIONS.items() if ENV[k] in variables)
        for k in ("ALLOC_CONF", "CUDA_ALLOC_CONF"):
            variables.pop(JOB_ENV[k])
        return JobEnv(variables, sbatch=opts)
    first = {JOB_ENV["PRELOAD"]: str(shim)} if shim else {}
    if shim and adapter:
        first[JOB_ENV["ADAPTER_PATH"]] = str(adapter)
    return JobEnv(variables, first)
