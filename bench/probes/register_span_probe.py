"""Can the pinned state's pool be registered in pieces, in the background (issue 27, warm-up)?

The first step's pinning is now mostly cudaHostRegister (shim/hoststate.c registers each
slice of prefill.c's pool as the state takes it). Registering the pool in fixed pieces while
its pages are written would take that off the first step, but a slice would then span two
registrations. This probe answers, on huge-page memory written first as the pool's is:

  span        copies host -> device and device -> host of --copy-mb within one registration,
              then across the boundary of two adjacent ones, and the same as one registration:
              their rates, and whether the call returned before the copy ended (the pinned,
              asynchronous path; a pageable copy is staged and returns late); a kernel reading
              the crossing range zero-copy, and whether its sum is right
  parallel    --pieces registrations of --piece-mb each, one after another, then all at once
              from as many threads: does registering scale with threads?
  beside      one registration of --piece-mb alone, then while --writers threads write other
              fresh pages (the pool's fill): does the fill slow it?

    python3 bench/probes/register_span_probe.py --out register_span.json

Host memory only, at most (--pieces + 2) x --piece-mb, and one device buffer of --copy-mb.
"""

import argparse
import ctypes
import json
import mmap
import threading
import time

from host_populate_probe import HOST_PORTABLE_MAPPED, _memset_threads, _View, cudart

HUGE = 2 << 20
MADV_HUGEPAGE = 14
H2D, D2H = 1, 2


def _check(err, what):
    if err:
        raise SystemExit(f"register_span_probe: {what} failed with CUDA error {err}")


class Region:
    """Anonymous memory on a huge page's boundary, advised MADV_HUGEPAGE and written (as tr_host_map
    and the pool's fill make it)."""

    def __init__(self, nbytes, writers=8):
        self.map = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.ptr, self.n = (base + HUGE - 1) // HUGE * HUGE, nbytes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise(self.ptr, nbytes, MADV_HUGEPAGE)
        if writers:
            _memset_threads(self.ptr, nbytes, writers)


def _timed(fn):
    t0 = time.perf_counter()
    r = fn()
    return r, time.perf_counter() - t0


def _copy(rt, torch, dev, host, nbytes, kind):
    """(GB/s, seconds the call itself took, seconds to its end) of one copy on a side stream."""
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    src, dst = (host, dev.data_ptr()) if kind == H2D else (dev.data_ptr(), host)
    err = rt.cudaMemcpyAsync(ctypes.c_void_p(dst), ctypes.c_void_p(src), nbytes, kind, ctypes.c_void_p(s.cuda_stream))
    t1 = time.perf_counter()
    if err:  # the runtime's answer is the finding (a copy across two registrations may be refused)
        rt.cudaGetLastError()
        return {"error": err}
    s.synchronize()
    t2 = time.perf_counter()
    return {"gb_s": round(nbytes / 1e9 / (t2 - t0), 2), "call_s": round(t1 - t0, 4), "end_s": round(t2 - t0, 4),
            "returned_before_the_end": (t1 - t0) < 0.5 * (t2 - t0)}


def span(rt, torch, piece, copy):
    reg = Region(2 * piece)
    dev = torch.empty(copy, dtype=torch.uint8, device="cuda")
    half = piece - copy // 2  # the copy straddles the two pieces' boundary
    out = {}
    _check(rt.cudaHostRegister(ctypes.c_void_p(reg.ptr), piece, HOST_PORTABLE_MAPPED), "cudaHostRegister (first)")
    _check(rt.cudaHostRegister(ctypes.c_void_p(reg.ptr + piece), piece, HOST_PORTABLE_MAPPED), "cudaHostRegister (second)")
    for name, at in (("within", 0), ("across", half)):
        for kind, label in ((H2D, "h2d"), (D2H, "d2h")):
            _copy(rt, torch, dev, reg.ptr + at, copy, kind)  # warm
            out[f"{label}_{name}_two"] = _copy(rt, torch, dev, reg.ptr + at, copy, kind)
    ctypes.memset(reg.ptr + half, 1, copy)  # the crossing range, read by a kernel zero-copy
    t = torch.as_tensor(_View(reg.ptr + half, copy), device="cuda").view(torch.uint8)
    out["kernel_across_two_sum_ok"] = int(t.sum(dtype=torch.int64).item()) == copy
    _check(rt.cudaHostUnregister(ctypes.c_void_p(reg.ptr)), "cudaHostUnregister (first)")
    _check(rt.cudaHostUnregister(ctypes.c_void_p(reg.ptr + piece)), "cudaHostUnregister (second)")
    _check(rt.cudaHostRegister(ctypes.c_void_p(reg.ptr), 2 * piece, HOST_PORTABLE_MAPPED), "cudaHostRegister (one)")
    for kind, label in ((H2D, "h2d"), (D2H, "d2h")):
        _copy(rt, torch, dev, reg.ptr + half, copy, kind)
        out[f"{label}_across_one"] = _copy(rt, torch, dev, reg.ptr + half, copy, kind)
    _check(rt.cudaHostUnregister(ctypes.c_void_p(reg.ptr)), "cudaHostUnregister (one)")
    return out


def parallel(rt, pieces, piece):
    reg = Region(pieces * piece)
    at = [reg.ptr + i * piece for i in range(pieces)]

    def register_all():
        for p in at:
            _check(rt.cudaHostRegister(ctypes.c_void_p(p), piece, HOST_PORTABLE_MAPPED), "cudaHostRegister")

    _, serial = _timed(register_all)
    for p in at:
        rt.cudaHostUnregister(ctypes.c_void_p(p))
    errs = [0] * pieces

    def one(i):
        errs[i] = rt.cudaHostRegister(ctypes.c_void_p(at[i]), piece, HOST_PORTABLE_MAPPED)
    ws = [threading.Thread(target=one, args=(i,)) for i in range(pieces)]
    t0 = time.perf_counter()
    for w in ws:
        w.start()
    for w in ws:
        w.join()
    threaded = time.perf_counter() - t0
    _check(max(errs), "cudaHostRegister (threads)")
    for p in at:
        rt.cudaHostUnregister(ctypes.c_void_p(p))
    gb = pieces * piece / 1e9
    return {"gb": gb, "serial_gb_s": round(gb / serial, 2), "threads": pieces, "threaded_gb_s": round(gb / threaded, 2)}


def beside(rt, piece, writers):
    gb = piece / 1e9
    out = {}
    for label, busy in (("alone", False), ("beside_writers", True)):
        reg = Region(piece)
        other = Region(4 * piece, writers=0) if busy else None
        fill = threading.Thread(target=_memset_threads, args=(other.ptr, other.n, writers)) if busy else None
        if fill:
            fill.start()
        _, s = _timed(lambda: _check(rt.cudaHostRegister(ctypes.c_void_p(reg.ptr), piece, HOST_PORTABLE_MAPPED),
                                     "cudaHostRegister"))
        if fill:
            fill.join()
        rt.cudaHostUnregister(ctypes.c_void_p(reg.ptr))
        out[f"{label}_gb_s"] = round(gb / s, 2)
    out["writers"] = writers
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--piece-mb", type=int, default=1024)
    ap.add_argument("--copy-mb", type=int, default=256)
    ap.add_argument("--pieces", type=int, default=4)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--out")
    ap.error = lambda msg: ap.exit(2, f"register_span_probe: {msg}\n")  # one line, not the usage
    a = ap.parse_args()
    if min(a.piece_mb, a.copy_mb, a.pieces, a.writers) < 1 or a.copy_mb > a.piece_mb or a.piece_mb % 2:
        ap.exit(2, "register_span_probe: --piece-mb (even), --copy-mb (at most --piece-mb), --pieces and --writers "
                   "must be positive\n")
    try:
        import torch
    except ImportError:
        ap.exit(2, "register_span_probe: needs PyTorch with CUDA (it times the CUDA runtime's registrations)\n")
    if not torch.cuda.is_available():
        ap.exit(2, "register_span_probe: no GPU here: it times the CUDA runtime's registrations on one\n")
    rt = cudart()
    rt.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    piece, copy = a.piece_mb << 20, a.copy_mb << 20
    res = {"piece_mb": a.piece_mb, "copy_mb": a.copy_mb, "span": span(rt, torch, piece, copy),
           "parallel": parallel(rt, a.pieces, piece), "beside": beside(rt, piece, a.writers)}
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
