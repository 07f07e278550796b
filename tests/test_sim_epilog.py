"""A node whose job ended takes no new job while the job completes (`--epilog`, issue 54):
Slurm 22.05 keeps a COMPLETING node (a job on it ended, its epilog not done) out of a shared
job's candidates and out of an exclusive job's (src/slurmctld/node_scheduler.c,
_pick_best_nodes: `bit_and_not(node_set_ptr[i].my_bitmap, cg_node_bitmap)`, or idle nodes
alone); the lab's replays start jobs 0-2 s after an end (bench/LOG.md, "The simulator against
Slurm as bands over the pass phase"). Here the ended job's GPUs come back `epilog` seconds
after its end, and until then its nodes take no job, even on GPUs free beside it.

Every expectation is derived by hand. One rack of two 8-GPU nodes n0 n1; `pack` places (the
fullest node that fits, the lowest on ties); passes every 30 s."""

import pytest

from transit_launch.errors import UsageError
from transit_launch.sim.limits import SchedParams
from transit_launch.sim.scheduler import Scenario, simulate
from transit_launch.sim.trace import Trace

# (submit s, run s, GPUs, limit s)
JOBS = [(0, 100, 2, 120),    # A: n0 (all free: the lowest), ends at 100
        (0, 500, 4, 540),    # D: n0 (6 free, the fullest that fits): n0 has 2 free
        (0, 500, 3, 540),    # B: n1 (n0's 2 do not fit): n1 has 5 free
        (100, 60, 4, 60),    # C
        (101, 60, 5, 60)]    # E
# epilog 0: at 100 A's 2 GPUs come back, n0 has 4 free and n1 5: C takes n0, the fullest that
#   fits; at 101 E fits n1 (5 free) and starts.
AT_ONCE = [0, 0, 0, 100, 101]
# epilog 5: at 100 n0 completes to 105, its 2 free GPUs out too: C takes n1 (1 left). E at 101:
#   n0 out, n1 1 free: it waits. At 105 n0 is back with 4: not 5. At 160 C ends and n1
#   completes to 165, when its 5 GPUs come back: E starts at 165 (the main scheduler, before
#   the pass at 180).
COMPLETING = [0, 0, 0, 100, 165]


def starts(epilog: float) -> list:
    t = Trace(submit=[j[0] for j in JOBS], duration=[float(j[1]) for j in JOBS], gpus=[j[2] for j in JOBS],
              ids=[str(i) for i in range(len(JOBS))], limits=[float(j[3]) for j in JOBS], source="test")
    return simulate(t, Scenario("t", racks=1, rack_gpus=16, gpus_per_node=8, sched=SchedParams(epilog=epilog))).start


def test_a_completing_node_takes_no_new_job():
    assert starts(0.0) == AT_ONCE
    assert starts(5.0) == COMPLETING


def test_a_job_that_needs_the_completing_node_waits_for_it():
    """B takes 6 GPUs instead (n1 has 2 free): at 100 C's 4 GPUs fit n0 alone, once A's come
    back. At epilog 0 it starts at 100; at epilog 5 it waits for n0 to complete and starts at
    its release, 105 (the main scheduler, before the pass at 120)."""
    jobs = [(0, 100, 2, 120), (0, 500, 4, 540), (0, 500, 6, 540), (100, 60, 4, 60)]
    t = Trace(submit=[j[0] for j in jobs], duration=[float(j[1]) for j in jobs], gpus=[j[2] for j in jobs],
              ids=[str(i) for i in range(len(jobs))], limits=[float(j[3]) for j in jobs], source="test")
    run = [simulate(t, Scenario("t", racks=1, rack_gpus=16, gpus_per_node=8, sched=SchedParams(epilog=e))).start
           for e in (0.0, 5.0)]
    assert run == [[0, 0, 0, 100], [0, 0, 0, 105]]


def test_the_option():
    with pytest.raises(UsageError) as e:
        SchedParams(epilog=-1)
    assert "--epilog takes 0 to 3600 seconds" in str(e.value)
    assert "epilog" not in SchedParams().reported()
    assert SchedParams(epilog=2).reported()["epilog"] == 2


def test_the_command_line(capsys):
    """--epilog reaches the replay and the report's scheduler line; the node-failure replays,
    which do not model it, refuse it."""
    from transit_launch import cli
    assert cli.main(["simulate", "--synthetic", "100", "--racks", "4", "--reductions", "0", "--epilog", "2"]) == 0
    assert ", epilog 2 s" in capsys.readouterr().out
    assert cli.main(["simulate", "--synthetic", "100", "--racks", "4", "--epilog", "2", "--node-failures", "0.5"]) != 0
    assert "--epilog is not modelled in the --node-failures replays" in capsys.readouterr().err
