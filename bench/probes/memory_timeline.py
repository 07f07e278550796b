"""Live GPU memory over one training step, at layer granularity and in GPU time: what a
lifetime-aware policy has to work with (issue 7's stretch: move optimizer state out
during forward and back during backward instead of reading it over PCIe inside the
optimizer step).

Runs examples/train_llama.py in this process, unchanged, with global hooks: module
forward pre/post hooks (blocks, the model), a gradient hook on every block's output (the
start of that block's backward), torch.optim's global step hooks. At each point it
records torch.cuda.memory_allocated() (in stream order on one stream: allocation and
free happen in program order) and a CUDA event on the current stream; the events give
GPU times once the step is over.

Then `bound`: with the optimizer state (O bytes) on the GPU outside the window where
allocated + O exceeds the budget, and moved at the PCIe rate in each direction, the
least time the step must wait for it. That is the best a lifetime-aware policy can do
with this memory profile, against advise's zero-copy cost (O / rate, full duplex).

    python3 bench/probes/memory_timeline.py --step 5 --out t.json -- --seq-len 8192 --batch 2 --accum 1
    python3 bench/probes/memory_timeline.py --analyze t.json [--budget BYTES] [--rate 50e9]
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: common.py
from common import is_module, run_trainer_here, split_trainer_args


class Recorder:
    """Marks of one training step (the `step`-th optimizer step, 1-based)."""

    def __init__(self, step: int):
        self.step, self.done_steps, self.marks = step, 0, []
        self.blocks, self.opt_bytes = {}, 0
        self.cuda = None

    @property
    def active(self):
        return self.done_steps == self.step - 1

    def mark(self, label: str):
        if not self.active:
            return
        import torch
        if self.cuda is None:
            self.cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append([label, ev, torch.cuda.memory_allocated(), torch.cuda.memory_reserved()])
        else:
            self.marks.append([label, time.perf_counter(), 0, 0])

    def resolve(self) -> list[dict]:
        """[{label, t_ms, allocated, reserved}], times from the step's first mark."""
        if not self.marks:
            return []
        if self.cuda:
            import torch
            torch.cuda.synchronize()
            t0 = self.marks[0][1]
            return [{"label": m[0], "t_ms": t0.elapsed_time(m[1]), "allocated": m[2], "reserved": m[3]}
                    for m in self.marks]
        t0 = self.marks[0][1]
        return [{"label": m[0], "t_ms": 1e3 * (m[1] - t0), "allocated": m[2], "reserved": m[3]} for m in self.marks]


def install(rec: Recorder):
    import torch
    from torch.nn.modules import module as M
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    def in_backward():
        return torch._C._current_graph_task_id() != -1

    def pre(mod, args):
        if is_module(mod, "Llama"):
            rec.mark("forward")
        elif is_module(mod, "Block"):
            i = rec.blocks.setdefault(id(mod), len(rec.blocks))
            rec.mark(f"recompute {i}" if in_backward() else f"fwd {i}")

    def post(mod, args, out):
        if in_backward() or not rec.active or not torch.is_tensor(out) or not out.requires_grad:
            return
        if is_module(mod, "Block"):
            i = rec.blocks[id(mod)]
            out.register_hook(lambda g, i=i: rec.mark(f"bwd {i}"))
        elif is_module(mod, "Llama"):
            rec.mark("loss")  # after the logits: the loss is next
            out.register_hook(lambda g: rec.mark("bwd logits"))

    M.register_module_forward_pre_hook(pre)
    M.register_module_forward_hook(post)

    def opt_pre(opt, args, kwargs):
        rec.mark("optimizer")

    def opt_post(opt, args, kwargs):
        if rec.active:
            rec.mark("optimizer end")
            rec.opt_bytes = state_bytes(opt)
        rec.done_steps += 1

    register_optimizer_step_pre_hook(opt_pre)
    register_optimizer_step_post_hook(opt_post)


def state_bytes(opt) -> int:
    """Bytes of the optimizer's state tensors (AdamW: exp_avg and exp_avg_sq; FSDP2: local shards)."""
    import torch
    n = 0
    for group in opt.param_groups:
        for p in group["params"]:
            for v in opt.state.get(p, {}).values():
                if torch.is_tensor(v) and v.numel() > 1:
                    v = v.to_local() if hasattr(v, "to_local") else v
                    n += v.numel() * v.element_size()
    return n


def bound(marks: list[dict], opt_bytes: float, budget: float, rate: float) -> dict:
    """Least wait for a schedule that keeps the optimizer state (opt_bytes) on the GPU
    wherever allocated + state fits the budget, moving it at `rate` bytes/s each way.
    At the step's start the state is on the GPU (it was just used); it must be there
    again when the optimizer starts. s_max(t) = clamp(budget - allocated(t), 0, O):
    leaving, the state still on the GPU at t is at least O - rate * t, so the step waits
    max_t((O - s_max(t)) / rate - t); coming back it waits max_t((O - s_max(t)) / rate -
    (t_opt - t)). Zero-copy (advise) pays O / rate inside the optimizer step instead."""
    t_opt = next(m["t_ms"] for m in marks if m["label"] == "optimizer") / 1e3
    step_s = marks[-1]["t_ms"] / 1e3
    out_wait = in_wait = 0.0
    for m in marks:
        t = m["t_ms"] / 1e3
        if t > t_opt:
            break
        short = opt_bytes - min(max(budget - m["allocated"], 0.0), opt_bytes)  # bytes that must be away at t
        out_wait = max(out_wait, short / rate - t)
        in_wait = max(in_wait, short / rate - (t_opt - t))
    peak = max(m["allocated"] for m in marks)
    return {"step_s": step_s, "optimizer_start_s": t_opt, "peak_allocated": peak, "budget": budget,
            "opt_bytes": opt_bytes, "rate": rate, "wait_out_s": out_wait, "wait_in_s": in_wait,
            "lifetime_pct": 100 * step_s / (step_s + out_wait + in_wait),
            "zero_copy_pct": 100 * step_s / (step_s + opt_bytes / rate),
            **staged(marks, opt_bytes, budget, rate, t_opt, step_s)}


def staged(marks: list[dict], opt_bytes: float, budget: float, rate: float, t_opt: float, step_s: float) -> dict:
    """What the shim's staging (TRANSIT_STAGE=1, retired: docs/retired-experiments.md) would
    reach with this profile, before the costs it adds (empty_cache's synchronization,
    allocating again): at the last backward start it lends X = min(O, budget - the most allocated from
    there to the step's end) and the optimizer waits for X / rate beyond the time left to
    it; the rest, O - X, is still read zero-copy (O - X) / rate; going home X / rate
    overlaps the next step up to its first peak (the loss), beyond that the step waits.
    t_opt, step_s: the optimizer's start and the step's end, seconds (from `bound`)."""
    starts = [m for m in marks if m["label"] == "bwd logits"]
    losses = [m for m in marks if m["label"] == "loss"]
    if not starts or not losses:
        return {}
    t_in = starts[-1]["t_ms"] / 1e3
    after = max(m["allocated"] for m in marks if t_in * 1e3 <= m["t_ms"] <= t_opt * 1e3)
    x = min(opt_bytes, max(budget - after, 0.0))
    wait_in = max(0.0, x / rate - (t_opt - t_in))
    wait_out = max(0.0, x / rate - losses[0]["t_ms"] / 1e3)
    extra = wait_in + wait_out + (opt_bytes - x) / rate
    return {"staged_bytes": x, "staged_wait_s": wait_in + wait_out, "staged_pct": 100 * step_s / (step_s + extra)}


def analyze(paths: list, budget: float | None, rate: float) -> list[dict]:
    """The bound and the models for every run of every timeline file, as one table."""
    from transit_launch.table import table
    rows, out = [], []
    for path in paths:
        for run in json.loads(Path(path).read_text())["runs"]:
            b = budget or run["budget"]
            r = bound(run["marks"], run["opt_bytes"], b, rate)
            out.append({"trainer": run["trainer"], **r})
            rows.append([" ".join(run["trainer"]), f"{r['step_s']:.3f}", f"{r['peak_allocated'] / 1e9:.2f}",
                         f"{b / 1e9:.2f}", f"{r['opt_bytes'] / 1e9:.2f}", f"{r['wait_out_s']:.3f}",
                         f"{r['wait_in_s']:.3f}", f"{r['lifetime_pct']:.1f}", f"{r['zero_copy_pct']:.1f}",
                         f"{r['staged_bytes'] / 1e9:.2f}" if "staged_bytes" in r else "-",
                         f"{r['staged_pct']:.1f}" if "staged_pct" in r else "-"])
    print(table(["trainer flags", "step s", "peak alloc GB", "budget GB", "optimizer GB", "wait out s",
                 "wait in s", "move-out/in % (model)", "zero-copy % (model)", "staged GB",
                 "staging % (model)"], rows))
    return out


def main():
    argv, extra = split_trainer_args(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step", type=int, default=5, help="the training step to record (after warm-up)")
    ap.add_argument("--out", default="")
    ap.add_argument("--analyze", nargs="*", help="timeline files: print the bound")
    ap.add_argument("--budget", type=float, default=0, help="bytes (default: peak reserved - optimizer bytes)")
    ap.add_argument("--rate", type=float, default=50e9, help="PCIe bytes/s each way (H200 measured ~50e9)")
    a = ap.parse_args(argv)
    if a.analyze:
        analyze(a.analyze, a.budget or None, a.rate)
        return 0
    rec = Recorder(a.step)
    install(rec)
    rc = run_trainer_here([*extra, "--steps", str(max(a.step + 1, 2))])
    if rc:
        return rc
    marks = rec.resolve()
    if not marks:
        print(f"step {a.step} was not recorded", file=sys.stderr)
        return 1
    import torch
    opt_bytes = rec.opt_bytes
    # the gate's budget: peak reserved less the optimizer state, so the state cannot stay at peak
    peak_reserved = torch.cuda.max_memory_reserved() if rec.cuda else 0
    run = {"trainer": extra, "step": a.step, "marks": marks, "opt_bytes": opt_bytes,
           "peak_reserved": peak_reserved, "budget": peak_reserved - opt_bytes}
    if a.out:
        Path(a.out).write_text(json.dumps({"runs": [run]}, indent=1))
    print(json.dumps({k: v for k, v in run.items() if k != "marks"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
