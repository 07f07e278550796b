"""`transit-launch report DIR`: what a job's stats directory says, whoever ran the job
(`run --stats DIR`, or a Slurm job with `--transit-stats=DIR` or a rendered script's
--stats): per rank and per node the budget held, the bytes offloaded, the policy and the
paths the shim took, the warm-up, and beside them the plan's prediction where the job had
one (render and submit set TRANSIT_PLAN; the shim copies it into every report as "plan").
Bad input (no directory, no stats, a file that is not the shim's) is one line (UsageError)."""

from __future__ import annotations

import json
from pathlib import Path

from transit_launch.errors import UsageError
from transit_launch.preload import run as runmod
from transit_launch.table import table

# what run.summary reads of every stats file: a file without them is not the shim's
_NUMBERS = ("pid", "budget_bytes", "managed_peak_bytes", "device_placed_peak_bytes", "host_placed_peak_bytes",
            "zero_copy_mapped_peak_bytes", "gpu_resident_peak_steady_bytes", "prefetch_bytes", "htod_bytes",
            "iterations", "free_at_start_bytes", "guard_limit_bytes")


def _load(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"{path}: not a readable JSON file ({getattr(e, 'strerror', None) or e})") from None


def _checked(path: Path, s: object) -> dict:
    """A stats file of the shim's, or the one line saying what it lacks."""
    def number(v):
        return isinstance(v, int | float) and not isinstance(v, bool)
    if not isinstance(s, dict):
        raise UsageError(f"{path}: not a stats file of the shim (not a JSON object)")
    bad = [k for k, t in (("policy", str), ("passthrough", bool)) if not isinstance(s.get(k), t)]
    bad += [k for k in _NUMBERS if not number(s.get(k))]
    hints = s.get("cold_hint_bytes")
    if not (isinstance(hints, dict) and number(hints.get("optimizer"))):
        bad.append("cold_hint_bytes")
    if not isinstance(s.get("iteration_ms", []), list) or not all(map(number, s.get("iteration_ms", []))):
        bad.append("iteration_ms")
    for k in ("rank", "local_rank"):
        if s.get(k) is not None and not (isinstance(s[k], int) and not isinstance(s[k], bool)):
            bad.append(k)
    if s.get("node") is not None and not isinstance(s["node"], str):
        bad.append("node")
    if bad:
        raise UsageError(f"{path}: not a stats file of the shim (missing or wrong: {', '.join(bad)})")
    return s


def read(directory: str) -> tuple[list[dict], dict | None]:
    """The stats files of a directory (each with its "file") and the plan's prediction."""
    d = Path(directory)
    if not d.is_dir():
        raise UsageError(f"{directory}: not a directory (give the job's stats directory: run --stats DIR, "
                         "--transit-stats=DIR)")
    try:
        files = sorted(p for p in d.iterdir() if p.suffix == ".json" and p.is_file())
    except OSError as e:
        raise UsageError(f"{directory}: cannot list it ({e.strerror})") from None
    stats = [_checked(p, _load(p)) | {"file": str(p)} for p in files]
    if not stats:
        raise UsageError(f"{directory}: no stats files (the shim writes one JSON per CUDA process there)")
    s = next((s for s in stats if s.get("plan") is not None), None)  # every rank of a job carries the same
    plan = s and s["plan"]
    if s and not (isinstance(plan, dict) and isinstance(plan.get("offload_gb_per_gpu"), int | float)):
        raise UsageError(f"{s['file']}: its \"plan\" is not the plan's prediction (no offload_gb_per_gpu)")
    return stats, plan


def paths_taken(s: dict) -> list[str]:
    """Which of the shim's paths a process's counters show it took."""
    taken = [name for name, key in (("host-state", "host_state_peak_bytes"), ("kept-on-gpu", "host_state_kept_bytes"),
                                    ("prefetch", "prefetch_bytes"), ("zero-copy", "zero_copy_mapped_peak_bytes"),
                                    ("fallback", "managed_fallbacks")) if s.get(key)]
    return ["pass-through"] if s["passthrough"] else taken


def summarize(stats: list[dict], plan: dict | None) -> dict:
    """Per rank (a process), per node, the plan's prediction and what was measured beside it."""
    ranks = []
    for s, p in zip(stats, runmod.summary(stats)["processes"]):
        ranks.append({"rank": s.get("rank"), "local_rank": s.get("local_rank"), "node": s.get("node"),
                      "pid": s["pid"], "policy": s["policy"], "passthrough": s["passthrough"],
                      "budget_gb": p["budget_gb"], "budget_held": p["budget_held"],
                      "on_gpu_peak_gb": p["device_placed_peak_gb"],
                      "offloaded_gb": round(p["host_placed_peak_gb"] + p["host_state_peak_gb"], 2),
                      "paths": paths_taken(s), "iterations": p["iterations"],
                      "median_iteration_ms": p["median_iteration_ms"], "warm_up": p["warm_up"],
                      "adapter": s.get("adapter"), "file": s["file"]})
    ranks.sort(key=lambda r: (r["rank"] is None, r["rank"] if r["rank"] is not None else 0, r["pid"]))
    nodes = {}
    for r in ranks:
        nodes.setdefault(r["node"], []).append(r)
    node_rows = [{"node": n, "ranks": len(rs), "budget_held": all(r["budget_held"] for r in rs),
                  "on_gpu_peak_gb": max(r["on_gpu_peak_gb"] for r in rs),
                  "offloaded_gb": round(sum(r["offloaded_gb"] for r in rs), 2),
                  "warm_up_extra_s": max((r["warm_up"]["extra_s"] for r in rs if r["warm_up"]), default=None)}
                 for n, rs in nodes.items()]
    extras = [r["warm_up"]["extra_s"] for r in ranks if r["warm_up"]]
    measured = {"ranks": len(ranks), "nodes": len(node_rows),
                "offloaded_gb_per_rank": round(sum(r["offloaded_gb"] for r in ranks) / len(ranks), 2),
                "warm_up_extra_s": max(extras) if extras else None,
                "budget_held": all(r["budget_held"] for r in ranks)}
    return {"ranks": ranks, "nodes": node_rows, "measured": measured, "plan": plan}


def step_taken(adapter: object) -> str:
    """What the hint adapter's optimizer step did in a process, from its counters (the
    "adapter" object of the stats: the step mode and its counts); "-" without an adapter."""
    if not isinstance(adapter, dict):
        return "-"
    mode, n = str(adapter.get("mode", "?")), adapter.get
    if mode == "0":
        return "in place"
    if mode == "stream":
        return f"stream: {n('steps', '?')} steps, {n('streamed_params', '?')} params"
    if mode == "host":
        stream = n("stream")
        stream = stream if isinstance(stream, dict) else {}
        return (f"host: {n('host_params', '?')} params on the CPU (share {n('share', '?')}), "
                f"{stream.get('streamed_params', 0)} streamed")
    return mode


def _yes(v: bool) -> str:
    return "yes" if v else "NO"


def _dash(v) -> object:
    return "-" if v is None else v


def text(summ: dict) -> str:
    rows = [[_dash(r["rank"]), _dash(r["node"]), r["pid"], r["policy"] + (" (pass-through)" if r["passthrough"] else ""),
             r["budget_gb"], _yes(r["budget_held"]), r["on_gpu_peak_gb"], r["offloaded_gb"],
             ",".join(r["paths"]) or "-", _dash(r["warm_up"] and r["warm_up"]["extra_s"]),
             _dash(r["median_iteration_ms"]), step_taken(r["adapter"])] for r in summ["ranks"]]
    out = ["Per rank:", table(["rank", "node", "pid", "policy", "budget GB", "budget held", "on GPU GB",
                               "offloaded GB", "paths", "warm-up s", "ms/iter", "optimizer step"], rows,
                              "rlrlrlrrlrrl"), "",
           "Per node:", table(["node", "ranks", "budget held", "on GPU GB (max)", "offloaded GB (sum)",
                               "warm-up s (max)"],
                              [[_dash(n["node"]), n["ranks"], _yes(n["budget_held"]), n["on_gpu_peak_gb"],
                                n["offloaded_gb"], _dash(n["warm_up_extra_s"])] for n in summ["nodes"]], "lrlrrr")]
    m, plan = summ["measured"], summ["plan"]
    if plan is None:
        out.append("\nNo plan's prediction in these stats (jobs of `render`/`submit` carry it: TRANSIT_PLAN).")
    else:
        warm = "-" if m["warm_up_extra_s"] is None else f"{m['warm_up_extra_s']} s"
        out += ["", "Plan beside the job:",
                table(["", "plan", "job"],
                      [["nodes", plan.get("nodes"), m["nodes"]], ["ranks (GPUs)", plan.get("gpus"), m["ranks"]],
                       ["policy", plan.get("policy"), ",".join(sorted({r["policy"] for r in summ["ranks"]}))],
                       ["offload GB per GPU", plan["offload_gb_per_gpu"], m["offloaded_gb_per_rank"]],
                       ["warm-up s", plan.get("predicted_warm_up_s"), warm],
                       ["efficiency", f"{plan['predicted_efficiency']:.0%}" if isinstance(
                           plan.get("predicted_efficiency"), int | float) else "-", "(not measured by the shim)"]],
                      "lrr")]
    if not m["budget_held"]:
        out.append("\nNO in budget held: the shim let more managed bytes reside on the GPU than the budget.")
    return "\n".join(out)


def cmd_report(a, command):
    summ = summarize(*read(a.dir))
    print(json.dumps(summ, indent=2) if a.json else text(summ))
    return 0


def register(sub):
    sp = sub.add_parser("report", help="summarize a job's stats directory (run --stats, --transit-stats)",
                        usage="transit-launch report [--json] DIR")
    sp.add_argument("dir", metavar="DIR", help="the job's stats directory: one JSON per rank, written by the shim")
    sp.add_argument("--json", action="store_true", help="the summary as JSON, for programs")
    sp.set_defaults(func=cmd_report)
