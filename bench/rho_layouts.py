"""rho for a full layout and its scaled-in one, over real network namespaces (issue 8).

Each layout runs the example trainer with one rank per network namespace, all joined by a
bridge (examples/netns_ranks.sh), so that every collective byte crosses a veth; the
global batch is the same in every layout (sequences per rank = global / ranks). `transit-launch
sweep --cap tc` caps every rank's veth at each bandwidth and computes
rho(B1, B2) = throughput at B1 / throughput at B2. The paper's claim: the scaled-in layout
(fewer ranks, each with host memory as GPU memory) is less sensitive to the network, rho
closer to 1.

    python3 bench/rho_layouts.py --layouts 4,2 --bandwidths 1000mbit,100mbit          # CPU, gloo
    python3 bench/rho_layouts.py --device cuda --layouts 2,1:advise:40GB ...        # GPUs, NCCL sockets

A layout is RANKS[:POLICY[:BUDGET]]; POLICY/BUDGET run each rank under `transit-launch run`.
Needs root (network namespaces, tc).
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from common import out_option  # noqa: E402 (bench/ is the script's folder: on sys.path)
NETNS = ROOT / "examples" / "netns_ranks.sh"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layouts", default="4,2")
    ap.add_argument("--bandwidths", default="1000mbit,100mbit")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--global-batch", type=int, default=8, help="sequences per step over all ranks")
    ap.add_argument("--micro-batch", type=int, default=0,
                    help="sequences per rank per microbatch (the rest as microbatches: --accum), so that every "
                         "layout has the memory profile of one microbatch; 0: the whole share in one microbatch")
    ap.add_argument("--single-rank-repeat", type=int, default=0,
                    help="repeats of a one-rank layout (no inter-rank traffic, so no spread to learn from the "
                         "network); 0: --repeat")
    ap.add_argument("--model", default="--dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 768 --vocab 4096 "
                                       "--seq-len 64", help="trainer flags (default: a CPU-sized model)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=300)
    out_option(ap, "rho_layouts")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("rho_layouts: needs root (network namespaces and tc)", file=sys.stderr)
        return 2
    results = {"command": " ".join(sys.argv), "device": a.device, "bandwidths": a.bandwidths, "layouts": []}
    for spec in a.layouts.split(","):
        ranks, policy, budget = (spec.split(":") + ["", ""])[:3]
        n = int(ranks)
        if a.global_batch % n or (a.micro_batch and (a.global_batch // n) % a.micro_batch):
            print(f"rho_layouts: global batch {a.global_batch} does not divide over {n} ranks"
                  + (f" x {a.micro_batch} sequences" if a.micro_batch else ""), file=sys.stderr)
            return 2
        share = a.global_batch // n
        batch, accum = (a.micro_batch, share // a.micro_batch) if a.micro_batch else (share, 1)
        repeat = a.single_rank_repeat if n == 1 and a.single_rank_repeat else a.repeat
        env = dict(os.environ, DEVICE=a.device, POLICY=policy, BUDGET=budget)
        subprocess.run(["bash", str(NETNS), "teardown", str(n)], env=env, capture_output=True)
        subprocess.run(["bash", str(NETNS), "setup", str(n)], env=env, check=True)
        try:
            ifaces = subprocess.run(["bash", str(NETNS), "ifaces", str(n)], env=env, capture_output=True,
                                    text=True, check=True).stdout.strip()
            cmd = [sys.executable, "-m", "transit_launch", "sweep", "--json", "--cap", "tc", "--iface", ifaces,
                   "--bandwidths", a.bandwidths, "--repeat", str(repeat), "--timeout", str(a.timeout), "--",
                   "bash", str(NETNS), "run", str(n), *a.model.split(), "--batch", str(batch), "--accum", str(accum),
                   "--steps", str(a.steps)]
            res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        finally:
            subprocess.run(["bash", str(NETNS), "teardown", str(n)], env=env, capture_output=True)
        try:
            rep = json.loads(res.stdout)
        except json.JSONDecodeError:
            print(f"rho_layouts: the sweep of layout {spec} failed: {res.stderr.strip()[-500:]}", file=sys.stderr)
            return 1
        entry = {"layout": spec, "ranks": n, "policy": policy or "none", "budget": budget or None,
                 "sequences_per_rank": share, "micro_batch": batch, "accum": accum, "repeat": repeat,
                 "sweep": rep,
                 "rho": rep["rho"][0]["rho"] if rep.get("rho") else None}
        results["layouts"].append(entry)
        per_bw = {b["bandwidth"]: b for b in rep["bandwidths"]}
        print(json.dumps({"layout": spec, "rho": entry["rho"],
                          "throughput": {k: v.get("throughput_median") for k, v in per_bw.items()}}), flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=1))
    print("layout          ranks  seq/rank  rho(" + a.bandwidths.replace(",", ", ") + ")")
    for e in results["layouts"]:
        print(f"{e['layout']:<15} {e['ranks']:>5}  {e['sequences_per_rank']:>8}  {e['rho']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
