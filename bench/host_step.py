"""The host update path (TRANSIT_OVERLAP_STEP=host) against the default streamed step, plain
advise and the peers (torchao's CPUOffloadOptimizer, FSDP2's CPUOffloadPolicy), on issue 50's held-out FSDP2 shape: blocks of
Linear(dim -> ffn) + GELU + Linear(ffn -> dim) under FSDP2 (world size 1, bf16 parameters,
fp32 reduce and master weights), fused AdamW, a fixed number of tokens a step split into
microbatches, with or without clip_grad_norm_(1.0). No activation checkpointing.

Each point: the reference (no shim) first; its peak reserved less the AdamW state is the
GPU budget of the transit runs (issue 20's definition); torchao against its own reference
(the same blocks without FSDP2, as torchao takes plain parameters); FSDP2's CPUOffloadPolicy
(parameters, gradients and the step on the host, no shim) against the FSDP2 reference. Per run: per-GPU TFLOPS
(6 x parameters x tokens / median step time over the measured steps), the median step, the
losses, the peak reserved, and for the host path its counters.

    python3 bench/host_step.py --points base,clip --out $OUT/host_step.json
    python3 bench/host_step.py --report bench/results/DATE/host_step.json
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from common import host_memory, out_option  # noqa: E402 (bench/ is the script's folder: on sys.path)
# name -> (dim, ffn, blocks, tokens a step, microbatches, clip)
POINTS = {"base": (4096, 16384, 8, 32768, 1, None), "clip": (4096, 16384, 8, 32768, 1, 1.0),
          "clip-accum4": (4096, 16384, 8, 32768, 4, 1.0), "wide-clip": (8192, 32768, 2, 32768, 1, 1.0)}
RUNS = ("reference", "stream", "host", "host-roomy", "host-2g", "host-base", "host-bare", "plain", "torchao-reference",
        "torchao", "fsdp2-offload")
PEERS = ("torchao-reference", "torchao", "fsdp2-offload")  # run only at --peer-points
# TRANSIT_OVERLAP_STEP of each transit run; host-roomy: the host path at the budget plus 16 GiB,
# host-2g plus 2 GiB (the state still does not fit), host-base under the base policy
MODES = {"stream": None, "host": "host", "host-roomy": "host", "host-2g": "host", "host-base": "host", "plain": "0"}
EXTRA = {"host-roomy": 16 << 30, "host-2g": 2 << 30}
POLICY = {"host-base": "base"}
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def worker(a):
    """One run in this process: prints one JSON line per step and a summary."""
    import torch
    import torch.distributed as dist

    dim, ffn, blocks, tokens, micro, clip = POINTS[a.point]
    torch.manual_seed(0)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)

    def block():
        return torch.nn.Sequential(torch.nn.Linear(dim, ffn, bias=False), torch.nn.GELU(),
                                   torch.nn.Linear(ffn, dim, bias=False))

    model = torch.nn.Sequential(*[block() for _ in range(blocks)]).to(dev)
    params = sum(p.numel() for p in model.parameters())
    if a.run.startswith("torchao"):
        ctx = torch.autocast("cuda", dtype=torch.bfloat16)
        if a.run == "torchao":
            from torchao.optim import CPUOffloadOptimizer
            opt = CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-4, fused=True)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    else:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        kw = {"mp_policy": mp}
        if a.run == "fsdp2-offload":
            from torch.distributed.fsdp import CPUOffloadPolicy
            kw["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
        for b in model:
            fully_shard(b, **kw)
        fully_shard(model, **kw)
        ctx = torch.autocast("cuda", enabled=False)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        if a.run == "host-bare":  # the host path without the shim: all of the state on the host
            sys.path.insert(0, str(ROOT / "transit_launch" / "adapter"))  # its modules import each other flat
            import transit_host
            transit_host.HostStep().install()
    gen = torch.Generator(device=dev).manual_seed(1)
    times, losses = [], []
    prof = None
    for step in range(a.steps):
        torch.cuda.synchronize()
        if a.profile_step and step == a.profile_step:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                      torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        t0 = time.perf_counter()
        for _ in range(micro):
            x = torch.randn(tokens // micro, dim, device=dev, generator=gen, dtype=torch.bfloat16)
            with ctx:
                loss = model(x).float().pow(2).mean() / micro
            loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if prof is not None:
            prof.__exit__(None, None, None)
            timeline(prof, a.timeline, times[-1])
            prof = None
        losses.append(loss.item() * micro)
        print(json.dumps({"step": step, "s": round(times[-1], 4), "loss": losses[-1]}), flush=True)
    med = statistics.median(times[a.warmup:])
    print(json.dumps({"summary": {"params": params, "median_s": med, "tflops": 6 * params * tokens / med / 1e12,
                                  "first_s": times[0], "losses": losses,
                                  "peak_reserved": torch.cuda.max_memory_reserved(dev),
                                  "alloc_retries": torch.cuda.memory_stats(dev).get("num_alloc_retries"),
                                  "threads": thread_ticks(),
                                  "state_bytes": 8 * params, **host_memory()}}), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


def timeline(prof, out, step_s):
    """One profiled step reduced to its GPU intervals per stream (kernels merged where less
    than 20 us apart; copies each with direction and bytes) and the CPU ranges over 0.5 ms,
    in ms from the step's first GPU event."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        prof.export_chrome_trace(f"{d}/t.json")
        ev = [e for e in json.loads(Path(f"{d}/t.json").read_text())["traceEvents"] if e.get("ph") == "X"]
    gpu = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    t0 = min(e["ts"] for e in gpu)
    streams = {}
    for e in sorted(gpu, key=lambda e: e["ts"]):
        s = streams.setdefault(str(e.get("args", {}).get("stream")), [])
        a, b = (e["ts"] - t0) / 1e3, (e["ts"] + e["dur"] - t0) / 1e3
        if e["cat"] == "gpu_memcpy":
            n = e.get("name", "").lower()
            kind = next((k for k in ("htod", "dtoh", "dtod") if k in n), "other")
            s.append([round(a, 3), round(b, 3), kind, int(e.get("args", {}).get("bytes", 0) or 0)])
        elif s and s[-1][2] == "k" and a - s[-1][1] < 0.02:
            s[-1][1] = round(b, 3)
            s[-1][3] += 1
        else:
            s.append([round(a, 3), round(b, 3), "k", 1])
    cpu = [[e.get("tid"), e["name"][:60], round((e["ts"] - t0) / 1e3, 3), round(e["dur"] / 1e3, 3)]
           for e in ev if e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime") and e["dur"] > 500]
    Path(out).write_text(json.dumps({"step_s": step_s, "streams": streams, "cpu": cpu}))


def thread_ticks():
    """CPU clock ticks (user + system) this process's threads used, summed by thread name."""
    out = {}
    tasks = f"/proc/{os.getpid()}/task"
    for tid in os.listdir(tasks):
        try:
            with open(f"{tasks}/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"{tasks}/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        n, ticks = out.get(name, (0, 0))
        out[name] = (n + 1, ticks + int(fields[11]) + int(fields[12]))
    return out


def launch(point, run, budget, a):
    import tempfile

    stats = tempfile.mkdtemp(prefix="host-step-stats-")
    kind, _, setting = run.partition(":")  # RUN:VAR=VALUE: that run with one more variable set
    budget += EXTRA.get(kind, 0)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--point", point, "--run", kind,
           "--steps", str(a.steps), "--warmup", str(a.warmup)]
    if a.profile_step and a.timelines:
        Path(a.timelines).mkdir(parents=True, exist_ok=True)
        name = run.replace(":", "-").replace("=", "-")
        cmd += ["--profile-step", str(a.profile_step), "--timeline", str(Path(a.timelines) / f"{point}-{name}.json")]
    env = dict(os.environ, **MULTICAST_OFF, PYTHONUNBUFFERED="1")
    if setting:
        var, _, value = setting.partition("=")
        env[var] = value
    if kind in MODES:
        env.pop("TRANSIT_OVERLAP_STEP", None)
        if MODES[kind] is not None:
            env["TRANSIT_OVERLAP_STEP"] = MODES[kind]
        cmd = [sys.executable, "-m", "transit_launch", "run", "--policy", POLICY.get(kind, "advise"), "--gpu-budget", f"{budget}B",
               "--stats", stats, "--", *cmd]
    t0 = time.time()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=a.timeout)
    summary = next((json.loads(ln)["summary"] for ln in res.stdout.splitlines() if ln.startswith('{"summary"')), None)
    said = [ln for ln in res.stderr.splitlines() if ln.startswith("transit adapter:")]
    shim = [json.loads(f.read_text()) for f in sorted(Path(stats).glob("*.json"))]
    return {"point": point, "run": run, "budget": budget, "rc": res.returncode, "wall_s": round(time.time() - t0, 1),
            "summary": summary, "adapter": said[-20:], "shim": shim,
            "stderr_tail": res.stderr[-1500:] if res.returncode or summary is None else ""}


def drive(a):
    out = []
    for point in a.points.split(","):
        ref = launch(point, "reference", 0, a)
        out.append(ref)
        s = ref["summary"]
        budget = int(s["peak_reserved"] - s["state_bytes"]) if s else 0
        for run in a.runs.split(","):
            if run == "reference" or (run in PEERS and point not in a.peer_points.split(",")):
                continue
            if budget <= 0 and run.partition(":")[0] in MODES:
                continue
            out.append(launch(point, run, budget, a))
            print(json.dumps({k: out[-1][k] for k in ("point", "run", "rc", "wall_s")}), file=sys.stderr, flush=True)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(out, indent=1))
    report(out)


def report(rows):
    refs = {(r["point"], r["run"]): r["summary"] for r in rows if r["summary"]}
    print(f"{'point':<12} {'run':<18} {'TFLOPS':>7} {'% of ref':>8} {'median s':>9} {'first s':>8}  loss[-1]")
    for r in rows:
        s = r["summary"]
        if not s:
            print(f"{r['point']:<12} {r['run']:<18} failed rc={r['rc']}: {r['stderr_tail'][-200:]!r}")
            continue
        ref = refs.get((r["point"], "torchao-reference" if r["run"] == "torchao" else "reference"))
        pct = f"{100 * s['tflops'] / ref['tflops']:.1f}%" if ref else "-"
        print(f"{r['point']:<12} {r['run']:<18} {s['tflops']:7.1f} {pct:>8} {s['median_s']:9.4f} {s['first_s']:8.3f}"
              f"  {s['losses'][-1]:.6g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--point", default="base")
    ap.add_argument("--run", default="reference")
    ap.add_argument("--points", default="base,clip", help=f"comma list of {', '.join(POINTS)}")
    ap.add_argument("--runs", default=",".join(RUNS),
                    help=f"comma list of {', '.join(RUNS)}; RUN:VAR=VALUE runs RUN with VAR set")
    ap.add_argument("--peer-points", default="base,clip", help=f"points where the peers ({', '.join(PEERS)}) run")
    ap.add_argument("--profile-step", type=int, default=0, help="record this step's timeline (0: none)")
    ap.add_argument("--timeline", help=argparse.SUPPRESS)
    ap.add_argument("--timelines", help="with --profile-step: a directory for each run's timeline")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=300)
    out_option(ap, "host_step")
    ap.add_argument("--report", help="print the table of a results file")
    a = ap.parse_args()
    if a.worker:
        worker(a)
    elif a.report:
        report(json.loads(Path(a.report).read_text()))
    else:
        drive(a)


if __name__ == "__main__":
    main()
