"""`transit-launch simulate`: scenarios side by side (baseline and reductions, on the full
cluster and optionally on a reduced one), as a table, --json, and an optional plot."""

from __future__ import annotations

from transit_launch.errors import UsageError
from transit_launch.sim import metrics
from transit_launch.sim.progress import Progress
from transit_launch.sim.scheduler import Scenario, simulate
from transit_launch.sim.trace import Trace
from transit_launch.table import table


def scenarios(racks: int, reductions: list[float], reduced_racks: int | None, **kw) -> list[Scenario]:
    out = []
    for r in ([racks] + ([reduced_racks] if reduced_racks else [])):
        for f in reductions:
            out.append(Scenario(name=f"{r} racks, {'baseline' if f == 0 else f'scale-in {f:.0%}'}", racks=r,
                                reduction=f, **kw))
    return out


def run_all(trace: Trace, scs: list[Scenario], progress: Progress | None = None) -> list[dict]:
    """Every scenario on the trace; progress (its phases after the current one are the
    scenarios) is told how far each is."""
    if not len(trace):
        why = ("; dropped: " + ", ".join(f"{n} {w}" for w, n in sorted(trace.dropped.items()))) if trace.dropped else ""
        raise UsageError(f"the trace has no jobs left after filtering{why}")
    biggest = max(trace.gpus)
    for sc in scs:  # all checked before the first scenario runs
        cap = sc.racks * sc.rack_gpus
        if biggest > cap:
            skipped = sum(1 for g in trace.gpus if g > cap)
            raise UsageError(f"{skipped} job(s) ask for more GPUs (up to {biggest}) than {sc.name} has ({cap}); "
                             "use more --racks or drop them from the trace")
    first = progress.k + 1 if progress else 0
    results, baseline = [], None
    for i, sc in enumerate(scs):
        if progress:
            progress.phase(first + i)
        res = simulate(trace, sc, baseline=baseline, progress=progress.update if progress else None)
        if sc.reduction == 0 and baseline is None:
            baseline = res  # transitions compare against the first (full-cluster) baseline
        results.append(metrics.scenario_report(res, trace.submit))
    base = results[0]
    for r in results:
        b, a = base["all"], r["all"]
        r["vs_baseline"] = {
            "rack_traversals": _ratio(a["rack_traversals"], b["rack_traversals"]),
            "traversal_hours": _ratio(a["traversal_hours"], b["traversal_hours"]),
            "inter_rack_gpu_hours": _ratio(a["inter_rack_gpu_hours"], b["inter_rack_gpu_hours"]),
            "queue_mean": _ratio(a["queue_mean_min"], b["queue_mean_min"]),
            "eligible_queue_mean": _ratio(r["eligible"].get("queue_mean_min"), base["eligible"].get("queue_mean_min")),
            "eligible_throughput": _ratio(r["eligible"].get("throughput_jobs_per_h"),
                                          base["eligible"].get("throughput_jobs_per_h")),
        }
    return results


def _ratio(a, b):
    if a is None or not b:
        return None
    return round(a / b - 1, 4)


def text(results: list[dict], trace: Trace) -> str:
    rows = []
    for r in results:
        a, e, v = r["all"], r["eligible"], r["vs_baseline"]
        rows.append([r["scenario"], a["jobs"], f"{a['throughput_jobs_per_h']:.1f}", f"{a['makespan_h']:.1f}",
                     f"{a['queue_mean_min']:.1f}", f"{a['queue_median_min']:.1f}", f"{a['queue_p95_min']:.1f}",
                     f"{e.get('queue_mean_min', 0):.1f}", a["rack_traversals"], _pctfmt(v["rack_traversals"]),
                     f"{a['traversal_hours']:.0f}", f"{a['inter_rack_gpu_hours']:.0f}", f"{a['gpu_utilization']:.1%}",
                     f"{a['idle_gpu_hours']:.0f}", f"{e.get('collapsed_to_one_node', 0):.0%}"])
    head = [f"trace: {trace.source}, {len(trace)} GPU jobs"]
    if trace.dropped:
        head.append("dropped: " + ", ".join(f"{n} {why}" for why, n in sorted(trace.dropped.items())))
    return "\n".join(head + ["", table(
        ["scenario", "jobs", "jobs/h", "makespan h", "queue mean min", "median", "p95", "eligible queue mean",
         "rack traversals", "vs base", "traversal-h", "inter-rack GPU-h", "GPU util", "idle GPU-h",
         "eligible on 1 node"], rows, "lrrrrrrrrrrrrrr"),
        "", "rack traversals (racks spanned - 1, summed over jobs) is the inter-rack traffic proxy; traversal-h",
        "weights it by run time; eligible = multi-node jobs; queue times in minutes."])


def _pctfmt(v):
    return "-" if v is None else f"{v:+.1%}"


def plot(results: list[dict], path: str) -> None:
    """Three panels like the paper's Figure 12. Values differ by orders of magnitude (queue
    times of 0.4 and 23000 minutes in one run), so rack traversals and queue times use a
    log scale (symmetric around zero, which a scenario without traversals or waiting
    reaches) and every bar carries its value."""
    from transit_launch.argtypes import require_matplotlib, save_figure
    plt = require_matplotlib("--plot")
    names = [r["scenario"] for r in results]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    for ax, key, label, log in zip(axes, ("rack_traversals", "queue_mean_min", "throughput_jobs_per_h"),
                                   ("rack traversals (inter-rack traffic)", "mean queue time (min)", "jobs per hour"),
                                   (True, True, False)):
        series = [("all jobs", [r["all"][key] or 0 for r in results], "tab:blue")]
        if key != "rack_traversals":
            series.append(("eligible (multi-node)", [r["eligible"].get(key) or 0 for r in results], "tab:orange"))
        width = 0.8 / len(series)
        for i, (lab, vals, color) in enumerate(series):  # side by side: neither hides the other's label
            x = [j + (i - (len(series) - 1) / 2) * width for j in range(len(names))]
            bars = ax.bar(x, vals, color=color, width=width, label=lab)
            ax.bar_label(bars, [_short(v) for v in vals], fontsize=6, padding=1)
        top = max([v for _, vals, _ in series for v in vals] + [1])
        if log:
            positive = [v for _, vals, _ in series for v in vals if v > 0]
            ax.set_yscale("symlog", linthresh=min(positive) if positive else 1.0)
            ax.set_ylim(0, top * 4)  # room for the labels above the tallest bar
        else:
            ax.set_ylim(0, top * 1.12)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_title(label + (" (log scale)" if log else ""), fontsize=10)
    axes[1].legend(fontsize=8)
    save_figure(fig, path, dpi=120)


def _short(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
