"""Slurm 22.05's reservation rule written plainly from its source, as the simulator first had
it (issue 54): the reference that backfill.slurm_reservation's shortcuts are checked against
(tests/test_sim_passes.py, tests/test_sim_reserve_at.py). No memo, no kept state: each retry
joins the reservations over its window, looks for `later_start` among all the reservations'
bounds, and gives the running jobs back one at a time with _choose after each batch."""

import bisect
import math

from transit_launch.sim import backfill


def will_run(cl, planned, alloc, cover, n: int, g: int, now: float, strategy: str):
    """(start, nodes) as _will_run_test (src/plugins/select/cons_common/job_test.c) finds them
    on the nodes `cover` leaves: now, else after the batch of planned ends (the first up to the
    first given-back end rounded up to 30 s plus 30 s, each later one up to that plus the window
    doubled, and doubled again until the next end is inside) after which the job fits; a job
    whose nodes are all in `cover` is passed over, and the edge is checked only after a job
    given back. (inf, None): none."""
    chosen = backfill._choose(cl, {}, cover, n, g, strategy)
    if chosen is not None:
        return now, chosen
    extra = {}
    window, end_time = backfill.SLURM_TIME_WINDOW, None
    i, count = 0, len(planned)
    while i < count:
        last = nxt = None
        while i < count:
            e, k = planned[i]
            i += 1
            if all(node in cover for node, _ in alloc[k]):
                continue
            if end_time is None:
                end_time = e + (window - e % window)
            last = e
            for node, v in alloc[k]:
                extra[node] = extra.get(node, 0) + v
            nxt = planned[i][0] if i < count else None
            if nxt is None or nxt > end_time + window:
                break
        if last is None:
            break
        window *= 2
        while nxt is not None and nxt > end_time + window:
            window *= 2
        chosen = backfill._choose(cl, extra, cover, n, g, strategy)
        if chosen is not None:
            return max(last, now), chosen
    return math.inf, None


def later_start(resv, start: float, end: float):
    """backfill.c's later_start: the first reservation end after `start` at which a node held
    just before is held by none just after, up to the end of the first span past `end`."""
    bounds = sorted({t for rs, re, _ in resv for t in (rs, re) if t > start})
    past = bisect.bisect_right(bounds, end)
    for b in bounds[:past + 2]:
        ending = [held for _, re, held in resv if re == b]
        if ending:
            after = set().union(*(held for rs, re, held in resv if rs <= b < re))
            if any(node not in after for held in ending for node in held):
                return b
    return None


def slurm_reservation(cl, planned, alloc, resv, n: int, g: int, length: float, now: float, horizon: float,
                      strategy: str, sp):
    """backfill.slurm_reservation's answer: from start_res = now, the reservations over [start_res,
    start_res + length] left out; tested again from later_start when the start is past it, and
    from the start when its nodes meet a reservation over its own rounded window."""
    start_res = now
    while start_res <= horizon:
        end = start_res + length
        cover = set()
        for rs, re, held in resv:
            if re > start_res and rs <= end:
                cover |= held
        later = later_start(resv, start_res, end)
        s, chosen = will_run(cl, planned, alloc, cover, n, g, now, strategy)
        if chosen is None:
            if later is None:
                break
            start_res = later
            continue
        s = max(s, start_res)
        if later is not None and s > later:
            start_res = later
            continue
        if s > now:
            first, last = sp.reservation(s), sp.reservation(s + length)
            if any(rs < last and re > first and not held.isdisjoint(chosen) for rs, re, held in resv):
                start_res = s
                continue
        return (s, chosen) if s <= horizon else (math.inf, None)
    return math.inf, None
