"""Probe (issue 50): torch's fused CPU AdamW over 268 M parameters timed on the main thread
and on a worker thread (the host step's), with and without the main thread's intra-op
thread count set there, bare and beside copies between the GPU and pinned memory.

    python3 bench/probes/cpu_step_thread.py
"""

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch


def adamw(n):
    p = torch.zeros(n)
    p.grad = torch.randn(n)
    opt = torch.optim.AdamW([p], lr=1e-4, fused=True)
    opt.step()
    return opt


def timed(opt, reps=5):
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        opt.step()
        out.append(time.perf_counter() - t0)
    return round(min(out), 4), round(sorted(out)[len(out) // 2], 4), torch.get_num_threads()


def dma(stop):
    """Copies up and down between pinned memory and the GPU until stop is set."""
    h = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
    d = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        while not stop.is_set():
            d.copy_(h, non_blocking=True)
            h.copy_(d, non_blocking=True)
            s.synchronize()


def main():
    n = 268 << 20
    opt = adamw(n)
    main_threads = torch.get_num_threads()
    res = {"cpu_count": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "main_threads": main_threads}
    pool = ThreadPoolExecutor(1)
    res["main"] = timed(opt)
    res["worker"] = pool.submit(timed, opt).result()

    def set_then_time():
        torch.set_num_threads(main_threads)
        return timed(opt)
    res["worker_set"] = pool.submit(set_then_time).result()
    if torch.cuda.is_available():
        stop = threading.Event()
        t = threading.Thread(target=dma, args=(stop,))
        t.start()
        time.sleep(0.5)
        res["main_dma"] = timed(opt)
        res["worker_dma"] = pool.submit(timed, opt).result()
        stop.set()
        t.join()
    print(json.dumps(res))


if __name__ == "__main__":
    main()
