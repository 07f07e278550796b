"""What a scenario did, for all jobs and for eligible jobs.

Utilisation, idle GPU time and throughput are measured over the submission window (the
first to the last submission): after it the cluster only drains, and how long the last
few jobs run decides the makespan, so rates taken to the makespan measure that tail (one
stretched 256-GPU job moved idle time by 8-13%). Busy GPU-time counts the part of each
job inside the window; throughput counts jobs finished in it. The makespan and total
GPU-hours stay, as what they are.

inter-rack traffic proxy: rack traversals, the paper's proxy: racks spanned - 1, summed over
jobs (each extra rack is one more ring hop over the spine). Beside it, traversal-hours
(traversals weighted by run time: how long that traffic flows) and the GPU-hours of jobs
that span racks. Times in hours; queue times in minutes."""

from __future__ import annotations

import statistics

from transit_launch.sim.scheduler import Result


def _pct(sorted_vals, q):
    if not sorted_vals:
        return 0.0
    return sorted_vals[min(len(sorted_vals) - 1, int(q * len(sorted_vals)))]


def window(submit: list) -> tuple[float, float]:
    return (submit[0], submit[-1]) if submit else (0.0, 0.0)


def summarize(res: Result, submit: list, idx=None) -> dict:
    idx = range(len(res.start)) if idx is None else idx
    w0, w1 = window(submit)
    waits, work, inter_work, traversals, racks, n, trav_h = [], 0.0, 0.0, 0, 0, 0, 0.0
    busy, done, last = 0.0, 0, 0.0
    for i in idx:
        n += 1
        s, e = res.start[i], res.end[i]
        d = e - s
        waits.append((s - submit[i]) / 60)
        w = res.gpus[i] * d / 3600
        work += w
        busy += res.gpus[i] * max(0.0, min(e, w1) - max(s, w0)) / 3600
        done += e <= w1
        if res.racks[i] > 1:
            inter_work += w
            traversals += res.racks[i] - 1
            trav_h += (res.racks[i] - 1) * d / 3600
        racks += res.racks[i]
        last = max(last, e)
    if not n:
        return {"jobs": 0}
    span = (w1 - w0) / 3600
    waits.sort()
    return {
        "jobs": n,
        "window_h": span,
        "makespan_h": (last - w0) / 3600,
        "finished_in_window": done,
        "throughput_jobs_per_h": done / span if span else None,
        "queue_mean_min": statistics.fmean(waits),
        "queue_median_min": _pct(waits, 0.5),
        "queue_p95_min": _pct(waits, 0.95),
        "gpu_hours": work,
        "gpu_hours_in_window": busy,
        "inter_rack_gpu_hours": inter_work,
        "rack_traversals": traversals,
        "traversal_hours": trav_h,
        "mean_racks_per_job": racks / n,
    }


def cluster_metrics(res: Result, submit: list) -> dict:
    s = summarize(res, submit)
    capacity = res.total_gpus * s["window_h"]
    s["gpu_utilization"] = s["gpu_hours_in_window"] / capacity if capacity else None
    s["idle_gpu_hours"] = capacity - s["gpu_hours_in_window"]
    return s


def _rounded(d: dict) -> dict:
    """Rounded once, at the end: a rate of rounded parts is off (0.446 for 0.5)."""
    return {k: _rounded(v) if isinstance(v, dict) else round(v, 4) if isinstance(v, float) else v
            for k, v in d.items()}


def scenario_report(res: Result, submit: list) -> dict:
    eligible = [i for i in range(len(res.start)) if res.eligible[i]]
    single = sum(1 for i in eligible if res.nodes[i] == 1)
    sc = res.scenario
    return _rounded({
        "scenario": sc.name, "racks": sc.racks, "gpus": res.total_gpus, "reduction": sc.reduction,
        "strategy": sc.strategy, "gpus_per_node": sc.gpus_per_node, "efficiency": sc.efficiency.name,
        "all": cluster_metrics(res, submit),
        "eligible": summarize(res, submit, eligible) | {
            "collapsed_to_one_node": single / len(eligible) if eligible else 0.0},
    })
