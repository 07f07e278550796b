"""TorchTitan's unchanged trainer, step by step, without offloading and under transit's
policies: the time of every step (so the steps before steady state show), its own peak
reserved memory, and the shim's stats.

The model is a catalog model's TorchTitan flavor at truncated depth (its real hidden size,
heads and vocabulary; `--layers`), sequence 8192, local batch 1, full activation
checkpointing, fused AdamW, TorchTitan's default clipping (max_norm 1.0), one GPU, local
assets (bench/torchtitan_assets.py: no downloads). The Trainer subclass only times
`train_step` (a CUDA synchronize at its end; the step ends with the loss's logging anyway).

Each run's budget (`--budget auto`) is the reference's peak reserved memory less the AdamW
state (8 bytes a parameter): the GPU that could not hold the state. `--runs` names the runs:
`ref` (no shim), a policy (`advise`, ...), and `POLICY:ENV=VAL,...` for a variant, e.g.
`advise:TRANSIT_STATE_POOL=0` (the state in the activations' blocks, as before the pool);
`TRANSIT_SHIM=PATH` in a variant runs another build of the shim.

    python3 bench/titan_steps.py --model llama3-8b --layers 16 --accum 8 \\
        --runs ref,advise,advise:TRANSIT_STATE_POOL=0 --steps 6 --out titan_steps.json
    python3 bench/titan_steps.py --report titan_steps.json
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import env, host_memory, run, transit, out_option
from titan_memory import LAYOUTS, TITAN, titan_args


def worker(a):
    import torch
    import torchtitan.train as tt
    from torchtitan.config import ConfigManager
    from torchtitan.protocols.train_spec import get_train_spec
    from torchtitan.tools.logging import init_logger

    module, flavor = TITAN[a.model]
    get_train_spec(module).model_args[flavor].n_layers = a.layers
    times, info = [], {}

    opt_times = []

    class StepTimer(tt.Trainer):
        def __init__(self, job_config):
            super().__init__(job_config)
            step = self.optimizers.step

            def timed_step(*args, **kw):  # the optimizer's part of a step, its hooks included
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = step(*args, **kw)
                torch.cuda.synchronize()
                opt_times.append(time.perf_counter() - t0)
                return out
            self.optimizers.step = timed_step

        def train_step(self, data_iterator):
            t0 = time.perf_counter()
            super().train_step(data_iterator)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)

    init_logger()
    a.titan_extra = ["--training.global-batch-size", str(a.accum)]
    config = ConfigManager().parse_args(titan_args(a, module, flavor, LAYOUTS["1gpu"], a.dump))
    trainer = StepTimer(config)
    info["params"] = sum(p.numel() for m in trainer.model_parts for p in m.parameters())
    try:
        trainer.train()
    finally:
        trainer.close()
    Path(a.out).write_text(json.dumps({"step_s": times, "optimizer_s": opt_times, "params": info["params"],
                                       "max_reserved": torch.cuda.max_memory_reserved(), **host_memory()}))
    return 0


def _run_env(name):
    """`policy:K=V+K=V` -> (policy, {K: V}) (`+`: the runs themselves are a comma list)."""
    policy, _, extra = name.partition(":")
    return policy, dict(kv.split("=", 1) for kv in extra.split("+") if kv)


def run_one(a, name, budget, assets):
    policy, extra_env = _run_env(name)
    with tempfile.TemporaryDirectory() as tmp:
        res_file, stats = Path(tmp) / "res.json", Path(tmp) / "stats"
        cmd = ["torchrun", "--standalone", "--nproc-per-node", "1", str(Path(__file__).resolve()), "--worker", "--model", a.model, "--layers",
               str(a.layers), "--accum", str(a.accum), "--steps", str(a.steps), "--assets", assets,
               "--dump", str(Path(tmp) / "dump"), "--out", str(res_file)]
        if policy != "ref":
            cmd = transit(policy, cmd, str(stats), budget)
        t0 = time.time()
        out, err, rc = run(cmd, env(**extra_env), a.timeout)
        r = {"name": name, "policy": policy, "env": extra_env, "budget": budget if policy != "ref" else None,
             "rc": rc, "wall_s": round(time.time() - t0, 1)}
        if res_file.exists():
            r.update(json.loads(res_file.read_text()))
        else:
            r["stderr_tail"] = err[-3000:]
        if stats.is_dir():
            from transit_launch.preload import run as runmod
            r["stats"] = runmod.read_stats(str(stats))
        r["adapter_lines"] = [ln for ln in err.splitlines() if ln.startswith(("transit adapter", "transit:"))][:20]
    return r


def _budget_of(name, runs, budget):
    """A run's own budget: `policy:STATE_OFF=f` (also `policy:K=V+STATE_OFF=f`) is the reference's peak reserved less f of the
    AdamW state (0: nothing needs to move; 0.5: half the state), else the common one."""
    env = _run_env(name)[1]
    if "STATE_OFF" not in env:
        return budget
    ref = next(r for r in runs if r["name"] == "ref" and "max_reserved" in r)
    return int(ref["max_reserved"] - float(env["STATE_OFF"]) * 8 * ref["params"])


def measure(a):
    from torchtitan_assets import write_dataset, write_tokenizer
    assets = tempfile.mkdtemp(prefix="titan-assets-")
    write_tokenizer(Path(assets) / "tokenizer")
    write_dataset(Path(assets) / "c4_synthetic")
    runs, budget = [], a.budget
    for name in a.runs.split(","):
        if name != "ref" and budget == 0:
            ref = next((r for r in runs if r["name"] == "ref" and "max_reserved" in r), None)
            if ref is None:
                print(f"{name}: skipped (--budget auto needs a ref run first)", file=sys.stderr)
                continue
            budget = ref["max_reserved"] - 8 * ref["params"]  # the GPU that could not hold the AdamW state
        r = run_one(a, name, _budget_of(name, runs, budget), assets)
        runs.append(r)
        print(json.dumps({k: r.get(k) for k in ("name", "rc", "wall_s", "step_s", "optimizer_s", "max_reserved",
                                                "budget")}),
              flush=True)
        Path(a.out).write_text(json.dumps({"model": a.model, "layers": a.layers, "accum": a.accum, "seq_len": 8192,
                                           "runs": runs}, indent=1))


def report(paths):
    for path in paths:
        d = json.loads(Path(path).read_text())
        ref = next((r for r in d["runs"] if r["name"] == "ref" and r.get("step_s")), None)
        steady_ref = steady(ref["step_s"]) if ref else None
        print(f"{path}: {d['model']} at {d['layers']} layers, {d['accum']} microbatches")
        tail_ref = tail(ref["step_s"]) if ref else None
        print(f"{'run':<34} {'budget GB':>9} {'step 1 s':>8} {'step 2 s':>8} {'steady s':>8} {'2/steady':>8} "
              f"{'% of ref':>8} {'warm-up':>8} {'last 4 s':>8} {'% of ref':>8}")
        for r in d["runs"]:
            s = r.get("step_s") or []
            if len(s) < 3:
                print(f"{r['name']:<34} failed: rc {r['rc']}")
                continue
            st = steady(s)
            pct = f"{100 * steady_ref / st:.1f}" if steady_ref else "-"
            # warm-up: what the first two steps took beyond two steady ones, in steady steps
            warm = (s[0] + s[1] - 2 * st) / st
            last = tail(s)
            print(f"{r['name'][:34]:<34} {(r['budget'] or 0) / 1e9:>9.2f} {s[0]:>8.2f} {s[1]:>8.2f} {st:>8.2f} "
                  f"{s[1] / st:>8.1f} {pct:>8} {warm:>8.1f} {last:>8.2f} "
                  f"{f'{100 * tail_ref / last:.1f}' if tail_ref else '-':>8}")


def tail(xs):
    """The median of a run's last four steps (past a host split's revision, which runs later
    than the first two)."""
    return statistics.median(xs[-4:])


def steady(xs):
    """A run's steady time from its per-step times: the median after the first two."""
    s = sorted(xs[2:])
    return s[len(s) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-8b", choices=sorted(TITAN))
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--accum", type=int, default=8, help="microbatches a step (the global batch, local batch 1)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--runs", default="ref,advise")
    ap.add_argument("--budget", type=int, default=0, help="bytes (default: auto, from the ref run)")
    ap.add_argument("--timeout", type=int, default=400, help="seconds a run")
    out_option(ap, "titan_steps")
    ap.add_argument("--report", nargs="*")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--assets", help=argparse.SUPPRESS)
    ap.add_argument("--dump", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.seq_len, a.local_batch = 8192, 1
    if a.worker:
        return worker(a)
    if a.report:
        return report(a.report)
    measure(a)
    report([a.out])
    return 0


if __name__ == "__main__":
    sys.exit(main())
