"""Planner calibration: `transit-launch plan`'s per-GPU memory estimate against the measured
torch.cuda.max_memory_reserved of the example trainer, over model sizes, sequence lengths
and recompute on/off.

The planner's per-GPU total also counts the CUDA context and NCCL buffers, which PyTorch's
caching allocator does not reserve; the comparison is between the allocator's part of the
estimate (total - CUDA_CONTEXT_BYTES - NCCL) and max_memory_reserved. Target: within 10%.

    python3 bench/calibrate.py --measure --out bench/results/calibration.json   # on a GPU
    python3 bench/calibrate.py --compare bench/results/calibration.json          # anywhere
"""

import argparse
import json
import subprocess
from pathlib import Path

from common import TRAINER, env, planner_estimate, trainer_records, out_option

# name: trainer flags (model, sequence, microbatch, recompute)
CONFIGS = {
    "1.0B s4096 b8 recompute": "--seq-len 4096 --batch 8",
    "1.0B s8192 b2 recompute": "--seq-len 8192 --batch 2",
    "1.0B s2048 b2 no-recompute": "--seq-len 2048 --batch 2 --no-recompute",
    "0.2B s2048 b4 recompute": "--dim 1024 --layers 16 --ffn 2816 --vocab 8192 --seq-len 2048 --batch 4",
    "0.5B s8192 b1 no-recompute": "--dim 1536 --layers 12 --heads 12 --kv-heads 4 --ffn 4096 --seq-len 8192 "
                                  "--batch 1 --no-recompute",
    "0.2B vocab128K s4096 b4 recompute": "--dim 512 --layers 8 --heads 8 --kv-heads 4 --ffn 1536 --vocab 128256 "
                                         "--seq-len 4096 --batch 4",
}


predict = planner_estimate  # (estimate, its allocator part) of a trainer flag string


def measure(out):
    runs = []
    for name, spec in CONFIGS.items():
        res = subprocess.run([*TRAINER, "--steps", "4", *spec.split()], capture_output=True, text=True, env=env(),
                             timeout=300)
        _, summ = trainer_records(res.stdout)
        runs.append({"name": name, "flags": spec, "rc": res.returncode, "summary": summ,
                     "stderr_tail": res.stderr[-1500:] if res.returncode else ""})
        print(name, res.returncode, summ and summ["max_reserved_gb"], flush=True)
        Path(out).write_text(json.dumps({"runs": runs}, indent=1))


def compare(path):
    from transit_launch.table import table
    rows, worst = [], 0.0
    for r in json.loads(Path(path).read_text())["runs"]:
        if not r["summary"]:
            rows.append([r["name"], "failed", "", "", "", ""])
            continue
        est, torch_part = predict(r["flags"])
        meas = r["summary"]["max_reserved_gb"] * 1e9
        err = (torch_part - meas) / meas
        worst = max(worst, abs(err))
        rows.append([r["name"], f"{r['summary']['params'] / 1e9:.2f}", est.peak_phase, f"{meas / 1e9:.2f}",
                     f"{torch_part / 1e9:.2f}", f"{100 * err:+.1f}%"])
    print(table(["run", "params (B)", "planner peak phase", "measured reserved GB", "planner GB (allocator part)",
                 "error"], rows))
    print(f"worst |error|: {100 * worst:.1f}% (target <= 10%)")
    return worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", action="store_true")
    out_option(ap, "calibration")
    ap.add_argument("--compare", default="")
    a = ap.parse_args()
    if a.measure:
        measure(a.out)
    if a.compare:
        compare(a.compare)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
