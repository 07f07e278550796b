"""Per-GPU TFLOPS of the example trainer with and without the shim, on one GPU.

1. pass-through overhead without memory pressure: no shim vs TRANSIT_POLICY=off (and
   base without a budget: every cudaMalloc managed), interleaved to expose drift;
2. base / prefetch / advise under a GPU budget that forces the optimizer states off the
   GPU: budget = the reference's torch.cuda.max_memory_reserved - AdamW state bytes.

Model FLOPs: 6 x non-embedding parameters x tokens per step / median step time (steps
after the third), per GPU. Losses are compared to the reference step by step.

    python3 bench/shim_policies.py   # a scratch file; `python3 -m bench policies` files it in bench/results/
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from common import TRAINER as TRAINER_CMD, env, run, trainer_records, transit, out_option
from transit_launch.preload import run as runmod

ap = argparse.ArgumentParser()
out_option(ap, "shim_policies")
ap.add_argument("--model", default="", help="trainer model flags (default: its 1.0 B-parameter defaults)")
ap.add_argument("--seq-len", type=int, default=4096)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--timeout", type=int, default=240)
ap.add_argument("--only", default="", help="comma-separated subset of run names")
ap.add_argument("--deterministic", action="store_true",
                help="math attention and deterministic kernels: exact loss comparison, much slower")
a = ap.parse_args()

TRAINER = [*TRAINER_CMD, *a.model.split(), "--seq-len", str(a.seq_len), "--batch", str(a.batch),
           *(["--deterministic"] if a.deterministic else [])]
results = {"command": " ".join([sys.argv[0], *sys.argv[1:]]), "trainer": TRAINER[1:], "runs": []}


def go(name, policy=None, budget=None, steps=None, timeout=None):
    if a.only and name not in a.only.split(","):
        return None
    stats_dir = tempfile.mkdtemp(prefix="tr-")
    cmd = TRAINER + ["--steps", str(steps or a.steps)]
    if policy:
        cmd = transit(policy, cmd, stats_dir, budget)
    t0 = time.time()
    out, err, rc = run(cmd, env(), timeout or a.timeout)
    steps_r, summ = trainer_records(out)
    stats = runmod.read_stats(stats_dir)
    r = {"name": name, "policy": policy or "none", "budget_bytes": budget, "rc": rc, "wall_s": round(time.time() - t0, 1),
         "losses": [s["loss"] for s in steps_r], "step_times": [s["step_time"] for s in steps_r]}
    if summ:
        r.update(tflops=summ["tflops_per_gpu"], median_step_time=summ["median_step_time"],
                 spread=summ["step_time_spread"], max_reserved_gb=summ.get("max_reserved_gb"),
                 params=summ["params"], tokens_per_step=summ["tokens_per_step"])
    elif steps_r:  # timed out: report what ran
        ts = sorted(s["step_time"] for s in steps_r[2:] or steps_r)
        r.update(median_step_time=ts[len(ts) // 2], tflops=steps_r[-1]["tflops"])
    if stats:
        r["shim"] = runmod.summary(stats)["processes"][0]
        s = stats[0]
        r["shim_raw"] = {k: s[k] for k in ("htod_bytes", "dtoh_bytes", "page_faults", "prefetch_bytes", "evict_bytes",
                                           "gpu_resident_peak_bytes", "gpu_resident_peak_steady_bytes",
                                           "device_placed_peak_bytes", "host_placed_peak_bytes", "cold_hint_bytes")}
    if rc not in (0,):
        r["stderr_tail"] = err[-1500:]
    results["runs"].append(r)
    print(json.dumps({k: v for k, v in r.items() if k not in ("losses", "step_times", "shim_raw")}), flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=1))
    return r


ref = go("reference")
go("off", "off")
go("reference-2")
go("off-2", "off")
go("base-nobudget", "base")
peak = int(ref["max_reserved_gb"] * 1e9) if ref and ref.get("max_reserved_gb") else None
if peak:
    adam = 8 * ref["params"]
    budget = peak - adam
    results["budget_bytes"] = budget
    results["adam_bytes"] = adam
    go("advise-budget", "advise", budget)
    go("prefetch-budget", "prefetch", budget, steps=8)
    go("base-budget", "base", budget, steps=6, timeout=150)
    go("advise-half-peak", "advise", peak // 2)
base = ref["losses"] if ref else []
for r in results["runs"]:
    n = min(len(base), len(r["losses"]))
    r["max_rel_loss_diff"] = max((abs(x - y) / abs(y) for x, y in zip(r["losses"][:n], base[:n])), default=None)
    r["pct_of_reference"] = round(100 * r["tflops"] / ref["tflops"], 1) if ref and r.get("tflops") else None
Path(a.out).write_text(json.dumps(results, indent=1))
print("name               policy    budget GB  TFLOPS  % ref  med step s  max rel loss diff")
for r in results["runs"]:
    print(f"{r['name']:<18} {r['policy']:<9} {(r['budget_bytes'] or 0) / 1e9:9.1f} {r.get('tflops') or 0:7.1f} "
          f"{r['pct_of_reference'] or 0:6.1f} {r.get('median_step_time') or 0:10.3f}  {r['max_rel_loss_diff']}")
