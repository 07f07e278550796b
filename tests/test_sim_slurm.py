"""The simulator's scheduler against Slurm's own (issue 54): a 12-job trace replayed on a lab
cluster of its own (tests/slurm_lab.py: 2 racks of 4 nodes of 4 fake GPUs, topology/tree,
sched/backfill at bf_interval=1 and bf_resolution=1, Slurm's minimums, since the defaults of
30 and 60 s are half of this one-minute run) and through the simulator with the same
parameters (tests/sim_replay.py; bench/sim_vs_slurm.py at bench size). About 70 s: time limits are whole minutes in Slurm,
so the trace's limits are one or two minutes and its run times 5-30 s; no compression. The replay
begins at collection on a thread (conftest's EARLY), so its minute of waiting overlaps the run's
other tests instead of holding a worker."""

import json
import shutil
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.conftest import run_dir
from tests.sim_replay import Lab, Replay, compress, in_sim, on_slurm, pairs_in_order, summary
from tests.slurm_lab import SlurmLab, missing
from transit_launch.sim.trace import Trace

# slow; one xdist group: the tests that read the replay wait for it on one worker
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("sim-slurm")]

# (submit s, run s, GPUs, limit s). Derived by hand, planning on limits:
#  0: four 1-GPU jobs fill node n1 (to 25). 1: J4 takes 6 of the 7 free nodes (to 31,
#  limit to 61). 2: J5 wants all 8 nodes: reserved at 61. 8: J6 (1 node, 10 s) would end by
#  8 + 60 = 68 > 61 on its limit: it waits (on run times it ends by 18 <= 31, J4's real end,
#  and backfills at once: the rule the simulator had). 31: J5 runs to 36, then J6.
#  33: J7 (6 nodes, limit 2 min) queues behind J6; both start at 36. 37: J8 (8 nodes) is
#  reserved at J7's planned end, 156. 38: J9 (1 node) fits the last node and ends by
#  98 <= 156: backfilled. 40: two 1-GPU jobs wait for a free GPU: J6 ends at 46 and
#  they backfill there (ends by 106 <= 156). J8 starts when J9 ends (53) and J10, J11 (56).
TRACE = [(0, 25, 1, 60), (0, 25, 1, 60), (0, 25, 1, 60), (0, 25, 1, 60),
         (1, 30, 24, 60), (2, 5, 32, 60), (8, 10, 4, 60),
         (33, 15, 24, 120), (37, 5, 32, 60), (38, 15, 4, 60), (40, 10, 1, 60), (40, 10, 1, 60)]
HAND = [0, 0, 0, 0, 1, 31, 36, 36, 56, 38, 46, 46]
# Slurm starts a job 0-2 s after it could (the end's report, the main scheduler's pass, the
# launch) and records whole seconds; the delays add up along a chain of jobs.
START_TOLERANCE_S = 5.0
QUEUE_TOLERANCE_S = 3.0     # the mean queue time: the same delays, averaged
MAKESPAN_TOLERANCE = 0.10


def trace() -> Trace:
    return Trace(submit=[j[0] for j in TRACE], duration=[float(j[1]) for j in TRACE], gpus=[j[2] for j in TRACE],
                 ids=[str(i) for i in range(len(TRACE))], limits=[float(j[3]) for j in TRACE], source="lab")


def test_the_hand_derivation_is_the_simulators():
    assert in_sim(Lab(), trace()).start == HAND


def test_compression_keeps_limits_in_whole_minutes():
    # 10x: 600 s runs 60 s (limit 1 min), 900 s runs 90 s (limit 2 min), 7200 s 720 s (12 min)
    t = Trace(submit=[0.0, 50.0, 100.0], duration=[600.0, 900.0, 7200.0], gpus=[1, 8, 64], ids=["a", "b", "c"])
    c = compress(t, 10)
    assert c.submit == [0, 5, 10] and c.duration == [60, 90, 720] and c.limits == [60, 120, 720]


RESULT = "sim-slurm-replay"  # run_dir's files: .json (the Replay), .skip or .error (one line why not)
WAIT_S = 600  # a guard for a replay that never reports (its own timeout is 240 s), not a bound on its speed


def _replay(out: Path, stop: threading.Event) -> None:
    """The trace replayed on a lab of its own (2 racks of 4 nodes), what happened written to out."""
    def write(suffix: str, text: str) -> None:
        tmp = out.with_suffix(suffix + ".tmp")
        tmp.write_text(text)
        tmp.rename(out.with_suffix(suffix))  # whole or absent to the reader

    why = missing()
    if why:
        write(".skip", why)
        return
    shape = Lab()
    root = Path(tempfile.mkdtemp(prefix="transit-simcheck-"))
    lab = SlurmLab(root, nodes=shape.nodes, gpus=shape.gpus_per_node, cpus=shape.gpus_per_node,
                   sched=shape.sched_params(), switches=shape.racks)
    try:
        lab.start()
        write(".json", json.dumps(asdict(on_slurm(lab, shape, trace(), timeout=240, stop=stop))))
    except Exception as e:  # the test reports it; the thread must not die silently
        write(".error", f"{type(e).__name__}: {e}")
    finally:
        lab.stop()
        shutil.rmtree(root, ignore_errors=True)


def _start(run_dir: Path):
    """conftest's EARLY: the replay begins at collection, on a thread, and the join stops it
    when the run is interrupted."""
    stop = threading.Event()
    thread = threading.Thread(target=_replay, args=(run_dir / RESULT, stop), name="sim-slurm-replay", daemon=True)
    thread.start()

    def join(interrupted: bool) -> None:
        if interrupted:
            stop.set()
        thread.join()
    return join


EARLY = ("replayed", _start)


@pytest.fixture(scope="module")
def replayed(request):
    out = run_dir(request.config) / RESULT
    deadline = time.monotonic() + WAIT_S
    while not any(out.with_suffix(x).exists() for x in (".json", ".skip", ".error")):
        assert time.monotonic() < deadline, f"the Slurm replay begun at collection left nothing in {WAIT_S} s"
        time.sleep(0.5)
    if out.with_suffix(".skip").exists():
        pytest.skip(out.with_suffix(".skip").read_text())
    assert not out.with_suffix(".error").exists(), out.with_suffix(".error").read_text()
    return Lab(), Replay(**json.loads(out.with_suffix(".json").read_text()))


def test_simulator_schedules_as_slurm_does(replayed):
    shape, slurm = replayed
    sim = in_sim(shape, trace(), slurm.submit)  # the submit times Slurm recorded
    off = [round(b - a, 1) for a, b in zip(sim.start, slurm.start)]
    assert all(-1 <= d <= START_TOLERANCE_S for d in off), f"Slurm started later by {off} s; Slurm {slurm.start}"
    assert pairs_in_order(slurm, sim) == 1.0
    s, m = summary(slurm), summary(sim)
    assert abs(s["queue_mean_s"] - m["queue_mean_s"]) <= QUEUE_TOLERANCE_S, (s, m)
    assert abs(s["makespan_s"] / m["makespan_s"] - 1) <= MAKESPAN_TOLERANCE, (s, m)
    assert abs(s["traversals"] - m["traversals"]) <= 1, (slurm.racks, sim.racks)


def test_planning_on_run_times_is_not_what_slurm_does(replayed):
    # the simulator before limits: J6 backfilled at 8 where Slurm held it to 36 and more
    shape, slurm = replayed
    sim = in_sim(shape, trace(), slurm.submit, plan_on="runtimes")
    assert sim.start[6] <= 10 and slurm.start[6] >= 36
    assert max(abs(a - b) for a, b in zip(sim.start, slurm.start)) > 4 * START_TOLERANCE_S
