"""What a scenario did, for all jobs and for eligible (multi-node) jobs.

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


def summarize(res: Result, submit: list, idx=None) -> dict:
    idx = range(len(res.start)) if idx is None else idx
    waits, work, inter_work, traversals, racks, n, trav_h = [], 0.0, 0.0, 0, 0, 0, 0.0
    first, last = float("inf"), 0.0
    for i in idx:
        n += 1
        d = res.end[i] - res.start[i]
        waits.append((res.start[i] - submit[i]) / 60)
        w = res.gpus[i] * d / 3600
        work += w
        if res.racks[i] > 1:
            inter_work += w
            traversals += res.racks[i] - 1
            trav_h += (res.racks[i] - 1) * d / 3600
        racks += res.racks[i]
        first = min(first, submit[i])
        last = max(last, res.end[i])
    if not n:
        return {"jobs": 0}
    makespan = (last - first) / 3600
    waits.sort()
    return {
        "jobs": n,
        "makespan_h": round(makespan, 3),
        "throughput_jobs_per_h": round(n / makespan, 3) if makespan else None,
        "queue_mean_min": round(statistics.fmean(waits), 3),
        "queue_median_min": round(_pct(waits, 0.5), 3),
        "queue_p95_min": round(_pct(waits, 0.95), 3),
        "gpu_hours": round(work, 1),
        "inter_rack_gpu_hours": round(inter_work, 1),
        "rack_traversals": traversals,
        "traversal_hours": round(trav_h, 1),
        "mean_racks_per_job": round(racks / n, 3),
    }


def cluster_metrics(res: Result, submit: list) -> dict:
    s = summarize(res, submit)
    capacity = res.total_gpus * s["makespan_h"]
    s["gpu_utilization"] = round(s["gpu_hours"] / capacity, 4) if capacity else None
    s["idle_gpu_hours"] = round(capacity - s["gpu_hours"], 1)
    return s


def scenario_report(res: Result, submit: list) -> dict:
    eligible = [i for i in range(len(res.start)) if res.orig_nodes[i] > 1]
    single = sum(1 for i in eligible if res.nodes[i] == 1)
    sc = res.scenario
    return {
        "scenario": sc.name, "racks": sc.racks, "gpus": res.total_gpus, "reduction": sc.reduction,
        "strategy": sc.strategy, "gpus_per_node": sc.gpus_per_node,
        "all": cluster_metrics(res, submit),
        "eligible": summarize(res, submit, eligible) | {
            "collapsed_to_one_node": round(single / len(eligible), 4) if eligible else 0.0},
    }
