"""How fast can fresh managed memory placed on the host get its pages (issue 27, warm-up)?

TorchTitan's first optimizer step under advise made its AdamW state at 1.4-3.4 GB/s: the
state's segments are new managed allocations placed on the host (preferred location host,
accessed by the GPU), and the GPU's first writes (the state's zeros) find no pages.
Populating them with a prefetch to the host first was slower still (bench/RESULTS.md).
This probe times the ways to give such an allocation its pages, then the GPU's first
write (zero_) and a second pass (add_, the steady zero-copy rate):

  fault       nothing first: the GPU's writes populate (what the shim does today)
  prefetch    cudaMemPrefetchAsync to the host first (the reverted change)
  cpu1/cpuN   the CPU writes every page first (memset), one thread or N threads
  hostalloc   pinned host memory instead (cudaHostAlloc, mapped): what shim/hoststate.c makes
  hostallocN  the same in N allocations made by N threads at once (does pinning scale?)
  register    anonymous memory the CPU populates with N threads, then cudaHostRegister (mapped)
  split-small / split-huge
              the register case timed in its two parts (the N threads' writes, then the
              registration), with 4 KiB pages (MADV_NOHUGEPAGE) or transparent huge pages
              (MADV_HUGEPAGE): which part costs, and do huge pages change it?
  pieces      the shim's path (shim/hoststate.c) for --pieces allocations made one after
              another, each mmap, N writers, cudaHostRegister: the shape of an optimizer's first step
  launch      small kernels' launch-to-finish time on this thread while N threads write
              fresh pages elsewhere, against idle (may the writes run beside a trainer?)

    python3 bench/probes/host_populate_probe.py --gb 8 --threads 16 --out probe.json

Each case allocates --gb of managed memory once, at most, and frees it: never more than
the GPU has free (the shared-GPU rule), whatever the host placement.
"""

import argparse
import ctypes
import json
import os
import threading
import time

ADV_PREFERRED, ADV_ACCESSED_BY = 3, 5
LOC_DEVICE, LOC_HOST = 1, 2


class Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


def cudart():
    """The libcudart torch loaded (the same runtime instance as torch's)."""
    import torch
    torch.cuda.init()
    with open("/proc/self/maps") as f:
        path = next(line.split()[-1] for line in f if "libcudart.so" in line)
    rt = ctypes.CDLL(path)
    rt.cudaMallocManaged.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
    rt.cudaMemAdvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, Loc]
    rt.cudaMemPrefetchAsync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, Loc, ctypes.c_uint, ctypes.c_void_p]
    rt.cudaFree.argtypes = [ctypes.c_void_p]
    rt.cudaDeviceSynchronize.argtypes = []
    rt.cudaHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
    rt.cudaFreeHost.argtypes = [ctypes.c_void_p]
    rt.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    rt.cudaHostUnregister.argtypes = [ctypes.c_void_p]
    return rt


HOST_PORTABLE_MAPPED = 1 | 2  # cudaHostAllocPortable | cudaHostAllocMapped (= cudaHostRegister's flags)


def _memset_threads(ptr, nbytes, n):
    chunk = -(-nbytes // n)
    ws = [threading.Thread(target=ctypes.memset, args=(ptr + i * chunk, 0, min(chunk, nbytes - i * chunk)))
          for i in range(n) if i * chunk < nbytes]  # ctypes releases the GIL: the memsets run at once
    for w in ws:
        w.start()
    for w in ws:
        w.join()


def pinned(rt, case, nbytes, threads):
    """The pinned cases: the time to get the memory, then the GPU's first write and a pass."""
    import mmap
    t0 = time.perf_counter()
    keep, free = None, []
    if case == "hostallocN":
        ptrs = [ctypes.c_void_p() for _ in range(threads)]
        part = nbytes // threads // 4096 * 4096
        errs = [0] * threads

        def get(i):
            errs[i] = rt.cudaHostAlloc(ctypes.byref(ptrs[i]), part, HOST_PORTABLE_MAPPED)
        ws = [threading.Thread(target=get, args=(i,)) for i in range(threads)]
        for w in ws:
            w.start()
        for w in ws:
            w.join()
        _check(max(errs), "cudaHostAlloc (threads)")
        free = [lambda q=q: rt.cudaFreeHost(q) for q in ptrs]
        ptr, nbytes = ptrs[0].value, part  # the kernels below run on one of them
    elif case == "hostalloc":
        p = ctypes.c_void_p()
        _check(rt.cudaHostAlloc(ctypes.byref(p), nbytes, HOST_PORTABLE_MAPPED), "cudaHostAlloc")
        free, ptr = [lambda: rt.cudaFreeHost(p)], p.value
    else:  # register
        keep = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(keep))
        _memset_threads(ptr, nbytes, threads)
        _check(rt.cudaHostRegister(ctypes.c_void_p(ptr), nbytes, HOST_PORTABLE_MAPPED), "cudaHostRegister")
        free = [lambda: rt.cudaHostUnregister(ctypes.c_void_p(ptr))]
    t1 = time.perf_counter()
    try:
        first, second, ok = _passes(ptr, nbytes)
    finally:
        for f in free:
            f()
        del keep  # (the mapping goes with the object)
    total = nbytes * (threads if case == "hostallocN" else 1)
    return {"case": case, "gb": total / 1e9, "populate_s": round(t1 - t0, 3), "populate_gb_s": round(total / 1e9 / (t1 - t0), 2),
            "first_write_s": round(first, 3), "second_pass_s": round(second, 3),
            "second_pass_gb_s": round(2 * nbytes / 1e9 / second, 2), "values_ok": ok}


class _View:
    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n // 4,), "typestr": "<f4", "data": (ptr, False), "version": 3}


def _passes(ptr, nbytes):
    """The GPU's first write (zero_) and a second pass (add_) over the memory, in seconds, and
    whether the values came out right."""
    import torch
    t = torch.as_tensor(_View(ptr, nbytes), device="cuda")
    t0 = time.perf_counter()
    t.zero_()
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    t.add_(1.0)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    ok = bool(t[:: max(1, t.numel() // 1000)].eq(1.0).all().item())
    return t1 - t0, t2 - t1, ok


def _check(err, what):
    if err:
        raise RuntimeError(f"{what}: cudaError {err}")


def _thp():
    out = {}
    for k in ("enabled", "defrag"):
        try:
            out[k] = open(f"/sys/kernel/mm/transparent_hugepage/{k}").read().strip()
        except OSError as e:
            out[k] = f"unreadable: {e}"
    return out


def _anon_huge_kb():
    with open("/proc/meminfo") as f:
        return next((int(line.split()[1]) for line in f if line.startswith("AnonHugePages:")), None)


def _fresh(nbytes, advice):
    import mmap
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if advice is not None:
        m.madvise(advice)
    return m, ctypes.addressof(ctypes.c_char.from_buffer(m))


def split(rt, case, nbytes, threads):
    """The writes and the registration timed apart, with small or huge pages."""
    import mmap
    advice = mmap.MADV_HUGEPAGE if case == "split-huge" else mmap.MADV_NOHUGEPAGE
    huge0 = _anon_huge_kb()
    m, ptr = _fresh(nbytes, advice)
    t0 = time.perf_counter()
    _memset_threads(ptr, nbytes, threads)
    t1 = time.perf_counter()
    huge1 = _anon_huge_kb()
    _check(rt.cudaHostRegister(ctypes.c_void_p(ptr), nbytes, HOST_PORTABLE_MAPPED), "cudaHostRegister")
    t2 = time.perf_counter()
    try:
        first, second, ok = _passes(ptr, nbytes)
    finally:
        t3 = time.perf_counter()
        rt.cudaHostUnregister(ctypes.c_void_p(ptr))
        t4 = time.perf_counter()
        del m
    gb = nbytes / 1e9
    return {"case": case, "gb": gb, "fill_s": round(t1 - t0, 3), "fill_gb_s": round(gb / (t1 - t0), 2),
            "register_s": round(t2 - t1, 3), "register_gb_s": round(gb / (t2 - t1), 2),
            "populate_gb_s": round(gb / (t2 - t0), 2), "unregister_s": round(t4 - t3, 3),
            "anon_huge_gb_after_fill": None if huge0 is None else round((huge1 - huge0) * 1024 / 1e9, 2),
            "first_write_s": round(first, 3), "second_pass_gb_s": round(2 * nbytes / 1e9 / second, 2),
            "values_ok": ok}


def pieces(rt, nbytes, threads, count):
    """count allocations one after another, each made as shim/hoststate.c makes one."""
    part = nbytes // count // 4096 * 4096
    held, fill_s, reg_s = [], 0.0, 0.0
    t0 = time.perf_counter()
    try:
        for _ in range(count):
            m, ptr = _fresh(part, None)
            a = time.perf_counter()
            _memset_threads(ptr, part, threads if part >= (64 << 20) else 1)
            b = time.perf_counter()
            _check(rt.cudaHostRegister(ctypes.c_void_p(ptr), part, HOST_PORTABLE_MAPPED), "cudaHostRegister")
            held.append((m, ptr))
            fill_s += b - a
            reg_s += time.perf_counter() - b
        t1 = time.perf_counter()
    finally:
        for _m, ptr in held:
            rt.cudaHostUnregister(ctypes.c_void_p(ptr))
        held.clear()
    gb = part * count / 1e9
    return {"case": "pieces", "gb": gb, "pieces": count, "piece_mb": part / 1e6, "populate_s": round(t1 - t0, 3),
            "populate_gb_s": round(gb / (t1 - t0), 2), "fill_s": round(fill_s, 3), "register_s": round(reg_s, 3)}


def launch(nbytes, threads, reps=2000):
    """Median and worst launch-to-finish time of a small kernel, idle and beside N writers."""
    import statistics
    import torch
    x = torch.ones(1024, device="cuda")

    def lat():
        out = []
        for _ in range(reps):
            a = time.perf_counter()
            x.add_(1.0)
            torch.cuda.synchronize()
            out.append(time.perf_counter() - a)
        return out
    idle = lat()
    m, ptr = _fresh(nbytes, None)
    w = threading.Thread(target=_memset_threads, args=(ptr, nbytes, threads))
    w.start()
    busy = lat()
    w.join()
    del m

    def us(v):
        return {"median_us": round(statistics.median(v) * 1e6, 1), "p99_us": round(sorted(v)[int(len(v) * 0.99)] * 1e6, 1),
                "max_us": round(max(v) * 1e6, 1)}
    return {"case": "launch", "gb": nbytes / 1e9, "idle": us(idle), "beside_writers": us(busy)}


def one(rt, case, nbytes, threads, count=64):
    if case.startswith("split-"):
        return split(rt, case, nbytes, threads)
    if case == "pieces":
        return pieces(rt, nbytes, threads, count)
    if case == "launch":
        return launch(nbytes, threads)
    if case in ("hostalloc", "hostallocN", "register"):
        return pinned(rt, case, nbytes, threads)
    p = ctypes.c_void_p()
    _check(rt.cudaMallocManaged(ctypes.byref(p), nbytes, 1), "cudaMallocManaged")
    try:
        _check(rt.cudaMemAdvise(p, nbytes, ADV_PREFERRED, Loc(LOC_HOST, 0)), "advise preferred host")
        _check(rt.cudaMemAdvise(p, nbytes, ADV_ACCESSED_BY, Loc(LOC_DEVICE, 0)), "advise accessed-by")
        t0 = time.perf_counter()
        if case == "prefetch":
            _check(rt.cudaMemPrefetchAsync(p, nbytes, Loc(LOC_HOST, 0), 0, None), "prefetch")
            _check(rt.cudaDeviceSynchronize(), "sync")
        elif case.startswith("cpu"):
            n = 1 if case == "cpu1" else threads
            chunk = -(-nbytes // n)
            ws = [threading.Thread(target=ctypes.memset, args=(p.value + i * chunk, 0, min(chunk, nbytes - i * chunk)))
                  for i in range(n)]  # ctypes releases the GIL: the memsets run at once
            for w in ws:
                w.start()
            for w in ws:
                w.join()
        t1 = time.perf_counter()
        first, second, ok = _passes(p.value, nbytes)
        return {"case": case, "gb": nbytes / 1e9, "populate_s": round(t1 - t0, 3), "first_write_s": round(first, 3),
                "total_s": round(t1 - t0 + first, 3), "total_gb_s": round(nbytes / 1e9 / (t1 - t0 + first), 2),
                "second_pass_s": round(second, 3), "second_pass_gb_s": round(2 * nbytes / 1e9 / second, 2),
                "values_ok": ok}
    finally:
        rt.cudaDeviceSynchronize()
        rt.cudaFree(p)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=8.0)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--cases", default="fault,prefetch,cpu1,cpuN,hostalloc,hostallocN,register")
    ap.add_argument("--pieces", type=int, default=64, help="allocations of the pieces case (64)")
    ap.add_argument("--out")
    a = ap.parse_args()
    import torch
    free, _ = torch.cuda.mem_get_info()
    nbytes = int(a.gb * 1e9) // 4096 * 4096
    if nbytes > free // 2:
        raise SystemExit(f"--gb {a.gb}: more than half of the GPU's free {free / 1e9:.1f} GB")
    rt = cudart()
    rows = []
    for case in a.cases.split(","):
        r = one(rt, case, nbytes, a.threads, a.pieces)
        rows.append(r)
        print(json.dumps(r), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"gb": a.gb, "threads": a.threads, "thp": _thp(), "cpus": os.cpu_count(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
