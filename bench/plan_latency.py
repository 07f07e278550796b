"""Wall time of `transit-launch plan --model llama3-70b` as a user runs it (a fresh
process each time, interpreter start-up included). Target: under 2 s.

    python3 bench/plan_latency.py [--runs 20]
"""

import argparse
import shutil
import statistics
import subprocess
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--runs", type=int, default=20)
args = ap.parse_args()
exe = shutil.which("transit-launch")
cmd = [exe] if exe else [sys.executable, "-m", "transit_launch"]
cmd += ["plan", "--model", "llama3-70b"]
times = []
for _ in range(args.runs):
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    times.append(time.perf_counter() - t0)
print(f"transit-launch plan --model llama3-70b: median {statistics.median(times) * 1e3:.0f} ms, "
      f"max {max(times) * 1e3:.0f} ms over {args.runs} runs (target < 2000 ms)")
