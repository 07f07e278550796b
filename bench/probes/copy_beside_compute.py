"""Probe (issue 50): copies between GPU memory and pinned host memory on a side stream, alone
and while the compute stream runs matmuls, in GB/s; run bare (plain cudaMalloc memory) and
under the shim (`transit-launch run --policy advise`: managed memory) to see whether the host
path's gradient copies slow down under the shim because their source is managed memory.

    python3 bench/probes/copy_beside_compute.py
    python3 -m transit_launch run --policy advise --gpu-budget 40GB -- python3 bench/probes/copy_beside_compute.py
"""

import json
import time

import torch


def main():
    n = 4 << 30
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    dev.fill_(1)
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    out = {}
    for busy in (False, True):
        for way in ("down", "up"):
            torch.cuda.synchronize()
            if busy:
                for _ in range(200):  # about a second of matmuls queued on the compute stream
                    a @ a
            t0 = time.perf_counter()
            with torch.cuda.stream(side):
                for _ in range(3):
                    (host.copy_(dev, non_blocking=True) if way == "down" else dev.copy_(host, non_blocking=True))
                ev = side.record_event()
            issued = time.perf_counter() - t0  # a copy the runtime makes synchronous shows here
            ev.synchronize()
            dt = time.perf_counter() - t0
            out[f"{way}{'_busy' if busy else ''}_GBps"] = round(3 * n / dt / 1e9, 1)
            out[f"{way}{'_busy' if busy else ''}_issue_ms"] = round(1e3 * issued, 2)
            torch.cuda.synchronize()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
