"""GPU and node profiles the planner sizes against.

memory: bytes nvidia-smi reports as total for the part (what the CUDA context and
PyTorch share). peak_bf16: dense bf16 tensor-core FLOP/s from the vendor datasheet
(no sparsity). host_link: sustained GPU<->host bandwidth in bytes/s for zero-copy
access, measured on an H200 (PCIe Gen5: 51.2 GB/s, ../shared/notes/gpu-lab.md);
Gen4 parts get half of it. fault_link: fault-driven migration bandwidth, same source
(12.2 GB/s on Gen5).
"""

from __future__ import annotations

from dataclasses import dataclass

from transit_launch.errors import UsageError

MiB = 2**20


@dataclass(frozen=True)
class GPU:
    name: str
    memory: int
    peak_bf16: float
    host_link: float
    fault_link: float


_GEN5 = dict(host_link=51.2e9, fault_link=12.2e9)
_GEN4 = dict(host_link=25.6e9, fault_link=6.1e9)

GPUS = {g.name: g for g in (
    GPU("h100-80gb", 81559 * MiB, 989e12, **_GEN5),
    GPU("h100-94gb", 95830 * MiB, 989e12, **_GEN5),
    GPU("h200-141gb", 143771 * MiB, 989e12, **_GEN5),
    GPU("a100-80gb", 81920 * MiB, 312e12, **_GEN4),
    GPU("a100-40gb", 40960 * MiB, 312e12, **_GEN4),
)}


def gpu_profile(name: str | None, memory: int | None = None) -> GPU:
    """A named profile, optionally with its memory replaced (--gpu-mem)."""
    base = GPUS.get(name or "h100-80gb")
    if base is None:
        raise UsageError(f"unknown GPU {name!r}; known: {', '.join(GPUS)} (or use --gpu-mem SIZE)")
    if memory is None:
        return base
    return GPU(f"{base.name}@{memory / 1e9:.0f}GB" if name else f"custom-{memory / 1e9:.0f}GB",
               memory, base.peak_bf16, base.host_link, base.fault_link)
