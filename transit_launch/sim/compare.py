"""Scenario against reference: every change in absolute units beside the percentage, and
over several seeds the mean with the range of the percentages.

Which reference: a scenario is judged against the baseline of its own cluster size (the
same racks, no scale-in); a smaller cluster's scenarios are also judged against the full
cluster's baseline, as their own explicit comparison (the paper's "32 racks with TRANSIT
against 72 without")."""

from __future__ import annotations

import statistics

# (key, where in a scenario report, label in the table)
METRICS = (
    ("rack_traversals", ("all", "rack_traversals"), "rack traversals"),
    ("traversal_hours", ("all", "traversal_hours"), "traversal-h"),
    ("queue_mean_min", ("all", "queue_mean_min"), "queue mean min"),
    ("eligible_queue_mean_min", ("eligible", "queue_mean_min"), "eligible queue min"),
    ("idle_gpu_hours", ("all", "idle_gpu_hours"), "idle GPU-h"),
    ("gpu_utilization", ("all", "gpu_utilization"), "GPU util"),
    ("throughput_jobs_per_h", ("all", "throughput_jobs_per_h"), "jobs/h"),
    ("eligible_throughput_jobs_per_h", ("eligible", "throughput_jobs_per_h"), "eligible jobs/h"),
    ("gpu_hours", ("all", "gpu_hours"), "GPU-h burned"),
    ("slowdown_mean", ("all", "slowdown_mean"), "slowdown"),
    ("makespan_h", ("all", "makespan_h"), "makespan h"),
    ("goodput", ("all", "goodput"), "goodput"),
)


def baseline_name(racks: int) -> str:
    return f"{racks} racks, baseline"


def pairs(names_racks: list[tuple[str, int, float]], full_racks: int) -> list[tuple[str, str]]:
    """(scenario, reference) for every scenario but a baseline against itself: its own
    size's baseline, and for a smaller cluster also the full one's."""
    have = {n for n, _, _ in names_racks}
    out = []
    for name, racks, reduction in names_racks:
        own = baseline_name(racks)
        if reduction > 0 and own in have:
            out.append((name, own))
        if racks != full_racks and baseline_name(full_racks) in have:
            out.append((name, baseline_name(full_racks)))
    return out


def _get(report: dict, path: tuple):
    return report[path[0]].get(path[1])


def compare(runs: list[list[dict]], full_racks: int) -> list[dict]:
    """runs: one list of scenario reports per seed, in the same order."""
    first = runs[0]
    pos = {r["scenario"]: k for k, r in enumerate(first)}
    out = []
    for name, ref in pairs([(r["scenario"], r["racks"], r["reduction"]) for r in first], full_racks):
        metrics = {}
        for key, path, _ in METRICS:
            vals = [(_get(run[pos[name]], path), _get(run[pos[ref]], path)) for run in runs]
            if any(v is None or b is None for v, b in vals):
                metrics[key] = None
                continue
            pcts = [(v / b - 1) if b else None for v, b in vals]
            known = [p for p in pcts if p is not None]
            metrics[key] = {
                "value": round(statistics.fmean(v for v, _ in vals), 4),
                "reference": round(statistics.fmean(b for _, b in vals), 4),
                "change": round(statistics.fmean(v - b for v, b in vals), 4),
                "change_range": [round(min(v - b for v, b in vals), 4), round(max(v - b for v, b in vals), 4)],
                "change_pct": round(statistics.fmean(known), 4) if len(known) == len(pcts) else None,
                "change_pct_range": [round(min(known), 4), round(max(known), 4)] if len(known) == len(pcts) else None,
            }
        out.append({"scenario": name, "reference": ref, "seeds": len(runs), "metrics": metrics})
    return out


def mean_report(reports: list[dict]) -> dict:
    """The seeds' scenario reports averaged leaf by leaf (numbers only)."""
    def avg(vals):
        if any(v is None for v in vals):
            return None
        if isinstance(vals[0], dict):
            return {k: avg([v.get(k) for v in vals]) for k in vals[0]}
        if all(isinstance(v, bool) for v in vals):  # a flag (collapsed): raised by any seed
            return any(vals)
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            return round(statistics.fmean(vals), 4)
        return vals[0]
    return avg(reports)
