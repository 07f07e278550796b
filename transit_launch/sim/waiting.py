"""The queue of waiting jobs, in submission order (ascending job index), with an index by
the GPUs a job asks. A backfill pass needs the jobs among the ones it tests that could fit
the GPUs free now; in a congested queue most tested jobs are too large, and the index
finds the small ones without walking every tested job (sim/backfill.py)."""

from __future__ import annotations

import bisect
import itertools
from collections import deque


class Waiting:
    """The waiting jobs (`jobs`, ascending) and, for each GPU count, its waiting jobs
    (`by_gpus`, ascending too): every job is in both, in the line of gpus[job]."""

    def __init__(self, gpus):
        self.gpus = gpus      # GPUs each job asks: its line in the index
        self.jobs = deque()
        self.by_gpus = {}     # GPU count -> deque of its waiting jobs
        self.counts = []      # the GPU counts of by_gpus, ascending
        self.lines = []       # their deques, in the same order

    def __len__(self) -> int:
        return len(self.jobs)

    def __getitem__(self, k: int) -> int:
        return self.jobs[k]

    def __iter__(self):
        return iter(self.jobs)

    def _line(self, g: int) -> deque:
        line = self.by_gpus.get(g)
        if line is None:
            line = self.by_gpus[g] = deque()
            k = bisect.bisect(self.counts, g)
            self.counts.insert(k, g)
            self.lines.insert(k, line)
        return line

    def append(self, j: int) -> None:
        """A job later than every waiting one (a submission in index order)."""
        self.jobs.append(j)
        self._line(self.gpus[j]).append(j)

    def insort(self, j: int) -> None:
        """A job back in its submission place (a requeue, or a submission in any order)."""
        bisect.insort(self.jobs, j)
        bisect.insort(self._line(self.gpus[j]), j)

    def popleft(self) -> int:
        """The head leaves: it is the first of its line too."""
        j = self.jobs.popleft()
        self.by_gpus[self.gpus[j]].popleft()
        return j

    def remove(self, j: int) -> None:
        """A waiting job leaves; found by bisection near the head, where backfill starts them."""
        _drop(self.jobs, j)
        _drop(self.by_gpus[self.gpus[j]], j)

    def last_tested(self, tested: int) -> int:
        """The last of the first `tested` jobs (-1 when none wait)."""
        return self.jobs[min(tested, len(self.jobs)) - 1] if self.jobs else -1

    def fitting(self, most_gpus: int, last: int, within: int | None = None) -> list:
        """The waiting jobs up to `last` that ask at most `most_gpus` GPUs, ascending: each
        line's jobs up to `last`, merged. within: at most this many jobs wait up to `last`
        (a bound on the bisection, as a deque reads an item in time growing with its
        distance from an end)."""
        out = []
        for g, line in zip(self.counts, self.lines):
            if g > most_gpus:
                break
            if line and line[0] <= last:  # its jobs up to `last`: the prefix a bisection finds
                if line[-1] <= last:
                    out.extend(line)
                else:
                    hi = len(line) if within is None else min(len(line), within)
                    out.extend(itertools.islice(line, bisect.bisect_right(line, last, 0, hi)))
        out.sort()
        return out

    def between(self, first: int, last: int):
        """The waiting jobs from `first` to `last`, in order (an iterator: the queue must not
        change while it is read)."""
        return itertools.takewhile(last.__ge__, itertools.dropwhile(first.__gt__, self.jobs))


def _drop(line: deque, j: int) -> None:
    """Deletes j from an ascending deque: bisection within a prefix that doubles until it
    holds j, since a deque reads an item in time growing with its distance from an end."""
    hi = 64
    while hi < len(line) and line[hi - 1] < j:
        hi *= 2
    k = bisect.bisect_left(line, j, 0, min(hi, len(line)))
    if k == len(line) or line[k] != j:
        raise ValueError(f"job {j} is not waiting")
    del line[k]
