"""Probe (issue 50): how should the host step's parameters go up beside the GEMMs under the
shim? The profiled host step (host_step_15) showed each 64 MiB piece's device copy (the bounce
buffer into the managed parameter) wait for a gap between the compute stream's GEMMs. Times a
queue of GEMMs of the host_step shape alone and beside 2 GiB of copies up, each way:

- one: today's `_through` (one 64 MiB bounce, the copy across and the device copy on one side stream)
- one-hi: the same on a high-priority stream
- ring / ring-hi: a ring of four 16 MiB pieces, the copy across on one stream, the device copy on
  another (normal or high priority), so the next piece crosses while the last waits for the SMs
- big-hi: one 256 MiB bounce on a high-priority stream (fewer pieces, fewer gaps)

Run under the shim (the parameter managed), and bare for the reference:

    python3 -m transit_launch run --policy advise --gpu-budget 20GB -- python3 bench/probes/up_path_probe.py
    python3 bench/probes/up_path_probe.py
"""

import json

import torch

MB = 1 << 20


def device_memory(nbytes):
    """Plain device memory: the shim's under the shim, torch's bare."""
    try:
        import transit_api
        import transit_staging
    except ImportError:
        return torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    if not transit_api.active():
        return torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    mem, why = transit_staging.device_buffer((transit_api.device_alloc, transit_api.device_free),
                                             torch.device("cuda", torch.cuda.current_device()), nbytes,
                                             device_memory, "probe's bounce buffer")
    if mem is None:
        raise SystemExit(why)
    return mem


def one(dst, src, buf, stream):
    with torch.cuda.stream(stream):
        n = buf.numel()
        for off in range(0, dst.numel(), n):
            k = min(n, dst.numel() - off)
            buf[:k].copy_(src[off:off + k], non_blocking=True)
            dst[off:off + k].copy_(buf[:k], non_blocking=True)


def ring(dst, src, buf, across, dev, free):
    """free: each slot's last device copy's event, kept across calls (a slot is reused only
    after the copy out of it)."""
    slots = len(free)
    piece = buf.numel() // slots
    for i, off in enumerate(range(0, dst.numel(), piece)):
        k, s = min(piece, dst.numel() - off), i % slots
        slot = buf[s * piece:s * piece + k]
        if free[s] is not None:
            across.wait_event(free[s])
        with torch.cuda.stream(across):
            slot.copy_(src[off:off + k], non_blocking=True)
            crossed = across.record_event()
        dev.wait_event(crossed)
        with torch.cuda.stream(dev):
            dst[off:off + k].copy_(slot, non_blocking=True)
            free[s] = dev.record_event()


def main():
    n = 256 * MB
    dst = torch.ones(n, dtype=torch.uint8, device="cuda")  # managed under the shim
    src = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    buf = device_memory(256 * MB)
    a = torch.randn(32768, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 16384, device="cuda", dtype=torch.bfloat16)
    streams = {"lo": torch.cuda.Stream(), "lo2": torch.cuda.Stream(), "hi": torch.cuda.Stream(priority=-1)}
    out = {"priorities": [streams[k].priority for k in ("lo", "hi")]}
    reps, gemms = 8, 40
    free = [None] * 4

    def case(name, copy):
        best = None
        for _ in range(3):
            torch.cuda.synchronize()
            c0, c1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            c0.record()
            if copy:
                for s in streams.values():
                    s.wait_stream(torch.cuda.current_stream())
                for _ in range(reps):
                    copy()
                ends = [torch.cuda.Event(enable_timing=True) for _ in streams]
                for e, s in zip(ends, streams.values()):
                    e.record(s)  # the copies' end: the latest of these
            for _ in range(gemms):
                a @ w
            c1.record()
            torch.cuda.synchronize()
            got = [c0.elapsed_time(c1)]
            if copy:
                got.append(max(c0.elapsed_time(e) for e in ends))
            best = got if best is None or got[0] < best[0] else best
        out[name] = {"compute_ms": round(best[0], 1)}
        if copy:
            out[name]["copies_end_ms"] = round(best[1], 1)
        print(name, out[name], flush=True)

    case("alone", None)
    case("one", lambda: one(dst, src, buf[:64 * MB], streams["lo"]))
    case("one-hi", lambda: one(dst, src, buf[:64 * MB], streams["hi"]))
    case("ring", lambda: ring(dst, src, buf[:64 * MB], streams["lo"], streams["lo2"], free))
    case("ring-hi", lambda: ring(dst, src, buf[:64 * MB], streams["lo"], streams["hi"], free))
    case("big-hi", lambda: one(dst, src, buf, streams["hi"]))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
