"""Scale-in on one host (issue 8): the example trainer under FSDP2 and torchrun on N GPUs
without offloading, and on N/2 GPUs under transit's advise policy, each GPU emulating a
smaller one (TRANSIT_GPU_BUDGET = --emulated-gpu), with the same global batch (the N/2
layout accumulates twice the microbatches).

Reports per layout: per-GPU TFLOPS (model FLOPs, rank 0), the peak reserved memory and
whether the N-GPU layout fits the emulated GPU without offloading, the bytes each GPU
offloaded (shim stats, every rank), and the collective bytes each GPU sent in one step,
measured (torch.profiler's record_param_comms events: ring traffic (d-1)/d x buffer) and
predicted by the planner (transit_launch.traffic).

    python3 bench/scale_in.py --gpus 2   # a scratch file; `python3 -m bench scale-in` files it in bench/results/

--emulated-gpu auto (the default) sizes the smaller GPU from the planner so that the N-GPU
layout fits it without offloading and the N/2 layout does not: the N layout's estimate
plus the larger of 10% (the planner's calibrated error) and a quarter of the gap to the
N/2 layout. `--device cpu` runs the same plumbing on CPU ranks (gloo; the shim passes
through without a GPU): a smoke test of the harness, not a measurement.
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

from common import ROOT, env, run, trainer_layout, trainer_records, transit, out_option
from transit_launch import units


def spec(a) -> str:
    return f"{a.model} --seq-len {a.seq_len} --batch {a.batch}"


def planner_peak(a, dp) -> float:
    """The planner's per-GPU estimate (bytes) of the trainer under FSDP over dp GPUs."""
    from transit_launch.planning import memory
    return memory.estimate(*trainer_layout(spec(a), dp)).total


def auto_emulated_gpu(a) -> int:
    """A GPU size the N layout fits and the N/2 layout does not (see the module doc)."""
    full, half = planner_peak(a, a.gpus), planner_peak(a, a.gpus // 2)
    size = full + max(0.10 * full, 0.25 * (half - full))
    if size >= half:
        raise ValueError(f"the planner puts {a.gpus} and {a.gpus // 2} GPUs too close ({full / 1e9:.1f} and "
                         f"{half / 1e9:.1f} GB a GPU) for an emulated GPU between them: pass --emulated-gpu")
    return int(size // 2**28 + 1) * 2**28  # up to 256 MiB


def predicted_sent_bytes(a, dp, accum):
    """Planner: bytes one GPU sends per step (its per-node tx+rx over 2 x GPUs, x microsteps)."""
    from transit_launch.planning import traffic
    t = traffic.per_node(*trainer_layout(spec(a), dp), gpus_per_node=dp)
    return (t.intra + t.inter) / 2 / dp * accum


def measured_sent_bytes(comm, dp):
    """Ring collectives: each rank sends (d-1)/d of the full buffer (all-gather output,
    reduce-scatter input), an all-reduce twice that."""
    total = 0.0
    for name, c in (comm or {}).items():
        factor = 2 if "allreduce" in name else 1
        total += factor * (dp - 1) / dp * c["buffer_bytes"]
    return total


def run_layout(a, ngpus, accum, policy, budget):
    stats = tempfile.mkdtemp(prefix="scale-in-")
    trainer = ["torchrun", "--standalone", "--nproc-per-node", str(ngpus), str(ROOT / "examples" / "train_llama.py"),
               *a.model.split(), "--seq-len", str(a.seq_len), "--batch", str(a.batch), "--accum", str(accum),
               "--steps", str(a.steps), "--comm-profile", str(a.warmup + 1), "--device", a.device]
    cmd = transit(policy, trainer, stats, budget if policy != "off" else None)
    out, err, rc = run(cmd, env(CUDA_VISIBLE_DEVICES=",".join(str(i) for i in range(ngpus))), a.timeout)
    _, summ = trainer_records(out)
    summ = summ or {}
    from transit_launch.preload import run as runmod
    st = runmod.read_stats(stats)
    procs = runmod.summary(st)["processes"] if st else []
    r = {"gpus": ngpus, "policy": policy, "budget_bytes": budget, "accum": accum, "rc": rc,
         "tflops_per_gpu": summ.get("tflops_per_gpu"), "median_step_s": summ.get("median_step_time"),
         "max_reserved_gb": summ.get("max_reserved_gb"), "losses": summ.get("losses"),
         "offloaded_gb_per_gpu": [p["host_placed_peak_gb"] for p in procs],
         "budget_held": all(p["budget_held"] for p in procs) if procs else None,
         "comm_profile_rank0": summ.get("comm_profile"),
         "sent_gb_per_gpu_measured": measured_sent_bytes(summ.get("comm_profile"), ngpus) / 1e9,
         "sent_gb_per_gpu_planner": predicted_sent_bytes(a, ngpus, accum) / 1e9}
    if rc:
        r["stderr_tail"] = err[-2500:]
        # a rank's own last words (an uncaught C++ exception before SIGABRT, a Python error)
        # come before torchrun's summary, which can fill the tail
        r["stderr_errors"] = [line for line in err.splitlines()
                              if any(k in line for k in ("terminate called", "what():", "Error", "error:", "Assertion"))][:20]
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=2, help="N: the full layout's GPUs (N/2 for the scaled-in one)")
    ap.add_argument("--emulated-gpu", default="auto",
                    help="the smaller GPU each H200 plays (TRANSIT_GPU_BUDGET), or auto (from the planner)")
    ap.add_argument("--model", default="", help="trainer model flags (default: its 1.0 B-parameter model)")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--accum", type=int, default=1, help="microbatches per step in the full layout")
    ap.add_argument("--steps", type=int, default=13)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a smoke test of the plumbing")
    ap.add_argument("--print-budget", action="store_true", help="print the emulated GPU's bytes and stop")
    out_option(ap, "scale_in")
    a = ap.parse_args()
    if a.gpus < 2 or a.gpus % 2:
        print("scale_in: --gpus must be even and at least 2", file=sys.stderr)
        return 2
    try:
        budget = auto_emulated_gpu(a) if a.emulated_gpu == "auto" else units.parse_size(a.emulated_gpu)
    except ValueError as e:
        print(f"scale_in: {e}", file=sys.stderr)
        return 2
    if a.print_budget:
        print(budget)
        return 0
    full = run_layout(a, a.gpus, a.accum, "off", budget)
    full["fits_emulated_gpu"] = bool(full["max_reserved_gb"]) and full["max_reserved_gb"] * 1e9 <= budget
    half = run_layout(a, a.gpus // 2, 2 * a.accum, "advise", budget)
    if full.get("tflops_per_gpu") and half.get("tflops_per_gpu"):
        half["pct_of_full_per_gpu"] = 100 * half["tflops_per_gpu"] / full["tflops_per_gpu"]
    result = {"command": " ".join(sys.argv), "device": a.device, "emulated_gpu_bytes": budget,
              "planner_peak_bytes": {"full": planner_peak(a, a.gpus), "scaled_in": planner_peak(a, a.gpus // 2)},
              "full": full, "scaled_in": half}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(f"{'layout':<22} {'rc':>3} {'TFLOPS/GPU':>10} {'reserved GB':>11} {'offloaded GB/GPU':>17} "
          f"{'sent GB/GPU/step (measured, planner)':>36}")
    for name, r in (("full", full), ("scaled-in (advise)", half)):
        off = ",".join(f"{x:.1f}" for x in r["offloaded_gb_per_gpu"]) or "-"
        print(f"{name + ' ' + str(r['gpus']) + ' GPUs':<22} {r['rc']:>3} {r['tflops_per_gpu'] or 0:>10.1f} "
              f"{r['max_reserved_gb'] or 0:>11.2f} {off:>17} "
              f"{r['sent_gb_per_gpu_measured']:>17.2f}, {r['sent_gb_per_gpu_planner']:.2f}")
        if r["rc"]:
            print("\n".join(r.get("stderr_errors", [])), r.get("stderr_tail", "")[-600:], sep="\n", file=sys.stderr)
    if "pct_of_full_per_gpu" in half:
        print(f"scaled-in per-GPU TFLOPS: {half['pct_of_full_per_gpu']:.1f}% of the full layout's "
              f"(the paper keeps > 90% at half the GPUs); full layout fits the emulated GPU: {full['fits_emulated_gpu']}")
    return 0 if full["rc"] == 0 and half["rc"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
