"""A real application, unchanged: TorchTitan from PyPI trains its llama3 debug model with
and without the shim, and the losses must match.

Which TorchTitan: 0.3.0 imports names that torch 2.11 (the device image) does not have
(torch.distributed.fsdp.DataParallelMeshDims, ..._fsdp_common.ShardPlacementResult), so on
torch 2.11 the run uses 0.2.2, the newest release whose torch imports all resolve there
(bench/fetch_wheels.sh fetches both; the device installs the one its torch can import).
The two releases spell the command line differently; `titan_args` speaks both.

1. reference: `torchrun -m torchtitan.train` on the llama3 debug model, deterministic
   (--debug.deterministic, seed 0), local assets (bench/torchtitan_assets.py: no
   downloads), TensorBoard on, so that losses are read back exactly (float32 scalars, not
   the console's rounded ones);
2. the same command under `transit-launch run --policy advise --gpu-budget B`, B = a
   fraction (default half) of the reference's peak reserved memory;
3. compare: relative loss difference per step (target <= 1e-6), the shim's stats;
4. TorchTitan's own FSDP2 CPU offload (--training.enable-cpu-offload), only with 2+ GPUs:
   on one GPU TorchTitan applies no FSDP (data-parallel shard degree 1), so the flag
   does nothing there.

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

from common import ROOT, env, run, transit, out_option


def read_scalars(tb_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out = {}
    for d in sorted({os.path.dirname(f) for f in glob.glob(f"{tb_dir}/**/events.out.tfevents.*", recursive=True)}):
        acc = EventAccumulator(d)
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            out.setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    return out


def titan_version():
    from importlib.metadata import version
    return tuple(int(x) for x in version("torchtitan").split(".")[:2])


def titan_args(ver, assets, dump, steps):
    """The debug-model training command of TorchTitan `ver` (major, minor)."""
    common = ["--training.steps", str(steps), "--checkpoint.no-enable", "--debug.seed", "0",
              "--debug.deterministic", "--metrics.log-freq", "1", "--metrics.enable-tensorboard",
              "--metrics.disable-color-printing"]
    if ver >= (0, 3):  # config registry, dataloader section, top-level dump folder
        return ["--module", "llama3", "--config", "llama3_debugmodel", "--hf-assets-path", f"{assets}/tokenizer",
                "--dataloader.dataset", "c4_test", "--dataloader.dataset-path", f"{assets}/c4_synthetic",
                "--validator.no-enable", "--dump-folder", dump, *common]
    return ["--model.name", "llama3", "--model.flavor", "debugmodel", "--model.hf-assets-path", f"{assets}/tokenizer",
            "--training.dataset", "c4_test", "--training.dataset-path", f"{assets}/c4_synthetic",
            "--validation.no-enable", "--job.dump-folder", dump, *common]


def titan(a, assets, dump, policy=None, budget=None, stats=None, extra=()):
    cmd = ["torchrun", "--standalone", "--nproc-per-node", str(a.gpus), "-m", "torchtitan.train",
           *titan_args(titan_version(), assets, dump, a.steps), *extra]
    if policy:
        cmd = transit(policy, cmd, stats, budget)
    out, err, rc = run(cmd, env(), a.timeout)  # a timeout kills torchrun's workers too
    scalars = read_scalars(dump)
    loss_tag = next((t for t in scalars if "loss" in t and "avg" in t), next((t for t in scalars if "loss" in t), None))
    mem_tag = next((t for t in scalars if "max_reserved(GiB)" in t), None)
    tflops = [v for k, v in sorted(scalars.get("tflops", {}).items()) if k > 2]  # after warm-up
    return {"rc": rc, "losses": [scalars[loss_tag][k] for k in sorted(scalars[loss_tag])] if loss_tag else [],
            "tflops_median": sorted(tflops)[len(tflops) // 2] if tflops else None,
            "loss_tag": loss_tag, "max_reserved_gib": max(scalars[mem_tag].values()) if mem_tag else None,
            "summary_tail": out[-1500:], "stderr_tail": err[-3000:] if rc else ""}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--budget-fraction", type=float, default=0.5)
    ap.add_argument("--timeout", type=int, default=400)
    ap.add_argument("--gpus", type=int, default=1, help="torchrun processes (TorchTitan's CPU offload needs 2+)")
    out_option(ap, "torchtitan")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="titan-"))
    subprocess.run([sys.executable, str(ROOT / "bench" / "torchtitan_assets.py"), str(work / "assets")], check=True)
    ref = titan(a, work / "assets", str(work / "ref"))
    from importlib.metadata import version
    import torch
    result = {"command": " ".join(sys.argv), "torchtitan": version("torchtitan"), "torch": torch.__version__,
              "reference": ref}
    if ref["rc"] == 0 and ref["max_reserved_gib"]:
        budget = int(ref["max_reserved_gib"] * 2**30 * a.budget_fraction)
        stats = str(work / "stats")
        run = titan(a, work / "assets", str(work / "advise"), "advise", budget, stats)
        from transit_launch.preload import run as runmod
        st = runmod.read_stats(stats)
        n = min(len(ref["losses"]), len(run["losses"]))
        run.update(budget_bytes=budget, shim=runmod.summary(st)["processes"] if st else None,
                   max_rel_loss_diff=max((abs(x - y) / abs(y) for x, y in zip(run["losses"][:n], ref["losses"][:n])),
                                         default=None), compared_steps=n)
        result["advise"] = run
        # TorchTitan's own answer to the same budget: FSDP2 CPU offload (what the paper compares)
        if a.gpus > 1:
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
