"""The plan's first-order model of a step under the shim: compute at an assumed share of
the GPU's peak, and the host link's part of what is offloaded (the optimizer state read and
written once a step, master weights, spilled hot data), as per-GPU TFLOPS against running
without offloading; the bytes the streamed step leaves on the host; the warm-up. The search
over node counts is plan.py's; this is what it costs each candidate with."""

from __future__ import annotations

from transit_launch.rules import (DEFAULT_OVERLAP, RING_OVERLAP_MODES, SHIM_RESERVED_GAP_PERCENT, STAGE_RING_BYTES,
                                  STATE_ROOM_SPARE_PERCENT)

# Each constant below is measured or fitted as bench/RESULTS.md, "What the plan predicts",
# records; tests/prediction_records.py names the runs each was fitted to, and tests/test_prediction.py
# checks every recorded run against the plan.
# The step's compute time: its FLOPs in TorchTitan's count (ModelCard.titan_flops_per_token:
# recomputation not counted) at this share of the GPU's dense bf16 peak: the paper's
# no-offload Llama3-70B baseline, not fitted to our runs.
ASSUMED_MFU = 0.42
# advise serves offloaded optimizer state zero-copy: the optimizer step reads and writes it
# once over the full-duplex host link, at this share of host_link in state bytes a second.
STATE_LINK_SHARE = 0.84
# advise's default step streams the pinned state through the copy engines (transit_streamed.py):
# in and out at once at this share of host_link in state bytes a second.
STREAM_LINK_SHARE = 1.0
# --overlap host: the CPU updates a share of the offloaded state in host memory (torch's fused
# CPU optimizer) while the streamed step moves the rest, the two side by side and balanced by
# the adapter's split (transit_split.SplitShare), so the state is served at the link's rate plus
# the CPU's. The CPU's: state bytes a second per host core the job's ranks share, as one
# TorchTitan run measured it against the streamed step of the same lease (its link's own rate
# taken out; prediction_records.HOST_FIT), not the fused kernel alone (the copies, the data
# loader and the application's threads beside it).
HOST_STEP_RATE_PER_CORE = 0.73e9
# Under the shim PyTorch's cache never runs short (what does not fit the GPU is placed on the
# host, not refused), so it keeps the blocks a real GPU's allocator would free and retry
# with, and the budget bounds reserved bytes: TorchTitan's reserved peak over the estimate.
SHIM_RESERVED_GAP = SHIM_RESERVED_GAP_PERCENT / 100
# The first step makes the optimizer state, what does not fit in host memory: bytes a second,
# for the warm-up the plan states (within a factor of 2). In place (plain advise) through the
# GPU's first writes to managed memory; streamed (the default) pinned by the shim on huge
# pages whose pages it writes in the background during the first forward and backward
# (shim/prefill.c), then read zero-copy by the first step. tests/prediction_records.py FIT
# says which run each was set from; one rank on the host: ranks pinning at once share its
# memory bandwidth, not measured.
WARMUP_STATE_RATE = 2.0e9
WARMUP_PINNED_RATE = 17.2e9
# Under host the first step also adopts the CPU's share: its state made and each parameter's
# host copy taken (transit_host's adopt), at this rate in state bytes (prediction_records.HOST_FIT).
WARMUP_HOST_RATE = 3.0e9


def streamed_offload(req, est) -> float:
    """What the streamed step leaves on the host, by the shim's rule for marked state
    (shim/hoststate.c): the state stays on the GPU only where the budget, less the ring and
    STATE_ROOM_SPARE_PERCENT of it, has room beside everything else; the rest is pinned. What
    else does not fit beside the ring goes to the host as under advise."""
    other = est.total * (1 + SHIM_RESERVED_GAP) - est.optimizer
    room = req.gpu.memory * (1 - STATE_ROOM_SPARE_PERCENT / 100) - STAGE_RING_BYTES - other
    kept = min(est.optimizer, max(0.0, room))
    return est.optimizer - kept + max(0.0, other - (req.gpu.memory - STAGE_RING_BYTES))


def step_mode(req) -> str:
    """The optimizer step's mode the job runs with: --overlap, else advise's default."""
    return req.overlap if req.overlap is not None else DEFAULT_OVERLAP["advise"]


def _cpu_rate(req) -> float:
    """Bytes of optimizer state a second the CPU updates for one GPU under host (0 otherwise):
    its rank's share of the node's cores."""
    return HOST_STEP_RATE_PER_CORE * req.host_cores / req.gpus_per_node if step_mode(req) == "host" else 0.0


def state_rate(req) -> float:
    """Bytes of optimizer state a second the step serves from the host, per GPU: the link's
    (streamed, also host's streamed share, or in place), plus the CPU's under host."""
    share = STREAM_LINK_SHARE if step_mode(req) in RING_OVERLAP_MODES else STATE_LINK_SHARE
    return share * req.gpu.host_link + _cpu_rate(req)


def host_share(req) -> float:
    """The share of the offloaded state whose update runs on the CPU under host (0 otherwise):
    the CPU's part of state_rate, as the split balances it."""
    return _cpu_rate(req) / state_rate(req)


def host_terms(req, c) -> dict:
    """The step's parts in seconds: compute, and the host link's share of what is offloaded.
    advise keeps on the GPU hot data first, then the fp32 master weights, then optimizer
    state, so what leaves is optimizer state first (read and written once a step, at
    STREAM_LINK_SHARE of the link when the step streams it, the default, else at
    STATE_LINK_SHARE), then master weights (also read by FSDP's two gathers of
    every microstep: an assumption, not measured), then hot data, which migrates on faults
    both ways in every microstep (an assumption). Network effects are not included (see
    traffic_ratio)."""
    lay = c.layout
    tokens = lay.local_batch * lay.seq_len
    flops = req.card.titan_flops_per_token(lay.seq_len) * tokens / (lay.tp * lay.pp)
    t_compute = c.microsteps * flops / (req.gpu.peak_bf16 * ASSUMED_MFU)
    opt = min(c.offload, c.est.optimizer)
    master = min(c.offload - opt, max(0.0, c.est.cold - c.est.optimizer))
    state_link = STATE_LINK_SHARE * req.gpu.host_link
    return {"compute_s": t_compute, "state_s": opt / state_rate(req) + master / state_link,
            "master_reads_s": c.microsteps * 2 * master / req.gpu.host_link,
            "spill_s": c.microsteps * 2 * c.spill / req.gpu.fault_link,
            "warm_up_s": _warm_up_s(req, opt) + master / WARMUP_STATE_RATE}


def _warm_up_s(req, opt: float) -> float:
    """The first step's seconds to make `opt` bytes of offloaded state, by the step's mode."""
    if step_mode(req) not in RING_OVERLAP_MODES:
        return opt / WARMUP_STATE_RATE
    cpu = host_share(req)
    return (1 - cpu) * opt / WARMUP_PINNED_RATE + cpu * opt / WARMUP_HOST_RATE


def efficiency_of(t: dict) -> float:
    """Per-GPU throughput relative to running without offloading: compute against compute
    plus the host link's part (the terms of host_terms)."""
    return t["compute_s"] / (t["compute_s"] + t["state_s"] + t["master_reads_s"] + t["spill_s"])
