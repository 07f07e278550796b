"""Probe: how fast does the host's memory serve the CPU's fused AdamW, alone and with PCIe copies
both ways beside it? (the host update path's bound: the CPU's step and the link's copies share
the host's memory)

    python3 bench/probes/host_memory_probe.py --out FILE.json      # on the lent GPU machine

Copy and add bandwidth by intra-op threads (1 GiB fp32; bytes read plus written), torch's fused
CPU AdamW over 256 Mi parameters with all threads but one (the host step's worker), then the same
step while 24 pinned copies of 1 GiB each way run on two streams.
"""

import argparse
import json
import sys
import time


def timed(f, reps=5):
    f()
    t = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - t) / reps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="the result file (JSON)")
    a = ap.parse_args(argv)
    if not a.out:
        print("host_memory_probe: --out FILE is needed (where the result goes)", file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError:
        print("host_memory_probe: needs PyTorch", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("host_memory_probe: needs a CUDA GPU (the copies beside the step)", file=sys.stderr)
        return 2
    res = {"threads": torch.get_num_threads()}
    n = 1 << 28
    x, y = torch.ones(n), torch.empty(n)
    for k in sorted({1, 4, 8, res["threads"] - 1, res["threads"]}):
        torch.set_num_threads(k)
        res[f"copy_GBps_{k}thr"] = round(2 * 4 * n / timed(lambda: y.copy_(x)) / 1e9, 1)
        res[f"add_GBps_{k}thr"] = round(3 * 4 * n / timed(lambda: y.add_(x, alpha=0.5)) / 1e9, 1)
    torch.set_num_threads(max(1, res["threads"] - 1))
    m = 256 << 20
    p = torch.zeros(m)
    p.grad = torch.ones(m)
    opt = torch.optim.AdamW([p], fused=True)
    opt.step()
    s = timed(opt.step, 4)
    res["adamw_ns_per_param"] = round(s / m * 1e9, 3)
    res["adamw_GBps_28B"] = round(28 * m / s / 1e9, 1)  # p, grad, m, v read; p, m, v written
    src, back = torch.empty(n, pin_memory=True), torch.empty(n, pin_memory=True)
    dst = torch.empty(n, device="cuda")
    up, down = torch.cuda.Stream(), torch.cuda.Stream()
    for _ in range(24):
        with torch.cuda.stream(up):
            dst.copy_(src, non_blocking=True)
        with torch.cuda.stream(down):
            back.copy_(dst, non_blocking=True)
    t = time.perf_counter()
    opt.step()
    s = time.perf_counter() - t
    torch.cuda.synchronize()
    res["adamw_ns_per_param_with_copies"] = round(s / m * 1e9, 3)
    print(json.dumps(res))
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
