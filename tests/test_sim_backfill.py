"""Slurm's backfill gives every job it tests a reservation of specific nodes, not the head
alone (issue 54: the seed-2 replay's gap): a small trace derived by hand, on one rack of
four 8-GPU nodes n0-n3, a pass at every event and no rounding."""

import pytest

from transit_launch.errors import UsageError
from transit_launch.sim.limits import SchedParams
from transit_launch.sim.scheduler import Scenario, simulate
from transit_launch.sim.trace import Trace

# (submit s, run s, GPUs, limit s)
JOBS = [(0, 600, 8, 600),   # J0 holds n0 to 600 (pack: the lowest node first)
        (0, 100, 8, 200),   # J1 n1, planned to 200, ends at 100
        (0, 50, 8, 100),    # J2 n2, ends at 50
        (0, 50, 8, 100),    # J3 n3, ends at 50
        (1, 10, 32, 60),    # H: the whole rack, the head from 1
        (2, 300, 24, 300),  # B: three nodes
        (3, 240, 8, 240)]   # C: one node
# At 50 J2 and J3 end; n2 and n3 are free, H and B do not fit.
# Slurm (every tested job reserved): H gets n0-n3 from J0's planned end, 600, to 660. B gets
#   the earliest time three nodes are free and held by no reservation over [s, s + 300]:
#   not 50 (two), 200 (J1's planned end: n1-n3, its window ends at 500 < 600): n1-n3 over
#   [200, 500]. C's window [50, 290] reaches 200: n1-n3 are held, n0 is busy: it waits.
#   At 100 J1 ends: B fits n1-n3 and ends by 400, before H's 600: it starts at 100 and
#   leaves no GPU free. At 400 B ends; C's window [400, 640] reaches H's 600 on every
#   node: it waits. J0 ends at 600: H starts (to 610), then C, the head, at 610.
CONSERVATIVE = [0, 0, 0, 0, 600, 100, 610]
# The head alone reserved (EASY, the simulator before; or --bf-reserve 1): at 50 H's
#   reservation is 600 with no node to spare; C ends by 290 <= 600: it backfills on n2 at
#   50. At 100 n1 and n3 are free, two of B's three. C ends at 290: B (ends by 590 <= 600)
#   starts; J0 ends at 600, B at 590: H at 600.
HEAD_ONLY = [0, 0, 0, 0, 600, 290, 50]


def starts(**kw):
    t = Trace(submit=[j[0] for j in JOBS], duration=[float(j[1]) for j in JOBS], gpus=[j[2] for j in JOBS],
              ids=[str(i) for i in range(len(JOBS))], limits=[float(j[3]) for j in JOBS], source="test")
    return simulate(t, Scenario("t", racks=1, gpus_per_node=8,
                                sched=SchedParams(bf_interval=0, bf_resolution=0, **kw))).start


def test_every_tested_job_is_reserved_as_slurm_does():
    assert starts(bf_reserve=0) == CONSERVATIVE
    assert starts(bf_reserve=10) == CONSERVATIVE  # 10 jobs reach B


def test_reserving_for_the_head_alone_backfills_past_the_second():
    assert starts(bf_reserve=1) == HEAD_ONLY
    assert starts() == HEAD_ONLY  # the default (docs/simulate.md says why)


def test_no_reservation_past_the_window():
    # bf_window 60 s: at 50 neither H (600) nor B (200) can start within 50 + 60: neither is
    # reserved, and C backfills at 50 as with the head alone; B at 290, H at 600.
    assert starts(bf_reserve=0, bf_window=60) == HEAD_ONLY


@pytest.mark.parametrize("kw,needle", [
    (dict(bf_reserve=-1), "--bf-reserve takes 0 (every job tested) to 1,000,000 jobs"),
    (dict(bf_reserve=1.5), "--bf-reserve takes 0"),
    (dict(bf_window=30), "--bf-window takes 1 to 43,200 minutes (30 days), got 0.5"),
    (dict(bf_window=float("inf")), "--bf-window takes 1 to 43,200 minutes"),
])
def test_bad_parameters(kw, needle):
    with pytest.raises(UsageError) as e:
        SchedParams(**kw)
    assert needle in str(e.value)
