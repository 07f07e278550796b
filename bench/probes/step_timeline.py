"""One training step's GPU timeline, summarized (issue 20: why the staged step's copies finish
late). The examples' trainer runs in this process; torch.profiler records training step
--step (from the zero_grad after the step before to the one after it), and the trace is reduced
to what the question needs: each stream's busy time, the copies by direction with their
bytes and rate, how much of them ran while the compute stream computed, and the compute
stream's idle gaps (where the GPU waited for the CPU or for a copy).

    python3 -m transit_launch run --policy advise --gpu-budget B -- \\
        python3 bench/probes/step_timeline.py --step 6 --out staged.json -- --seq-len 8192 --accum 1 --steps 7

    python3 bench/probes/step_timeline.py --summarize trace.json   # an exported Chrome trace
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: common.py
from common import run_trainer_here, split_trainer_args


def _union(intervals):
    """Total length of the union of [start, end) intervals."""
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def _overlap(intervals, others):
    """Length of the intervals covered by the union of others (both lists of [a, b))."""
    merged = []
    for a, b in sorted(others):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    total = 0.0
    for a, b in intervals:
        for c, d in merged:
            if d <= a:
                continue
            if c >= b:
                break
            total += min(b, d) - max(a, c)
    return total


def _kind(name):
    n = name.lower()
    if "memcpy" not in n:
        return None
    for k in ("htod", "dtoh", "dtod"):
        if k in n:
            return k
    return "other"


def summarize(trace):
    """The summary of a Chrome trace (torch.profiler's export) as a dict; times in ms."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not gpu:
        return {"error": "no GPU events in the trace"}
    t0 = min(e["ts"] for e in gpu)
    t1 = max(e["ts"] + e["dur"] for e in gpu)
    streams = {}
    for e in gpu:
        s = streams.setdefault(str(e.get("args", {}).get("stream", "?")), {"kernels": [], "copies": []})
        (s["copies"] if e["cat"] == "gpu_memcpy" else s["kernels"]).append((e["ts"], e["ts"] + e["dur"]))
    compute = max(streams, key=lambda k: sum(b - a for a, b in streams[k]["kernels"]))
    busy = streams[compute]["kernels"]
    gaps = []
    end = None
    for a, b in sorted(busy):
        if end is not None and a > end:
            gaps.append(a - end)
        end = b if end is None else max(end, b)
    copies = {}
    for e in gpu:
        k = _kind(e.get("name", "")) if e["cat"] == "gpu_memcpy" else None
        if k is None:
            continue
        c = copies.setdefault(k, {"count": 0, "bytes": 0, "ms": 0.0, "iv": []})
        c["count"] += 1
        c["bytes"] += int(e.get("args", {}).get("bytes", 0) or 0)
        c["ms"] += e["dur"] / 1e3
        c["iv"].append((e["ts"], e["ts"] + e["dur"]))
    for c in copies.values():
        iv = c.pop("iv")
        c["busy_ms"] = _union(iv) / 1e3
        c["beside_compute_ms"] = _overlap(iv, busy) / 1e3
        c["gb_per_s"] = c["bytes"] / (c["busy_ms"] / 1e3) / 1e9 if c["busy_ms"] else None
    return {"window_ms": (t1 - t0) / 1e3, "compute_stream": compute,
            "compute_busy_ms": _union(busy) / 1e3, "compute_idle_ms": sum(gaps) / 1e3,
            "compute_gaps_over_1ms": sorted((round(g / 1e3, 2) for g in gaps if g > 1e3), reverse=True)[:10],
            "streams": {k: {"kernels": len(v["kernels"]), "kernel_busy_ms": _union(v["kernels"]) / 1e3,
                            "copies": len(v["copies"]), "copy_busy_ms": _union(v["copies"]) / 1e3}
                        for k, v in streams.items()},
            "copies": copies}


def show(res):
    if "error" in res:
        print(f"step_timeline: {res['error']}", file=sys.stderr)
        return
    print(f"window {res['window_ms']:.1f} ms; compute stream {res['compute_stream']}: busy "
          f"{res['compute_busy_ms']:.1f} ms, idle {res['compute_idle_ms']:.1f} ms "
          f"(gaps over 1 ms: {res['compute_gaps_over_1ms']})")
    for k, c in sorted(res["copies"].items()):
        rate = f"{c['gb_per_s']:.1f} GB/s" if c["gb_per_s"] else "-"
        print(f"  {k}: {c['count']} copies, {c['bytes'] / 1e9:.2f} GB in {c['busy_ms']:.1f} ms ({rate}), "
              f"{c['beside_compute_ms']:.1f} ms of it beside compute")
    for k, s in sorted(res["streams"].items(), key=lambda kv: -kv[1]["kernel_busy_ms"] - kv[1]["copy_busy_ms"]):
        print(f"  stream {k}: {s['kernels']} kernels {s['kernel_busy_ms']:.1f} ms, {s['copies']} copies "
              f"{s['copy_busy_ms']:.1f} ms")


def main():
    argv, extra = split_trainer_args(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="then -- and examples/train_llama.py's flags")
    ap.add_argument("--step", type=int, default=6, help="the training step to record (1 is the first)")
    ap.add_argument("--out", default="", help="write the summary here (JSON)")
    ap.add_argument("--summarize", default="", help="summarize this exported Chrome trace instead of running")
    a = ap.parse_args(argv)
    if a.summarize:
        try:
            res = summarize(json.loads(Path(a.summarize).read_text()))
        except (OSError, ValueError) as e:
            print(f"step_timeline: cannot read {a.summarize}: {e}", file=sys.stderr)
            sys.exit(2)
        show(res)
        if a.out:
            Path(a.out).write_text(json.dumps(res, indent=1))
        sys.exit(2 if "error" in res else 0)
    if a.step < 2:
        print("step_timeline: --step must be at least 2 (it starts at the end of the step before)", file=sys.stderr)
        sys.exit(2)
    import torch

    if not torch.cuda.is_available():
        print("step_timeline: no GPU (it records CUDA streams)", file=sys.stderr)
        sys.exit(2)
    from torch.optim import Optimizer

    state = {"n": 0, "prof": None, "first": None}
    zero_grad = Optimizer.zero_grad

    # The step boundary is the application's zero_grad after its step: an optimizer step
    # hook would be foreign to the adapter's overlap, which then turns itself off.
    def zero_grad_then_tick(opt, *args, **kwargs):
        out = zero_grad(opt, *args, **kwargs)
        tick(opt)
        return out

    def tick(opt):
        if state["first"] is None:
            state["first"] = opt
        if opt is not state["first"]:
            return
        state["n"] += 1
        if state["n"] == a.step - 1:
            torch.cuda.synchronize()
            state["prof"] = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                               torch.profiler.ProfilerActivity.CUDA])
            state["prof"].__enter__()
        elif state["n"] == a.step and state["prof"] is not None:
            torch.cuda.synchronize()
            prof, state["prof"] = state["prof"], None
            prof.__exit__(None, None, None)
            path = Path(a.out or "step_timeline.json").with_suffix(".trace.json")
            prof.export_chrome_trace(str(path))
            res = summarize(json.loads(path.read_text()))
            path.unlink()  # hundreds of MB: the summary is what comes back
            res["step"] = a.step
            show(res)
            if a.out:
                Path(a.out).write_text(json.dumps(res, indent=1))

    Optimizer.zero_grad = zero_grad_then_tick
    return run_trainer_here(extra)


if __name__ == "__main__":
    sys.exit(main())
