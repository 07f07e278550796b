"""The optimizer state's pages written before the first step (shim/prefill.c,
transit_state_expect, API version 7), on the fake runtime. The adapter says how much state
the first step will make; the shim maps one pool of that size, writes it in the background,
and the marked allocations take slices of it, only registered. What was registered, where,
and what is still mapped is read from the fake runtime's log (cudaHostRegister's size and
pointer), the kernel's account (the bytes advised huge pages in /proc/self/smaps, which the
fake reads; msync on the page after each slice) and the fake's tally; the shim's debug line
says only where its pool starts."""

import re
from pathlib import Path

import pytest

from transit_launch import rules

from tests.test_shim import GB, pytestmark, run, stats_of  # noqa: F401  (pytestmark: the same skip)
from tests.test_shim_host_state import BUDGET, STATE, THP, MiB, host_allocs, state_run

SLACK = 5 * MiB  # the adapter's estimate is above what the step makes: the pool has a tail
DEBUG = {"TRANSIT_LOG": "debug"}


def pool_of(res):
    """(start, bytes) of the shim's pool, from its debug line; None when it made none."""
    m = re.search(r"optimizer state's pool 0x([0-9a-f]+) \((\d+) bytes\) filling", res.stderr)
    return (int(m.group(1), 16), int(m.group(2))) if m else None


def registered(calls):
    """(pointer, size) of each successful cudaHostRegister, in order."""
    return [(int(c.split()[2], 16), int(c.split()[1])) for c in host_allocs(calls) if "->" not in c]


def huge_pages(size):
    return -(-size // (2 * MiB)) * 2 * MiB


def unregistered_once(calls, ptrs):
    return all(calls.count(f"cudaHostUnregister {hex(p)}") == 1 for p in ptrs)


def after_frees(res):
    tail = res.stdout.split("free_after=" if "free_after=" in res.stdout else "freed=")[1]
    return dict(line.split("=", 1) for line in tail.splitlines() if "=" in line)


def test_expected_state_comes_from_the_pool_and_its_tail_is_given_back(built, tmp_path):
    res, out, calls, stats = state_run(built, tmp_path, env=DEBUG, then=(f"expect:{SLACK}",))
    start, size = pool_of(res)
    assert size == huge_pages(3 * STATE + SLACK) and start % (2 * MiB) == 0
    regs = registered(calls)
    # the three slices one after another from the pool's start, each registered whole, inside it
    assert regs == [(start + i * STATE, STATE) for i in range(3)], calls
    assert all(start <= p and p + n <= start + size for p, n in regs)
    assert [out[f"state{i}_host"] for i in range(3)] == ["1"] * 3 and out["last_error"] == "0"
    assert [out[f"state{i}_err"] for i in range(3)] == ["0"] * 3
    # after expect(0) the page after the last slice (the pool's tail) is unmapped; the others'
    # next pages are the next slices, still mapped
    assert [out[f"state{i}_next_mapped"] for i in range(3)] == ["1", "1", "0"]
    if THP:  # the kernel's account: the pool advised huge pages, then only the slices
        assert all(c.endswith(" hg=1") for c in host_allocs(calls))
        before = int(out["huge_before"])
        assert int(out["huge_expected"]) - before == size and int(out["huge_released"]) - before == 3 * STATE
    assert stats["host_state_prefill_bytes"] == size and stats["host_state_prefill_used_bytes"] == 3 * STATE
    assert stats["host_state_allocs"] == 3 and stats["host_state_bytes"] == 3 * STATE
    assert int(out["fake_pinned"]) == 3 * STATE
    # each slice freed by its own unregister, once; nothing pinned or rejected afterwards
    assert unregistered_once(calls, [p for p, _ in regs])
    tally = after_frees(res)
    assert tally["fake_pinned"] == "0" and tally["fake_bad_frees"] == "0" and tally["fake_live_ptrs"] == "0"


def test_a_pool_too_small_for_the_third_makes_it_as_before(built, tmp_path):
    """A pool of two and a half states: two slices, the third made by the allocation's own
    path (its own mapping, outside the pool); the pool's half state left is unmapped."""
    res, out, calls, stats = state_run(built, tmp_path, env=DEBUG, then=(f"expect:{-(STATE // 2)}",))
    start, size = pool_of(res)
    assert size == 2 * STATE + STATE // 2
    regs = registered(calls)
    assert regs[:2] == [(start, STATE), (start + STATE, STATE)] and len(regs) == 3, calls
    third, n = regs[2]
    assert n == STATE and (third + n <= start or third >= start + size) and third % (2 * MiB) == 0
    assert [out[f"state{i}_host"] for i in range(3)] == ["1"] * 3
    assert out["state1_next_mapped"] == "0"  # the pool's tail after the second slice
    if THP:
        assert int(out["huge_released"]) - int(out["huge_before"]) == 3 * STATE  # two slices + the third's own
    assert stats["host_state_prefill_bytes"] == size and stats["host_state_prefill_used_bytes"] == 2 * STATE
    assert unregistered_once(calls, [p for p, _ in regs]) and after_frees(res)["fake_pinned"] == "0"


@pytest.mark.parametrize("policy, env", [("off", {}), ("advise", {"FAKE_NO_MANAGED": "1"}), ("base", {}),
                                         ("prefetch", {}), ("advise", {"TRANSIT_HOST_STATE": "0"})],
                         ids=["off", "passthrough", "base", "prefetch", "host-state-off"])
def test_expect_does_nothing_where_no_state_is_pinned(built, tmp_path, policy, env):
    """Off, passing through (no managed memory), the policies that keep state managed, and
    TRANSIT_HOST_STATE=0: no pool is mapped (the kernel's account is unchanged), nothing pinned."""
    res, out, calls, stats = state_run(built, tmp_path, policy=policy, env={**DEBUG, **env},
                                       then=(f"expect:{SLACK}",))
    assert pool_of(res) is None and host_allocs(calls) == []
    assert out["huge_expected"] == out["huge_before"] == out["huge_released"]
    assert stats is None or stats["host_state_prefill_bytes"] == 0


def mem_available():
    """The kernel's MemAvailable in bytes, as the shim reads it (/proc/meminfo)."""
    line = next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemAvailable:"))
    return int(line.split()[1]) * 1024


def test_a_pool_the_host_refuses_leaves_the_allocations_own_path(built, tmp_path):
    """A pool mmap refuses (the process's address space limited below it by prlimit): said
    once, and the state is pinned as before. The expectation asks for far more than the host
    has, so the pool is half the available memory (the cap), which the limit refuses."""
    limit = min(mem_available() // 4, 6 * GB)
    if limit < 2 * GB:
        pytest.skip("needs 8 GB of available host memory (the limit must leave the application room)")
    res, out, calls, stats = state_run(built, tmp_path, env=DEBUG, then=(f"expect:{1 << 50}",),
                                       prefix=("prlimit", f"--as={limit}"))
    assert pool_of(res) is None
    said = [line for line in res.stderr.splitlines() if "pool failed" in line]
    assert len(said) == 1 and "mmap for the optimizer state's pool failed" in said[0], res.stderr
    assert [n for _, n in registered(calls)] == [STATE] * 3
    assert stats["host_state_prefill_bytes"] == 0 and stats["host_state_prefill_used_bytes"] == 0
    assert stats["host_state_allocs"] == 3


def test_the_pool_takes_at_most_half_the_available_memory_per_rank(built, tmp_path):
    """The pool is written whole, also where the budget pins less of it: it takes at most half
    the host's available memory, shared by the node's ranks (LOCAL_WORLD_SIZE). With a rank
    count that makes that share one and a half states (the test's own reading of
    MemAvailable, which may move by a third either way before the shim's), the expected three
    states get a pool of about one and a half: one slice from it, two by their own paths."""
    share = 3 * STATE // 2
    ranks = mem_available() // 2 // share
    res, out, calls, stats = state_run(built, tmp_path, env={**DEBUG, "LOCAL_WORLD_SIZE": str(ranks)},
                                       then=(f"expect:{SLACK}",))
    start, size = pool_of(res)
    assert STATE <= size < 2 * STATE, size
    regs = registered(calls)
    assert len(regs) == 3 and regs[0] == (start, STATE)
    assert all(p + n <= start or p >= start + size for p, n in regs[1:]), calls
    assert stats["host_state_prefill_bytes"] == size and stats["host_state_prefill_used_bytes"] == STATE
    assert stats["host_state_allocs"] == 3


def test_threads_at_once_take_disjoint_slices_while_the_pool_fills(built, tmp_path):
    """Eight threads, each marked on its own, allocate at the same moment, just after the
    adapter's expect: the background fill has hardly begun. Each gets its own slice: together
    they tile the pool exactly, and each is unregistered once when freed."""
    k = 8
    stats_path = tmp_path / "s.json"
    res, out, calls = run(built, "state-threads", 4 * GB, STATE, k, stats_path, "expect:0",
                          env={**BUDGET, **DEBUG})
    assert res.returncode == 0, res.stderr
    start, size = pool_of(res)
    assert size == k * STATE
    regs = sorted(registered(calls))
    assert [n for _, n in regs] == [STATE] * k
    assert [p for p, _ in regs] == [start + i * STATE for i in range(k)]  # disjoint, the whole pool
    assert [out[f"state{i}_host"] for i in range(k)] == ["1"] * k
    assert [out[f"state{i}_err"] for i in range(k)] == ["0"] * k
    stats = stats_of(stats_path)
    assert stats["host_state_prefill_used_bytes"] == k * STATE and stats["host_state_allocs"] == k
    assert unregistered_once(calls, [p for p, _ in regs])
    tally = after_frees(res)
    assert tally["fake_pinned"] == "0" and tally["fake_bad_frees"] == "0"


def test_the_shims_exit_ends_a_pool_still_filling(built, tmp_path):
    """No expect(0) (a job that ends inside its first step): the shim's exit stops the fill,
    joins it and unmaps what no slice took; the process exits cleanly."""
    res, out, calls = run(built, "state-threads", 4 * GB, STATE, 2, tmp_path / "s.json", f"expect-exit:{1 << 30}",
                          env={**BUDGET, **DEBUG})
    assert res.returncode == 0, res.stderr
    start, size = pool_of(res)
    assert size == 2 * STATE + (1 << 30)
    assert f"optimizer state's pool: {1 << 30} bytes not taken, unmapped" in res.stderr
    assert sorted(registered(calls)) == [(start, STATE), (start + STATE, STATE)]


def test_a_second_figure_is_ignored(built, tmp_path):
    """The shim takes the first expectation only (once per process): a second, twice as large,
    makes no second pool and does not grow the first."""
    res, out, calls, stats = state_run(built, tmp_path, env=DEBUG, then=(f"expect-twice:{SLACK}",))
    start, size = pool_of(res)
    assert size == huge_pages(3 * STATE + SLACK) and res.stderr.count("optimizer state's pool 0x") == 1
    assert registered(calls) == [(start + i * STATE, STATE) for i in range(3)], calls
    assert stats["host_state_prefill_bytes"] == size


def test_once_a_slice_is_taken_the_fill_keeps_near_the_slices(built, tmp_path):
    """The expectation is three states and 4 GiB more (as where the budget keeps part of the
    state on the GPU, so that no slice takes the tail). After the marked allocations the
    application waits until the fill has stopped writing (the test build's hook: the fill
    waits at its bound, or has ended), then reads the kernel's account of the pool's mapping
    (its resident bytes in /proc/self/smaps): the slices' pages and exactly PREFILL_AHEAD_BYTES
    past them are written. A fill that ignored the slices writes the whole pool; one that wrote
    only what a slice waits for, none past them."""
    tail = 4 << 30
    res, out, calls, stats = state_run(built, tmp_path, env=DEBUG, then=(f"expect-idle:{tail}",))
    assert out["settled"] == "1"
    start, size = pool_of(res)
    assert size == 3 * STATE + tail and int(out["pool_mapping"]) == size  # the pool alone, one mapping
    assert registered(calls) == [(start + i * STATE, STATE) for i in range(3)], calls
    assert int(out["pool_written"]) == 3 * STATE + rules.PREFILL_AHEAD_BYTES, (int(out["pool_written"]), size)
    assert f"optimizer state's pool: {tail} bytes not taken, unmapped" in res.stderr
    assert stats["host_state_prefill_used_bytes"] == 3 * STATE
    # where the pinning went: the fill's lead over the first slice, and what it had written
    assert stats["host_state_prefill_lead_s"] >= 0 and stats["host_state_prefill_ahead_bytes"] <= size
    assert stats["host_state_register_s"] <= stats["host_state_pin_s"]
