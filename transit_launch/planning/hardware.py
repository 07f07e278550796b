"""GPU and node profiles the planner sizes against.

memory: bytes nvidia-smi reports as total for the part (what the CUDA context and
PyTorch share). peak_bf16: dense bf16 tensor-core FLOP/s from the vendor datasheet
(no sparsity). host_link: sustained GPU<->host bandwidth in bytes/s for zero-copy
access, measured on an H200 by the project's GPU lab (PCIe Gen5: 51.2 GB/s; bench/LOG.md
holds the link's rates measured since); Gen4 parts get half of it. fault_link: fault-driven
migration bandwidth, same measurement (12.2 GB/s on Gen5).
"""

from __future__ import annotations

from dataclasses import dataclass

from transit_launch.checks import integer, real
from transit_launch.errors import UsageError
from transit_launch.rules import GPU_BUDGET_MAX, format_size

MiB = 2**20
# plan, render, submit and simulate all assume this many GPUs per node unless told: 4 is
# the paper's H100 nodes and what the examples use (DGX nodes and ACME's Seren and Kalos
# have 8: say --gpus-per-node 8).
DEFAULT_GPUS_PER_NODE = 4
# Nodes of more GPUs than this do not exist (the largest are 8 or 16); a larger number is
# a typo, and the planner's layouts would be meaningless for it.
MAX_GPUS_PER_NODE = 64
# Below 1 GiB a GPU holds little more than its CUDA context (about 0.6 GB): `--gpu-mem 1KB`
# is a typo, not a GPU the planner can size anything against.
MIN_GPU_MEMORY = 2**30


@dataclass(frozen=True)
class GPU:
    name: str
    memory: int             # what the plan sizes against: the part's, or --gpu-mem (an emulated budget)
    peak_bf16: float
    host_link: float
    fault_link: float
    capacity: int | None = None  # the part's own memory when --gpu-mem replaced it

    def __post_init__(self):
        # above GPU_BUDGET_MAX (the --gpu-budget bound, several times the largest GPU): a typo
        if not integer(self.memory) or not MIN_GPU_MEMORY <= self.memory <= GPU_BUDGET_MAX:
            raise UsageError(f"GPU memory (--gpu-mem) must be from {format_size(MIN_GPU_MEMORY)} to "
                             f"{format_size(GPU_BUDGET_MAX)}, got {self.memory!r} bytes")
        for name in ("peak_bf16", "host_link", "fault_link"):
            v = getattr(self, name)
            if not (real(v) and v > 0):
                raise UsageError(f"GPU {name} must be a positive number, got {v!r}")

    @property
    def physical(self) -> int:
        return self.capacity or self.memory


_GEN5 = dict(host_link=51.2e9, fault_link=12.2e9)
_GEN4 = dict(host_link=25.6e9, fault_link=6.1e9)

GPUS = {g.name: g for g in (
    GPU("h100-80gb", 81559 * MiB, 989e12, **_GEN5),
    GPU("h100-94gb", 95830 * MiB, 989e12, **_GEN5),
    GPU("h200-141gb", 143771 * MiB, 989e12, **_GEN5),
    GPU("a100-80gb", 81920 * MiB, 312e12, **_GEN4),
    GPU("a100-40gb", 40960 * MiB, 312e12, **_GEN4),
)}


def gpu_from_gres_type(gres_type: str) -> str:
    """The profile a Slurm GRES type names ('h100', 'a100_80gb', 'nvidia_h100_80gb_hbm3',
    AutoDetect's names): its model and, where it has two sizes, its memory; UsageError, one
    line, when it names none of the known profiles or not which size."""
    t = gres_type.lower()
    sizes = {"h200": {"": "h200-141gb"}, "h100": {"94": "h100-94gb", "": "h100-80gb"},
             "a100": {"40": "a100-40gb", "80": "a100-80gb"}}
    for model, by_size in sizes.items():
        if model in t:
            for size, name in by_size.items():
                if size and size in t.replace(model, ""):
                    return name
            if "" in by_size:
                return by_size[""]
            raise UsageError(f"the partition's GPUs are gpu:{gres_type}, which does not say whether they have "
                             f"{' or '.join(s + ' GB' for s in by_size)}: give --gpu ({', '.join(by_size.values())})")
    raise UsageError(f"the partition's GPUs are gpu:{gres_type}, none of the known ones ({', '.join(GPUS)}): give "
                     "--gpu, or --gpu-mem SIZE for another GPU")


def gpu_profile(name: str | None, memory: int | None = None) -> GPU:
    """A named profile, optionally with its memory replaced (--gpu-mem)."""
    base = GPUS.get("h100-80gb" if name is None else name)  # '' is a typo, not the default
    if base is None:
        raise UsageError(f"unknown GPU {name!r}; known: {', '.join(GPUS)} (or use --gpu-mem SIZE)")
    if memory is None:
        return base
    size = f"{memory / 1e9:.2f}".rstrip("0").rstrip(".") + "GB"
    if name is not None and memory > base.memory:  # a named GPU has what it has (without --gpu: a custom one)
        raise UsageError(f"--gpu-mem {size} is more than {base.name} has ({base.memory / 1e9:.2f} GB): the plan would "
                         "cost a job that does not fit; name a larger --gpu, or leave out --gpu for a custom GPU")
    return GPU(f"{base.name}@{size}" if name else f"custom-{size}", memory, base.peak_bf16, base.host_link,
               base.fault_link, capacity=base.memory)
