"""Probe (issue 50): does a copy between GPU memory and pinned host memory on a side stream
stall the compute stream's kernels beside it? The host step's profiled step under the shim
showed the compute stream idle for exactly each gradient's copy down (managed memory), and
not bare. Times a queue of matmuls alone and beside copies down and up, each direct and
through a plain-device-memory bounce buffer (the shim's transit_device_alloc under the shim,
torch's memory bare), in pieces as transit_host._through copies. Run bare and under the shim:

    python3 bench/probes/copy_stall_probe.py
    python3 -m transit_launch run --policy advise --gpu-budget 20GB -- python3 bench/probes/copy_stall_probe.py
"""

import json

import torch

MB = 1 << 20


def bounce_buffer(nbytes):
    """Plain device memory: the shim's under the shim, torch's bare; and where it came from."""
    try:
        import transit_api
        import transit_staging
    except ImportError:
        return torch.empty(nbytes, dtype=torch.uint8, device="cuda"), "torch"
    if not transit_api.active():
        return torch.empty(nbytes, dtype=torch.uint8, device="cuda"), "torch"
    mem, why = transit_staging.device_buffer((transit_api.device_alloc, transit_api.device_free),
                                             torch.device("cuda", torch.cuda.current_device()), nbytes,
                                             bounce_buffer, "probe's bounce buffer")
    if mem is None:
        raise SystemExit(why)
    return mem, "shim"


def through(dst, src, buf):
    d, s, n = dst.view(-1), src.view(-1), buf.numel()
    for off in range(0, d.numel(), n):
        k = min(n, d.numel() - off)
        buf[:k].copy_(s[off:off + k], non_blocking=True)
        d[off:off + k].copy_(buf[:k], non_blocking=True)


def main():
    n = 256 * MB
    dev = torch.ones(n, dtype=torch.uint8, device="cuda")
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    buf, origin = bounce_buffer(64 * MB)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    out = {"bounce_from": origin}

    def case(name, copy, reps=8, matmuls=60):
        best = None
        for _ in range(3):
            torch.cuda.synchronize()
            c0, c1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            c0.record()
            if copy:
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    s0.record()
                    for _ in range(reps):
                        copy()
                    s1.record()
            for _ in range(matmuls):
                a @ a
            c1.record()
            torch.cuda.synchronize()
            got = (c0.elapsed_time(c1), s0.elapsed_time(s1) if copy else 0.0)
            best = got if best is None or got[0] < best[0] else best
        out[name] = {"compute_ms": round(best[0], 1)}
        if copy:
            out[name]["copy_GBps"] = round(reps * n / best[1] / 1e6, 1)

    case("alone", None)
    case("down_direct", lambda: host.copy_(dev, non_blocking=True))
    case("down_bounce", lambda: through(host, dev, buf))
    case("up_direct", lambda: dev.copy_(host, non_blocking=True))
    case("up_bounce", lambda: through(dev, host, buf))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
