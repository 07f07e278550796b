"""What of the pinned pool's fill slows the trainer's first forward and backward (issue 27, warm-up)?

shim/prefill.c writes and registers the first step's pinned state in the background, during the
first forward and backward, and they run 0.2-1.0 s longer beside it (bench/LOG.md, "The fill's
writers, and what slows the first forward"). This probe times a trainer thread's CUDA work while
one bounded background activity runs, as the fill runs it, against none:

  activities  idle; write (--host-gb of fresh huge pages written once by --writers threads, as the
              fill's writer); register (the --piece-mb regions of a written --host-gb registered
              once each, one after another, as the fill's registrar); register-small (the same in
              64 MiB regions: does a stall last one registration?); both (write and register)
  work        round robin until the activity ends: launch (200 small kernels, synchronized),
              alloc (the shim's path for a new segment: cudaMallocManaged of 64 MiB, preferred
              location the device, prefetched there on the legacy stream, synchronized, freed),
              matmul (8 bf16 8192^3 matmuls, synchronized: GPU-bound)

Then: does host memory the driver makes in pieces (cuMemCreate, location host), mapped side by
side, take one copy across two pieces, which one registration per segment cannot? Each of the 8
cases runs in a process of its own, killed after --case-timeout seconds and then recorded as not
finished (at most 8 x 60 s by default: run it as a device call of its own); the results are saved
after every case.

    python3 bench/probes/fill_stall_probe.py --out fill_stall.json

b1e01e3's version registered and unregistered regions in a loop without end; on 2026-12-04 its
register case did not finish in 190 s and a second try got no answer from the machine (cause
unknown): bench/results/2026-12-04/fill-writers/fill_stall_partial.txt. This one registers each
region once. Host memory at most 2 x --host-gb; device memory: 64 MiB at a time, three 128 MiB
matrices and one copy buffer of --copy-mb.
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

import host_populate_probe
from host_populate_probe import ADV_PREFERRED, LOC_DEVICE, Loc

HUGE = 2 << 20
HOST_PORTABLE_MAPPED = host_populate_probe.HOST_PORTABLE_MAPPED


def cudart():
    """host_populate_probe's handle on the libcudart torch loaded, with the calls this probe adds."""
    rt = host_populate_probe.cudart()
    rt.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    return rt


def huge_region(nbytes):
    """Anonymous memory on a huge page's boundary, advised MADV_HUGEPAGE (as tr_host_map makes it):
    (the mapping, kept alive by the caller, and the aligned address)."""
    m, base = host_populate_probe._fresh(nbytes + HUGE, mmap.MADV_HUGEPAGE)
    return m, (base + HUGE - 1) // HUGE * HUGE


write_pages = host_populate_probe._memset_threads  # n threads at once (ctypes releases the GIL)


class Background:
    """One bounded activity in threads of its own, as the fill does it: --host-gb of fresh pages
    written once (write), the regions of a written --host-gb registered once each, one after
    another (register, register-small), or both at once. Unregistered only after it ends."""

    def __init__(self, rt, what, host, piece, writers):
        self.rt, self.what, self.host, self.piece, self.writers = rt, what, host, piece, writers
        self.threads, self.done, self.maps = [], {"written_gb": 0.0, "registered_gb": 0.0, "register_s": 0.0,
                                                  "errors": 0, "s": 0.0}, []
        self.registered = []
        if what.startswith("register") or what == "both":
            m, self.reg_ptr = huge_region(host)
            self.maps.append(m)
            write_pages(self.reg_ptr, host, writers)

    def _write(self):
        m, p = huge_region(self.host)
        self.maps.append(m)
        write_pages(p, self.host, self.writers)
        self.done["written_gb"] = self.host / 1e9

    def _register(self):
        for i in range(self.host // self.piece):
            p = self.reg_ptr + i * self.piece
            t0 = time.perf_counter()
            err = self.rt.cudaHostRegister(ctypes.c_void_p(p), self.piece, HOST_PORTABLE_MAPPED)
            self.done["register_s"] += time.perf_counter() - t0
            if err:
                self.done["errors"] += 1
                self.rt.cudaGetLastError()
                break
            self.registered.append(p)
            self.done["registered_gb"] += self.piece / 1e9

    def busy(self):
        return any(t.is_alive() for t in self.threads)

    def __enter__(self):
        targets = {"idle": [], "write": [self._write], "register": [self._register],
                   "register-small": [self._register], "both": [self._write, self._register]}[self.what]
        self.threads = [threading.Thread(target=t, daemon=True) for t in targets]
        self.t0 = time.perf_counter()
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        for t in self.threads:
            t.join()
        self.done["s"] = round(time.perf_counter() - self.t0, 3)
        for p in self.registered:
            self.rt.cudaHostUnregister(ctypes.c_void_p(p))
        for m in self.maps:
            m.close()


def op(torch, rt, kind, x, a, b):
    """One piece of a trainer thread's work, synchronized: its wall time in ms."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    if kind == "launch":  # launch-bound: 200 small kernels
        for _ in range(200):
            x.add_(1.0)
    elif kind == "alloc":  # the shim's path for a new segment
        p, n = ctypes.c_void_p(), 64 << 20
        if rt.cudaMallocManaged(ctypes.byref(p), n, 1) == 0:
            rt.cudaMemAdvise(p, n, ADV_PREFERRED, Loc(LOC_DEVICE, 0))
            rt.cudaMemPrefetchAsync(p, n, Loc(LOC_DEVICE, 0), 0, None)
            rt.cudaDeviceSynchronize()
            rt.cudaFree(p)
    else:  # GPU-bound
        for _ in range(8):
            torch.mm(a, b)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def summary(ms):
    return {"median_ms": round(statistics.median(ms), 3), "max_ms": round(max(ms), 3),
            "total_ms": round(sum(ms), 1), "n": len(ms)} if ms else {"n": 0}


ACTIVITY = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch, fill_stall_probe as f
what, host, piece, writers = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rt = f.cudart()
x = torch.ones(1024, device="cuda")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
for kind in ("launch", "alloc", "matmul"):  # each once before any is timed
    f.op(torch, rt, kind, x, a, b)
times = {"launch": [], "alloc": [], "matmul": []}
with f.Background(rt, what, host, piece, writers) as bg:
    k = 0  # round robin while the background works (idle: 60 rounds)
    while (bg.busy() if what != "idle" else k < 180) or k < 3:
        kind = ("launch", "alloc", "matmul")[k % 3]
        times[kind].append(f.op(torch, rt, kind, x, a, b)); k += 1
row = {kind: f.summary(ms) for kind, ms in times.items()}
row["background"] = bg.done
print(json.dumps(row), flush=True)
"""


class Stuck(Exception):
    """A case's process outlived its kill: it may still hold its memory, so no further case runs."""


def case(argv, timeout):
    """One case in a process of its own: its last JSON line, or how it ended. Ended by SIGKILL after
    timeout seconds ({"not_finished_s": timeout}); Stuck if it is still there 10 s later."""
    p = subprocess.Popen([sys.executable, "-c", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        so, se = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        try:
            p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            raise Stuck(f"a case still ran 10 s after its kill (after {timeout} s): {argv[1:]}") from None
        return {"not_finished_s": timeout}
    lines = [ln for ln in so.splitlines() if ln.startswith("{")]
    return {**(json.loads(lines[-1]) if lines else {}), **({"rc": p.returncode, "stderr": se[-400:]}
                                                          if p.returncode or not lines else {})}


def stalls(a, out, save):
    """Each activity as a case (above), into out[what], saved after each: a trainer thread's work
    there, against idle."""
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    for what in ("idle", "write", "register-small", "register", "both"):
        piece = (64 << 20) if what == "register-small" else a.piece_mb << 20
        out[what] = case([ACTIVITY, here, what, str(a.host_gb << 30), str(piece), str(a.writers)], a.case_timeout)
        print(what, json.dumps(out[what]), flush=True)
        save()


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
class Access(ctypes.Structure): _fields_ = [("location", Loc), ("flags", ctypes.c_int)]  # CUmemAccess_flags: an enum
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


def vmm(a, out, save):
    """Each access case as a case (a mapping the CPU cannot touch kills only its process)."""
    for access in ("device", "device+host", "device+host_numa"):
        out[access] = case([VMM_CASE, str(a.vmm_piece_mb << 20), "8", str(a.copy_mb << 20), access], a.case_timeout)
        print("vmm", json.dumps(out[access]), flush=True)
        save()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host-gb", type=int, default=32)
    ap.add_argument("--piece-mb", type=int, default=2048)
    ap.add_argument("--vmm-piece-mb", type=int, default=64)
    ap.add_argument("--copy-mb", type=int, default=32)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--case-timeout", type=int, default=60)
    ap.add_argument("--out")
    ap.error = lambda msg: ap.exit(2, f"fill_stall_probe: {msg}\n")  # one line, not the usage
    a = ap.parse_args()
    if min(a.host_gb, a.piece_mb, a.vmm_piece_mb, a.copy_mb, a.writers, a.case_timeout) < 1 or a.piece_mb > a.host_gb << 10 \
            or a.copy_mb > 2 * a.vmm_piece_mb:
        ap.exit(2, "fill_stall_probe: sizes and --writers must be positive, --piece-mb at most --host-gb, "
                   "--copy-mb at most twice --vmm-piece-mb\n")
    try:
        import torch
    except ImportError:
        ap.exit(2, "fill_stall_probe: needs PyTorch with CUDA (it times CUDA work beside the fill)\n")
    if not torch.cuda.is_available():
        ap.exit(2, "fill_stall_probe: no GPU here: it times CUDA work beside the fill on one\n")
    res = {"host_gb": a.host_gb, "piece_mb": a.piece_mb, "writers": a.writers, "stalls": {}, "vmm": {}}

    def save():  # after every case: what was measured survives a later one that never ends
        if a.out:
            with open(a.out, "w") as f:
                f.write(json.dumps(res, indent=1) + "\n")
    try:
        stalls(a, res["stalls"], save)
        vmm(a, res["vmm"], save)
    except Stuck as e:
        res["stuck"] = str(e)
        save()
        sys.exit(f"fill_stall_probe: {e}; the cases after it not run")


if __name__ == "__main__":
    main()
