"""Probe of docs/lifetime-policy.md's two ways of turning PyTorch's cached-but-free GPU
memory into room a lifetime-aware policy could use, on examples/train_llama.py, unchanged.

At the start of backward (the gradient of the model's output: the logits and the loss
are dead then) of every probed step, the free blocks of PyTorch's cache are listed
(torch.cuda.memory_snapshot) and one mechanism is applied:
  discard      cudaMemDiscardBatchAsync (CUDA 13) on the free blocks, aligned inwards to
               2 MiB, enqueued in stream order after the compute stream (a block free now
               is dead after every kernel enqueued so far). Needs managed memory: run it under
               `transit-launch run --policy base` without a budget.
  empty-cache  torch.cuda.empty_cache(): whole free segments go back through cudaFree.
  none         only the listing.
Recorded per step: free bytes at the hook, bytes discarded or released, device memory
used before and after (NVML: the shim reports its budget through cudaMemGetInfo), how
much of the discarded memory the allocator had handed out again by the optimizer step,
the time of the call and the step time (one record per microbatch; use one microbatch a
step to compare step times). Steps 1..W run plain, W+1..W+P probed, then P
plain again, so that the probed steps' times compare with their neighbours.

    transit-launch run --policy base -- python3 bench/probes/lifetime_probe.py --mode discard \\
        --out probe.json -- --seq-len 8192 --batch 2 --accum 1
"""

import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: common.py
from common import is_module, run_trainer_here, split_trainer_args
ALIGN = 2 << 20  # UVM's large page: never discard a page that a live block shares


def blocks(snapshot):
    """(start, end, state) of every block; blocks carry no address in some PyTorch versions,
    but lie in address order from their segment's start."""
    for seg in snapshot:
        addr = seg["address"]
        for b in seg["blocks"]:
            start = b.get("address", addr)
            addr = start + b["size"]
            yield start, addr, b["state"]


def free_ranges(snapshot, min_bytes=ALIGN):
    """[(start, end)] of inactive blocks, aligned inwards to ALIGN."""
    out = []
    for start, end, state in blocks(snapshot):
        if state == "inactive":
            s, e = (start + ALIGN - 1) // ALIGN * ALIGN, end // ALIGN * ALIGN
            if e - s >= min_bytes:
                out.append((s, e))
    return out


def reused(ranges, snapshot):
    """Bytes of `ranges` covered by allocated blocks in `snapshot`."""
    return sum(max(0, min(end, e) - max(start, s)) for start, end, state in blocks(snapshot) if state != "inactive"
               for s, e in ranges)


def snapshot():
    import torch
    try:
        return torch.cuda.memory_snapshot(include_traces=False)  # without trace entries: fast
    except TypeError:
        return torch.cuda.memory_snapshot()


def cudart():
    """The libcudart this process already uses (PyTorch's), by its path in /proc/self/maps."""
    for line in open("/proc/self/maps"):
        path = line.split()[-1]
        if "libcudart.so" in path:
            return ctypes.CDLL(path)
    return ctypes.CDLL("libcudart.so")


class Probe:
    def __init__(self, a):
        self.a, self.step, self.recs, self.cur = a, 0, [], []  # cur: discarded this step
        self.t_last = None
        self.side = None  # a stream for the discard when the compute stream is the legacy NULL stream

    def probed(self):
        return self.a.warmup < self.step + 1 <= self.a.warmup + self.a.probe

    def nvml_used(self):
        import torch
        try:
            return torch.cuda.device_memory_used()
        except Exception:
            return None

    def at_backward(self):
        import torch
        rec = {"step": self.step + 1, "probed": self.probed(), "mode": self.a.mode if self.probed() else "none"}
        snap = snapshot()
        ranges = free_ranges(snap)
        rec["free_bytes"] = sum(e - s for s, e in ranges)
        rec["reserved"] = torch.cuda.memory_reserved()
        rec["allocated"] = torch.cuda.memory_allocated()
        if rec["probed"] and self.a.mode != "none":
            torch.cuda.synchronize()
            rec["nvml_used_before"] = self.nvml_used()
            t = time.perf_counter()
            if self.a.mode == "discard":
                n = len(ranges)
                ptrs = (ctypes.c_void_p * n)(*[s for s, _ in ranges])
                sizes = (ctypes.c_size_t * n)(*[e - s for s, e in ranges])
                # the batch APIs refuse the legacy NULL stream (cudaErrorInvalidValue: what the
                # 2026-11-30 run got from PyTorch's default stream), so the discard goes on a
                # stream ordered after everything enqueued so far, and the compute stream after it
                cur = torch.cuda.current_stream()
                if not cur.cuda_stream and self.side is None:
                    self.side = torch.cuda.Stream()
                side = cur if cur.cuda_stream else self.side
                side.wait_stream(cur)
                rt = cudart()
                rt.cudaMemDiscardBatchAsync.restype = ctypes.c_int
                rec["discard_rc"] = rt.cudaMemDiscardBatchAsync(ptrs, sizes, ctypes.c_size_t(n), ctypes.c_ulonglong(0),
                                                                ctypes.c_void_p(side.cuda_stream))
                cur.wait_stream(side)
                if rec["discard_rc"]:
                    rt.cudaGetLastError()  # not the application's error
                rec["discarded"] = rec["free_bytes"] if rec["discard_rc"] == 0 else 0
                self.cur += ranges if rec["discard_rc"] == 0 else []
            else:
                before = torch.cuda.memory_reserved()
                torch.cuda.empty_cache()
                rec["released"] = before - torch.cuda.memory_reserved()
            torch.cuda.synchronize()
            rec["call_s"] = time.perf_counter() - t
            rec["nvml_used_after"] = self.nvml_used()
        self.recs.append(rec)

    def at_optimizer(self):
        if self.cur and self.recs:
            self.recs[-1]["discarded_reused_by_optimizer"] = reused(self.cur, snapshot())
            self.cur = []

    def at_step_end(self):
        import torch
        torch.cuda.synchronize()
        now = time.perf_counter()
        if self.recs and self.t_last is not None:
            self.recs[-1]["step_s"] = now - self.t_last
        self.t_last = now
        self.step += 1


def install(p: Probe):
    import torch
    from torch.nn.modules import module as M
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    def post(mod, args, out):
        if is_module(mod, "Llama") and torch.is_tensor(out) and out.requires_grad \
                and torch._C._current_graph_task_id() == -1:
            out.register_hook(lambda g: p.at_backward())

    M.register_module_forward_hook(post)
    register_optimizer_step_pre_hook(lambda opt, args, kwargs: p.at_optimizer())
    register_optimizer_step_post_hook(lambda opt, args, kwargs: p.at_step_end())


def main():
    argv, extra = split_trainer_args(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["none", "discard", "empty-cache"], default="discard")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--probe", type=int, default=3)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("lifetime_probe: needs a GPU", file=sys.stderr)
        return 2
    p = Probe(a)
    install(p)
    rc = run_trainer_here([*extra, "--steps", str(a.warmup + 2 * a.probe)])
    if rc:
        return rc
    result = {"mode": a.mode, "trainer": extra, "steps": p.recs}
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    for r in p.recs:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
