"""Probe (issue 50): the host path sends the parameters up into the GPU's memory after each
CPU step. Under the shim that memory is managed (cudaMallocManaged); torchao writes plain
device memory. This times the same copies both ways: pinned host -> device and device ->
pinned host, 4.3 GB in 67 M-element pieces (the FSDP2 shape's parameters), on two streams
as the host path issues them. Run it bare and under `transit-launch run --policy advise`:

    python3 bench/probes/copy_into_managed.py
    python3 -m transit_launch run --policy advise -- python3 bench/probes/copy_into_managed.py
"""

import json
import os
import time

import torch

PIECES, ELEMS = 16, 4096 * 16384


def timed(fn, stream):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    stream.synchronize()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main():
    dev = torch.device("cuda", 0)
    gpu = [torch.empty(ELEMS, device=dev) for _ in range(PIECES)]
    for g in gpu:
        g.fill_(1.0)  # first touch on the GPU (managed pages placed there)
    host = [torch.empty(ELEMS, pin_memory=True) for _ in range(PIECES)]
    up, down = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    nbytes = PIECES * ELEMS * 4
    out = {"shim": "LD_PRELOAD" in os.environ and "transit" in os.environ["LD_PRELOAD"], "gb": nbytes / 1e9}
    for name, stream, copy in (("up", up, lambda g, h: g.copy_(h, non_blocking=True)),
                               ("down", down, lambda g, h: h.copy_(g, non_blocking=True))):
        times = []
        for _ in range(3):
            def run(stream=stream, copy=copy):  # called at once, below
                with torch.cuda.stream(stream):
                    for g, h in zip(gpu, host):
                        copy(g, h)
            times.append(timed(run, stream))
        out[f"{name}_gbps"] = round(nbytes / min(times) / 1e9, 1)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
