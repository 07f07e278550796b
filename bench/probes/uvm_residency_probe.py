"""Does the GPU budget hold physically? (an open question from 2026-11-29, bench/RESULTS.md)

The shim keeps *placed* managed bytes under TRANSIT_GPU_BUDGET, but cudaMemGetInfo in
the training process showed more device memory in use than placed, by about the
host-placed bytes the GPU had touched first. Hypothesis: the UVM driver keeps the
chunks of pages it evicted and RM can reclaim them. Probe: while the trainer runs under
advise at half its peak, a second process without the shim asks for the rest of the
card with plain cudaMalloc (never managed memory: no oversubscription):
  rest = free memory before the trainer started - budget - 3 GB (context, NCCL, cuBLAS).
If that succeeds while the trainer keeps stepping, the budget held physically.

    python3 bench/probes/uvm_residency_probe.py [--out bench/results/uvm_probe.json]
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: common.py
from common import ROOT, TRAINER, env, trainer_records, transit

ap = argparse.ArgumentParser()
ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "uvm_probe.json"))
ap.add_argument("--margin-gb", type=float, default=3.0)
a = ap.parse_args()
ENV = env()
FREE = "import torch; f, t = torch.cuda.mem_get_info(); print(f, t)"

free0, total = map(int, subprocess.run([sys.executable, "-c", FREE], capture_output=True, text=True, env=ENV,
                                       check=True).stdout.split())
ref = subprocess.run(TRAINER + ["--steps", "6"], capture_output=True, text=True, env=ENV, check=True).stdout
peak = trainer_records(ref)[1]["max_reserved_gb"] * 1e9
budget = int(peak / 2)
proc = subprocess.Popen(transit("advise", [*TRAINER, "--steps", "400"], budget=budget), stdout=subprocess.PIPE,
                        text=True, env=ENV, cwd=ROOT)


def next_steps(n):
    """The trainer's next n step records (fewer if it ends)."""
    out = []
    while len(out) < n:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith('{"step"'):
            out.append(json.loads(line))
    return out


steps = next_steps(12)
rest = int(free0 - budget - a.margin_gb * 1e9)
probe = (f"import torch, time; x = torch.empty({rest}, dtype=torch.uint8, device='cuda'); x.fill_(1); "
         "torch.cuda.synchronize(); time.sleep(5); print('ok', torch.cuda.mem_get_info()[0])")
res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=ENV)
after = next_steps(8)
proc.terminate()
proc.wait(60)
result = {
    "free_before_gb": free0 / 1e9, "total_gb": total / 1e9, "trainer_peak_gb": peak / 1e9, "budget_gb": budget / 1e9,
    "probe_alloc_gb": rest / 1e9, "probe_ok": res.returncode == 0 and res.stdout.startswith("ok"),
    "probe_error": res.stderr.strip().splitlines()[-1] if res.returncode else None,
    "trainer_step_s_before": [s["step_time"] for s in steps[-4:]],
    "trainer_step_s_during_after": [s["step_time"] for s in after],
}
Path(a.out).parent.mkdir(parents=True, exist_ok=True)
Path(a.out).write_text(json.dumps(result, indent=1))
print(json.dumps(result, indent=1))
