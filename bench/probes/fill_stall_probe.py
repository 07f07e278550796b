"""What of the pinned pool's fill slows the trainer's first forward and backward (issue 27, warm-up)?

shim/prefill.c writes and registers the first step's pinned state in the background, during the
first forward and backward, and they run 0.2-0.9 s longer beside it (bench/RESULTS.md, "The fill's
writes and registrations in a pipeline"). This probe times the work a trainer's thread gives CUDA
while one background activity runs, against none:

  activities  idle; write (--writers threads write fresh huge pages, as the fill's writer);
              register (one thread registers written regions of --piece-mb, one after another, as
              the fill's registrar); register-small (the same in 64 MiB regions: is a stall as long
              as one registration?); both (write and register, as the pipeline)
  work        launch: a burst of 200 small kernels, then a synchronize (launch-bound);
              alloc: the shim's path for a new segment: cudaMallocManaged of 64 MiB, preferred
              location the device, prefetched there on the legacy stream, synchronized, freed;
              matmul: 8 bf16 8192^3 matmuls, synchronized (GPU-bound)

and then asks whether host memory made by the driver in pieces (cuMemCreate, location host) mapped
side by side takes one copy across two pieces, which one registration per segment cannot.

    python3 bench/probes/fill_stall_probe.py --out fill_stall.json

Host memory at most 2 x --host-gb (the written regions and the pages written beside); device
memory: 64 MiB at a time, three 128 MiB matrices and one copy buffer of --copy-mb.
"""

import argparse
import ctypes
import json
import mmap
import statistics
import subprocess
import sys
import threading
import time

HUGE = 2 << 20
MADV_HUGEPAGE = 14
HOST_PORTABLE_MAPPED = 1 | 2
ADV_PREFERRED, LOC_DEVICE = 3, 1


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
    rt.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    rt.cudaHostUnregister.argtypes = [ctypes.c_void_p]
    rt.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    rt.cudaDeviceSynchronize.argtypes = []
    return rt


def huge_region(nbytes):
    """Anonymous memory on a huge page's boundary, advised MADV_HUGEPAGE (as tr_host_map makes it):
    (the mapping, kept alive by the caller, and the aligned address)."""
    m = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    ptr = (base + HUGE - 1) // HUGE * HUGE
    libc = ctypes.CDLL(None)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise(ptr, nbytes, MADV_HUGEPAGE)
    return m, ptr


def write_pages(ptr, nbytes, n):
    chunk = -(-nbytes // n) // HUGE * HUGE or HUGE
    ws = [threading.Thread(target=ctypes.memset, args=(ptr + i * chunk, 0, min(chunk, nbytes - i * chunk)))
          for i in range(n) if i * chunk < nbytes]  # ctypes releases the GIL: the memsets run at once
    for w in ws:
        w.start()
    for w in ws:
        w.join()


class Background:
    """One activity in threads of its own until stopped: fresh pages written (new regions each
    round, given back after), and/or written regions registered and unregistered in turn."""

    def __init__(self, rt, what, host, piece, writers):
        self.rt, self.what, self.host, self.piece, self.writers = rt, what, host, piece, writers
        self.stop = threading.Event()
        self.threads, self.done = [], {"written_gb": 0.0, "registered_gb": 0.0, "register_s": 0.0, "errors": 0}
        if "register" in what or what == "both":
            self.reg_map, self.reg_ptr = huge_region(host)
            write_pages(self.reg_ptr, host, writers)

    def _write(self):
        while not self.stop.is_set():
            m, p = huge_region(self.host)
            write_pages(p, self.host, self.writers)
            self.done["written_gb"] += self.host / 1e9
            m.close()

    def _register(self):
        i, regions = 0, max(1, self.host // self.piece)
        while not self.stop.is_set():
            p = self.reg_ptr + i * self.piece
            i = (i + 1) % regions
            t0 = time.perf_counter()
            err = self.rt.cudaHostRegister(ctypes.c_void_p(p), self.piece, HOST_PORTABLE_MAPPED)
            self.done["register_s"] += time.perf_counter() - t0
            if err:
                self.done["errors"] += 1
                continue
            self.done["registered_gb"] += self.piece / 1e9
            self.rt.cudaHostUnregister(ctypes.c_void_p(p))

    def __enter__(self):
        targets = {"idle": [], "write": [self._write], "register": [self._register],
                   "register-small": [self._register], "both": [self._write, self._register]}[self.what]
        self.threads = [threading.Thread(target=t, daemon=True) for t in targets]
        for t in self.threads:
            t.start()
        time.sleep(0.2 if self.threads else 0)  # under way before the work is timed
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()
        if hasattr(self, "reg_map"):
            self.reg_map.close()


def work(torch, rt, kind, reps):
    """Each repetition's wall time in ms."""
    x = torch.ones(1024, device="cuda")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if kind == "launch":
            for _ in range(200):
                x.add_(1.0)
            torch.cuda.synchronize()
        elif kind == "alloc":
            p = ctypes.c_void_p()
            n = 64 << 20
            if rt.cudaMallocManaged(ctypes.byref(p), n, 1) == 0:
                rt.cudaMemAdvise(p, n, ADV_PREFERRED, Loc(LOC_DEVICE, 0))
                rt.cudaMemPrefetchAsync(p, n, Loc(LOC_DEVICE, 0), 0, None)
                rt.cudaDeviceSynchronize()
                rt.cudaFree(p)
        else:
            for _ in range(8):
                c = a @ b
            torch.cuda.synchronize()
            del c
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def summary(ms):
    return {"median_ms": round(statistics.median(ms), 3), "max_ms": round(max(ms), 3),
            "total_ms": round(sum(ms), 1), "n": len(ms)}


def stalls(torch, rt, a):
    out = {}
    for what in ("idle", "write", "register", "register-small", "both"):
        piece = (64 << 20) if what == "register-small" else a.piece_mb << 20
        row = {}
        with Background(rt, what, a.host_gb << 30, piece, a.writers) as bg:
            for kind, reps in (("launch", 150), ("alloc", 150), ("matmul", 30)):
                row[kind] = summary(work(torch, rt, kind, reps))
        row["background"] = {k: round(v, 3) for k, v in bg.done.items()}
        out[what] = row
        print(what, json.dumps(row), flush=True)
    return out


VMM_CASE = r"""
import ctypes, json, sys, time
import torch
torch.cuda.init(); torch.zeros(1, device="cuda")
cu = ctypes.CDLL("libcuda.so.1")
class Loc(ctypes.Structure): _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]
class Flags(ctypes.Structure): _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                                           ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]
class Prop(ctypes.Structure): _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", Loc),
                                          ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", Flags)]
class Access(ctypes.Structure): _fields_ = [("location", Loc), ("flags", ctypes.c_ulonglong)]
piece, count, copy, access = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
res = {"case": access}
prop = Prop(1, 0, Loc(2, 0))  # pinned, no handle types, location HOST
g = ctypes.c_size_t()
res["granularity_err"] = cu.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(prop), 0)
res["granularity"] = g.value
va = ctypes.c_ulonglong()
res["reserve_err"] = cu.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(piece * count), ctypes.c_size_t(0), ctypes.c_ulonglong(0), ctypes.c_ulonglong(0))
t0 = time.perf_counter(); errs = []
for i in range(count):
    h = ctypes.c_ulonglong()
    e = cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(piece), ctypes.byref(prop), ctypes.c_ulonglong(0))
    e = e or cu.cuMemMap(ctypes.c_ulonglong(va.value + i * piece), ctypes.c_size_t(piece), ctypes.c_size_t(0), h, ctypes.c_ulonglong(0))
    errs.append(e)
descs = [Access(Loc(1, 0), 3)] + ([Access(Loc(2, 0), 3)] if access == "device+host" else []) + ([Access(Loc(3, 0), 3)] if access == "device+host_numa" else [])
arr = (Access * len(descs))(*descs)
res["set_access_err"] = cu.cuMemSetAccess(ctypes.c_ulonglong(va.value), ctypes.c_size_t(piece * count), arr, ctypes.c_size_t(len(descs)))
res["create_map_errs"] = sorted(set(errs)); res["create_map_gb_s"] = round(piece * count / 1e9 / (time.perf_counter() - t0), 2)
print(json.dumps(res), flush=True)
rt = ctypes.CDLL(next(l.split()[-1] for l in open("/proc/self/maps") if "libcudart.so" in l))
rt.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
src = torch.arange(copy // 4, device="cuda", dtype=torch.int32); dst = torch.empty_like(src)
s = torch.cuda.Stream(); at = va.value + piece - copy // 2  # across the first two pieces' boundary
for name, kind, a_, b_ in (("d2h_across", 4, at, src.data_ptr()), ("h2d_across", 4, dst.data_ptr(), at)):  # cudaMemcpyDefault
    torch.cuda.synchronize(); t0 = time.perf_counter()
    e = rt.cudaMemcpyAsync(ctypes.c_void_p(a_), ctypes.c_void_p(b_), copy, kind, ctypes.c_void_p(s.cuda_stream)); t1 = time.perf_counter()
    s.synchronize(); t2 = time.perf_counter()
    res[name] = {"err": e, "gb_s": round(copy / 1e9 / (t2 - t0), 2), "returned_before_the_end": (t1 - t0) < 0.5 * (t2 - t0)}
res["round_trip_equal"] = bool(torch.equal(src, dst))
print(json.dumps(res), flush=True)
if access != "device":  # the CPU's own access (a fault here kills only this case)
    ctypes.memset(at, 7, 4096); res["cpu_write_read"] = ctypes.string_at(at, 1) == b"\x07"
    print(json.dumps(res), flush=True)
"""


def vmm(a):
    """Each access case in a process of its own (a mapping the CPU cannot touch kills only it): its
    last line of results, and how it ended."""
    out = {}
    for access in ("device", "device+host", "device+host_numa"):
        p = subprocess.run([sys.executable, "-c", VMM_CASE, str(a.vmm_piece_mb << 20), "8", str(a.copy_mb << 20),
                            access], capture_output=True, text=True, timeout=120)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        out[access] = {"rc": p.returncode, **(json.loads(lines[-1]) if lines else {}),
                       **({"stderr": p.stderr[-400:]} if p.returncode else {})}
        print("vmm", json.dumps(out[access]), flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host-gb", type=int, default=8)
    ap.add_argument("--piece-mb", type=int, default=2048)
    ap.add_argument("--vmm-piece-mb", type=int, default=64)
    ap.add_argument("--copy-mb", type=int, default=32)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--out")
    ap.error = lambda msg: ap.exit(2, f"fill_stall_probe: {msg}\n")  # one line, not the usage
    a = ap.parse_args()
    if min(a.host_gb, a.piece_mb, a.vmm_piece_mb, a.copy_mb, a.writers) < 1 or a.piece_mb > a.host_gb << 10 \
            or a.copy_mb > 2 * a.vmm_piece_mb:
        ap.exit(2, "fill_stall_probe: sizes and --writers must be positive, --piece-mb at most --host-gb, "
                   "--copy-mb at most twice --vmm-piece-mb\n")
    try:
        import torch
    except ImportError:
        ap.exit(2, "fill_stall_probe: needs PyTorch with CUDA (it times CUDA work beside the fill)\n")
    if not torch.cuda.is_available():
        ap.exit(2, "fill_stall_probe: no GPU here: it times CUDA work beside the fill on one\n")
    rt = cudart()
    res = {"host_gb": a.host_gb, "piece_mb": a.piece_mb, "writers": a.writers, "stalls": stalls(torch, rt, a),
           "vmm": vmm(a)}
    text = json.dumps(res, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
