"""The pinned optimizer state's segments made ready before the first step (shim/prefill.c,
transit_state_segments, API version 8), on the fake runtime. The adapter predicts the sizes
of the segments the first step's state will be allocated in; the shim maps a pool with a
region for each, writes (one thread) and registers (another) them in the background from the
last one back, and a marked allocation of a predicted size takes its region, ready or not. What was registered,
where, on which device and by whom is read from the fake runtime's log (cudaHostRegister's
size, pointer and the calling thread's device, in call order), what is mapped and written from
the kernel's account (smaps, which the fake reads; msync on the page after each allocation) and
the fake's tally; the shim's debug line says only where its pool starts."""

import re
from pathlib import Path

import pytest

from tests.test_shim import GB, pytestmark, run, stats_of  # noqa: F401  (pytestmark: the same skip)
from tests.test_shim_host_state import BUDGET, STATE, THP, MiB, host_allocs, state_run

DEBUG = {"TRANSIT_LOG": "debug"}
GATED = {**DEBUG, "APP_PREFILL_GATE": "1"}  # the fill begins nothing until the allocations are made
# Budgets and the room each leaves for state beside the 4 GB (hoststate.c, derived as in
# test_shim_host_state.py: less 3% of the budget and the 256 MiB ring):
#   4505 MB: 505,000,000 - 135,150,000 - 268,435,456 = 101,414,544, 1.51 states of 64 MiB
#            (one state leaves 34,305,680: a half state, 32 MiB, fits beside it)
#   4643 MB: 643,000,000 - 139,290,000 - 268,435,456 = 235,274,544, 3.51 states
BUDGET_1_5_STATES, ROOM_1_5 = 4_505_000_000, 101_414_544
BUDGET_3_5_STATES, ROOM_3_5 = 4_643_000_000, 235_274_544


def pool_of(res):
    """(start, bytes) of the shim's pool, from its debug line; None when it made none."""
    m = re.search(r"optimizer state's pool 0x([0-9a-f]+) \((\d+) bytes, \d+ segments\) filling", res.stderr)
    return (int(m.group(1), 16), int(m.group(2))) if m else None


def registered(calls):
    """(pointer, size) of each successful cudaHostRegister, in call order."""
    return [(int(c.split()[2], 16), int(c.split()[1])) for c in host_allocs(calls) if "->" not in c]


def unregistered_once(calls, ptrs):
    return all(calls.count(f"cudaHostUnregister {hex(p)}") == 1 for p in ptrs)


def after_frees(res):
    tail = res.stdout.split("free_after=" if "free_after=" in res.stdout else "freed=")[1]
    return dict(line.split("=", 1) for line in tail.splitlines() if "=" in line)


def test_predicted_segments_are_taken_ready_made_from_the_last(built, tmp_path):
    """Three segments predicted and the fill left to end before the allocations (segs-ready):
    it registered the three regions itself, the last first; each allocation takes its region
    whole, registered already (no registration of its own), and frees it with one unregister."""
    res, out, calls, stats = state_run(built, tmp_path, env=DEBUG, then=("segs-ready:s,s,s",))
    start, size = pool_of(res)
    assert size == 3 * STATE and start % (2 * MiB) == 0
    assert registered(calls) == [(start + i * STATE, STATE) for i in (2, 1, 0)], calls
    assert [out[f"state{i}_host"] for i in range(3)] == ["1"] * 3 and out["last_error"] == "0"
    assert [out[f"state{i}_err"] for i in range(3)] == ["0"] * 3
    assert stats["host_state_prefill_ready_bytes"] == 3 * STATE
    assert stats["host_state_prefill_used_bytes"] == 3 * STATE and stats["host_state_prefill_unused_bytes"] == 0
    assert stats["host_state_register_s"] == 0  # the allocations registered nothing
    assert stats["host_state_allocs"] == 3 and int(out["fake_pinned"]) == 3 * STATE
    if THP:
        assert all(c.endswith(" hg=1") for c in host_allocs(calls))
    assert unregistered_once(calls, [p for p, _ in registered(calls)])
    tally = after_frees(res)
    assert tally["fake_pinned"] == "0" and tally["fake_bad_frees"] == "0" and tally["fake_live_ptrs"] == "0"


def test_the_fill_registers_on_the_jobs_device(built, tmp_path):
    """The job runs on device 3 (its LOCAL_RANK's): the fill's thread registers there too, not in
    a context of device 0 that it would otherwise create on another rank's GPU."""
    res, out, calls, stats = state_run(built, tmp_path, env={**DEBUG, "APP_DEVICE": "3"},
                                       then=("segs-ready:s,s,s",))
    regs = host_allocs(calls)
    assert len(regs) == 3 and all(" dev=3 " in c for c in regs), calls
    assert stats["host_state_prefill_ready_bytes"] == 3 * STATE


def test_a_region_written_but_not_yet_registered_is_registered_by_its_allocation(built, tmp_path):
    """The fill's writer has written all three regions, its registrar has registered none (held
    by the test's gate): each allocation takes its written region and registers it itself, in the
    allocations' order (the registrar would have gone from the last); none is made ready."""
    res, out, calls, stats = state_run(built, tmp_path, env={**DEBUG, "APP_PREFILL_GATE": "2"},
                                       then=("segs-ready:s,s,s",))
    start, size = pool_of(res)
    assert size == 3 * STATE and out["gated"] == "1"
    assert registered(calls) == [(start + i * STATE, STATE) for i in range(3)], calls
    assert [out[f"state{i}_host"] for i in range(3)] == ["1"] * 3 and out["last_error"] == "0"
    assert stats["host_state_prefill_ready_bytes"] == 0 and stats["host_state_prefill_used_bytes"] == 3 * STATE
    assert stats["host_state_prefill_unused_bytes"] == 0 and stats["host_state_allocs"] == 3
    assert unregistered_once(calls, [p for p, _ in registered(calls)]) and after_frees(res)["fake_pinned"] == "0"


def test_the_fill_makes_no_region_the_budget_would_keep_on_the_device(built, tmp_path):
    """The budget has room for one and a half states beside the 4 GB: the first state will stay
    on the device. The fill makes the last two regions and holds at the first, which lies within
    that room; the first allocation is kept on the device, the other two take the two made, and
    the first region is never registered (none is made for nothing)."""
    res, out, calls, stats = state_run(
        built, tmp_path, env={**DEBUG, "TRANSIT_GPU_BUDGET": f"{BUDGET_1_5_STATES}B"},
        then=("segs-ready:s,s,s",))
    start, size = pool_of(res)
    assert size == 3 * STATE
    assert registered(calls) == [(start + 2 * STATE, STATE), (start + STATE, STATE)], calls
    assert [out[f"state{i}_host"] for i in range(3)] == ["0", "1", "1"] and out["last_error"] == "0"
    assert stats["host_state_kept_bytes"] == STATE and stats["host_state_prefill_ready_bytes"] == 2 * STATE
    assert stats["host_state_prefill_unused_bytes"] == 0
    # the room the hold made its two regions under is the room the state found: nothing kept that was made
    assert stats["host_state_prefill_hold_regions"] == 2
    assert stats["host_state_prefill_hold_room_bytes"] == stats["host_state_first_room_bytes"] == ROOM_1_5
    assert unregistered_once(calls, [p for p, _ in registered(calls)]) and after_frees(res)["fake_pinned"] == "0"


def test_the_fill_makes_nothing_when_the_budget_keeps_all_the_state(built, tmp_path):
    """Room for three and a half states: all three stay on the device. The fill holds at every
    region, and goes on holding once the kept state has filled that room (the room the first
    state found is the rule then, not what is left beside the state itself): nothing is
    written or registered, nothing made for nothing."""
    res, out, calls, stats = state_run(
        built, tmp_path, env={**DEBUG, "TRANSIT_GPU_BUDGET": f"{BUDGET_3_5_STATES}B"},
        then=("segs-idle:s,s,s",))
    assert out["settled"] == "1" and pool_of(res)[1] == 3 * STATE
    assert [out[f"state{i}_host"] for i in range(3)] == ["0"] * 3 and registered(calls) == [], calls
    assert stats["host_state_kept_bytes"] == 3 * STATE and stats["host_state_prefill_unused_bytes"] == 0
    assert stats["host_state_prefill_ready_bytes"] == 0 and stats["host_state_prefill_register_s"] == 0
    assert stats["host_state_prefill_hold_regions"] == 0 and stats["host_state_first_room_bytes"] == ROOM_3_5


def test_a_state_taking_a_later_ready_region_leaves_the_fill_its_earlier_ones(built, tmp_path):
    """Three regions of one size; the fill has made only the last (the test's gate closes after
    one region) when the first state comes: it takes that ready region, but its place in the
    order is the first region's, so the fill, opened again, goes on to make the other two, and
    the next two states take them ready (none is left to the allocations to write)."""
    res, out, calls, stats = state_run(
        built, tmp_path, env={**DEBUG, "APP_PREFILL_GATE": "4", "APP_PREFILL_OPEN_AFTER_FIRST": "1"},
        then=("segs-ready:s,s,s",))
    start, size = pool_of(res)
    assert size == 3 * STATE
    assert registered(calls) == [(start + i * STATE, STATE) for i in (2, 1, 0)], calls  # all the fill's
    assert [out[f"state{i}_host"] for i in range(3)] == ["1"] * 3 and out["last_error"] == "0"
    assert stats["host_state_prefill_ready_bytes"] == 3 * STATE and stats["host_state_register_s"] == 0
    assert unregistered_once(calls, [p for p, _ in registered(calls)]) and after_frees(res)["fake_pinned"] == "0"


def test_the_greedy_rule_holds_only_what_the_budget_keeps(built, tmp_path):
    """Room for one and a half states beside the 4 GB, and segments of a state, two states, and
    a half: the budget keeps the first, cannot keep the double one, and keeps the half beside the
    first (hoststate.c decides allocation by allocation). So the fill makes only the double one's
    region: the half's lies past the room by its end but is kept, and is not made for nothing."""
    res, out, calls, stats = state_run(
        built, tmp_path, parts=1, env={**DEBUG, "TRANSIT_GPU_BUDGET": f"{BUDGET_1_5_STATES}B"},
        then=(f"segs-idle:s,{2 * STATE},{STATE // 2}",))
    start, size = pool_of(res)
    assert size == 3 * STATE + STATE // 2
    assert registered(calls) == [(start + STATE, 2 * STATE)], calls
    assert out["settled"] == "1" and stats["host_state_prefill_unused_bytes"] == 2 * STATE


def test_allocations_before_the_fill_make_their_own_regions_and_the_fill_keeps_above_them(built, tmp_path):
    """A 4 GiB segment first (the state the GPU keeps, which no marked allocation of this size
    takes), three states, and one more state at the end. The allocations come while the fill
    has begun nothing: each takes the first region of its size and registers it itself. Then
    the fill makes only what lies above the lowest region taken (the last state, which nothing
    takes and which is given back, unregistered, at the first step's end); the 4 GiB below are
    never written."""
    res, out, calls, stats = state_run(built, tmp_path, env=GATED, then=(f"segs-idle:{4 << 30},s,s,s,s",))
    assert out["gated"] == "1" and out["settled"] == "1"
    start, size = pool_of(res)
    assert size == (4 << 30) + 4 * STATE
    first = start + (4 << 30)
    assert registered(calls) == [(first + i * STATE, STATE) for i in range(4)], calls  # three taken, then the fill's
    assert int(out["pool_mapping"]) == size and int(out["pool_written"]) == 4 * STATE  # not the 4 GiB
    assert f"cudaHostUnregister {hex(first + 3 * STATE)}" in calls  # the last, made and not taken
    assert stats["host_state_prefill_ready_bytes"] == 0 and stats["host_state_prefill_unused_bytes"] == STATE
    assert stats["host_state_prefill_used_bytes"] == 3 * STATE
    assert [out[f"state{i}_next_mapped"] for i in range(3)] == ["1", "1", "0"]  # the next, then given back
    assert unregistered_once(calls, [p for p, _ in registered(calls)]) and after_frees(res)["fake_pinned"] == "0"


def test_a_size_not_predicted_makes_its_own_memory(built, tmp_path):
    """Two states predicted for three allocations: two from the pool, ready; the third by the
    allocation's own path, its own mapping outside the pool."""
    res, out, calls, stats = state_run(built, tmp_path, env=DEBUG, then=("segs-ready:s,s",))
    start, size = pool_of(res)
    assert size == 2 * STATE
    regs = registered(calls)
    assert regs[:2] == [(start + STATE, STATE), (start, STATE)] and len(regs) == 3, calls
    third, n = regs[2]
    assert n == STATE and (third + n <= start or third >= start + size) and third % (2 * MiB) == 0
    assert [out[f"state{i}_host"] for i in range(3)] == ["1"] * 3
    assert stats["host_state_prefill_ready_bytes"] == 2 * STATE and stats["host_state_allocs"] == 3
    assert unregistered_once(calls, [p for p, _ in regs]) and after_frees(res)["fake_pinned"] == "0"


def test_a_wrong_prediction_costs_only_what_it_would_have_saved(built, tmp_path):
    """Every predicted size wrong (one page more than the allocations'): no allocation takes a
    region; all three are pinned by their own path, and the regions the fill made are given back."""
    wrong = STATE + 2 * MiB
    res, out, calls, stats = state_run(built, tmp_path, env=DEBUG, then=(f"segs-ready:{wrong},{wrong},{wrong}",))
    start, size = pool_of(res)
    regs = registered(calls)
    assert regs[:3] == [(start + i * wrong, wrong) for i in (2, 1, 0)] and [n for _, n in regs[3:]] == [STATE] * 3
    assert all(p + n <= start or p >= start + size for p, n in regs[3:])
    assert [out[f"state{i}_host"] for i in range(3)] == ["1"] * 3 and out["last_error"] == "0"
    assert stats["host_state_prefill_used_bytes"] == 0 and stats["host_state_prefill_unused_bytes"] == 3 * wrong
    assert unregistered_once(calls, [p for p, _ in regs]) and after_frees(res)["fake_pinned"] == "0"


@pytest.mark.parametrize("policy, env", [("off", {}), ("advise", {"FAKE_NO_MANAGED": "1"}), ("base", {}),
                                         ("prefetch", {}), ("advise", {"TRANSIT_HOST_STATE": "0"})],
                         ids=["off", "passthrough", "base", "prefetch", "host-state-off"])
def test_segments_do_nothing_where_no_state_is_pinned(built, tmp_path, policy, env):
    """Off, passing through (no managed memory), the policies that keep state managed, and
    TRANSIT_HOST_STATE=0: no pool is mapped (the kernel's account is unchanged), nothing pinned."""
    res, out, calls, stats = state_run(built, tmp_path, policy=policy, env={**DEBUG, **env},
                                       then=("segs:s,s,s",))
    assert pool_of(res) is None and host_allocs(calls) == []
    assert out["huge_expected"] == out["huge_before"] == out["huge_released"]
    assert stats is None or stats["host_state_prefill_bytes"] == 0


def test_the_retired_expect_makes_no_pool(built, tmp_path):
    """An adapter of version 7 sends a total (transit_state_expect): it says nothing of the
    segments, so no pool is made and the state is pinned when made; its closing 0 is harmless."""
    res, out, calls, stats = state_run(built, tmp_path, env=DEBUG, then=(f"expect:{3 * STATE}",))
    assert pool_of(res) is None and out["huge_expected"] == out["huge_before"]
    assert [n for _, n in registered(calls)] == [STATE] * 3 and out["last_error"] == "0"
    assert stats["host_state_prefill_bytes"] == 0 and stats["host_state_allocs"] == 3


def mem_available():
    """The kernel's MemAvailable in bytes, as the shim reads it (/proc/meminfo)."""
    line = next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemAvailable:"))
    return int(line.split()[1]) * 1024


def test_a_pool_the_host_refuses_leaves_the_allocations_own_path(built, tmp_path):
    """A pool mmap refuses (the process's address space limited below it by prlimit, the pool
    within the host's room): said once, and the state is pinned as before."""
    limit = min(mem_available() // 4, 6 * GB)
    if limit < 2 * GB:
        pytest.skip("needs 8 GB of available host memory (the limit must leave the application room)")
    res, out, calls, stats = state_run(built, tmp_path, env=DEBUG, then=(f"segs:s,s,s,{limit}",),
                                       prefix=("prlimit", f"--as={limit}"))
    assert pool_of(res) is None
    said = [line for line in res.stderr.splitlines() if "pool failed" in line]
    assert len(said) == 1 and "mmap for the optimizer state's pool failed" in said[0], res.stderr
    assert [n for _, n in registered(calls)] == [STATE] * 3
    assert stats["host_state_prefill_bytes"] == 0 and stats["host_state_prefill_used_bytes"] == 0
    assert stats["host_state_allocs"] == 3


def test_the_pool_takes_at_most_half_the_available_memory_per_rank_its_last_segments(built, tmp_path):
    """Regions made but not taken hold pinned memory until the first step ends: the pool takes
    at most half the host's available memory, shared by the node's ranks (LOCAL_WORLD_SIZE),
    and the segments it drops are the first (the state the GPU keeps). With a rank count that
    makes that share one and a half states (the test's own reading of MemAvailable, which may
    move by a third either way before the shim's), three states get a pool of one."""
    share = 3 * STATE // 2
    ranks = mem_available() // 2 // share
    res, out, calls, stats = state_run(built, tmp_path, env={**DEBUG, "LOCAL_WORLD_SIZE": str(ranks)},
                                       then=("segs-ready:s,s,s",))
    start, size = pool_of(res)
    assert size == STATE, size
    assert "3 segments expected, the last 1 of them taken" in res.stderr
    regs = registered(calls)
    assert len(regs) == 3 and regs[0] == (start, STATE)
    assert all(p + n <= start or p >= start + size for p, n in regs[1:]), calls
    assert stats["host_state_prefill_used_bytes"] == STATE and stats["host_state_allocs"] == 3


def test_threads_at_once_take_disjoint_regions_while_the_fill_runs(built, tmp_path):
    """Eight threads, each marked on its own, allocate at the same moment, just after the
    list: the fill has hardly begun, and some regions are being made as they are asked for.
    Each thread gets its own region, registered once (by the fill or by itself): together they
    tile the pool exactly, and each is unregistered once when freed."""
    k = 8
    stats_path = tmp_path / "s.json"
    res, out, calls = run(built, "state-threads", 4 * GB, STATE, k, stats_path, "segs:" + ",".join("s" * k),
                          env={**BUDGET, **DEBUG})
    assert res.returncode == 0, res.stderr
    start, size = pool_of(res)
    assert size == k * STATE
    regs = registered(calls)
    assert sorted(regs) == [(start + i * STATE, STATE) for i in range(k)]  # once each, the whole pool
    assert [out[f"state{i}_host"] for i in range(k)] == ["1"] * k
    assert [out[f"state{i}_err"] for i in range(k)] == ["0"] * k
    stats = stats_of(stats_path)
    assert stats["host_state_prefill_used_bytes"] == k * STATE and stats["host_state_allocs"] == k
    assert stats["host_state_prefill_unused_bytes"] == 0
    assert unregistered_once(calls, [p for p, _ in regs])
    tally = after_frees(res)
    assert tally["fake_pinned"] == "0" and tally["fake_bad_frees"] == "0"


def test_the_shims_exit_ends_a_pool_still_filling(built, tmp_path):
    """No closing list (a job that ends inside its first step): the shim's exit stops the fill,
    joins it and unmaps what no allocation took, without the runtime; the process exits cleanly."""
    res, out, calls = run(built, "state-threads", 4 * GB, STATE, 2, tmp_path / "s.json", f"segs-exit:{1 << 30},s,s",
                          env={**BUDGET, **DEBUG})
    assert res.returncode == 0, res.stderr
    start, size = pool_of(res)
    assert size == 2 * STATE + (1 << 30)
    assert re.search(r"optimizer state's pool: \d+ bytes not taken \(\d+ of them made ready\), given back", res.stderr)
    taken = [(p, n) for p, n in registered(calls) if n == STATE]
    assert sorted(taken) == [(start + (1 << 30), STATE), (start + (1 << 30) + STATE, STATE)]


@pytest.mark.parametrize("which", ["1", "2"])  # the registrar's thread, the writer's
def test_a_fill_thread_that_cannot_start_withdraws_the_pool_before_anyone_takes_from_it(built, tmp_path, which):
    """One of the fill's two threads cannot be started (the process's thread limit): said once,
    the pool is unmapped before any allocation could see it, and eight threads allocating at that
    moment each pin their own memory, write it (the fake's kernel touches all) and exit cleanly."""
    k = 8
    stats_path = tmp_path / "s.json"
    res, out, calls = run(built, "state-threads", 4 * GB, STATE, k, stats_path, "segs:" + ",".join("s" * k),
                          env={**BUDGET, **DEBUG, "TRANSIT_TEST_PREFILL_THREAD_FAIL": which})
    assert res.returncode == 0, res.stderr
    assert pool_of(res) is None
    assert res.stderr.count("pthread_create for the optimizer state's pool failed (error 11)") == 1, res.stderr
    assert [out[f"state{i}_host"] for i in range(k)] == ["1"] * k
    stats = stats_of(stats_path)
    assert stats["host_state_prefill_used_bytes"] == 0 and stats["host_state_allocs"] == k
    assert stats["host_state_prefill_bytes"] == 0
    assert len(registered(calls)) == k and after_frees(res)["fake_pinned"] == "0"


def test_children_forked_while_the_fill_runs_never_wait_on_its_lock(built, tmp_path):
    """A data loader forks while the fill's threads take and leave their lock: each of 300
    children ends the pool it inherited (not its own: it has no fill threads) at once, never
    stuck on a lock a fill thread held at the fork (every 30th fork comes while another thread
    holds it, by the test build's hook); the parent's pool is untouched."""
    res, out, calls, stats = state_run(built, tmp_path, env=DEBUG, then=(f"segs-fork:{1 << 30},{1 << 30},s,s,s",))
    assert res.returncode == 0, res.stderr
    assert out["forks_ok"] == "300"
    assert stats["host_state_prefill_used_bytes"] == 3 * STATE and out["last_error"] == "0"


def test_a_second_list_is_ignored(built, tmp_path):
    """The shim takes the first list only (once per process): a second, each size twice, makes
    no second pool and changes nothing of the first."""
    res, out, calls, stats = state_run(built, tmp_path, env=DEBUG, then=("segs-twice:s,s,s",))
    start, size = pool_of(res)
    assert size == 3 * STATE and res.stderr.count("optimizer state's pool 0x") == 1
    assert sorted(registered(calls)) == [(start + i * STATE, STATE) for i in range(3)], calls
    assert stats["host_state_prefill_bytes"] == size and stats["host_state_prefill_used_bytes"] == 3 * STATE


@pytest.mark.parametrize("backend", ["ctypes", "cffi"])
def test_the_adapters_bindings_send_the_list_to_the_shim(built, tmp_path, backend):
    """The adapter's own bindings (transit_api.py, under ctypes and under cffi) against the
    shim in a Python process on the fake runtime: the list arrives whole (the shim's pool has
    its segments and their bytes), and the empty list ends it."""
    import os
    import subprocess
    import sys

    if backend == "cffi":
        pytest.importorskip("cffi")
    from transit_launch.preload import inject
    code = "\n".join([
        "import ctypes, sys",
        f"sys.path.insert(0, {str(inject.adapter_dir())!r})",
        *(["sys.modules['cffi'] = None"] if backend == "ctypes" else []),  # ctypes: as without cffi
        f"ctypes.CDLL({str(built['dir'] / 'libcudart.so.13')!r}, mode=ctypes.RTLD_GLOBAL)",
        "rt = ctypes.CDLL(None)  # the global scope: the shim's cudaMalloc first, as PyTorch's calls find it",
        "p = ctypes.c_void_p(); rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 20))  # the runtime in use",
        "import transit_api",
        "print('backend=' + transit_api.backend)",
        f"print('sent=%d' % transit_api.state_segments([{STATE}, {2 * STATE}, {STATE}]))",
        "print('ended=%d' % transit_api.state_segments([]))",
    ])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRANSIT_", "FAKE_"))}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**env, **BUDGET, **DEBUG, "LD_PRELOAD": str(built["shim"]), "TRANSIT_POLICY": "advise",
                              "FAKE_CUDART_LOG": str(tmp_path / "calls.log")})
    assert res.returncode == 0, res.stderr
    assert f"backend={backend}" in res.stdout and "sent=1" in res.stdout and "ended=1" in res.stdout
    assert re.search(rf"optimizer state's pool 0x[0-9a-f]+ \({4 * STATE} bytes, 3 segments\) filling", res.stderr)
    assert re.search(r"optimizer state's pool: \d+ bytes not taken \(\d+ of them made ready\), given back", res.stderr)


def test_after_the_first_take_the_fill_still_makes_no_region_the_budget_keeps(built, tmp_path):
    """Three same-size states, room for one and a half: the fill makes the last two regions before
    the allocations (segs-settled), the first state is kept on the device and takes none, the
    other two take the two made. The first pinned state's place in the order is the first region
    of its size that nothing took: the kept state's, so the floor lies below it. Left to run
    again before the end, the fill must still not make that kept state's region: hoststate.c's
    rule, under the room the first state found, decides after the first take too. (It was made
    for nothing, then given back: TorchTitan's same-size segments made 2.2-4.1 GB so at half the
    state.)"""
    b = BUDGET_1_5_STATES
    res, out, calls, stats = state_run(built, tmp_path, env={**DEBUG, "TRANSIT_GPU_BUDGET": f"{b}B"},
                                       then=("segs-settled:s,s,s",))
    start, size = pool_of(res)
    assert out["settled"] == "1" and [out[f"state{i}_host"] for i in range(3)] == ["0", "1", "1"]
    assert stats["host_state_kept_bytes"] == STATE
    assert registered(calls) == [(start + 2 * STATE, STATE), (start + STATE, STATE)], calls
    assert stats["host_state_prefill_unused_bytes"] == 0


def test_states_that_took_the_kept_states_regions_leave_the_fill_nothing_to_make(built, tmp_path):
    """The same states, the fill begun only after the allocations (its gate): the two pinned
    states each take the first free region of their size, the kept state's and the next, and
    make them themselves. The rule still pins the last two regions, but two of that size are
    taken: the fill makes no third (it would be taken by nobody)."""
    b = BUDGET_1_5_STATES
    res, out, calls, stats = state_run(built, tmp_path, env={**GATED, "TRANSIT_GPU_BUDGET": f"{b}B"},
                                       then=("segs-idle:s,s,s",))
    start, size = pool_of(res)
    assert out["gated"] == "1" and out["settled"] == "1"
    assert [out[f"state{i}_host"] for i in range(3)] == ["0", "1", "1"]
    assert registered(calls) == [(start, STATE), (start + STATE, STATE)], calls  # the states' own
    assert stats["host_state_prefill_unused_bytes"] == 0
