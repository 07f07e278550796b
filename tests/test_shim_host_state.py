"""Optimizer state born in pinned host memory (shim/hoststate.c, transit_state_alloc and
transit_host_state, API version 5), on the fake runtime. What is pinned, what stays
managed, and what the memory does is read from the fake runtime's own log and account
(cudaHostRegister / cudaHostUnregister calls, its pinned bytes, its zero-copy touches), not from
the shim's stats alone."""

from pathlib import Path

import pytest

from tests.test_shim import GB, pytestmark, run, stats_of  # noqa: F401  (pytestmark: the same skip)
from tests.test_shim_faults import cupti  # noqa: F401  (the fake CUPTI, a fixture)

MiB = 1 << 20
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled").exists() and "[never]" not in \
    Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
STATE = 64 * MiB  # real memory now (the shim writes its pages): three of these, above the threads' split
# 4 GB of the application's fill the budget but for 32 MiB: no marked 64 MiB state fits beside them
BUDGET = {"TRANSIT_GPU_BUDGET": f"{4 * GB + 32 * MiB}B"}


def state_run(built, tmp_path, policy="advise", env=None, parts=3, then=(), prefix=()):
    """4 GB of the application's, then `parts` marked 64 MiB allocations, then two unmarked
    ones (another thread's, and the caller's after the mark), under a budget that holds the
    4 GB and 32 MiB more: the marked state does not fit."""
    stats = tmp_path / "s.json"
    res, out, calls = run(built, "state", 4 * GB, STATE, parts, stats, *then, policy=policy,
                          env={**BUDGET, **(env or {})}, prefix=prefix)
    assert res.returncode == 0, res.stderr
    # the fake's tally is printed twice: while everything lives (kept here), and after the frees
    live = res.stdout.split("free0=")[0]
    out = {**out, **dict(line.split("=", 1) for line in live.splitlines() if "=" in line)}
    return res, out, calls, (stats_of(stats) if stats.exists() else None)


def host_allocs(calls):
    return [c for c in calls if c.startswith("cudaHostRegister")]


def test_marked_state_is_pinned_host_memory(built, tmp_path):
    res, out, calls, stats = state_run(built, tmp_path)
    pinned = host_allocs(calls)
    assert [c.split()[1] for c in pinned] == [str(STATE)] * 3, calls
    assert (out["state0_host"], out["state1_host"], out["state2_host"]) == ("1", "1", "1")
    ptrs = {c.split()[2] for c in pinned}
    # each on a huge page's boundary, and advised huge pages by the kernel's own account (the
    # fake reads the mapping's VmFlags in /proc/self/smaps), where the kernel has them
    assert all(int(p, 16) % (2 * MiB) == 0 for p in ptrs), pinned
    if THP:
        assert all(c.endswith(" hg=1") for c in pinned), pinned
    assert stats["host_state_pin_s"] > 0
    assert not any(c.startswith("cudaMallocManaged") and c.split()[2] in ptrs for c in calls)
    assert [out[f"state{i}_err"] for i in range(3)] == ["0", "0", "0"] and out["last_error"] == "0"
    # inside one allocation counts, a range past its end does not
    assert out["inside_host"] == "1" and out["past_end_host"] == "0"
    # the fake's own account: 3 x 64 MiB pinned while they live; the kernel reached them where they are
    assert int(out["fake_pinned"]) == 3 * STATE
    assert int(out["fake_zero_copy"]) >= 3 * STATE
    # the device never held more than the budget (plain + managed pages, the fake's count)
    assert int(out["fake_device_used_peak"]) <= 4 * GB + 32 * MiB
    assert stats["host_state_bytes"] == 3 * STATE and stats["host_state_peak_bytes"] == 3 * STATE
    assert stats["host_state_allocs"] == 3 and stats["host_state_kept_bytes"] == 0
    # pinned state takes nothing from the budget: on the device the 4 GB; the two unmarked
    # allocations, managed, did not fit either and went to the host
    assert stats["device_placed_peak_bytes"] == 4 * GB and stats["host_placed_peak_bytes"] == 2 * STATE


def test_activations_freed_before_the_state_still_keep_their_room(built, tmp_path):
    """Training's order (issue 52): the step's activations (the 4 GB) are freed before the
    optimizer makes its state, and the next step makes them again after it. The room for state
    is the budget less the most the device held, not less what is allocated when the state
    comes: all three states are pinned as when the 4 GB lived, and the next step's 4 GB finds
    the device as it left it (test_marked_state_is_pinned_host_memory's placement: the 4 GB
    on the device, the two unmarked 64 MiB over the budget on the host). Kept on the device,
    the 192 MiB of state would push part of the next step's activations to the host. By hand,
    the room with the peak: 4,033,554,432 - 4e9 - 389,442,088 (3% of the budget and the 256 MiB
    ring) < 0, none kept; with only what is allocated (nothing): 3,644,112,344, all three kept."""
    res, out, calls, stats = state_run(built, tmp_path, env={"APP_HOT_FREED_FIRST": "1"})
    assert [c.split()[1] for c in host_allocs(calls)] == [str(STATE)] * 3, calls
    assert (out["state0_host"], out["state1_host"], out["state2_host"]) == ("1", "1", "1")
    assert stats["host_state_kept_bytes"] == 0 and int(out["fake_pinned"]) == 3 * STATE
    assert stats["device_placed_peak_bytes"] == 4 * GB and stats["host_placed_peak_bytes"] == 2 * STATE
    assert int(out["fake_device_used_peak"]) <= 4 * GB + 32 * MiB


# The room for state (hoststate.c): the budget less the device's peak (the 4 GB), 3% of the
# budget (the cache's growth) and, with no ring yet, the 256 MiB staging ring. By hand:
#   6 GB:    6e9 - 4e9 - 180,000,000 - 268,435,456 = 1,551,564,544, 23 states: all 3 kept
#   4573 MB: 4.573e9 - 4e9 - 137,190,000 - 268,435,456 = 167,374,544 = 2.49 states: 2 kept
BUDGET_2_5_STATES = 4_573_000_000


@pytest.mark.parametrize("budget, kept", [(6 * GB, 3), (BUDGET_2_5_STATES, 2)])
def test_state_the_budget_holds_stays_managed_on_the_device(built, tmp_path, budget, kept):
    """Only the overflow is pinned: under 6 GB all three states fit beside the 4 GB and the
    spare room, and stay managed, placed on the device (the fake's pages say so); with room for
    two and a half, the first two fit and the third, which would not, is pinned."""
    res, out, calls, stats = state_run(built, tmp_path, env={"TRANSIT_GPU_BUDGET": f"{budget}B"})
    assert [c.split()[1] for c in host_allocs(calls)] == [str(STATE)] * (3 - kept), calls
    assert [out[f"state{i}_host"] for i in range(3)] == ["0"] * kept + ["1"] * (3 - kept)
    assert stats["host_state_kept_bytes"] == kept * STATE and stats["host_state_bytes"] == (3 - kept) * STATE
    assert int(out["fake_pinned"]) == (3 - kept) * STATE
    assert int(out["fake_device_used_peak"]) <= budget
    assert stats["device_placed_peak_bytes"] >= 4 * GB + kept * STATE


def test_only_the_marked_thread_allocates_state(built, tmp_path):
    """Another thread's allocation while one thread is marked, and the caller's allocation
    after the mark is lifted, are managed as always (over the budget: on the host)."""
    res, out, calls, stats = state_run(built, tmp_path)
    assert out["other_host"] == "0" and out["after_host"] == "0" and out["hot_host"] == "0"
    assert len(host_allocs(calls)) == 3


def test_freed_state_goes_back_with_cuda_free_host(built, tmp_path):
    res, out, calls, stats = state_run(built, tmp_path)
    for c in host_allocs(calls):
        ptr = c.split()[2]
        assert f"cudaHostUnregister {ptr}" in calls
        assert f"cudaFree {ptr}" not in calls  # the runtime would refuse it
    assert [out[f"free{i}"] for i in range(3)] == ["0", "0", "0"]
    # the second tally (after every free): nothing pinned or live, no rejected free
    tail = res.stdout.split("free_after=")[1]
    tally = dict(line.split("=", 1) for line in tail.splitlines() if "=" in line)
    assert tally["fake_pinned"] == "0" and tally["fake_live_ptrs"] == "0" and tally["fake_bad_frees"] == "0"


def test_a_refused_host_allocation_takes_the_managed_path(built, tmp_path):
    res, out, calls, stats = state_run(built, tmp_path, env={"FAKE_HOST_REGISTER_FAIL": "1"})
    assert host_allocs(calls) == [f"cudaHostRegister {STATE} -> oom"] * 3
    assert [out[f"state{i}_err"] for i in range(3)] == ["0", "0", "0"] and out["state2_host"] == "0"
    assert out["last_error"] == "0"  # the shim's own failure is not the application's error
    assert res.stderr.count("cudaHostRegister for") == 1  # said once
    assert stats["host_state_allocs"] == 0 and int(out["fake_pinned"]) == 0


@pytest.mark.parametrize("policy", ["base", "prefetch"])
def test_only_advise_pins_state(built, tmp_path, policy):
    """base and prefetch move cold data through managed memory by design: no pinned state."""
    res, out, calls, stats = state_run(built, tmp_path, policy=policy)
    assert host_allocs(calls) == []
    assert out["state2_host"] == "0" and stats["host_state_allocs"] == 0


def test_off_ignores_the_mark(built, tmp_path):
    stats = tmp_path / "s.json"
    res, out, calls = run(built, "state", 4 * GB, GB, 3, stats, policy="off", env=BUDGET)
    assert res.returncode == 0, res.stderr
    assert host_allocs(calls) == [] and out["state2_host"] == "0"
    assert all(c.startswith("cudaMalloc ") for c in calls if c.startswith("cudaMalloc"))  # plain, not managed


def test_the_opt_out_keeps_state_managed(built, tmp_path):
    res, out, calls, stats = state_run(built, tmp_path, env={"TRANSIT_HOST_STATE": "0"})
    assert host_allocs(calls) == [] and out["state2_host"] == "0" and stats["host_state_allocs"] == 0
    assert sum(c.startswith(f"cudaMallocManaged {STATE} ") for c in calls) == 5  # three states, after, other


def test_a_bad_opt_out_value_is_said_and_the_default_kept(built, tmp_path):
    res, out, calls, stats = state_run(built, tmp_path, env={"TRANSIT_HOST_STATE": "no"})
    said = [line for line in res.stderr.splitlines() if "TRANSIT_HOST_STATE" in line]
    assert len(said) == 1 and "is not 0 or 1" in said[0] and "using 1" in said[0], res.stderr
    assert len(host_allocs(calls)) == 3


@pytest.mark.parametrize("hinted", [True, False])
def test_hints_on_pinned_state_keep_advise_from_probing_access(built, cupti, tmp_path, hinted):  # noqa: F811
    """advise probes which data is cold (CUPTI, every managed region sent to the host to be
    faulted back in the next step) only when no optimizer state was reported. Where all the
    state is pinned, none of the adapter's optimizer hints named managed memory, so the shim
    probed: on TorchTitan at 16 microbatches that made steps 1 + 2 63.4 s against plain
    advise's 32.0 (bench/LOG.md, "The streamed step by default"). A hint on pinned state is
    a report: no CUPTI, nothing of the application's sent to the host (the fake's own count of
    pages moved there: the two unmarked 64 MiB allocations the budget had no room for). With
    no hints at all the probe still runs: the case it is for."""
    res, out, calls, stats = state_run(built, tmp_path, env={"LD_LIBRARY_PATH": str(cupti)},
                                       then=("step" if hinted else "step-nohint",))
    used = [c for c in calls if c.startswith("cupti")]
    if hinted:
        assert [out[f"hint{i}"] for i in range(3)] == ["0"] * 3  # pinned state: a known range
        assert used == [] and "CUPTI recording" not in res.stderr, (used, res.stderr)
        assert int(out["fake_to_host"]) <= 2 * STATE
        assert stats["iterations"] == 2 and stats["host_state_bytes"] == 3 * STATE
    else:
        assert "cuptiActivityRegisterCallbacks" in used
        assert int(out["fake_to_host"]) >= 4 * GB  # the application's 4 GB went to the host


@pytest.mark.parametrize("inflight", [str(64 * MiB), str(1 << 30), "abc", "0"])
def test_the_room_left_for_the_ring_is_the_ring_the_adapter_makes(built, tmp_path, inflight):
    """The ring does not exist yet when the state is made, so the shim leaves the room of the
    ring the adapter will make: TRANSIT_OVERLAP_INFLIGHT's bytes, read by the adapter's rule (a
    positive integer, else the 256 MiB default). Under a budget with room for two and a half
    states beside the default ring, a 64 MiB ring leaves room for all three, a 1 GiB ring for
    none, and a value that is no positive integer changes nothing."""
    # 4573 MB less the 4 GB and 137,190,000 (3%): 435,810,000; less a 64 MiB ring 368,701,136
    # (5.49 states: 3 kept), less 1 GiB nothing (0 kept), less 256 MiB 2.49 states (2 kept)
    kept = {str(64 * MiB): 3, str(1 << 30): 0}.get(inflight, 2)
    res, out, calls, stats = state_run(built, tmp_path, env={"TRANSIT_GPU_BUDGET": f"{BUDGET_2_5_STATES}B",
                                                             "TRANSIT_OVERLAP_INFLIGHT": inflight})
    assert stats["host_state_kept_bytes"] == kept * STATE and stats["host_state_bytes"] == (3 - kept) * STATE
