"""Node counts for a model: the fewest without offloading, and scale-in options below it.

For every candidate node count the layout is derived from the parallelism preset, kept
only if its degrees divide the model and its data-parallel degree divides the global
batch, then sized (memory.estimate) and costed (traffic.per_node, a first-order step-time
model below). Units: bytes inside, GB (1e9) in reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from transit_launch.errors import UsageError
from transit_launch.planning.hardware import GPU
from transit_launch.planning.memory import Estimate, Layout, check_degrees, estimate
from transit_launch.planning.models import ModelCard
from transit_launch.planning.traffic import Traffic, per_node
from transit_launch.units import gb

PRESETS = ("fsdp", "fsdp+tp", "tp+pp", "fsdp+ep")
PRECISIONS = ("mixed", "bf16")
RECOMPUTE = ("full", "none")
DEFAULT_GPUS_PER_NODE = 4
MAX_NODES = 1024
# CPU memory of one training rank besides offloaded data: Python, PyTorch's host
# allocations, pinned staging buffers and the data loader (assumption: a TorchTitan rank
# runs at 6-10 GB RSS; 10 GB keeps the check on the safe side).
HOST_BYTES_PER_RANK = 10e9
# Share of a node's DRAM a job may use: the OS, page cache and Slurm's own accounting
# need the rest.
HOST_USABLE_FRACTION = 0.9
# Model FLOPs utilisation assumed for step times: the paper's no-offload Llama3-70B
# baseline ran at 418 of the H100's 989 dense bf16 TFLOPS.
ASSUMED_MFU = 0.42
# 2 TB per node: DGX H100/H200 and the paper's clusters. Override with --host-mem.
DEFAULT_HOST_MEM = 2000e9


@dataclass(frozen=True)
class Request:
    card: ModelCard
    gpu: GPU
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    host_mem: float = DEFAULT_HOST_MEM
    parallel: str = "fsdp"
    tp: int | None = None
    pp: int | None = None
    ep: int | None = None
    seq_len: int = 8192
    local_batch: int = 1
    global_batch: int | None = None
    precision: str = "mixed"
    recompute: str = "full"
    scale_in: tuple[float, ...] | None = None
    min_efficiency: float = 0.9

    def __post_init__(self):  # the same checks for Python callers as for the CLI
        if self.parallel not in PRESETS:
            raise UsageError(f"parallel {self.parallel!r} is not one of {', '.join(PRESETS)}")
        if self.precision not in PRECISIONS:
            raise UsageError(f"precision {self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if self.recompute not in RECOMPUTE:
            raise UsageError(f"recompute {self.recompute!r} is not one of {', '.join(RECOMPUTE)}")
        for name in ("gpus_per_node", "seq_len", "local_batch", "global_batch", "tp", "pp", "ep"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got {v!r}")
        if not (self.host_mem > 0 and math.isfinite(self.host_mem)):
            raise UsageError(f"--host-mem must be a positive size, got {self.host_mem!r}")
        if not 0 < self.min_efficiency <= 1:  # also refuses nan
            raise UsageError(f"--min-efficiency must lie in (0, 1], got {self.min_efficiency}")
        if self.scale_in is not None and not all(0 < f < 1 for f in self.scale_in):
            raise UsageError(f"--scale-in fractions must lie strictly between 0 and 1, got {self.scale_in}")


@dataclass
class Candidate:
    nodes: int
    layout: Layout
    est: Estimate
    traffic: Traffic
    microsteps: int
    offload: float = 0.0
    spill: float = 0.0  # offloaded bytes beyond the cold states: hot data off the GPU
    host_per_node: float = 0.0
    fits_host: bool = True
    efficiency: float = 1.0
    notes: list = field(default_factory=list)


def _largest_divisor_at_most(n: int, limit: int) -> int:
    return max(d for d in range(1, max(1, limit) + 1) if n % d == 0)


def layout_for(req: Request, nodes: int) -> Layout | None:
    """The layout of `nodes` nodes, or None when the degrees cannot tile the GPUs."""
    g, card = req.gpus_per_node, req.card
    gpus = nodes * g
    heads = math.gcd(card.heads, card.kv_heads)
    tp = req.tp or (_largest_divisor_at_most(math.gcd(heads, g), g)
                    if req.parallel in ("fsdp+tp", "tp+pp") else 1)
    pp = req.pp or (gpus // tp if req.parallel == "tp+pp" else 1)
    if gpus % (tp * pp):
        return None
    dp = gpus // (tp * pp)
    ep = req.ep or 1
    if req.ep is None and req.parallel == "fsdp+ep":
        if not card.moe:
            raise UsageError(f"--parallel fsdp+ep needs an MoE model; {card.name} is dense")
        ep = _largest_divisor_at_most(math.gcd(card.moe.experts, dp * tp), g)
    microsteps = max(1, req.global_batch // (dp * req.local_batch)) if req.global_batch else 1
    return Layout(dp=dp, tp=tp, pp=pp, ep=ep, local_batch=req.local_batch, seq_len=req.seq_len,
                  precision=req.precision, recompute=req.recompute, microsteps=microsteps)


def _valid(req: Request, lay: Layout | None) -> bool:
    if lay is None:
        return False
    if req.global_batch is not None and req.global_batch % (lay.dp * lay.local_batch):
        return False
    try:
        estimate(req.card, lay)
    except UsageError:
        return False
    return True


def evaluate(req: Request, nodes: int, lay: Layout) -> Candidate:
    est = estimate(req.card, lay)
    gbatch = req.global_batch or lay.dp * lay.local_batch
    microsteps = gbatch // (lay.dp * lay.local_batch)
    c = Candidate(nodes, lay, est, per_node(req.card, lay, req.gpus_per_node), microsteps)
    c.offload = max(0.0, est.total - req.gpu.memory)
    c.spill = max(0.0, c.offload - est.cold)
    c.host_per_node = req.gpus_per_node * (c.offload + HOST_BYTES_PER_RANK)
    c.fits_host = c.host_per_node <= req.host_mem * HOST_USABLE_FRACTION
    c.efficiency = predicted_efficiency(req, c)
    if c.spill:
        c.notes.append(f"{gb(c.spill)} GB of hot data (gradients/activations) must leave the GPU")
    if not c.fits_host:
        c.notes.append("host DRAM too small")
    return c


def predicted_efficiency(req: Request, c: Candidate) -> float:
    """Per-GPU throughput relative to running without offloading, compute and PCIe only.

    advise serves cold state zero-copy: it is read and written once per optimizer step
    over the host link, which is full duplex, so reads and writes overlap (measured on the
    H200, bench/RESULTS.md: 8.03 GB of AdamW state cost 0.175 s a step, 10 GB each way,
    against 0.157 s for cold / host_link and 0.314 s for 2 x cold / host_link; predicted
    74/89/97% against measured 72/88/95% at 16K/49K/197K tokens a step). Hot data that does
    not fit (spill) migrates on faults in every microstep, both ways. Network effects are
    not included (see traffic_ratio).
    """
    if not c.offload:
        return 1.0
    lay = c.layout
    tokens = lay.local_batch * lay.seq_len
    recompute = 8 / 6 if lay.recompute == "full" else 1.0
    flops = req.card.flops_per_token() * tokens * recompute / (lay.tp * lay.pp)
    t_compute = c.microsteps * flops / (req.gpu.peak_bf16 * ASSUMED_MFU)
    cold = min(c.offload, c.est.cold)
    t_host = cold / req.gpu.host_link + c.microsteps * 2 * c.spill / req.gpu.fault_link
    return t_compute / (t_compute + t_host)


@dataclass
class Plan:
    req: Request
    baseline: Candidate
    options: list[Candidate]
    recommended: Candidate


def plan(req: Request) -> Plan:
    check_degrees(req.card, req.tp or 1, req.pp or 1, req.ep or 1)
    if req.tp and req.gpus_per_node % req.tp and req.tp % req.gpus_per_node:
        raise UsageError(f"tp={req.tp} neither divides nor is a multiple of {req.gpus_per_node} GPUs per node")
    valid = []  # node counts whose layout tiles the GPUs and divides the global batch
    baseline = None
    for n in range(1, MAX_NODES + 1):
        lay = layout_for(req, n)
        if not _valid(req, lay):
            continue
        cand = evaluate(req, n, lay)
        valid.append(cand)
        if cand.est.total <= req.gpu.memory:
            baseline = cand
            break
    if not valid:
        gb_txt = f"global batch {req.global_batch}" if req.global_batch else "this model"
        raise UsageError(f"no node count up to {MAX_NODES} gives a {req.parallel} layout that serves "
                         f"{gb_txt} with local batch {req.local_batch} on {req.gpus_per_node} GPUs per node")
    if baseline is None:
        floor = valid[-1].est
        term, size = max(((k, v) for k, v in floor.breakdown().items() if k in ("activations", "logits", "fsdp")),
                         key=lambda kv: kv[1])
        hint = "lower --seq-len or --local-batch" + (", or use --recompute full" if req.recompute == "none" else "")
        raise UsageError(f"{req.card.name} does not fit on {req.gpu.name} without offloading at any node count "
                         f"up to {valid[-1].nodes}: the per-GPU floor is {gb(floor.total)} GB, of which "
                         f"{term} take {gb(size)} GB; {hint}")
    below = valid[:-1]
    if req.scale_in is not None:
        chosen = []
        for f in req.scale_in:
            target = round(baseline.nodes * (1 - f))
            fit = [c for c in below if c.nodes <= max(target, 1)]
            if fit and fit[-1] not in chosen:
                chosen.append(fit[-1])
        options = sorted(chosen, key=lambda c: -c.nodes)
    else:
        options = sorted(below, key=lambda c: -c.nodes)
    good = [c for c in options if c.fits_host and c.efficiency >= req.min_efficiency]
    recommended = min(good, key=lambda c: c.nodes) if good else baseline
    return Plan(req, baseline, options, recommended)



def auto_nodes(p: Plan, max_nodes: int) -> tuple[int, str]:
    """`submit --nodes auto`: the fewest nodes whose layout fits host DRAM without pushing
    hot data off the GPU, and why."""
    # the no-offload minimum needs no host DRAM for offloading: it is always a candidate
    fit = [c for c in p.options if c.fits_host and not c.spill and c.nodes <= max_nodes]
    fit += [p.baseline] if p.baseline.nodes <= max_nodes else []
    if not fit:
        raise UsageError(f"no node count up to the partition's {max_nodes} fits {p.req.card.name} "
                         f"({p.baseline.nodes} nodes without offloading)")
    c = min(fit, key=lambda c: c.nodes)
    if c is p.baseline:
        return c.nodes, (f"the no-offload minimum: no fewer nodes fit host DRAM ({gb(p.req.host_mem):.0f} GB per "
                         "node) without spilling hot data")
    return c.nodes, (f"fewest nodes whose offload ({gb(c.offload):.1f} GB per GPU) fits host DRAM "
                     f"({gb(c.host_per_node):.0f} of {gb(p.req.host_mem):.0f} GB per node); the no-offload "
                     f"minimum is {p.baseline.nodes}")
