"""Probe (issue 50): the host path's CPU AdamW steps ran about 30-40% slower per parameter
under the shim than without it (bench/host_step.py: host against host-bare). This times
torch's fused CPU AdamW over 4 x 67 M fp32 parameters alone, then while the copy engines
move 1 GiB pieces from GPU memory to pinned host memory (as the gradients go down), bare
and under `transit-launch run --policy advise`; and lists the threads of this process.

    python3 bench/probes/cpu_step_under_shim.py
    python3 -m transit_launch run --policy advise -- python3 bench/probes/cpu_step_under_shim.py
"""

import json
import os
import threading
import time

import torch

N, ELEMS = 4, 4096 * 16384


def cpu_steps(opt, reps=5):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    return round(min(times), 4), round(sorted(times)[len(times) // 2], 4)


def main():
    dev = torch.device("cuda", 0)
    ph = [torch.randn(ELEMS, pin_memory=True) for _ in range(N)]
    for p in ph:
        p.grad = torch.randn(ELEMS, pin_memory=True)
    opt = torch.optim.AdamW(ph, lr=1e-4, fused=True)
    opt.step()  # the state's first touch
    out = {"shim": "transit" in os.environ.get("LD_PRELOAD", ""), "threads_torch": torch.get_num_threads()}
    out["alone_min_med_s"] = cpu_steps(opt)
    src = [torch.ones(1 << 28, device=dev) for _ in range(4)]  # 4 x 1 GiB
    dst = [torch.empty(1 << 28, pin_memory=True) for _ in range(4)]
    side = torch.cuda.Stream(dev)
    stop = threading.Event()

    def copier():
        with torch.cuda.stream(side):
            while not stop.is_set():
                for s, d in zip(src, dst):
                    d.copy_(s, non_blocking=True)
                side.synchronize()
    t = threading.Thread(target=copier)
    t.start()
    time.sleep(0.2)
    out["with_copies_min_med_s"] = cpu_steps(opt)
    stop.set()
    t.join()
    tasks = f"/proc/{os.getpid()}/task"
    names = {}
    for tid in os.listdir(tasks):
        with open(f"{tasks}/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"{tasks}/{tid}/comm") as f:
            name = f.read().strip()
        names.setdefault(name, [0, 0])
        names[name][0] += 1
        names[name][1] += int(fields[11]) + int(fields[12])  # utime + stime, clock ticks
    out["threads"] = names
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
