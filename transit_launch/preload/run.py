"""`transit-launch run`: start a command locally with the shim and the adapter injected,
then summarize the stats every CUDA process of it wrote."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from transit_launch.argtypes import check_program
from transit_launch.preload import inject
from transit_launch.preload.options import ShimOptions
from transit_launch.errors import UsageError
from transit_launch.table import table
from transit_launch.units import gb


def launch_env(opts: ShimOptions, stats_dir: str, environ: dict | None = None) -> dict:
    env = dict(os.environ if environ is None else environ)
    # the shim under off too: its pass-through mode, for A/B runs
    return opts.job_env(shim=inject.shim_path(), adapter=inject.adapter_dir(), environ=env,
                        stats=stats_dir).apply(env)


def run(command: list[str], opts: ShimOptions) -> tuple[int, list[dict]]:
    if not command:
        raise UsageError("run needs the command after --, e.g. -- python train.py")
    # what would stop the run is refused before the warnings and the start
    check_program(command)
    stats_dir = opts.stats or tempfile.mkdtemp(prefix="transit-stats-")
    _stats_dir(stats_dir)
    shim = inject.shim_path()
    if opts.policy != "off" and (shim is None or not shim.is_file()):
        print(f"transit-launch: warning: libtransit.so is not available ({inject.shim_missing_reason()}); "
              "running without it", file=sys.stderr)
    env = launch_env(opts, stats_dir)
    try:
        proc = subprocess.Popen(command, env=env)
    except OSError as e:
        raise UsageError(f"cannot start {command[0]!r}: {e.strerror}") from None
    # Ctrl-C and Slurm's SIGTERM reach the job; we wait for it to end and still report.
    forward = lambda sig, _frame: proc.send_signal(sig)  # noqa: E731
    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return rc, read_stats(stats_dir)


def _stats_dir(path: str) -> None:
    """Create the stats directory before the command starts: a job of hours must not end
    without its stats because the shim could not write them."""
    if os.path.exists(path) and not os.path.isdir(path):  # Path's raise where the user cannot search
        raise UsageError(f"--stats {path} is a file; run writes one stats file per process into a directory")
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--stats {path}: cannot create the directory ({e.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"--stats {path}: the directory is not writable")


def read_stats(stats_dir: str) -> list[dict]:
    out = []
    for p in sorted(Path(stats_dir).glob("*.json")):
        try:
            out.append(json.loads(p.read_text()) | {"file": str(p)})
        except (OSError, json.JSONDecodeError):
            continue
    return out


def measured_within(s: dict) -> bool:
    """Device memory in use after warm-up (cudaMemGetInfo, whole process) stayed within the
    budget plus the reserve the guard keeps for what does not go through cudaMalloc
    (context, cuBLAS, NCCL: about 0.85 GB measured on the H200). Informational: it also
    counts the chunks the UVM driver keeps after it evicted pages to the host, which are not
    the process's to keep (UVM_CACHE_NOTE)."""
    reserve = s["free_at_start_bytes"] - s["guard_limit_bytes"]
    return s["gpu_resident_peak_steady_bytes"] <= s["budget_bytes"] + reserve


UVM_CACHE_NOTE = ("in use (cudaMemGetInfo) also counts chunks the UVM driver keeps after evicting pages to the "
                  "host and gives back under pressure; on an H200 another process took all but the budget + 2.9 GB "
                  "with plain cudaMalloc while such a job ran (bench/RESULTS.md, \"What a second process can allocate\")")


def budget_held(s: dict) -> bool:
    """The budget as the issue defines it: the managed bytes the shim let reside on the GPU,
    by its own placement, with the adapter's plain device buffers (the streamed step's ring),
    never exceeded it. Physically checked by bench/probes/uvm_residency_probe.py (in git at be13156)."""
    return s["device_placed_peak_bytes"] <= s["budget_bytes"]


def warm_up(s: dict) -> dict | None:
    """The first two steps against steady ones, from the shim's clocks: the first from its
    optimizer's creation (the adapter's attach) to its end, the second, and the median of
    the rest; None without the first step's clock or with fewer than four steps."""
    it, first = s.get("iteration_ms") or [], s.get("first_iteration_ms") or 0
    if not first or len(it) < 3:
        return None
    steady = statistics.median(it[1:])
    extra = first + it[0] - 2 * steady
    return {"first_s": round(first / 1e3, 2), "second_s": round(it[0] / 1e3, 2), "steady_s": round(steady / 1e3, 3),
            "extra_s": round(extra / 1e3, 2), "steady_steps": round(extra / steady, 1) if steady > 0 else None}


def summary(stats: list[dict]) -> dict:
    procs = []
    for s in stats:
        it = s.get("iteration_ms") or []
        steady = it[2:] if len(it) > 4 else it
        procs.append({
            "pid": s["pid"], "policy": s["policy"], "passthrough": s["passthrough"],
            "budget_gb": gb(s["budget_bytes"]), "managed_peak_gb": gb(s["managed_peak_bytes"]),
            "device_placed_peak_gb": gb(s["device_placed_peak_bytes"]),  # the device buffers included
            "device_buffer_gb": gb(s.get("device_buffer_bytes", 0)),  # plain memory for the adapter, at exit
            "host_placed_peak_gb": gb(s["host_placed_peak_bytes"]),  # managed memory placed on the host
            "zero_copy_peak_gb": gb(s["zero_copy_mapped_peak_bytes"]),
            # optimizer state made in pinned host memory (advise; read zero-copy, never migrated)
            "host_state_peak_gb": gb(s.get("host_state_peak_bytes", 0)),
            # ... and the state marked for it that the budget held on the GPU (stepped in place)
            "host_state_kept_gb": gb(s.get("host_state_kept_bytes", 0)),
            "host_state_pin_s": s.get("host_state_pin_s", 0.0),  # the wall time of making it (part of the first step)
            # ... of which taken from the pool of its predicted segments (shim/prefill.c), and of
            # that made ready (written and registered) in the background before the first step
            "host_state_prefill_used_gb": gb(s.get("host_state_prefill_used_bytes", 0)),
            "host_state_prefill_ready_gb": gb(s.get("host_state_prefill_ready_bytes", 0)),
            # ... and what the pool made ready that no state took (given back after the first step)
            "host_state_prefill_unused_gb": gb(s.get("host_state_prefill_unused_bytes", 0)),
            "optimizer_hint_gb": gb(s["cold_hint_bytes"]["optimizer"]),
            "gpu_in_use_steady_gb": gb(s["gpu_resident_peak_steady_bytes"]),
            "prefetch_gb": gb(s["prefetch_bytes"]), "htod_gb": gb(s["htod_bytes"]),
            "iterations": s["iterations"], "iteration_source": s["iteration_source"],
            "median_iteration_ms": round(statistics.median(steady), 2) if steady else None,
            "budget_held": budget_held(s), "measured_within": measured_within(s), "file": s.get("file"),
            # allocations the runtime refused as managed memory, served as plain device memory
            "managed_fallbacks": s.get("managed_fallbacks", 0),
            "warm_up": warm_up(s),
        })
    return {"processes": procs}


def summary_text(summ: dict) -> str:
    if not summ["processes"]:
        return ("transit-launch: no CUDA process of the command wrote shim stats (the shim writes them in "
                "processes that call the CUDA runtime: none did, e.g. PyTorch on a machine without a GPU)")
    rows = [[p["pid"], p["policy"] + (" (pass-through)" if p["passthrough"] else ""), p["budget_gb"],
             p["managed_peak_gb"], p["device_placed_peak_gb"], round(p["host_placed_peak_gb"] + p["host_state_peak_gb"], 2),
             round(p["zero_copy_peak_gb"] + p["host_state_peak_gb"], 2),
             p["gpu_in_use_steady_gb"], p["prefetch_gb"], p["iterations"], p["median_iteration_ms"],
             "yes" if p["budget_held"] else "NO", "yes" if p["measured_within"] else "no (*)"]
            for p in summ["processes"]]
    text = table(["pid", "policy", "budget GB", "managed GB", "on GPU GB", "on host GB", "zero-copy GB",
                  "in use GB", "prefetch GB", "iters", "ms/iter", "budget held", "in use within"], rows,
                 "llrrrrrrrrrll")
    if any(not p["measured_within"] for p in summ["processes"]):
        text += "\n(*) " + UVM_CACHE_NOTE
    for p in summ["processes"]:
        if w := p.get("warm_up"):
            text += (f"\npid {p['pid']}: first step {w['first_s']} s (from its optimizer's creation), second "
                     f"{w['second_s']} s, steady {w['steady_s']} s: {w['extra_s']} s beyond two steady steps "
                     f"({w['steady_steps']} steady steps; a job's first step is slower without the shim too)")
        if p["host_state_peak_gb"] or p["host_state_kept_gb"]:
            early = (f" ({p['host_state_prefill_ready_gb']} GB of it made ready before the first step)"
                     if p["host_state_prefill_ready_gb"] else "")
            text += (f"\npid {p['pid']}: {p['host_state_peak_gb']} GB of optimizer state made in pinned host memory "
                     f"in {p['host_state_pin_s']:.2f} s{early} (in the on-host and zero-copy columns; it did not fit "
                     f"the budget when it was made) and {p['host_state_kept_gb']} GB more of it kept on the GPU by the "
                     "budget (stepped in place)")
            if p["host_state_prefill_unused_gb"]:
                text += (f"\npid {p['pid']}: {p['host_state_prefill_unused_gb']} GB of pinned memory made ready for "
                         "predicted state that no allocation took, given back after the first step")
        if p["managed_fallbacks"]:
            text += (f"\npid {p['pid']}: {p['managed_fallbacks']} allocation(s) could not be managed memory and "
                     "stayed plain device memory (not placed by the policy)")
    return text
