"""Progress of a long `simulate` on stderr: which phase of how many (the trace first, then
each scenario), how far it is, and an ETA for the whole run.

Neither tqdm nor rich is installed here, and a dependency for one status line is not
worth it, so this is a small stderr line of our own:
- on a terminal, one line redrawn in place (at most PER_SECOND times a second) and
  cleared at the end, so the table that follows stands alone;
- elsewhere (a Slurm log, a pipe, a test) coarse lines only: one when a phase ends;
- nothing for runs that end within PATIENCE_S (a quick run needs no progress), and
  nothing with --quiet.
"""

from __future__ import annotations

import sys
import time

PATIENCE_S = 2.0
PER_SECOND = 4


def _clock(seconds: float) -> str:
    s = int(seconds + 0.5)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    """phases: (label, weight) in order; weight is the expected share of the work (the
    ETA assumes work per weight is the same in every phase)."""

    def __init__(self, phases: list[tuple[str, float]], stream=None, enabled: bool = True,
                 patience: float | None = None, clock=time.monotonic):
        self.phases = phases
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.patience, self.clock = PATIENCE_S if patience is None else patience, clock
        self.total = sum(w for _, w in phases) or 1.0
        self.start_t = clock()
        self.k, self.done_weight, self.last_draw, self.drawn = -1, 0.0, 0.0, False

    def phase(self, k: int) -> None:
        """Phase k (0-based) begins; the one before it has ended."""
        if self.k >= 0:
            self._end_phase()
        self.k = k
        self.update(0.0)

    def update(self, fraction: float) -> None:
        """The current phase is this far (0..1)."""
        if not self.tty or self.k < 0:
            return
        now = self.clock()
        if now - self.start_t < self.patience or now - self.last_draw < 1 / PER_SECOND:
            return
        self.last_draw = now
        self._write("\r" + self._line(fraction) + "\x1b[K")
        self.drawn = True

    def close(self) -> None:
        """The run ended: the last phase ends, and the terminal line is cleared."""
        if self.k >= 0:
            self._end_phase()
            self.k = -1
        if self.drawn:
            self._write("\r\x1b[K")
            self.drawn = False

    def _end_phase(self) -> None:
        self.done_weight += self.phases[self.k][1]
        if self.enabled and not self.tty and self.clock() - self.start_t >= self.patience:
            self._write(self._line(1.0, done=True) + "\n")

    def _line(self, fraction: float, done: bool = False) -> str:
        label, weight = self.phases[self.k]
        elapsed = self.clock() - self.start_t
        overall = (self.done_weight + (0 if done else weight * fraction)) / self.total
        eta = f"ETA {_clock(elapsed * (1 - overall) / overall)}" if 0 < overall < 1 else ""
        what = "done" if done else f"{fraction:4.0%}"
        return (f"simulate: [{self.k + 1}/{len(self.phases)}] {label}: {what}, {_clock(elapsed)} elapsed"
                + (f", {eta}" if eta else ""))

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # stderr closed or gone: progress is not worth failing for
            self.enabled = self.tty = False
