"""Headlines as bands over the efficiency curves: which curves (the chosen --efficiency one
first, then efficiency.BAND's others), and the band's rows and table from every curve's
scenario reports (sim/reruns.py replays the scale-in scenarios once a curve).

A headline (queue-time change, rack traversals, makespan, throughput, goodput; percent
changes, goodput in points, absolute where the reference is 0) is reported per curve as
the mean over the seeds, its band the lowest and highest of those means with the curve that
gives each end, and the seeds' range the lowest and highest single seed over every curve."""

from __future__ import annotations

from transit_launch.sim import compare, efficiency
from transit_launch.sim.efficiency import Curve
from transit_launch.sim.run import _pct
from transit_launch.table import table

# (compare.METRICS key, label); POINTS: changes in points of a share, the others in percent
HEADLINES = (("queue_mean_min", "queue mean"), ("rack_traversals", "rack traversals"), ("makespan_h", "makespan"),
             ("throughput_jobs_per_h", "jobs/h"), ("goodput", "goodput"))
POINTS = frozenset({"goodput"})


def curves(label: str, chosen: Curve) -> list[tuple[str, Curve]]:
    """(label, curve): the chosen one, then the band's others."""
    out = [(label, chosen)]
    for name in efficiency.BAND:
        c = efficiency.parse(name)
        if c.name != chosen.name and name != label:
            out.append((name, c))
    return out


def _value(key: str, m: dict, spread: bool = False):
    """A change as the band reads it: points for POINTS, else percent (absolute where the
    reference is 0); spread: the seeds' [lowest, highest] instead of the mean."""
    pct = key not in POINTS and m["change_pct"] is not None
    if spread:
        return m["change_pct_range"] if pct else m["change_range"]
    return m["change_pct"] if pct else m["change"]


def band(per_curve: list[tuple[str, list[list[dict]]]], full_racks: int) -> list[dict]:
    """per_curve: (label, runs) with runs one list of scenario reports a seed (compare.compare's
    input), the chosen curve first. One row a scale-in comparison and headline."""
    comps = [(label, compare.compare(runs, full_racks)) for label, runs in per_curve]
    reduced = {r["scenario"] for r in per_curve[0][1][0] if r["reduction"] > 0}
    rows = []
    for k, first in enumerate(comps[0][1]):
        if first["scenario"] not in reduced:
            continue
        for key, label in HEADLINES:
            ms = [(lab, cs[k]["metrics"][key]) for lab, cs in comps]
            if any(m is None for _, m in ms):
                continue
            means = {lab: _value(key, m) for lab, m in ms}
            spreads = [_value(key, m, True) for _, m in ms]
            rows.append({"scenario": first["scenario"], "reference": first["reference"], "metric": key,
                         "label": label, "unit": "pt" if key in POINTS else "abs" if ms[0][1]["change_pct"] is None
                         else "%"} | spread(means, spreads))
    return rows


def spread(means: dict, ranges: list) -> dict:
    """A headline's band from its mean over the seeds by curve ({label: mean}, the chosen
    curve first) and each curve's seeds' [lowest, highest]: the lowest and highest mean with
    the curve that gives each, and the seeds' range, the lowest and highest single seed over
    every curve. The one definition of a band: the scale-in report's and the node-failure
    report's (sim/failures.py) rows both come from here."""
    lo, hi = min(means, key=means.get), max(means, key=means.get)
    return {"by_curve": means, "band": [means[lo], means[hi]], "lowest": lo, "highest": hi,
            "seeds": [min(r[0] for r in ranges), max(r[1] for r in ranges)]}


def _fmt(v: float, unit: str) -> str:
    """pt: a share's change in points; abs: an absolute change (the reference was 0); share:
    a share itself (the node-failure report's goodput); %: a change in percent."""
    if unit == "pt":
        return f"{v * 100:+.1f} pt"
    if unit == "share":
        return f"{v:.2%}"
    return (f"{v:+,.0f}" if abs(v) >= 100 else f"{v:+.1f}") if unit == "abs" else _pct(v)


def about(label: str, c: Curve) -> str:
    """What a curve is, beside its label: a measured one's description, else its name
    without the label ('' where they are the same)."""
    what = {n: w for n, _, w in efficiency.MEASURED}
    return what.get(label) or (c.name[len(label):].strip(" ()") if c.name.startswith(label + " (")
                               else c.name if c.name != label else "")


def legend(label: str, chosen: Curve, others: list[tuple[str, Curve]], reductions: list[float], seeds: int) -> str:
    """What each curve is, by its efficiency at the reductions asked for."""
    parts = []
    for lab, c in [(label, chosen)] + others:
        at = ", ".join(f"{c(f):.1%} at {f:.0%}" for f in reductions if f > 0)
        what = about(lab, c)
        parts.append(f"{lab}{' *' if lab == label else ''}: {at}" + (f" ({what})" if what else ""))
    return "\n".join([f"headlines over the efficiency curves (per-GPU efficiency kept at each reduction; * the "
                      f"--efficiency curve{'; means over the seeds' if seeds > 1 else ''}):"]
                     + ["  " + p for p in parts]
                     + ["a change in percent (goodput in points); band: the lowest..highest curve, named; measured "
                        "points hold at every reduction", ""])


def _ends(row: dict) -> list[str]:
    """The curves at the band's ends; where every curve reads the same as shown: '-'."""
    lo, hi = (_fmt(v, row["unit"]) for v in row["band"])
    return ["-", "-"] if lo == hi else [row["lowest"], row["highest"]]


# the columns a row is named by: (heading, the row's key)
SCENARIO_COLUMNS = (("scenario", "scenario"), ("against", "reference"))


def text(rows: list[dict], labels: list[str], seeds: int, lead: tuple = SCENARIO_COLUMNS) -> str:
    """The band's table: the row's names (`lead`), the headline, its value by curve, the
    band with the curves at its ends, and over several seeds their range."""
    def span(lo_hi, unit):
        return f"{_fmt(lo_hi[0], unit)}..{_fmt(lo_hi[1], unit)}"
    several = seeds > 1
    head = [h for h, _ in lead] + ["headline"] + [lab + (" *" if i == 0 else "") for i, lab in enumerate(labels)] \
        + ["band", "lowest", "highest"] + (["seeds' range"] if several else [])
    body = [[r[k] for _, k in lead] + [r["label"]] + [_fmt(r["by_curve"][lab], r["unit"]) for lab in labels]
            + [span(r["band"], r["unit"])] + _ends(r) + ([span(r["seeds"], r["unit"])] if several else [])
            for r in rows]
    return table(head, body, "l" * (len(lead) + 1) + "r" * (len(labels) + 1) + "ll" + ("r" if several else ""))
