"""bench/probes/memory_timeline.py: the bound a lifetime-aware policy could reach from a step's
memory profile, and the hooks that record the profile (on CPU here: labels and order;
memory and GPU times need a GPU); bench/probes/lifetime_probe.py's reading of PyTorch's
allocator snapshot (which ranges are safe to discard)."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import NEEDS_TORCH, ROOT, torch_importable

import lifetime_probe as lp  # bench/probes/, on sys.path by bench/tests/conftest.py
import memory_timeline as mt

GB = 1e9


def profile(peak_at, step=0.6, opt_at=0.5, peak=20 * GB, low=5 * GB):
    """A step: low memory, a peak at `peak_at` seconds, low again, the optimizer at `opt_at`."""
    pts = [(0.0, low), (peak_at, peak), (opt_at, low), (step, low)]
    labels = ["forward", "loss", "optimizer", "optimizer end"]
    return [{"label": lab, "t_ms": 1e3 * t, "allocated": a, "reserved": peak} for lab, (t, a) in zip(labels, pts)]


def test_no_wait_when_the_state_always_fits():
    r = mt.bound(profile(0.3), opt_bytes=8 * GB, budget=30 * GB, rate=50 * GB)
    assert r["wait_out_s"] == r["wait_in_s"] == 0 and r["lifetime_pct"] == 100
    assert r["zero_copy_pct"] == pytest.approx(100 * 0.6 / (0.6 + 0.16))


def test_wait_when_the_peak_comes_before_the_state_can_leave():
    # budget = peak: all 10 GB must be away at the peak; leaving takes 0.2 s
    r = mt.bound(profile(0.1), opt_bytes=10 * GB, budget=20 * GB, rate=50 * GB)
    assert r["wait_out_s"] == pytest.approx(0.1)   # peak at 0.1 s, 0.2 s to leave
    assert r["wait_in_s"] == pytest.approx(0.0)    # 0.4 s from the peak to the optimizer
    r = mt.bound(profile(0.4), opt_bytes=10 * GB, budget=20 * GB, rate=50 * GB)
    assert (r["wait_out_s"], r["wait_in_s"]) == (pytest.approx(0.0), pytest.approx(0.1))
    assert r["lifetime_pct"] == pytest.approx(100 * 0.6 / 0.7)


def test_staging_model_lends_what_fits_after_the_last_backward_start():
    # forward 0-0.1 s, loss at 0.1 s (20 GB), backward from 0.15 s at 8 GB, optimizer at 0.5 s
    marks = [{"label": lab, "t_ms": 1e3 * t, "allocated": a, "reserved": 20 * GB} for lab, t, a in
             [("forward", 0.0, 5 * GB), ("loss", 0.1, 20 * GB), ("bwd logits", 0.15, 8 * GB),
              ("bwd 0", 0.3, 9 * GB), ("optimizer", 0.5, 6 * GB), ("optimizer end", 0.6, 6 * GB)]]
    r = mt.bound(marks, opt_bytes=8 * GB, budget=15 * GB, rate=50 * GB)
    assert r["staged_bytes"] == 6 * GB                 # 15 GB less the 9 GB most allocated after 0.15 s
    assert r["staged_wait_s"] == pytest.approx(0.02)   # 0.12 s home, 0.1 s until the next loss
    assert r["staged_pct"] == pytest.approx(100 * 0.6 / (0.6 + 0.02 + 2 / 50))


def test_only_the_part_that_does_not_fit_must_move():
    # 4 GB of room at the peak: 6 of the 10 GB move, 0.12 s each way
    r = mt.bound(profile(0.05), opt_bytes=10 * GB, budget=24 * GB, rate=50 * GB)
    assert r["wait_out_s"] == pytest.approx(0.07)


@pytest.mark.skipif(not torch_importable(), reason=NEEDS_TORCH)
def test_recorder_marks_every_layer_forward_backward_and_the_optimizer(tmp_path):
    out = tmp_path / "t.json"
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "probes" / "memory_timeline.py"), "--step", "3", "--out", str(out),
                          "--", "--device", "cpu", "--dim", "64", "--layers", "3", "--heads", "4", "--kv-heads", "2",
                          "--ffn", "128", "--vocab", "256", "--seq-len", "32", "--batch", "2"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})  # a tiny model: two threads only wait
    assert res.returncode == 0, res.stderr[-2000:]
    run = json.loads(out.read_text())["runs"][0]
    labels = [m["label"] for m in run["marks"]]
    assert labels == ["forward", "fwd 0", "fwd 1", "fwd 2", "loss", "bwd logits", "bwd 2", "recompute 2", "bwd 1",
                      "recompute 1", "bwd 0", "recompute 0", "optimizer", "optimizer end"]
    times = [m["t_ms"] for m in run["marks"]]
    assert times == sorted(times)
    block = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64  # wq, wo; wk, wv (2 of 4 heads); FFN; norms
    params = 2 * 256 * 64 + 3 * block + 64                      # embedding, output; final norm
    assert run["opt_bytes"] == 2 * 4 * params  # AdamW: two fp32 states per parameter


MB = 1 << 20


def test_probe_discards_only_whole_pages_of_free_blocks():
    """A segment at 0 MiB: a live 3 MiB block, a free 7 MiB block, a live 1 MiB block, a
    free 1 MiB block. Only [4, 10) MiB of the free [3, 10) MiB is whole 2 MiB pages that no live
    block shares; the 1 MiB free block has none."""
    blocks = [{"size": 3 * MB, "state": "active_allocated"}, {"size": 7 * MB, "state": "inactive"},
              {"size": MB, "state": "active_allocated"}, {"size": MB, "state": "inactive"}]
    snap = [{"address": 0, "total_size": 12 * MB, "blocks": blocks}]
    assert lp.free_ranges(snap) == [(4 * MB, 10 * MB)]
    with_addresses = [{"address": 64 * MB, "blocks": [dict(b, address=64 * MB + o) for b, o in
                                                      zip(blocks, (0, 3 * MB, 10 * MB, 11 * MB))]}]
    assert lp.free_ranges(with_addresses) == [(68 * MB, 74 * MB)]


def test_probe_counts_discarded_bytes_handed_out_again():
    later = [{"address": 0, "blocks": [{"size": 5 * MB, "state": "active_allocated"},
                                       {"size": 7 * MB, "state": "inactive"}]}]
    assert lp.reused([(4 * MB, 10 * MB)], later) == MB  # the new 5 MiB block covers [4, 5) MiB


def test_analyze_the_recorded_h200_timelines_in_one_table():
    """The three recorded timelines (1, 3, 12 microbatches, 2026-11-29) give one table whose
    zero-copy model matches what advise measured within 2 points (70.1 / 85.8 / 95.8%)."""
    files = [str(ROOT / f"bench/results/2026-11-29/memory_timeline_accum{n}_2026-11-29.json") for n in (1, 3, 12)]
    res = subprocess.run([sys.executable, str(ROOT / "bench/probes/memory_timeline.py"), "--analyze", *files],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 5 and lines[0].startswith("trainer flags")  # header, rule, three runs
    zero_copy = {line.split()[5]: float(line.split()[-3]) for line in lines[2:]}
    for accum, measured in (("1", 70.1), ("3", 85.8), ("12", 95.8)):
        assert abs(zero_copy[accum] - measured) <= 2.0
