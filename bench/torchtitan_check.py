"""A real application, unchanged: TorchTitan (PyPI 0.3.0) trains its llama3 debug model with
and without the shim, and the losses must match.

1. reference: `torchrun -m torchtitan.train --module llama3 --config llama3_debugmodel`,
   deterministic (--debug.deterministic, seed 0), local assets (bench/torchtitan_assets.py:
   no downloads), TensorBoard on, so that losses are read back exactly (float32 scalars,
   not the console's rounded ones);
2. the same command under `transit-launch run --policy advise --gpu-budget B`, B = a
   fraction (default half) of the reference's peak reserved memory;
3. compare: relative loss difference per step (target <= 1e-6), the shim's stats;
4. TorchTitan's own FSDP2 CPU offload (--training.enable-cpu-offload) for its TFLOPS (the
   debug model is tiny: a correctness check first, its speeds are not the gate's).

    python3 bench/torchtitan_check.py --out bench/results/torchtitan.json   # on a GPU
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, env, transit


def read_scalars(tb_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out = {}
    for d in sorted({os.path.dirname(f) for f in glob.glob(f"{tb_dir}/**/events.out.tfevents.*", recursive=True)}):
        acc = EventAccumulator(d)
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            out.setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    return out


def titan(a, assets, dump, policy=None, budget=None, stats=None, extra=()):
    cmd = ["torchrun", "--standalone", "--nproc-per-node", "1", "-m", "torchtitan.train", "--module", "llama3",
           "--config", "llama3_debugmodel", "--hf-assets-path", f"{assets}/tokenizer", "--dataloader.dataset",
           "c4_test", "--dataloader.dataset-path", f"{assets}/c4_synthetic", "--training.steps", str(a.steps),
           "--checkpoint.no-enable", "--validator.no-enable", "--debug.seed", "0", "--debug.deterministic",
           "--metrics.log-freq", "1", "--metrics.enable-tensorboard", "--metrics.disable-color-printing",
           "--dump-folder", dump, *extra]
    if policy:
        cmd = transit(policy, cmd, stats, budget)
    res = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=a.timeout, cwd=ROOT)
    scalars = read_scalars(dump)
    loss_tag = next((t for t in scalars if "loss" in t and "avg" in t), next((t for t in scalars if "loss" in t), None))
    mem_tag = next((t for t in scalars if "max_reserved(GiB)" in t), None)
    tflops = [v for k, v in sorted(scalars.get("tflops", {}).items()) if k > 2]  # after warm-up
    return {"rc": res.returncode, "losses": [scalars[loss_tag][k] for k in sorted(scalars[loss_tag])] if loss_tag else [],
            "tflops_median": sorted(tflops)[len(tflops) // 2] if tflops else None,
            "loss_tag": loss_tag, "max_reserved_gib": max(scalars[mem_tag].values()) if mem_tag else None,
            "summary_tail": res.stdout[-1500:], "stderr_tail": res.stderr[-3000:] if res.returncode else ""}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--budget-fraction", type=float, default=0.5)
    ap.add_argument("--timeout", type=int, default=400)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "torchtitan.json"))
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="titan-"))
    subprocess.run([sys.executable, str(ROOT / "bench" / "torchtitan_assets.py"), str(work / "assets")], check=True)
    ref = titan(a, work / "assets", str(work / "ref"))
    result = {"command": " ".join(sys.argv), "reference": ref}
    if ref["rc"] == 0 and ref["max_reserved_gib"]:
        budget = int(ref["max_reserved_gib"] * 2**30 * a.budget_fraction)
        stats = str(work / "stats")
        run = titan(a, work / "assets", str(work / "advise"), "advise", budget, stats)
        from transit_launch import run as runmod
        st = runmod.read_stats(stats)
        n = min(len(ref["losses"]), len(run["losses"]))
        run.update(budget_bytes=budget, shim=runmod.summary(st)["processes"] if st else None,
                   max_rel_loss_diff=max((abs(x - y) / abs(y) for x, y in zip(run["losses"][:n], ref["losses"][:n])),
                                         default=None), compared_steps=n)
        result["advise"] = run
        # TorchTitan's own answer to the same budget: FSDP2 CPU offload (what the paper compares)
        off = titan(a, work / "assets", str(work / "cpu-offload"), extra=("--training.enable-cpu-offload",))
        result["torchtitan-cpu-offload"] = off
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    for k in ("reference", "advise", "torchtitan-cpu-offload"):
        r = result.get(k)
        if r:
            print(k, "rc", r["rc"], "steps", len(r["losses"]), "max_reserved_gib", r["max_reserved_gib"],
                  "tflops", r["tflops_median"], "max_rel_loss_diff", r.get("max_rel_loss_diff"),
                  (r["stderr_tail"] or "")[-800:])
    return 0 if result.get("advise", {}).get("rc") == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
