"""Scale-in N -> N/2 as a matrix (issue 19): the example trainer with and without activation
recomputation, at two global batch sizes, each repeated, and where the scaled-in step's
time goes.

Per configuration (recomputation, microbatches of the full layout) three layouts, the same
global batch in all three:
  full        N GPUs, FSDP2, no offloading (pass-through shim), each GPU emulating the smaller
              GPU of bench/scale_in.py (the N layout fits it, the N/2 layout does not);
  half-off    N/2 GPUs, twice the microbatches, no offloading and no budget: what the same
              tokens cost on half the GPUs when memory is not short (no gap from offloading);
  half-advise N/2 GPUs, twice the microbatches, `transit-launch run --policy advise` under the
              emulated GPU: the scaled-in layout.
So half-advise / full = (half-off / full) x (half-advise / half-off): the first factor is what
scaling in costs without offloading (collectives that no longer overlap, launch gaps), the second
what offloading costs. NVML's PCIe counters, sampled in a thread while each run trains, give the
bytes each GPU moved over PCIe a step (host memory read and written zero-copy), so the offload
seconds can be set against bytes / bandwidth.

    python3 bench/scale_in_matrix.py --gpus 2 --configs ac:1,ac:2,noac:1,noac:2 --repeats 2 \
        --out scale_in_matrix.json
    python3 bench/scale_in_matrix.py --report scale_in_matrix.json [more.json ...]

The emulated GPU (`--emulated-gpu auto`) is bench/scale_in.py's planner size, raised to the full
layout's measured peak reserved memory (rounded up to 256 MiB) when the planner predicts less: the
full layout is what ran on that card, so it must fit it (the planner under-predicted this trainer
with recomputation after issue 18: 16.91 GB against a measured 18.48).

A configuration is RECOMPUTE:ACCUM (ac: full activation checkpointing, noac: none; ACCUM microbatches a step in the full
layout). --deadline stops starting runs after that many seconds (the JSON is rewritten after
every run, so a cut call keeps what finished). `--device cpu` runs the plumbing on gloo ranks.
"""

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from common import ROOT, env, run, trainer_records, transit, out_option
import scale_in
from transit_launch.rules import ENV

# layout -> (divisor of N for its GPUs, factor of the microbatches, policy, environment)
LAYOUTS = {"full": (1, 1, "off", {}), "half-off": (2, 2, "off", {}), "half-advise": (2, 2, "advise", {}),
           "half-host": (2, 2, "advise", {ENV["OVERLAP_STEP"]: "host"})}


class PcieSampler:
    """NVML PCIe throughput (KB/s over 20 ms windows) of every GPU, sampled back to back."""

    def __init__(self):
        self.samples, self.stop, self.thread, self.error = [], threading.Event(), None, None
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception as e:  # noqa: BLE001 - no NVML: no PCIe numbers, the rest still runs
            self.nvml, self.error = None, f"{type(e).__name__}: {e}"

    def _loop(self):
        n = self.nvml
        while not self.stop.is_set():
            for i, h in enumerate(self.handles):
                try:
                    tx = n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES)
                    rx = n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_RX_BYTES)
                except Exception as e:  # noqa: BLE001
                    self.error = f"{type(e).__name__}: {e}"
                    return
                self.samples.append((time.time(), i, tx * 1e3, rx * 1e3))

    def __enter__(self):
        if self.nvml:
            self.thread = threading.Thread(target=self._loop, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        if self.thread:
            self.thread.join(5)

    def window(self, t0, t1, gpus):
        """Mean device-to-host (tx) and host-to-device (rx) GB/s per GPU between t0 and t1."""
        out = {}
        for g in gpus:
            s = [(tx, rx) for t, i, tx, rx in self.samples if i == g and t0 <= t <= t1]
            if s:
                out[str(g)] = {"tx_gbps": statistics.mean(x[0] for x in s) / 1e9,
                               "rx_gbps": statistics.mean(x[1] for x in s) / 1e9, "samples": len(s)}
        return out


def run_layout(a, cfg, name, ngpus, accum, policy, budget, sampler, extra_env=None):
    recompute, _ = cfg
    model = (a.model + (" --no-recompute" if recompute == "noac" else "")).strip()
    stats = tempfile.mkdtemp(prefix="scale-in-")
    trainer = ["torchrun", "--standalone", "--nproc-per-node", str(ngpus), str(ROOT / "examples" / "train_llama.py"),
               *model.split(), "--seq-len", str(a.seq_len), "--batch", str(a.batch), "--accum", str(accum),
               "--steps", str(a.steps), "--comm-profile", "2", "--device", a.device]
    cmd = transit(policy, trainer, stats, budget if policy != "off" else None)
    t_start = time.time()
    out, err, rc = run(cmd, env(CUDA_VISIBLE_DEVICES=",".join(str(i) for i in range(ngpus)), **(extra_env or {})),
                       a.timeout)
    wall = time.time() - t_start
    recs, summ = trainer_records(out)
    summ = summ or {}
    from transit_launch.preload import run as runmod
    st = runmod.read_stats(stats)
    procs = runmod.summary(st)["processes"] if st else []
    spec = SimpleNamespace(model=model, seq_len=a.seq_len, batch=a.batch, gpus=ngpus)
    r = {"layout": name, "recompute": recompute, "gpus": ngpus, "policy": policy, "env": extra_env or {},
         "budget_bytes": budget if policy != "off" else None, "emulated_gpu_bytes": budget, "accum": accum,
         "global_sequences": a.batch * accum * ngpus, "tokens_per_step_per_gpu": summ.get("tokens_per_step"),
         "rc": rc, "wall_s": round(wall, 1), "tflops_per_gpu": summ.get("tflops_per_gpu"),
         "median_step_s": summ.get("median_step_time"), "step_time_spread": summ.get("step_time_spread"),
         "step_times": [x["step_time"] for x in recs], "max_reserved_gb": summ.get("max_reserved_gb"),
         "max_allocated_gb": summ.get("max_allocated_gb"), "losses": summ.get("losses"),
         "host_peak_rss_gb": summ.get("host_peak_rss_gb"), "shim": procs,
         "offloaded_gb_per_gpu": [p["host_placed_peak_gb"] for p in procs if not p["passthrough"]],
         "comm_profile_rank0": summ.get("comm_profile"),
         "sent_gb_per_gpu_measured": scale_in.measured_sent_bytes(summ.get("comm_profile"), ngpus) / 1e9,
         "sent_gb_per_gpu_planner": scale_in.predicted_sent_bytes(spec, ngpus, accum) / 1e9}
    if name == "full":
        r["fits_emulated_gpu"] = bool(r["max_reserved_gb"]) and r["max_reserved_gb"] * 1e9 <= budget
    steady = [x for x in recs if x["step"] > 3]
    if sampler and len(steady) >= 2:
        # the steady steps' window: from the end of step 3 to the end of the last step
        t0 = next(x["t_end"] for x in recs if x["step"] == 3)
        r["pcie"] = sampler.window(t0, steady[-1]["t_end"], range(ngpus))
        r["pcie_gb_per_step"] = {g: {"d2h": v["tx_gbps"] * r["median_step_s"], "h2d": v["rx_gbps"] * r["median_step_s"]}
                                 for g, v in r["pcie"].items()} if r["median_step_s"] else None
    if rc:
        r["stderr_tail"] = err[-2500:]
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=2, help="N: the full layout's GPUs (N/2 for the scaled-in ones)")
    ap.add_argument("--configs", default="ac:1,ac:2,noac:1,noac:2", help="RECOMPUTE:ACCUM,... (see the doc)")
    ap.add_argument("--layouts", default="full,half-off,half-advise", help=f"of {', '.join(LAYOUTS)}")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--half-off-repeats", type=int, default=1, help="repeats of the half-off layout (a reference)")
    ap.add_argument("--model", default="", help="trainer model flags (default: its 1.0 B-parameter model)")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--timeout", type=int, default=150)
    ap.add_argument("--deadline", type=float, default=0, help="start no run after this many seconds (0: none)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--emulated-gpu", default="auto", help="bytes, or auto per configuration (bench/scale_in.py)")
    out_option(ap, "scale_in_matrix")
    ap.add_argument("--report", nargs="*", help="print the tables of these result files and stop")
    a = ap.parse_args()
    if a.report:
        return report(a.report)
    t_begin = time.time()
    cfgs = [(c.split(":")[0], int(c.split(":")[1])) for c in a.configs.split(",")]
    layouts = a.layouts.split(",")
    if not set(layouts) <= set(LAYOUTS):
        print(f"scale_in_matrix: unknown layout in {a.layouts!r} (layouts: {', '.join(LAYOUTS)})", file=sys.stderr)
        return 2
    budgets = {}
    for rec, _ in cfgs:
        spec = SimpleNamespace(model=(a.model + (" --no-recompute" if rec == "noac" else "")).strip(),
                               seq_len=a.seq_len, batch=a.batch, gpus=a.gpus)
        if a.emulated_gpu != "auto":
            from transit_launch import units
            budgets[rec] = units.parse_size(a.emulated_gpu)
        else:
            budgets[rec] = scale_in.auto_emulated_gpu(spec)
        budgets[rec + "_planner"] = {"full": scale_in.planner_peak(spec, a.gpus),
                                     "scaled_in": scale_in.planner_peak(spec, a.gpus // 2)}
    result = {"command": " ".join(sys.argv), "device": a.device, "seq_len": a.seq_len, "batch": a.batch,
              "steps": a.steps, "budgets": budgets, "runs": [], "skipped": []}
    sampler = PcieSampler() if a.device == "cuda" else None
    if sampler and sampler.error:
        result["pcie_error"] = sampler.error
    plan = []
    for rep in range(1, a.repeats + 1):
        for cfg in cfgs:
            for name in layouts:
                if name == "half-off" and rep > a.half_off_repeats:
                    continue
                plan.append((rep, cfg, name))
    with sampler or contextlib.nullcontext():
        for rep, cfg, name in plan:
            rec, accum = cfg
            if a.deadline and time.time() - t_begin > a.deadline:
                result["skipped"].append({"repeat": rep, "recompute": rec, "accum": accum, "layout": name})
                continue
            div, factor, policy, extra = LAYOUTS[name]
            r = run_layout(a, cfg, name, a.gpus // div, factor * accum, policy, budgets[rec], sampler, extra)
            r["repeat"] = rep
            if name == "full" and a.emulated_gpu == "auto":
                raised = fit_full(budgets, rec, r)
                if raised:
                    print(f"scale_in_matrix: {rec}: the full layout's peak ({r['max_reserved_gb']:.2f} GB) is over the "
                          f"planner's emulated GPU; the later layouts get {raised / 1e9:.2f} GB", flush=True)
            result["runs"].append(r)
            print(json.dumps({k: r.get(k) for k in ("repeat", "recompute", "layout", "gpus", "accum", "rc", "wall_s",
                                                     "tflops_per_gpu", "median_step_s", "max_reserved_gb",
                                                     "offloaded_gb_per_gpu", "sent_gb_per_gpu_measured",
                                                     "pcie_gb_per_step")}), flush=True)
            if r["rc"]:
                print(r.get("stderr_tail", "")[-800:], file=sys.stderr, flush=True)
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(result, indent=1))
    Path(a.out).write_text(json.dumps(result, indent=1))
    report([a.out])
    return 0 if all(r["rc"] == 0 for r in result["runs"]) else 1


def fit_full(budgets, rec, full_run):
    """Raise the emulated GPU of `rec` to the full layout's measured peak (256 MiB steps) when
    that run did not fit it; the new size, or None when it fitted (or did not run)."""
    peak = full_run.get("max_reserved_gb")
    if full_run.get("rc") or not peak or peak * 1e9 <= budgets[rec]:
        return None
    budgets.setdefault(rec + "_planner_size", budgets[rec])
    budgets[rec] = -(-int(peak * 1e9) // 2**28) * 2**28
    return budgets[rec]


def avg(xs):
    xs = [x for x in xs if x is not None]
    return statistics.mean(xs) if xs else float("nan")


def report(paths):
    runs = []
    for p in paths:
        runs += json.loads(Path(p).read_text())["runs"]
    print(f"{'recompute':<9} {'accum':>5} {'layout':<12} {'reps':>4} {'TFLOPS/GPU':>18} {'step s':>7} "
          f"{'reserved GB':>11} {'offloaded GB/GPU':>16} {'sent GB/GPU/step':>16} {'PCIe GB/step h2d,d2h':>20}")
    # runs compare only under one emulated GPU (files from calls with another size stay apart)
    keys = sorted({(r["recompute"], r["accum"] if r["layout"] == "full" else r["accum"] // 2,
                    r.get("emulated_gpu_bytes") or 0) for r in runs})
    for rec, acc, emu in keys:
        base = {}
        over = False  # a full run over the emulated GPU it shared with a scaled-in one: not a scale-in
        for name in LAYOUTS:
            rs = [r for r in runs if r["recompute"] == rec and r["layout"] == name and r["rc"] == 0
                  and (r["accum"] if name == "full" else r["accum"] // 2) == acc
                  and (r.get("emulated_gpu_bytes") or 0) == emu]
            if not rs:
                continue
            over |= name == "full" and any(r.get("fits_emulated_gpu") is False for r in rs)
            tf = [r["tflops_per_gpu"] for r in rs]
            base[name] = statistics.mean(tf)
            pc = [r.get("pcie_gb_per_step") or {} for r in rs]
            h2d = [sum(v["h2d"] for v in p.values()) / max(len(p), 1) for p in pc if p]
            d2h = [sum(v["d2h"] for v in p.values()) / max(len(p), 1) for p in pc if p]
            off = [max(r["offloaded_gb_per_gpu"] or [0]) for r in rs]
            print(f"{rec:<9} {acc:>5} {name:<12} {len(rs):>4} "
                  f"{' / '.join(f'{x:.1f}' for x in tf):>18} {avg(r['median_step_s'] for r in rs):>7.3f} "
                  f"{avg(r['max_reserved_gb'] for r in rs):>11.2f} {avg(off):>16.2f} "
                  f"{avg(r['sent_gb_per_gpu_measured'] for r in rs):>16.2f} "
                  f"{(f'{statistics.mean(h2d):.2f}, {statistics.mean(d2h):.2f}' if h2d else '-'):>20}")
        for half in ("half-advise", "half-host"):
            if "full" in base and half in base:
                line = (f"  -> {half}: scaled-in {100 * base[half] / base['full']:.1f}% of full per GPU "
                        f"(emulated GPU {emu / 1e9:.2f} GB)")
                if "half-off" in base:
                    line += (f" = {100 * base['half-off'] / base['full']:.1f}% (half the GPUs, no offload) x "
                             f"{100 * base[half] / base['half-off']:.1f}% (offloading)")
                if over:
                    line += " [the full layout's peak was over the emulated GPU: pass --emulated-gpu]"
                print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
