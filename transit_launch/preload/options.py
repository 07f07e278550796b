"""What the shim and its hint adapter are told (TRANSIT_*): the one home of the options
that `run`, `render` and `submit` share, checked once, turned into the job's environment
by inject.shim_env."""

from __future__ import annotations

import re
from dataclasses import dataclass

from transit_launch.errors import UsageError
from transit_launch.rules import LOG_LEVELS, POLICIES, overlap_refusal

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class ShimOptions:
    """policy None: render and submit choose (advise below the no-offload minimum)."""
    policy: str | None = None
    gpu_budget: int | None = None  # bytes (TRANSIT_GPU_BUDGET, exported with its unit)
    stats: str | None = None       # TRANSIT_STATS
    log: str | None = None         # TRANSIT_LOG
    overlap: str | None = None     # TRANSIT_OVERLAP_STEP

    def __post_init__(self):
        for name, value, allowed in (("policy", self.policy, POLICIES), ("log", self.log, LOG_LEVELS)):
            if value is not None and value not in allowed:
                raise UsageError(f"--{name} {value!r} is not one of {', '.join(allowed)}")
        if self.overlap is not None and overlap_refusal(self.overlap):
            raise UsageError(f"--overlap {overlap_refusal(self.overlap)}")
        if self.gpu_budget is not None and (isinstance(self.gpu_budget, bool) or not isinstance(self.gpu_budget, int)
                                            or self.gpu_budget <= 0):
            raise UsageError(f"--gpu-budget {self.gpu_budget!r} is not a positive number of bytes")
        if self.stats is not None and _CONTROL.search(self.stats):
            raise UsageError(f"--stats {self.stats!r}: a path with control characters cannot go into a job's "
                             "environment or script")

    @classmethod
    def from_args(cls, a) -> "ShimOptions":
        """From the parsed arguments of preload/cli.py's add_shim_args."""
        return cls(a.policy, a.gpu_budget, a.stats, a.log, a.overlap)

    def job_env(self, policy: str | None = None, shim=None, adapter=None, environ: dict | None = None,
                stats: str | None = None, plugin: bool = False, plan: dict | None = None):
        """The job's whole environment (inject.job_env) with these options; policy and stats
        override this object's (the policy a plan chose, the temporary directory `run` made)."""
        from transit_launch.preload import inject
        return inject.job_env(policy or self.policy, self.gpu_budget, stats or self.stats, self.log, self.overlap,
                              shim=shim, adapter=adapter, environ=environ, plugin=plugin, plan=plan)
