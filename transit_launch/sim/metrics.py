"""What a scenario did, for all jobs and for eligible jobs.

Rates are taken over the makespan (first submission to last end): every job is finished
there, so throughput is jobs over the makespan and can rise when the same jobs finish
sooner (over the submission window it could not exceed the arrival rate), and
utilisation and idle GPU time count every GPU-hour the jobs burn, which scale-in raises
(a stretched job holds fewer GPUs for longer). GPU-hours burned stand beside them, and
the submission window's own figures stay in --json (`*_in_window`).

Slowdown: a job's (wait + run) / run, bounded (Feitelson's): run times under 10 s count
as 10 s and the result is at least 1, so that a 1-second job waiting a minute does not
read 60. Offered load: the arrival rate times the mean GPU-seconds a job burns, over the
cluster's GPUs; above 1 the queue grows without bound, and the run is flagged
`collapsed`: its queue times then measure how long the trace is, not the scheduler.

Goodput: the trace's work (a job's GPUs at the size it asked for x its recorded run time;
a scaled-in job that ended at an event, which fewer nodes do not postpone, did the held
GPUs' share) over the GPU-hours the jobs were owed from submission to end (the GPUs they
held x (end - submit)): waiting and a scaled-in job's slower per-GPU rate count against
it, as in the node-failure replay (sim/failures.py). A job moved into one rack by
scale-in can run faster than recorded (--speedup), so a job's own share can pass 1.

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


SLOWDOWN_FLOOR_S = 10.0


def summarize(res: Result, submit: list, idx=None) -> dict:
    idx = range(len(res.start)) if idx is None else idx
    w0, w1 = window(submit)
    waits, work, inter_work, traversals, racks, n, trav_h = [], 0.0, 0.0, 0, 0, 0, 0.0
    busy, done, last, slow = 0.0, 0, 0.0, []
    useful, owed = 0.0, 0.0
    start, end, gpus, rk, jw, floor = res.start, res.end, res.gpus, res.racks, res.work, SLOWDOWN_FLOOR_S
    for i in idx:
        n += 1
        s, e = start[i], end[i]
        d = e - s
        wait = s - submit[i]
        waits.append(wait / 60)
        slow.append(max(1.0, (wait + d) / max(d, floor)))
        g = gpus[i]
        w = g * d / 3600
        work += w
        owed += g * (e - submit[i])
        useful += jw[i] if jw else 0.0
        busy += g * max(0.0, min(e, w1) - max(s, w0)) / 3600
        done += e <= w1
        r = rk[i]
        if r > 1:
            inter_work += w
            traversals += r - 1
            trav_h += (r - 1) * d / 3600
        racks += r
        if e > last:
            last = e
    if not n:
        return {"jobs": 0}
    span = (w1 - w0) / 3600
    makespan = (last - w0) / 3600
    waits.sort()
    slow.sort()
    return {
        "jobs": n,
        "window_h": span,
        "makespan_h": makespan,
        "finished_in_window": done,
        "throughput_jobs_per_h": n / makespan if makespan else None,
        "throughput_in_window_jobs_per_h": done / span if span else None,
        "queue_mean_min": statistics.fmean(waits),
        "queue_median_min": _pct(waits, 0.5),
        "queue_p95_min": _pct(waits, 0.95),
        "slowdown_mean": statistics.fmean(slow),
        "slowdown_p95": _pct(slow, 0.95),
        "gpu_hours": work,
        "goodput": useful / owed if res.work and owed else None,
        "gpu_hours_in_window": busy,
        "inter_rack_gpu_hours": inter_work,
        "rack_traversals": traversals,
        "traversal_hours": trav_h,
        "mean_racks_per_job": racks / n,
    }


def cluster_metrics(res: Result, submit: list) -> dict:
    s = summarize(res, submit)
    capacity = res.total_gpus * s["makespan_h"]
    s["gpu_utilization"] = s["gpu_hours"] / capacity if capacity else None
    s["idle_gpu_hours"] = capacity - s["gpu_hours"]
    window = res.total_gpus * s["window_h"]
    s["gpu_utilization_in_window"] = s["gpu_hours_in_window"] / window if window else None
    s["idle_gpu_hours_in_window"] = window - s["gpu_hours_in_window"]
    n = s["jobs"]
    # arrivals: n - 1 gaps over the window; work: the GPU-hours the jobs burned here
    s["offered_load"] = (n - 1) / s["window_h"] * (s["gpu_hours"] / n) / res.total_gpus if s["window_h"] else None
    s["collapsed"] = bool(s["offered_load"] and s["offered_load"] > 1)
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
