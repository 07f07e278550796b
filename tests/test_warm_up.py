"""The first step's cost, measured by the shim and shown by `run`'s summary (issue 31: the
plan states the warm-up it expects, the job reports the one it got)."""

import time

from transit_launch.preload import run as runmod

from tests.test_shim import pytestmark, run, stats_of  # noqa: F401 (the same skip: a compiler, CUDA headers)


def test_the_first_step_is_clocked_from_the_adapters_attach(built, tmp_path):
    """With the adapter attached (the first optimizer made) the shim times the first step
    from there to the first boundary: more than nothing, less than the process lived (the
    test's own clock). The later steps are the boundary-to-boundary times, one fewer than
    the boundaries."""
    t0 = time.monotonic()
    res, out, _ = run(built, "loop", 5, 20, 10**9, "adapter", "attach", env={"TRANSIT_STATS": str(tmp_path / "a.json")})
    lived_ms = (time.monotonic() - t0) * 1e3
    assert res.returncode == 0, res.stderr
    s = stats_of(tmp_path / "a.json")
    assert 0 < s["first_iteration_ms"] < lived_ms
    assert s["iterations"] == 5 and len(s["iteration_ms"]) == 4


def test_without_an_attach_the_first_step_is_unknown(built, tmp_path):
    """Boundaries alone (an adapter that never made an optimizer known, or kernel-sequence
    guesses) give no clock for the first step: 0, which the summary treats as unknown."""
    res, _, _ = run(built, "loop", 5, 20, 10**9, "adapter", env={"TRANSIT_STATS": str(tmp_path / "b.json")})
    assert res.returncode == 0, res.stderr
    s = stats_of(tmp_path / "b.json")
    assert s["first_iteration_ms"] == 0 and s["iterations"] == 5
    assert runmod.warm_up(s) is None


def test_the_summary_says_where_the_optimizer_state_went():
    """The streamed default's run at half the state (bench/results/2026-12-02/torchtitan-3/
    titan_steps_accum1_stream.json, advise:STATE_OFF=0.5): the shim pinned 15.83 GB of the
    state and the budget kept 20.50 GB on the GPU; the summary says both, in GB as printed."""
    import json
    from tests.prediction_records import RESULTS
    rec = next(r for r in json.loads((RESULTS / "2026-12-02/torchtitan-3/titan_steps_accum1_stream.json")
                                     .read_text())["runs"] if r["name"] == "advise:STATE_OFF=0.5")
    text = runmod.summary_text(runmod.summary(rec["stats"]))
    assert "15.83 GB of optimizer state made in pinned host memory" in text
    assert "and 20.5 GB more of it kept on the GPU by the budget (stepped in place)" in text


def test_the_summary_says_what_the_background_fill_made_ready_and_for_nothing():
    """The pipeline's run at half the state (bench/results/2026-12-04/first-step-fill/
    ad_accum1.json, the second advise:STATE_OFF=0.5): 15,829,303,296 bytes pinned, all of them
    ready before the step (15.83 GB), and 3,741,319,168 bytes made ready that no state took
    (3.74 GB), given back."""
    import json
    from tests.prediction_records import RESULTS
    runs = [r for r in json.loads((RESULTS / "2026-12-04/first-step-fill/ad_accum1.json").read_text())["runs"]
            if r["name"] == "advise:STATE_OFF=0.5"]
    text = runmod.summary_text(runmod.summary(runs[1]["stats"]))
    assert "15.83 GB of optimizer state made in pinned host memory in 0.00 s (15.83 GB of it made ready " \
           "before the first step)" in text
    assert "3.74 GB of pinned memory made ready for predicted state that no allocation took, given back" in text
    text = runmod.summary_text(runmod.summary(
        next(r for r in json.loads((RESULTS / "2026-12-02/torchtitan-3/titan_steps_accum1_stream.json").read_text())
             ["runs"] if r["name"] == "advise:STATE_OFF=0.5")["stats"]))
    assert "made ready" not in text  # a shim of before the pool says nothing of it


def test_the_summary_reports_the_warm_up_against_steady_steps():
    """TorchTitan's 16-microbatch run under advise (bench/results/2026-12-01/
    titan_steps_accum16_masterroom_2026-12-01.json, shim clocks rounded): first step 37.3 s,
    second 9.85 s, then 9.79 and 9.80 s. By hand: steady = median(9.79, 9.80) = 9.795 s (the
    second step is part of the warm-up, not of the median); 37.3 + 9.85 - 2 x 9.795 = 27.56 s
    beyond two steady steps = 27.56 / 9.795 = 2.8 steady steps."""
    s = {"pid": 7, "policy": "advise", "passthrough": False, "budget_bytes": 61_711_810_560,
         "managed_peak_bytes": 98_866_036_736, "device_placed_peak_bytes": 61_708_697_600,
         "host_placed_peak_bytes": 37_165_727_744, "zero_copy_mapped_peak_bytes": 37_165_727_744,
         "cold_hint_bytes": {"optimizer": 36_322_672_640}, "gpu_resident_peak_steady_bytes": 80_830_529_536,
         "prefetch_bytes": 0, "htod_bytes": 0, "iterations": 5, "iteration_source": "adapter",
         "first_iteration_ms": 37_300.0, "iteration_ms": [9_850.0, 9_790.0, 9_800.0],
         "free_at_start_bytes": 149_557_477_376, "guard_limit_bytes": 148_483_735_552}
    w = runmod.warm_up(s)
    assert w == {"first_s": 37.3, "second_s": 9.85, "steady_s": 9.795, "extra_s": 27.56, "steady_steps": 2.8}
    text = runmod.summary_text(runmod.summary([s]))
    assert ("pid 7: first step 37.3 s (from its optimizer's creation), second 9.85 s, steady 9.795 s: 27.56 s "
            "beyond two steady steps (2.8 steady steps") in text
    short = dict(s, iteration_ms=[9_850.0, 9_790.0])  # fewer than four steps: no steady median to speak of
    assert runmod.warm_up(short) is None
