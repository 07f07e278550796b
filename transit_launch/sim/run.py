"""`transit-launch simulate`: scenarios side by side (baseline and reductions, on the full
cluster and optionally on a reduced one) and their changes against their references
(sim/compare.py), as tables, --json, and an optional plot."""

from __future__ import annotations

from transit_launch.errors import UsageError
from transit_launch.sim import compare, metrics
from transit_launch.sim.progress import Progress
from transit_launch.sim.scheduler import Scenario, simulate
from transit_launch.sim.trace import Trace
from transit_launch.table import table


def scenarios(racks: int, reductions: list[float], reduced_racks: int | None, **kw) -> list[Scenario]:
    """Every reduction (0: the baseline) on the full cluster, then on the reduced one."""
    out = []
    for r in ([racks] + ([reduced_racks] if reduced_racks else [])):
        for f in reductions:
            out.append(Scenario(name=compare.baseline_name(r) if f == 0 else f"{r} racks, scale-in {f:.0%}", racks=r,
                                reduction=f, **kw))
    if reduced_racks and reduced_racks >= racks:  # after Scenario's own range check of it
        raise UsageError(f"--reduced-racks {reduced_racks} must be fewer than --racks {racks}: it is the smaller "
                         "cluster the scenarios also run on")
    return out


def check_fits(trace: Trace, scs: list[Scenario]) -> None:
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


def run_all(trace: Trace, scs: list[Scenario], progress: Progress | None = None, each=None,
            baselines: dict | None = None) -> list[dict]:
    """Every scenario on the trace, each scale-in's placement transitions judged against
    the baseline of its own cluster size (run first when it is in scs); progress (its
    phases after the current one are the scenarios) is told how far each is; each(result),
    when given, gets every scenario's Result (--jobs-out); baselines, when given, gets each
    cluster size's baseline Result (sim/bands.py replays against them)."""
    check_fits(trace, scs)
    first = progress.k + 1 if progress else 0
    results = []
    baselines = {} if baselines is None else baselines
    for i, sc in enumerate(scs):
        if progress:
            progress.phase(first + i)
        res = simulate(trace, sc, baseline=baselines.get(sc.racks), progress=progress.update if progress else None)
        if sc.reduction == 0:
            baselines.setdefault(sc.racks, res)
        if each:
            each(res)
        results.append(metrics.scenario_report(res, trace.submit))
    return results


def _fmt(v, unit=""):
    if v is None:
        return "-"
    if unit == "%":
        return f"{v:.1%}"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 1 or v == 0 else f"{v:.2f}"


def _change(m: dict | None, key: str) -> str:
    """'-560 (-26%)', over seeds '-560 (-26%, -28..-24%)'; utilisation in points."""
    if m is None:
        return "-"
    d = m["change"]
    absolute = f"{d * 100:+.1f} pt" if key == "gpu_utilization" else (f"{d:+,.0f}" if abs(d) >= 100 else f"{d:+.1f}")
    if m["change_pct"] is None:
        return absolute
    lo, hi = m["change_pct_range"]
    spread = f", {_pct(lo)}..{_pct(hi)}" if hi - lo >= 0.005 else ""
    return f"{absolute} ({_pct(m['change_pct'])}{spread})"


def _pct(p: float) -> str:
    """A change as a percentage; from +1000% on, as a multiple (from 0.4 to 4000 minutes)."""
    return f"{p:+.0%}" if p < 10 else f"{1 + p:.0f}x"


def scheduler_line(p, limit_factor: float) -> str:
    """The scheduler's parameters (SchedParams) as the reports head them."""
    limits = "recorded, else " + (f"run time x [1, {limit_factor:g}] drawn" if limit_factor > 1 else "the run time")
    return (f"scheduler: FIFO, backfill on {p.plan_on} (time limits: {limits}, in minutes) reserving for "
            + ("every job tested" if not p.bf_reserve else "the head" if p.bf_reserve == 1
               else f"the first {p.bf_reserve} jobs")
            + (" at Slurm's batched job ends" if p.bf_reserve_at == "slurm" else "")
            + f", bf_max_job_test {p.bf_max_job_test}, bf_interval {p.bf_interval:g} s, bf_resolution "
            f"{p.bf_resolution:g} s, bf_window {p.bf_window / 60:g} min"
            + (f", epilog {p.epilog:g} s" if p.epilog else ""))


def text(means: list[dict], comparisons: list[dict], trace: Trace, seeds: list[int], sc: Scenario,
         limit_factor: float = 1.0) -> str:
    rows = []
    for r in means:
        a, e = r["all"], r["eligible"]
        rows.append([r["scenario"] + (" *" if a.get("collapsed") else ""), f"{a['jobs']:.0f}",
                     _fmt(a["gpu_utilization"], "%"), _fmt(a["gpu_hours"]), _fmt(a["idle_gpu_hours"]),
                     _fmt(a["throughput_jobs_per_h"]), _fmt(a["queue_mean_min"]), _fmt(a["queue_p95_min"]),
                     _fmt(a["slowdown_mean"]), _fmt(e.get("queue_mean_min")), _fmt(a["rack_traversals"]),
                     _fmt(a["traversal_hours"]), f"{e.get('collapsed_to_one_node', 0):.0%}", _fmt(a["makespan_h"])])
    shown = ("rack_traversals", "queue_mean_min", "eligible_queue_mean_min", "gpu_hours", "idle_gpu_hours",
             "throughput_jobs_per_h")
    labels = {k: label for k, _, label in compare.METRICS}
    crow = [[c["scenario"], c["reference"]] + [_change(c["metrics"][k], k) for k in shown] for c in comparisons]
    several = len(seeds) > 1
    head = [f"trace: {trace.source}, {len(trace)} GPU jobs" + (f" each; means over {len(seeds)} seeds" if several else ""),
            scheduler_line(sc.sched, limit_factor), f"scaled-in efficiency: {sc.efficiency.name}"]
    if trace.dropped:
        head.append("dropped: " + ", ".join(f"{n} {why}" for why, n in sorted(trace.dropped.items())))
    collapsed = [r["scenario"] for r in means if r["all"].get("collapsed")]
    return "\n".join(head + [
        "", table(["scenario", "jobs", "GPU util", "GPU-h", "idle GPU-h", "jobs/h", "queue mean min", "p95",
                   "slowdown", "eligible queue min", "rack traversals", "traversal-h", "eligible on 1 node",
                   "makespan h"], rows, "lrrrrrrrrrrrrr"),
        "", table(["scenario", "against"] + [labels[k] for k in shown], crow, "llrrrrrr"),
        "", "GPU util, idle GPU-h and jobs/h: over the makespan (first submission to last end); GPU-h: burned by",
        "the jobs; slowdown: (wait + run) / run, runs under 10 s as 10 s; rack traversals (racks spanned - 1,",
        "summed over jobs) is the inter-rack traffic proxy; eligible = multi-node training jobs; queue times in",
        "minutes; a change is absolute (percent" + (", then its range over the seeds)." if several else ").")]
        + ([f"* collapsed: offered load above 1, the queue grows without bound and its times measure the trace's "
            f"length ({', '.join(collapsed)})"] if collapsed else []))


def plot(results: list[dict], path: str) -> None:
    """Three panels like the paper's Figure 12. Values differ by orders of magnitude (queue
    times of 0.4 and 23000 minutes in one run), so rack traversals and queue times use a
    log scale (symmetric around zero, which a scenario without traversals or waiting
    reaches) and every bar carries its value."""
    from transit_launch.output_files import require_matplotlib, save_figure
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
