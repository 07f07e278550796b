"""TorchTitan's own GPU memory for the catalog models at truncated depth (issue 18, item 1).

Each run is TorchTitan's unchanged trainer (`torchtitan.train.Trainer`, its model, loss,
optimizer, FSDP2/TP/PP, full activation checkpointing, its default mixed precision) on a
catalog model with its real hidden size, heads, vocabulary and experts but only `--layers`
layers, sequence 8192, local batch 1 or 4, local assets (bench/torchtitan_assets.py: no
downloads). A subclass of the Trainer only observes:

- the allocator's counters at every phase boundary of every step (step start, forward up to
  the loss, loss, backward, gradient clipping, optimizer), with the peak allocated inside
  each phase (torch.cuda.max_memory_allocated, reset at each boundary; the run's overall
  max_memory_reserved/max_memory_allocated are kept across the resets);
- the persistent tensors at the end of the run (parameters, gradients, optimizer states,
  buffers: local shards, bytes);
- one step (--record-step) under torch.cuda.memory._record_memory_history (Python stacks):
  the allocator snapshot's segments (reserved, allocated, inactive split) and a replay of
  the step's trace that classifies every block live at the step's peak (and at each
  phase's peak) by who allocated it: param / grad / optimizer_state / buffer (blocks older
  than the recording, matched by address), fsdp_all_gather (unsharded parameters),
  fsdp_reduce_scatter, forward (activations and saved tensors), loss (logits in fp32, the
  cross-entropy), recompute (activation checkpointing in backward), moe, tp_collectives,
  pipelining, grad_clip, optimizer, backward_autograd (no Python frame: the autograd
  engine's gradients of activations and weights), other.

So a per-layer term is (peak at 4 layers - peak at 2 layers) / 2 and the per-model term what
is left, category by category.

    # one run (any layout), under torchrun:
    torchrun --standalone --nproc-per-node 1 bench/titan_memory.py --worker --model llama3-8b --layers 2 \
        --local-batch 1 --assets DIR --out run.json
    # a matrix, 1-GPU runs in parallel lanes (one per GPU), then the multi-GPU ones:
    python3 bench/titan_memory.py --matrix "llama3-8b:2,4:1,4:1gpu" --out titan_memory.json
    python3 bench/titan_memory.py --report titan_memory.json

A matrix entry is MODEL:LAYERS:BATCHES:LAYOUT with comma lists (LAYOUT: 1gpu, fsdp2, tp2, pp2),
entries separated by ';'.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from common import out_option  # noqa: E402 (bench/ is the script's folder: on sys.path)

# catalog card -> TorchTitan 0.2.2 (module, flavor)
TITAN = {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"), "llama3-405b": ("llama3", "405B"),
         "llama4-scout": ("llama4", "17bx16e"), "qwen3-32b": ("qwen3", "32B"),
         "qwen3-30b-a3b": ("qwen3", "30B-A3B"),
         # TorchTitan's debug models, for smoke tests of this script
         "llama3-debug": ("llama3", "debugmodel"), "qwen3-debug-moe": ("qwen3", "debugmodel_moe")}
LAYOUTS = {"1gpu": dict(gpus=1, dp_shard=1, tp=1, pp=1), "fsdp2": dict(gpus=2, dp_shard=2, tp=1, pp=1),
           "tp2": dict(gpus=2, dp_shard=1, tp=2, pp=1), "pp2": dict(gpus=2, dp_shard=1, tp=1, pp=2)}
MARK_UNIT = 512  # marker allocations: (MARK_BASE + index) x 512 bytes, from _marker() below
MARK_BASE = 1013
PHASES = ["step_start", "fb_start", "loss_start", "loss_end", "fb_end", "opt_start", "opt_end", "step_end"]


# ----------------------------------------------------------------------------- worker

def titan_args(a, module, flavor, layout, dump):
    args = ["--model.name", module, "--model.flavor", flavor, "--model.hf-assets-path", f"{a.assets}/tokenizer",
            "--training.dataset", "c4_test", "--training.dataset-path", f"{a.assets}/c4_synthetic",
            "--validation.no-enable", "--job.dump-folder", dump, "--checkpoint.no-enable",
            "--training.steps", str(a.steps), "--training.seq-len", str(a.seq_len),
            "--training.local-batch-size", str(a.local_batch), "--activation-checkpoint.mode", "full",
            "--metrics.log-freq", "1", "--metrics.disable-color-printing", "--debug.seed", "0",
            "--lr-scheduler.warmup-steps", "1",
            "--parallelism.data-parallel-shard-degree", str(layout["dp_shard"]),
            "--parallelism.tensor-parallel-degree", str(layout["tp"]),
            "--parallelism.pipeline-parallel-degree", str(layout["pp"])]
    if layout["pp"] > 1:
        # one microbatch a sequence (TorchTitan's default microbatch size 1), 1F1B
        args += ["--parallelism.pipeline-parallel-schedule", "1F1B"]
    return args + a.titan_extra


def _marker(torch, index):
    torch.empty((MARK_BASE + index) * MARK_UNIT, dtype=torch.uint8, device="cuda")


class Recorder:
    def __init__(self, torch, record_step):
        self.torch, self.record_step = torch, record_step
        self.events, self.recording, self.snapshot = [], False, None
        self.max_alloc = self.max_reserved = 0
        self.step = 0
        self.t0_alloc = None

    def mark(self, name):
        c = self.torch.cuda
        peak, rpeak = c.max_memory_allocated(), c.max_memory_reserved()
        self.max_alloc, self.max_reserved = max(self.max_alloc, peak), max(self.max_reserved, rpeak)
        self.events.append({"step": self.step, "phase": name, "allocated": c.memory_allocated(),
                            "reserved": c.memory_reserved(), "peak_allocated_since_last": peak,
                            "peak_reserved_since_last": rpeak})
        c.reset_peak_memory_stats()
        if self.recording:
            _marker(self.torch, PHASES.index(name))

    def begin_step(self, step):
        self.step = step
        if step == self.record_step:
            self.t0_alloc = self.torch.cuda.memory_allocated()
            self.torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                                          max_entries=2_000_000)
            self.recording = True
        self.mark("step_start")

    def end_step(self, step):
        self.mark("step_end")
        if self.recording:
            self.snapshot = self.torch.cuda.memory._snapshot()
            self.torch.cuda.memory._record_memory_history(enabled=None)
            self.recording = False


def tensor_ranges(torch, model_parts, optimizers):
    """(start, end, category) of the storages of parameters, gradients, optimizer states, buffers."""
    from torch.distributed.tensor import DTensor

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    out, totals = [], {"param": 0, "grad": 0, "optimizer_state": 0, "buffer": 0}
    seen = set()

    def add(t, cat):
        t = local(t)
        if not isinstance(t, torch.Tensor) or t.device.type != "cuda":
            return
        st = t.untyped_storage()
        key = st.data_ptr()
        if key in seen:
            return
        seen.add(key)
        out.append((key, key + st.nbytes(), cat))
        totals[cat] += st.nbytes()

    for m in model_parts:
        for p in m.parameters():
            add(p, "param")
            if p.grad is not None:
                add(p.grad, "grad")
        for b in m.buffers():
            add(b, "buffer")
    for opt in getattr(optimizers, "optimizers", [optimizers]):
        for st in opt.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor) and v.numel() > 1:
                    add(v, "optimizer_state")
    return out, totals


def classify(frames, phase):
    """A block's category from the Python stack that allocated it and the phase it was allocated in."""
    if not frames:
        return {"forward": "forward_no_python_frame", "loss": "loss",
                "backward": "backward_autograd"}.get(phase, f"{phase}_no_python_frame")
    names = [(f.get("filename", ""), f.get("name", "")) for f in frames]
    text = " ".join(f"{fn}:{nm}" for fn, nm in names)
    if "torch/optim/" in text or "components/optimizer" in text:
        return "optimizer"
    if "clip_grad" in text:
        return "grad_clip"
    if "_fsdp_collectives" in text or "_fsdp_param_group" in text or "_fsdp_param.py" in text:
        if "reduce" in text:
            return "fsdp_reduce_scatter"
        return "fsdp_all_gather"
    if any(nm in ("unpack_hook", "recompute_fn", "_checkpoint_hook") for _, nm in names) or "recompute" in text:
        return "recompute"
    if "pipelining" in text:
        return "pipelining"
    if "_functional_collectives" in text or "tensor/parallel" in text or "distributed/tensor/_" in text:
        return "tp_collectives" if phase != "loss" else "loss"
    if "components/loss" in text or "cross_entropy" in text or phase == "loss":
        return "loss"
    if "/moe/" in text:
        return "moe_" + phase
    if phase == "forward":
        return "forward"
    if phase == "backward":
        return "backward_python"
    return phase + "_other"


def replay(snap, ranges, device=0):
    """Replay the recorded step: the live blocks by category at the step's allocated peak and at
    each phase's peak."""
    trace = snap["device_traces"][device]
    final_live = {}
    for seg in snap["segments"]:
        if seg.get("device", device) != device:
            continue
        addr = seg["address"]
        for b in seg["blocks"]:
            if b["state"] in ("active_allocated", "active_pending_free"):
                final_live[addr] = (b["size"], b.get("frames") or [])
            addr += b["size"]
    seen_first = {}
    for e in trace:
        if e["action"] in ("alloc", "free_requested", "free_completed"):
            seen_first.setdefault(e["addr"], e)

    def old_cat(addr, size):
        for s, _t, cat in ranges:
            if addr <= s < addr + size:
                return cat
        return "older_than_step"

    live = {}
    for addr, e in seen_first.items():
        if e["action"] != "alloc":
            live[addr] = (e["size"], old_cat(addr, e["size"]), "before")
    for addr, (size, _) in final_live.items():
        if addr not in seen_first:
            live[addr] = (size, old_cat(addr, size), "before")
    start_bytes = sum(v[0] for v in live.values())
    phase_of_mark = {(MARK_BASE + i) * MARK_UNIT: p for i, p in enumerate(PHASES)}
    phase, total = "step_start", start_bytes
    cur_phase_name = {"step_start": "forward", "fb_start": "forward", "loss_start": "loss", "loss_end": "backward",
                      "fb_end": "clip", "opt_start": "optimizer", "opt_end": "after_optimizer",
                      "step_end": "after_step"}
    best = {"bytes": -1}
    phase_best = {}

    cats = {}
    for size, cat, _ in live.values():
        cats[cat] = cats.get(cat, 0) + size

    def compose():
        return dict(sorted(((k, v) for k, v in cats.items() if v), key=lambda kv: -kv[1]))

    pending_marks = set()
    for e in trace:
        act, addr, size = e["action"], e["addr"], e["size"]
        if act == "alloc":
            fr = e.get("frames") or []
            if size in phase_of_mark and any("titan_memory" in f.get("filename", "") and f.get("name") == "_marker"
                                             for f in fr):
                phase = phase_of_mark[size]
                pending_marks.add(addr)
                continue
            cat = classify(fr, cur_phase_name[phase])
            if addr in live:  # not freed in the trace (should not happen): count it once
                total -= live[addr][0]
                cats[live[addr][1]] -= live[addr][0]
            live[addr] = (size, cat, phase)
            cats[cat] = cats.get(cat, 0) + size
            total += size
            if total > best["bytes"]:
                best = {"bytes": total, "phase": cur_phase_name[phase], "by_category": None}
                best["by_category"] = compose()
            pb = phase_best.get(cur_phase_name[phase])
            if pb is None or total > pb["bytes"]:
                phase_best[cur_phase_name[phase]] = {"bytes": total, "by_category": compose()}
        elif act == "free_completed":
            if addr in pending_marks:
                pending_marks.discard(addr)
                continue
            if addr in live:
                size0, cat0, _ = live.pop(addr)
                total -= size0
                cats[cat0] -= size0
    return {"replay_start_bytes": start_bytes, "replay_end_bytes": total, "trace_entries": len(trace),
            "peak": best, "phase_peaks": phase_best}


def snapshot_summary(snap, device=0):
    seg = [s for s in snap["segments"] if s.get("device", device) == device]
    out = {"segments": len(seg), "reserved": sum(s["total_size"] for s in seg),
           "allocated": sum(s["allocated_size"] for s in seg), "active": sum(s["active_size"] for s in seg),
           "requested": sum(s.get("requested_size", 0) for s in seg)}
    for pool in ("large", "small"):
        ps = [s for s in seg if s.get("segment_type") == pool]
        out[f"{pool}_pool_reserved"] = sum(s["total_size"] for s in ps)
        out[f"{pool}_pool_allocated"] = sum(s["allocated_size"] for s in ps)
    out["inactive_split"] = out["reserved"] - out["allocated"]
    out["largest_segment"] = max((s["total_size"] for s in seg), default=0)
    return out


def worker(a):
    import torch
    import torchtitan.train as tt
    from torchtitan.protocols.train_spec import get_train_spec

    module, flavor = TITAN[a.model]
    margs = get_train_spec(module).model_args[flavor]
    margs.n_layers = a.layers
    layout = LAYOUTS[a.layout]
    rank = int(os.environ.get("RANK", 0))
    rec = Recorder(torch, a.record_step if rank == 0 else -1)
    info = {}

    class MemTrainer(tt.Trainer):
        def __init__(self, job_config):
            super().__init__(job_config)
            rec.mark("after_init")
            info["after_init_allocated"] = torch.cuda.memory_allocated()
            info["params_total"] = sum(p.numel() for m in self.model_parts for p in m.parameters())
            loss_fn = self.loss_fn

            def wrapped_loss(pred, labels, *args, **kw):
                rec.mark("loss_start")
                out = loss_fn(pred, labels, *args, **kw)
                rec.mark("loss_end")
                return out
            self.loss_fn = wrapped_loss
            opt_step = self.optimizers.step

            def wrapped_step(*args, **kw):
                rec.mark("opt_start")
                out = opt_step(*args, **kw)
                rec.mark("opt_end")
                return out
            self.optimizers.step = wrapped_step

        def forward_backward_step(self, **kw):
            rec.mark("fb_start")
            out = super().forward_backward_step(**kw)
            rec.mark("fb_end")
            return out

        def train_step(self, data_iterator):
            rec.begin_step(self.step)
            super().train_step(data_iterator)
            rec.end_step(self.step)

        def close(self):
            try:
                finish(self)
            finally:
                super().close()

    def finish(tr):
        ranges, totals = tensor_ranges(torch, tr.model_parts, tr.optimizers)
        res = {"rank": rank, "world": int(os.environ.get("WORLD_SIZE", 1)),
               "max_memory_reserved": max(rec.max_reserved, torch.cuda.max_memory_reserved()),
               "max_memory_allocated": max(rec.max_alloc, torch.cuda.max_memory_allocated()),
               "persistent": totals, "phases": rec.events, "steps_run": tr.step, **info,
               "memory_stats": {k: v for k, v in torch.cuda.memory_stats().items()
                                if k in ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free")}}
        if rec.snapshot is not None:
            try:
                res["snapshot"] = snapshot_summary(rec.snapshot, torch.cuda.current_device())
                res["replay"] = replay(rec.snapshot, ranges, torch.cuda.current_device())
                res["replay"]["recording_start_allocated"] = rec.t0_alloc
            except Exception as e:  # noqa: BLE001 - the counters above still count
                res["replay_error"] = f"{type(e).__name__}: {e}"
        Path(f"{a.out}.rank{rank}").write_text(json.dumps(res))

    # torchtitan.train.main(MemTrainer), with our arguments (ConfigManager.parse_args's default
    # is the sys.argv of import time)
    from torchtitan.config import ConfigManager
    from torchtitan.tools.logging import init_logger
    init_logger()
    config = ConfigManager().parse_args(titan_args(a, module, flavor, layout, a.dump))
    trainer = None
    try:
        trainer = MemTrainer(config)
        trainer.train()
    except Exception:
        if trainer:
            trainer.close()
        raise
    trainer.close()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


# ----------------------------------------------------------------------------- driver

def parse_matrix(spec):
    jobs = []
    for entry in filter(None, (x.strip() for x in spec.split(";"))):
        model, layers, batches, layouts = entry.split(":")
        for lay in layouts.split(","):
            for L in layers.split(","):
                for b in batches.split(","):
                    jobs.append({"model": model, "layers": int(L), "local_batch": int(b), "layout": lay})
    return jobs


def run_job(a, job, gpus, work):
    layout = LAYOUTS[job["layout"]]
    tag = f"{job['model']}_L{job['layers']}_b{job['local_batch']}_{job['layout']}"
    out = work / f"{tag}.json"
    dump = work / f"dump_{tag}"
    cmd = ["torchrun", "--standalone", "--nproc-per-node", str(layout["gpus"]), str(Path(__file__).resolve()),
           "--worker", "--model", job["model"], "--layers", str(job["layers"]), "--local-batch",
           str(job["local_batch"]), "--layout", job["layout"], "--assets", str(a.assets), "--steps", str(a.steps),
           "--seq-len", str(a.seq_len), "--record-step", str(a.record_step), "--out", str(out), "--dump", str(dump),
           *a.titan_extra]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(map(str, gpus)), NCCL_NVLS_ENABLE="0",
               TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1", PYTHONUNBUFFERED="1")
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=a.timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        import signal
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            log, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            log, _ = proc.communicate()
        rc = "timeout"
    module, flavor = TITAN[job["model"]]
    r = {**job, "titan_module": module, "titan_flavor": flavor, "seq_len": a.seq_len, "layout_detail": layout,
         "activation_checkpoint": "full",
         "mixed_precision": ("FSDP2 MixedPrecisionPolicy: bf16 params, fp32 reduce" if layout["dp_shard"] > 1 else
                             "none: fp32 (TorchTitan disables mixed precision for TP/PP without FSDP)"
                             if layout["tp"] > 1 or layout["pp"] > 1 else "torch.autocast bf16 (1 GPU: no FSDP)"),
         "rc": rc, "wall_s": round(time.time() - t0, 1), "ranks": []}
    for rk in range(layout["gpus"]):
        p = Path(f"{out}.rank{rk}")
        if p.exists():
            r["ranks"].append(json.loads(p.read_text()))
    if r["ranks"]:
        r["reserved"] = max(x["max_memory_reserved"] for x in r["ranks"])
        r["allocated"] = max(x["max_memory_allocated"] for x in r["ranks"])
    oom = "OutOfMemoryError" in (log or "") or "CUDA out of memory" in (log or "")
    r["oom"] = oom
    if rc != 0:
        r["log_tail"] = (log or "")[-3000:]
    import re
    r["titan_log_memory"] = re.findall(r"memory:\s+([0-9.]+)GiB\(([0-9.]+)%\)", log or "")[-1:]
    return r


def driver(a):
    t_begin = time.time()
    work = Path(tempfile.mkdtemp(prefix="titan-mem-"))
    a.assets = work / "assets"
    subprocess.run([sys.executable, str(ROOT / "bench" / "torchtitan_assets.py"), str(a.assets)], check=True)
    jobs = parse_matrix(a.matrix)
    import torch
    from importlib.metadata import version
    result = {"command": " ".join(sys.argv), "torchtitan": version("torchtitan"), "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
              "schema": "runs[]: model (catalog card), titan_module/titan_flavor, layers (truncated depth), "
                        "local_batch, seq_len, layout (1gpu|fsdp2|tp2|pp2) and layout_detail, mixed_precision, rc, "
                        "oom, reserved/allocated (bytes: max over ranks of torch.cuda.max_memory_reserved/allocated), "
                        "ranks[]: per rank max_memory_reserved, max_memory_allocated, persistent (bytes of param, "
                        "grad, optimizer_state, buffer local shards at the end), phases[] (allocator counters at "
                        "every phase boundary, peak_allocated_since_last = the peak inside the phase that ends "
                        "there), snapshot (segments of the recorded step's end: reserved, allocated, "
                        "inactive_split, pools), replay.peak (bytes and by_category at the recorded step's "
                        "allocated peak), replay.phase_peaks (the same at each phase's peak)",
              "runs": [], "skipped": []}
    ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    lock = threading.Lock()

    def save():
        with lock:
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(result, indent=1))

    def record(r):
        with lock:
            result["runs"].append(r)
        short = {k: r.get(k) for k in ("model", "layers", "local_batch", "layout", "rc", "oom", "wall_s")}
        short["reserved_gb"] = round(r["reserved"] / 1e9, 2) if r.get("reserved") else None
        short["allocated_gb"] = round(r["allocated"] / 1e9, 2) if r.get("allocated") else None
        print(json.dumps(short), flush=True)
        if r["rc"] != 0 and not r["oom"]:
            print(r.get("log_tail", "")[-1500:], flush=True)
        save()

    def late():
        return a.deadline and time.time() - t_begin > a.deadline

    single = [j for j in jobs if LAYOUTS[j["layout"]]["gpus"] == 1]
    multi = [j for j in jobs if LAYOUTS[j["layout"]]["gpus"] > 1]
    queue = list(single)

    def lane(g):
        while True:
            with lock:
                if not queue:
                    return
                job = queue.pop(0)
            if late():
                with lock:
                    result["skipped"].append(job)
                continue
            record(run_job(a, job, [g], work))

    threads = [threading.Thread(target=lane, args=(g,)) for g in range(max(1, min(ngpu, a.lanes)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for job in multi:
        if late() or ngpu < LAYOUTS[job["layout"]]["gpus"]:
            result["skipped"].append(job)
            continue
        record(run_job(a, job, list(range(LAYOUTS[job["layout"]]["gpus"])), work))
    save()
    report([a.out])
    return 0


def report(paths):
    runs = []
    for p in paths:
        runs += json.loads(Path(p).read_text())["runs"]
    print(f"{'model':<14} {'layout':<6} {'L':>2} {'b':>2} {'rc':>7} {'reserved GB':>11} {'allocated GB':>12} "
          f"{'param':>6} {'grad':>6} {'optim':>6}  peak phase / top categories (GB)")
    for r in sorted(runs, key=lambda r: (r["model"], r["layout"], r["local_batch"], r["layers"])):
        r0 = (r.get("ranks") or [{}])[0]
        pers = r0.get("persistent", {})
        peak = (r0.get("replay") or {}).get("peak") or {}
        cats = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in list((peak.get("by_category") or {}).items())[:5])
        print(f"{r['model']:<14} {r['layout']:<6} {r['layers']:>2} {r['local_batch']:>2} "
              f"{('OOM' if r.get('oom') else str(r['rc'])):>7} "
              f"{(r.get('reserved') or 0) / 1e9:>11.2f} {(r.get('allocated') or 0) / 1e9:>12.2f} "
              f"{pers.get('param', 0) / 1e9:>6.1f} {pers.get('grad', 0) / 1e9:>6.1f} "
              f"{pers.get('optimizer_state', 0) / 1e9:>6.1f}  {peak.get('phase', '-')}: {cats}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help="one run, inside torchrun")
    ap.add_argument("--model", choices=sorted(TITAN))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--local-batch", type=int, default=1)
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="1gpu")
    ap.add_argument("--assets", default="")
    ap.add_argument("--dump", default="")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--record-step", type=int, default=2, help="the step whose allocations are traced")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--matrix", default="", help="MODEL:LAYERS:BATCHES:LAYOUTS;... (see the doc)")
    ap.add_argument("--lanes", type=int, default=2, help="1-GPU runs in parallel, one GPU each")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per run")
    ap.add_argument("--deadline", type=float, default=0, help="start no run after this many seconds")
    out_option(ap, "titan_memory")
    ap.add_argument("--report", nargs="*")
    a, extra = ap.parse_known_args()
    a.titan_extra = [x for x in extra if x != "--"]
    if a.report:
        return report(a.report)
    if a.worker:
        return worker(a)
    if not a.matrix:
        ap.error("--matrix or --worker or --report")
    return driver(a)


if __name__ == "__main__":
    raise SystemExit(main())
