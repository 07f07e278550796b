"""The band's replays (sim/bands.py): every seed's scale-in scenarios again with each other
efficiency curve, against that seed's baselines (no job scales in there, so a baseline does
not depend on the curve), on forked workers beside the main replay where cores allow."""

from __future__ import annotations

import multiprocessing
import os
from dataclasses import replace

from transit_launch.sim import metrics
from transit_launch.sim.efficiency import Curve
from transit_launch.sim.scheduler import Result, Scenario, simulate
from transit_launch.sim.trace import Trace

# a forked worker touches the trace's lists and so copies them: past this many jobs the
# memory of a copy a worker outweighs the time it saves, and the replays stay in this process
PARALLEL_MAX_JOBS = 200_000
_SHARED: tuple = ()  # (trace, scenarios, baselines, curves by label) for the workers forked next


def _one(task: tuple[str, int]) -> dict:
    trace, scs, baselines, by_label = _SHARED
    label, k = task
    sc = scs[k]
    res = simulate(trace, replace(sc, efficiency=by_label[label]), baseline=baselines.get(sc.racks))
    return metrics.scenario_report(res, trace.submit)


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


def threads() -> int:
    """This process's threads (the OS's count: a fork copies only the forking thread, and a
    lock another thread held stays held in the child)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


class Reruns:
    """Every seed's scale-in scenarios again with each other curve, against that seed's
    baselines (no job scales in there: a baseline does not depend on the curve). With more
    than one core, each seed's replays run on forked workers while this process goes on to
    the next seed (they inherit the trace and the baselines by the fork: nothing is sent);
    one seed in flight. A fork happens only while this process has one thread: a pool's own
    threads, or a host's (pytest-xdist's, an embedding application's), could hold a lock the
    child then waits on forever; so the seed in flight is waited for first, and a process
    with other threads replays here. collect() gives, by label, one list of scenario
    reports a seed."""

    def __init__(self, curves: list[tuple[str, Curve]]):
        self.curves, self.seeds, self.workers = curves, [], cores()

    def submit(self, trace: Trace, scs: list[Scenario], reports: list[dict], baselines: dict[int, Result]) -> None:
        global _SHARED
        tasks = [(label, k) for label, _ in self.curves for k, sc in enumerate(scs) if sc.reduction]
        for k, (pool, *_) in enumerate(self.seeds):
            if pool is not None:
                self._wait(k)  # its pool's threads end with it: no fork beside them
        if self.workers < 2 or not tasks or len(trace) > PARALLEL_MAX_JOBS or threads() > 1:
            _SHARED = (trace, scs, baselines, dict(self.curves))
            try:
                self.seeds.append((None, tasks, [_one(t) for t in tasks], reports))
            finally:
                _SHARED = ()
            return
        _SHARED = (trace, scs, baselines, dict(self.curves))
        try:
            pool = multiprocessing.get_context("fork").Pool(min(self.workers, len(tasks)))
        finally:
            _SHARED = ()
        self.seeds.append((pool, tasks, [pool.apply_async(_one, (t,)) for t in tasks], reports))
        pool.close()

    def _wait(self, k: int, progress=None) -> None:
        pool, tasks, pending, reports = self.seeds[k]
        if pool is not None:
            got = []
            for p in pending:
                got.append(p.get())
                if progress:
                    progress.phase(progress.k + 1)
            pool.join()
            self.seeds[k] = (None, tasks, got, reports)
        elif progress:
            for _ in tasks:
                progress.phase(progress.k + 1)

    def collect(self, progress=None) -> dict[str, list[list[dict]]]:
        out = {label: [] for label, _ in self.curves}
        for k in range(len(self.seeds)):
            self._wait(k, progress)
            _, tasks, got, reports = self.seeds[k]
            by_task = dict(zip(tasks, got))
            for label in out:
                out[label].append([by_task.get((label, i), rep) for i, rep in enumerate(reports)])
        return out

    def close(self) -> None:
        for pool, *_ in self.seeds:
            if pool is not None:
                pool.terminate()


def rerun(trace: Trace, scs: list[Scenario], reports: list[dict], baselines: dict[int, Result],
          curves: list[tuple[str, Curve]]) -> dict[str, list[dict]]:
    """One seed's scenario reports with each curve, by label (Reruns of one seed)."""
    r = Reruns(curves)
    try:
        r.submit(trace, scs, reports, baselines)
        return {label: runs[0] for label, runs in r.collect().items()}
    finally:
        r.close()
