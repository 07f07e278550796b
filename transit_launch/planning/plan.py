"""Node counts for a model: the fewest without offloading, and scale-in options below it.

For every candidate node count the layout is derived from the parallelism preset, kept
only if its degrees divide the model and its data-parallel degree divides the global
batch, then sized (memory.estimate) and costed (traffic.per_node, and the first-order
step-time model of efficiency.py). Units: bytes inside, GB (1e9) in reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from transit_launch.checks import integer, real
from transit_launch.errors import UsageError
from transit_launch.planning import choice
from transit_launch.planning.efficiency import (SHIM_RESERVED_GAP, efficiency_of, host_share, host_terms, step_mode,
                                                 streamed_offload)
from transit_launch.planning.hardware import DEFAULT_GPUS_PER_NODE, GPU, MAX_GPUS_PER_NODE
from transit_launch.planning.memory import (PRECISIONS, RECOMPUTE, Estimate, Layout, check_degrees, estimate,
                                            titan_precision)
from transit_launch.planning.models import ModelCard
from transit_launch.planning.traffic import Traffic, per_node
from transit_launch.rules import RING_OVERLAP_MODES, STAGE_RING_BYTES, format_size, overlap_refusal
from transit_launch.units import gb

PRESETS = ("fsdp", "fsdp+tp", "tp+pp", "fsdp+ep")
# The most nodes the planner searches (a job of 1024 nodes is beyond what it is for).
MAX_NODES = 1024
# CPU memory of one training rank besides offloaded data: Python, PyTorch's host
# allocations, pinned staging buffers and the data loader (assumption: a TorchTitan rank
# runs at 6-10 GB RSS; 10 GB keeps the check on the safe side).
HOST_BYTES_PER_RANK = 10e9
# Share of a node's DRAM a job may use: the OS, page cache and Slurm's own accounting
# need the rest.
HOST_USABLE_FRACTION = 0.9
# 2 TB per node: DGX H100/H200 and the paper's clusters. Override with --host-mem.
DEFAULT_HOST_MEM = 2000e9
# A node of less DRAM cannot run a training rank: `--host-mem 1KB` is a typo. Nor does any
# node hold more than MAX_HOST_MEM (the largest single-system-image servers hold tens of TB;
# GPU nodes 0.5 to 4 TB): `--host-mem 999TB` is a typo too (docs/plan.md).
MIN_HOST_MEM = 2**30
MAX_HOST_MEM = 64 * 2**40
# Host cores per node (DGX H100/H200: two 56-core CPUs): what --overlap host's CPU update
# shares among the node's ranks. Override with --host-cores; submit takes the job's CPUs.
DEFAULT_HOST_CORES = 112
MAX_HOST_CORES = 4096
# --overlap host keeps an fp32 copy of each parameter it updates on the host beside its state:
# AdamW's state is 8 B a parameter, the copy 4 B.
HOST_COPY_PER_STATE_BYTE = 0.5


@dataclass(frozen=True)
class Request:
    card: ModelCard
    gpu: GPU
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    host_mem: float = DEFAULT_HOST_MEM
    host_cores: int = DEFAULT_HOST_CORES
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
    max_nodes: int = MAX_NODES  # the partition's node count when submit knows it
    overlap: str | None = None  # TRANSIT_OVERLAP_STEP (rules.OVERLAP_MODES): stream pays its ring from the budget

    def __post_init__(self):  # the same checks for Python callers as for the CLI
        if not isinstance(self.card, ModelCard) or not isinstance(self.gpu, GPU):
            raise UsageError("a plan request needs a ModelCard and a GPU")
        if self.parallel not in PRESETS:
            raise UsageError(f"parallel {self.parallel!r} is not one of {', '.join(PRESETS)}")
        if self.precision not in PRECISIONS:
            raise UsageError(f"precision {self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if self.recompute not in RECOMPUTE:
            raise UsageError(f"recompute {self.recompute!r} is not one of {', '.join(RECOMPUTE)}")
        for name in ("gpus_per_node", "host_cores", "seq_len", "local_batch", "global_batch", "tp", "pp", "ep",
                     "max_nodes"):
            v = getattr(self, name)
            if v is not None and (not integer(v) or v < 1):
                raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got {v!r}")
        if self.gpus_per_node > MAX_GPUS_PER_NODE:
            raise UsageError(f"--gpus-per-node {self.gpus_per_node}: no node has more than {MAX_GPUS_PER_NODE} GPUs")
        if self.host_cores > MAX_HOST_CORES:
            raise UsageError(f"--host-cores {self.host_cores}: no node has more than {MAX_HOST_CORES} cores")
        if not real(self.host_mem) or self.host_mem < MIN_HOST_MEM:
            raise UsageError(f"--host-mem must be at least 1GiB, got {self.host_mem!r} bytes")
        if self.host_mem > MAX_HOST_MEM:
            raise UsageError(f"--host-mem {format_size(int(self.host_mem))} is more than any node has: host DRAM per "
                             f"node must be at most {format_size(MAX_HOST_MEM)}")
        if not real(self.min_efficiency) or not 0 < self.min_efficiency <= 1:
            raise UsageError(f"--min-efficiency must lie in (0, 1], got {self.min_efficiency}")
        if self.scale_in is not None and not all(0 < f < 1 for f in self.scale_in):
            raise UsageError(f"--scale-in fractions must lie strictly between 0 and 1, got {self.scale_in}")
        if self.max_nodes > MAX_NODES:
            raise UsageError(f"max_nodes {self.max_nodes} is above the planner's {MAX_NODES}")
        if self.overlap is not None and overlap_refusal(self.overlap):
            raise UsageError(f"overlap {overlap_refusal(self.overlap)}")


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
    warm_up_s: float = 0.0  # the first step's extra seconds the plan states (host_terms)
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
    # what TorchTitan will really run: mixed precision without FSDP under TP or PP is fp32
    return Layout(dp=dp, tp=tp, pp=pp, ep=ep, local_batch=req.local_batch, seq_len=req.seq_len,
                  precision=titan_precision(req.precision, dp, tp, pp), recompute=req.recompute,
                  microsteps=microsteps)


def invalid(req: Request, lay: Layout | None) -> str | None:
    """Why a node count's layout cannot run, or None."""
    if lay is None:
        return "the degrees do not tile the GPUs"
    if req.global_batch is not None and req.global_batch % (lay.dp * lay.local_batch):
        return "dp x local batch does not divide the global batch"
    try:
        estimate(req.card, lay)
    except UsageError as e:
        return str(e)
    return None


def evaluate(req: Request, nodes: int, lay: Layout, offloads: bool = True) -> Candidate:
    """The candidate of `nodes` nodes under advise (offloads), or as the job runs without
    the shim (the no-offload rows, policy off: a real GPU's allocator frees its cache and
    retries, so the shim's reserved gap does not apply and nothing leaves the GPU)."""
    est = estimate(req.card, lay)
    gbatch = req.global_batch or lay.dp * lay.local_batch
    microsteps = gbatch // (lay.dp * lay.local_batch)
    c = Candidate(nodes, lay, est, per_node(req.card, lay, req.gpus_per_node), microsteps)
    if lay.precision != req.precision:
        c.notes.append(f"{lay.precision} (TorchTitan, TP/PP without FSDP)")
    if not offloads:
        c.host_per_node = req.gpus_per_node * HOST_BYTES_PER_RANK
        c.fits_host = c.host_per_node <= req.host_mem * HOST_USABLE_FRACTION
        return c
    # what the shim places on the host: the reserved bytes over the budget (SHIM_RESERVED_GAP)
    # (also where the estimate alone fits: the budget bounds what is reserved, gap included)
    c.offload = max(0.0, est.total * (1 + SHIM_RESERVED_GAP) - req.gpu.memory)
    mode = step_mode(req)
    # the streamed step (and host's streamed share) pays its ring from the budget
    ring = mode in RING_OVERLAP_MODES and c.offload > 0
    if ring:
        c.offload = streamed_offload(req, est)
    c.spill = max(0.0, c.offload - est.cold)
    # host's CPU share keeps its parameters' fp32 copies on the host too
    copies = host_share(req) * min(c.offload, est.optimizer) * HOST_COPY_PER_STATE_BYTE
    c.host_per_node = req.gpus_per_node * (c.offload + copies + HOST_BYTES_PER_RANK)
    c.fits_host = c.host_per_node <= req.host_mem * HOST_USABLE_FRACTION
    # rounded once here, so every output (table, --json, --plot, messages) shows the same percent
    if c.offload:
        t = host_terms(req, c)
        c.efficiency, c.warm_up_s = round(efficiency_of(t), 4), t["warm_up_s"]
    if ring and req.overlap == "stream":  # asked for; as advise's default it is not repeated on every row
        c.notes.append(f"stream: {STAGE_RING_BYTES >> 20} MiB ring")
    if ring and mode == "host":
        c.notes.append(f"host: {host_share(req):.0%} of the state updated by the CPU")
    if c.spill:
        c.notes.append(f"{gb(c.spill)} GB of hot data (gradients/activations) must leave the GPU")
    if not c.fits_host:
        c.notes.append("host DRAM too small")
    return c


@dataclass
class Plan:
    req: Request
    baseline: Candidate | None  # the fewest nodes without offloading; None: no valid node count fits without it
    options: list[Candidate]    # with offloading, most nodes first
    recommended: Candidate
    reason: str                 # why the recommendation (choice.recommend)
    no_fit: str = ""            # with baseline None: why, in one sentence

    @property
    def reference(self) -> Candidate:
        """What traffic ratios and the per-GPU breakdown refer to: the no-offload minimum, or
        without one the option with the most nodes (the least offload)."""
        return self.baseline or self.options[0]

    @property
    def rows(self) -> list[Candidate]:
        """Every node count the plan shows, most nodes first (the baseline first)."""
        return ([self.baseline] if self.baseline else []) + self.options

    def at(self, nodes: int) -> Candidate | None:
        """The candidate of `nodes` nodes (shown or not), or None when that layout cannot run."""
        shown = next((c for c in self.rows if c.nodes == nodes), None)
        if shown:
            return shown
        lay = layout_for(self.req, nodes)
        return None if invalid(self.req, lay) else evaluate(self.req, nodes, lay, self.needs_offload(nodes))

    def why_not(self, nodes: int) -> str | None:
        return invalid(self.req, layout_for(self.req, nodes))

    def needs_offload(self, nodes: int) -> bool:
        return self.baseline is None or nodes < self.baseline.nodes


def plan(req: Request) -> Plan:
    check_degrees(req.card, req.tp or 1, req.pp or 1, req.ep or 1)
    if req.tp and req.gpus_per_node % req.tp and req.tp % req.gpus_per_node:
        raise UsageError(f"tp={req.tp} neither divides nor is a multiple of {req.gpus_per_node} GPUs per node")
    valid, rejected = [], {}  # rejected: why -> node counts whose layout cannot run
    baseline = None
    for n in range(1, req.max_nodes + 1):
        lay = layout_for(req, n)
        why = invalid(req, lay)
        if why:
            rejected.setdefault(why, []).append(n)
            continue
        cand = evaluate(req, n, lay)
        if cand.est.total <= req.gpu.memory:  # the no-offload minimum runs without the shim (policy off)
            baseline = evaluate(req, n, lay, offloads=False)
            valid.append(baseline)
            break
        valid.append(cand)
    if not valid:
        raise UsageError(choice.no_layout(req, rejected, pp_hint(req)))
    if baseline is None:
        return _no_fit(req, valid)
    below = sorted(valid[:-1], key=lambda c: -c.nodes)
    # one rule over every node count (plan, render, submit): --scale-in only picks the rows shown
    recommended, reason = choice.recommend(req, baseline, below)
    if req.scale_in is None:
        return Plan(req, baseline, below, recommended, reason)
    shown = {recommended.nodes}
    for f in req.scale_in:
        target = round(baseline.nodes * (1 - f))
        fit = [c.nodes for c in below if c.nodes <= max(target, 1)]
        if fit:
            shown.add(fit[0])
    return Plan(req, baseline, [c for c in below if c.nodes in shown], recommended, reason)


def _no_fit(req: Request, valid: list[Candidate]) -> Plan:
    """No valid node count fits without offloading: answer with the offload options, from the
    fewest nodes up to the first that runs as fast as without offloading (more nodes would
    only add rows), or refuse when none keeps hot data on the GPU within host DRAM."""
    hint = pp_hint(req)
    if not any(choice.servable(c) for c in valid):
        raise UsageError(choice.unservable(req, valid, hint))
    shown = []
    for c in valid:
        shown.append(c)
        if c.efficiency >= choice.AS_FAST and choice.servable(c):
            break
    options = sorted(shown, key=lambda c: -c.nodes)
    recommended, reason = choice.recommend(req, None, options)
    return Plan(req, None, options, recommended, reason, choice.no_fit(req, valid, _free_minimum(req), hint))


def _free_minimum(req: Request) -> Candidate | None:
    """The no-offload minimum without the global batch and node limit: what stands in the way."""
    free = replace(req, global_batch=None, max_nodes=MAX_NODES)
    for n in range(1, MAX_NODES + 1):
        lay = layout_for(free, n)
        if invalid(free, lay) is None:
            c = evaluate(free, n, lay)
            if c.est.total <= req.gpu.memory:
                return c
    return None


def other_layout(p):
    """(preset, candidate) of another parallelism preset whose fewest good nodes beat this
    plan's recommendation, or None. Better means: it keeps --min-efficiency where this
    recommendation does not, or it does so on fewer nodes. Each preset is searched with
    its default degrees (no --tp/--pp/--ep) from 1 node up, stopping at the first node
    count that fits without offloading or is served at the floor: that is the count its
    own plan would recommend (without --scale-in)."""
    req, cur = p.req, p.recommended
    ok_here = choice.meets_floor(req, cur, p.needs_offload(cur.nodes))
    limit = cur.nodes - 1 if ok_here else req.max_nodes  # only fewer nodes can beat a good answer
    best = None
    for preset in PRESETS:
        if preset == req.parallel or (preset == "fsdp+ep" and not req.card.moe):
            continue
        alt = replace(req, parallel=preset, tp=None, pp=None, ep=None)
        for n in range(1, (best[1].nodes - 1 if best else limit) + 1):
            try:
                lay = layout_for(alt, n)
                if invalid(alt, lay):
                    continue
                c = evaluate(alt, n, lay)
            except UsageError:
                break  # this preset cannot lay the model out at all
            if choice.meets_floor(req, c, c.est.total > req.gpu.memory):
                best = (preset, c)
                break
    return best


def pp_hint(req: Request) -> tuple[int, int] | None:
    """(nodes, local batch): the fewest nodes that would fit without offloading if the local
    batch were raised to the pipeline degree that layout needs (tp+pp needs one microbatch
    per stage at least), or None when a larger local batch would not help."""
    if req.parallel != "tp+pp" and not req.pp:
        return None
    for n in range(1, req.max_nodes + 1):
        lay = layout_for(req, n)
        if lay is None or lay.pp <= req.local_batch:
            continue
        lay = replace(lay, local_batch=lay.pp)
        wider = replace(req, local_batch=lay.pp)
        if invalid(wider, lay) is None and estimate(req.card, lay).total <= req.gpu.memory:
            return n, lay.pp
    return None
