"""libtransit.so on a machine without a GPU: a fake libcudart (tests/fakecuda) records
every runtime call, and a small program linked against it, the way PyTorch's libraries
are, runs under LD_PRELOAD. Checks interposition, the allocation table, placement
decisions, the budget and the oversubscription guard, stats JSON, threads, fork, and
pass-through when something the shim needs is missing."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from transit_launch.preload import run as runmod

from transit_launch import doctor
from transit_launch.preload import inject
from transit_launch.preload import build as shimbuild


GB = 10**9
ADV_PREFERRED, ADV_UNSET_PREFERRED, ADV_ACCESSED_BY = 3, 4, 5
LOC_DEVICE, LOC_HOST = 1, 2

CUDA_INC = shimbuild.find_header("cuda_runtime_api.h")
pytestmark = pytest.mark.skipif(CUDA_INC is None or not shutil.which("cc"),
                                reason="needs a C compiler and the CUDA runtime headers (cuda_runtime_api.h)")


def run(built, *args, policy="advise", env=None, preload=True, prefix=()):
    log = built["dir"] / f"calls-{os.getpid()}-{run.n}.log"
    run.n += 1
    log.unlink(missing_ok=True)
    e = {k: v for k, v in os.environ.items() if not k.startswith(("TRANSIT_", "FAKE_"))}
    e.update({"FAKE_CUDART_LOG": str(log), "TRANSIT_POLICY": policy, "TRANSIT_LOG": "info"})
    if preload:
        e["LD_PRELOAD"] = str(built["shim"])
    e.update(env or {})
    res = subprocess.run([*prefix, str(built["app"]), *map(str, args)], env=e, capture_output=True, text=True, timeout=120)
    calls = log.read_text().splitlines() if log.exists() else []
    out = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    return res, out, calls


run.n = 0


def stats_of(path):
    return json.loads(Path(path).read_text())


def test_build_is_warning_free_and_exports_only_the_api(built):
    assert "warning" not in built["warnings"]
    syms = subprocess.run(["nm", "-D", "--defined-only", str(built["shim"])], capture_output=True, text=True).stdout
    names = {line.split()[-1] for line in syms.splitlines() if line.strip()}
    assert {"cudaMalloc", "cudaFree", "cudaMemGetInfo", "cudaLaunchKernel", "__cudaLaunchKernel", "transit_hint",
            "transit_iteration"} <= names
    assert all(n.startswith(("cuda", "__cudaLaunchKernel", "transit_")) for n in names), names


def test_interposition_turns_cudamalloc_managed(built, tmp_path):
    res, out, calls = run(built, "alloc", GB, 2 * GB, env={"TRANSIT_STATS": str(tmp_path / "s.json")})
    assert res.returncode == 0 and out["alloc0"] == "0" and out["alloc1"] == "0"
    assert [c.split()[0] for c in calls if c.startswith("cudaMalloc")] == ["cudaMallocManaged"] * 2
    assert sum(c.startswith("cudaFree") for c in calls) == 2
    s = stats_of(tmp_path / "s.json")
    assert s["policy"] == "advise" and s["managed_allocs"] == 2 and s["managed_peak_bytes"] == 3 * GB
    assert s["managed_bytes"] == 0 and s["host_placed_bytes"] == 0  # everything freed, nothing left behind


def test_off_is_pure_pass_through(built, tmp_path):
    res, out, calls = run(built, "alloc", GB, policy="off", env={"TRANSIT_STATS": str(tmp_path / "s.json")})
    assert res.returncode == 0 and out["alloc0"] == "0"
    assert [c.split()[0] for c in calls] == ["cudaMalloc", "cudaFree"]
    assert stats_of(tmp_path / "s.json")["managed_allocs"] == 0


def test_no_output_on_stdout(built):
    plain, _, _ = run(built, "hint", GB, 0, GB, 2, preload=False)
    shimmed, _, _ = run(built, "hint", GB, 0, GB, 2, env={"TRANSIT_LOG": "debug"})
    strip = lambda text: [l for l in text.splitlines() if not l.startswith(("ptr=", "hint"))]  # noqa: E731
    assert strip(shimmed.stdout) == strip(plain.stdout) == []
    assert "hint=0" in shimmed.stdout
    assert "transit[" in shimmed.stderr  # the log goes to stderr


def test_budget_places_overflow_on_host_zero_copy(built, tmp_path):
    res, out, calls = run(built, "alloc", GB, GB, 2 * GB,
                          env={"TRANSIT_GPU_BUDGET": "3GB", "TRANSIT_STATS": str(tmp_path / "s.json")})
    third = next(c.split()[2] for c in calls if c.startswith("cudaMallocManaged 2000000000"))
    advice = [c.split() for c in calls if c.startswith("cudaMemAdvise")]
    assert [(a[1], int(a[3]), int(a[4])) for a in advice] == [(third, ADV_PREFERRED, LOC_HOST),
                                                             (third, ADV_ACCESSED_BY, LOC_DEVICE)]
    # the program sees a 3 GB GPU with 1 GB free (2 GB placed on it)
    assert (int(out["total"]), int(out["free"])) == (3 * GB, GB)
    s = stats_of(tmp_path / "s.json")
    assert s["device_placed_peak_bytes"] == 2 * GB <= s["budget_bytes"] == 3 * GB
    assert int(out["fake_device_used_peak"]) <= 3 * GB  # the runtime's own account of its device
    assert s["host_placed_peak_bytes"] == 2 * GB and s["zero_copy_mapped_peak_bytes"] == 2 * GB


def test_base_places_overflow_without_accessed_by(built):
    _, _, calls = run(built, "alloc", 2 * GB, 2 * GB, policy="base", env={"TRANSIT_GPU_BUDGET": "3GB"})
    advice = [c.split() for c in calls if c.startswith("cudaMemAdvise")]
    assert [(int(a[3]), int(a[4])) for a in advice] == [(ADV_PREFERRED, LOC_HOST)]


def test_guard_refuses_beyond_free_memory(built, tmp_path):
    env = {"FAKE_GPU_MEM": str(10 * GB), "TRANSIT_STATS": str(tmp_path / "s.json")}
    res, out, calls = run(built, "alloc", 6 * GB, 6 * GB, GB, env=env)
    assert (out["alloc0"], out["alloc1"], out["alloc2"]) == ("0", "2", "0")  # 2 = cudaErrorMemoryAllocation
    assert "refusing cudaMalloc(6000000000)" in res.stderr
    assert stats_of(tmp_path / "s.json")["guard_refusals"] == 1
    assert sum(c.startswith("cudaMallocManaged") for c in calls) == 2  # never asked the runtime
    _, out, _ = run(built, "alloc", 6 * GB, 6 * GB, env=env | {"TRANSIT_ALLOW_OVERSUBSCRIBE": "1"})
    assert (out["alloc0"], out["alloc1"]) == ("0", "0")


GRAIN = 2 << 20  # placement cuts regions at the UVM driver's 2 MiB block (shim/transit.h)


def aligned(base, off, length):
    """The hint range the shim uses: aligned inwards to 64 KiB."""
    start = (base + off + 65535) // 65536 * 65536
    return start, (base + off + length) // 65536 * 65536


def test_hint_moves_optimizer_range_to_host_when_the_budget_needs_room(built, tmp_path):
    """4 GB fit a 5.1 GB budget; a second allocation of 3 GB does not and starts on the
    host. At the boundary advise ranks hot data first: of the 2 GB optimizer range all but
    the room the 5 GB of hot data leave (to the 2 MiB grain below it) goes, zero-copy, and
    the hot allocation takes its room; the second boundary moves nothing."""
    res, out, calls = run(built, "place", 4 * GB, 3 * GB, tmp_path / "s.json", f"1000000:{2 * GB}:2",
                          env={"TRANSIT_GPU_BUDGET": "5100MB"})
    assert out["hint0"] == "0" and out["stats"] == "0", res.stderr
    start, end = aligned(int(out["ptr"], 16), 1_000_000, 2 * GB)
    hot = 7 * GB - (end - start)
    start += (5100 * 10**6 - hot) // (2 << 20) * (2 << 20)  # the head that fits stays on the GPU
    assert 0 < start - aligned(int(out["ptr"], 16), 1_000_000, 2 * GB)[0] < 100 * 10**6
    want, q = f"0x{start:x} {end - start}", f"{out['q']} {3 * GB}"
    for call in (f"cudaMemAdvise {want} {ADV_PREFERRED} {LOC_HOST} 0",
                 f"cudaMemAdvise {want} {ADV_ACCESSED_BY} {LOC_DEVICE} 0",
                 f"cudaMemPrefetchAsync {want} {LOC_HOST} 0 (nil)",  # evicted now: the budget holds physically
                 f"cudaMemAdvise {q} {ADV_PREFERRED} {LOC_DEVICE} 0",
                 f"cudaMemPrefetchAsync {q} {LOC_DEVICE} 0 (nil)"):
        assert calls.count(call) == 1, (call, calls)
    assert f"cudaMemPrefetchAsync {q} {LOC_HOST} 0 (nil)" not in calls  # not pushed out just to come back
    # demoted before the hot allocation was promoted: placement never above the budget
    assert calls.index(f"cudaMemPrefetchAsync {want} {LOC_HOST} 0 (nil)") < \
        calls.index(f"cudaMemPrefetchAsync {q} {LOC_DEVICE} 0 (nil)")
    s = stats_of(tmp_path / "s.json")
    assert s["cold_hint_bytes"]["optimizer"] - (end - start) < 100 * 10**6
    assert s["zero_copy_mapped_bytes"] == end - start
    assert s["device_placed_bytes"] == 7 * GB - (end - start) <= s["budget_bytes"]
    assert s["device_placed_peak_bytes"] <= s["budget_bytes"]
    assert int(out["fake_device_used_peak"]) <= s["budget_bytes"]  # the runtime's own account


def test_optimizer_range_stays_on_the_gpu_while_the_budget_has_room(built, tmp_path):
    """Cold data leaves only when the budget needs its room (what the planner assumes):
    under an 8 GB budget a hinted 2 GB optimizer range of a 4 GB allocation stays."""
    res, out, calls = run(built, "place", 4 * GB, 0, tmp_path / "s.json", f"1000000:{2 * GB}:2",
                          env={"TRANSIT_GPU_BUDGET": "8GB"})
    assert out["hint0"] == "0" and out["stats"] == "0", res.stderr
    populate = f"cudaMemPrefetchAsync {out['ptr']} {4 * GB} {LOC_DEVICE} 0 (nil)"  # at allocation, see below
    assert [c for c in calls if c.startswith(("cudaMemAdvise", "cudaMemPrefetchAsync"))] == [populate], calls
    s = stats_of(tmp_path / "s.json")
    start, end = aligned(int(out["ptr"], 16), 1_000_000, 2 * GB)
    assert s["cold_hint_bytes"]["optimizer"] == end - start and s["zero_copy_mapped_bytes"] == 0
    assert s["device_placed_bytes"] == 4 * GB


def test_a_new_device_allocation_is_populated_at_once(built, tmp_path):
    """A new allocation placed on the GPU is prefetched there right after cudaMallocManaged,
    once, on the legacy stream: its pages are made at once, not by a storm of first-touch
    faults as the caching allocator grows through the first step (measured on the H200:
    TorchTitan's first step under advise 47.6 s, 37.6 s so, bench/RESULTS.md). One placed on
    the host is not (advice only); nor is anything during prefetch's warm-up."""
    res, out, calls = run(built, "alloc", GB, 2 * GB, env={"TRANSIT_GPU_BUDGET": "2GB"})
    assert res.returncode == 0, res.stderr
    mallocs = [c.split()[2] for c in calls if c.startswith("cudaMallocManaged")]
    assert len(mallocs) == 2
    first = calls.index(f"cudaMallocManaged {GB} {mallocs[0]}")
    assert calls[first + 1] == f"cudaMemPrefetchAsync {mallocs[0]} {GB} {LOC_DEVICE} 0 (nil)"
    assert not [c for c in calls if c.startswith(f"cudaMemPrefetchAsync {mallocs[1]}")], calls  # the host's
    assert sum(c.startswith("cudaMemPrefetchAsync") for c in calls) == 1
    res, out, calls = run(built, "alloc", GB, policy="prefetch")
    assert res.returncode == 0 and not [c for c in calls if c.startswith("cudaMemPrefetchAsync")], calls


def test_a_new_allocation_takes_the_room_of_master_weights_when_no_state_is_on_the_gpu(built, tmp_path):
    """advise's ranking in the first step, before any boundary: a 4 GB allocation holding a
    1 GB optimizer range and a 1 GB master-weight range leaves 2 GB of the 6 GB budget; a new 3.2 GB
    segment takes the optimizer range's room first, then of the master weights only the
    tail it still needs (hot data stays), and lands on the GPU instead of being served
    zero-copy to the step's end."""
    res, out, calls = run(built, "place", 4 * GB, 0, tmp_path / "s.json", f"1000000:{GB}:2",
                          f"{1_000_000 + 2 * GB}:{GB}:1", f"late:{3200 * 10**6}", env={"TRANSIT_GPU_BUDGET": "6GB"})
    assert out["hint0"] == out["hint1"] == "0" and out["stats"] == "0", res.stderr
    o0, o1 = aligned(int(out["ptr"], 16), 1_000_000, GB)
    m0, m1 = aligned(int(out["ptr"], 16), 1_000_000 + 2 * GB, GB)
    host = [c.split()[1:3] for c in calls if c.startswith("cudaMemPrefetchAsync") and f" {LOC_HOST} " in c]
    need = 4 * GB - (o1 - o0) + 3200 * 10**6 - 6 * GB  # still short after the optimizer range left
    m0 += (m1 - m0 - need) // GRAIN * GRAIN  # the master weights' head stays
    # the optimizer range first, then the master weights' tail
    assert host == [[f"0x{o0:x}", str(o1 - o0)], [f"0x{m0:x}", str(m1 - m0)]], calls
    late = out["late"]
    assert [c for c in calls if c.startswith(("cudaMemAdvise " + late, "cudaMemPrefetchAsync " + late))] == [
        f"cudaMemPrefetchAsync {late} {3200 * 10**6} {LOC_DEVICE} 0 (nil)"]
    s = stats_of(tmp_path / "s.json")
    assert s["room_demotions"] == 2 and s["zero_copy_mapped_bytes"] == (o1 - o0) + (m1 - m0)
    assert s["device_placed_peak_bytes"] <= s["budget_bytes"]
    assert int(out["fake_device_used_peak"]) <= s["budget_bytes"]  # the runtime's own account


def test_a_new_allocation_takes_the_room_of_optimizer_state_kept_on_the_gpu(built, tmp_path):
    """Under a 6 GB budget a 4 GB allocation keeps its 1 GB optimizer range on the GPU at
    the first boundary; the next step's new 2.5 GB segment does not fit beside it and
    takes the room it needs of it (that tail of the state zero-copy) instead of being served
    zero-copy itself, which made that step 20x slower on the H200. The second boundary moves
    nothing."""
    res, out, calls = run(built, "place", 4 * GB, 0, tmp_path / "s.json", f"1000000:{GB}:2",
                          f"late:{2500 * 10**6}", env={"TRANSIT_GPU_BUDGET": "6GB"})
    assert out["hint0"] == "0" and out["stats"] == "0", res.stderr
    start, end = aligned(int(out["ptr"], 16), 1_000_000, GB)
    start += (end - start - (4 * GB + 2500 * 10**6 - 6 * GB)) // GRAIN * GRAIN  # the head that still fits stays
    opt, late = f"0x{start:x} {end - start}", out["late"]
    moves = [c for c in calls if c.startswith(("cudaMemAdvise", "cudaMemPrefetchAsync"))
             and not c.endswith(f"{LOC_DEVICE} 0 (nil)")]  # less the new allocations' populating
    assert moves == [f"cudaMemAdvise {opt} {ADV_PREFERRED} {LOC_HOST} 0",
                     f"cudaMemAdvise {opt} {ADV_ACCESSED_BY} {LOC_DEVICE} 0",
                     f"cudaMemPrefetchAsync {opt} {LOC_HOST} 0 (nil)"], moves
    # the late segment was never advised to the host: it went to the GPU (populated there)
    # once the room was free
    assert [c for c in calls if c.startswith(("cudaMemAdvise " + late, "cudaMemPrefetchAsync " + late))] == [
        f"cudaMemPrefetchAsync {late} {2500 * 10**6} {LOC_DEVICE} 0 (nil)"]
    s = stats_of(tmp_path / "s.json")
    assert s["room_demotions"] >= 1 and s["zero_copy_mapped_bytes"] == end - start
    assert s["device_placed_bytes"] == 4 * GB - (end - start) + 2500 * 10**6 <= s["budget_bytes"]
    assert s["device_placed_peak_bytes"] <= s["budget_bytes"]
    assert int(out["fake_device_used_peak"]) <= s["budget_bytes"]  # the runtime's own account


def test_master_weights_keep_the_gpu_before_optimizer_states(built, tmp_path):
    """Room for the hot 1 GB of a 5 GB allocation plus 2.2 GB: the fp32 master range (read
    in every forward and backward) gets the GPU, the optimizer range only the 0.2 GB left."""
    res, out, calls = run(built, "place", 5 * GB, 0, tmp_path / "s.json", f"{GB}:{2 * GB}:1",
                          f"{3 * GB}:{2 * GB}:2", env={"TRANSIT_GPU_BUDGET": "3200MB"})
    assert out["hint0"] == out["hint1"] == "0", res.stderr
    # a 5 GB allocation under a 3.2 GB budget starts on the host (allocation order)
    base = int(out["ptr"], 16)
    master, opt = aligned(base, GB, 2 * GB), aligned(base, 3 * GB, 2 * GB)
    advice = [c for c in calls if c.startswith(("cudaMemAdvise", "cudaMemPrefetchAsync"))]
    assert f"cudaMemPrefetchAsync 0x{master[0]:x} {master[1] - master[0]} {LOC_DEVICE} 0 (nil)" in advice
    head = (3_200_000_000 - (5 * GB - (opt[1] - opt[0]))) // GRAIN * GRAIN  # of the optimizer range
    assert f"cudaMemPrefetchAsync 0x{opt[0]:x} {head} {LOC_DEVICE} 0 (nil)" in advice
    assert f"cudaMemPrefetchAsync 0x{opt[0]:x} {opt[1] - opt[0]} {LOC_DEVICE} 0 (nil)" not in advice
    s = stats_of(tmp_path / "s.json")
    # on the GPU: the hot pieces around the two ranges, the master range, the optimizer range's head
    assert s["device_placed_bytes"] == 5 * GB - (opt[1] - opt[0]) + head <= 3_200_000_000
    assert s["host_placed_bytes"] == s["zero_copy_mapped_bytes"] == opt[1] - opt[0] - head


@pytest.mark.parametrize("budget_mb", [4500, 3500])
def test_sparse_tables_keep_the_gpu_after_master_weights_and_before_optimizer_state(built, tmp_path, budget_mb):
    """A 6 GB allocation: 1 GB hot, 2 GB master weights, 1 GB of an embedding's table hinted
    SPARSE (read in part), 2 GB of optimizer state. Under 4.5 GB the table gets the GPU
    whole and the state the 0.5 GB left; under 3.5 GB the table gets 0.5 GB and the state
    nothing: advise's order is hot, master, sparse, optimizer."""
    res, out, calls = run(built, "place", 6 * GB, 0, tmp_path / "s.json", f"{GB}:{2 * GB}:1",
                          f"{3 * GB}:{GB}:3", f"{4 * GB}:{2 * GB}:2", env={"TRANSIT_GPU_BUDGET": f"{budget_mb}MB"})
    assert out["hint0"] == out["hint1"] == out["hint2"] == "0", res.stderr
    base = int(out["ptr"], 16)
    master, table, opt = aligned(base, GB, 2 * GB), aligned(base, 3 * GB, GB), aligned(base, 4 * GB, 2 * GB)
    room = budget_mb * 10**6 - (6 * GB - (opt[1] - opt[0]) - (table[1] - table[0]))  # after hot and master
    on_gpu = {"table": min(table[1] - table[0], room // GRAIN * GRAIN)}
    room -= on_gpu["table"]
    on_gpu["opt"] = room // GRAIN * GRAIN if on_gpu["table"] == table[1] - table[0] else 0
    s = stats_of(tmp_path / "s.json")
    assert s["cold_hint_bytes"] == {"master": master[1] - master[0], "sparse": table[1] - table[0],
                                    "optimizer": opt[1] - opt[0]}
    assert s["host_placed_bytes"] == (table[1] - table[0] - on_gpu["table"]) + (opt[1] - opt[0] - on_gpu["opt"])
    assert s["device_placed_bytes"] <= budget_mb * 10**6
    to_gpu = [c.split()[1:3] for c in calls if c.startswith("cudaMemPrefetchAsync") and f" {LOC_DEVICE} 0" in c]
    assert [f"0x{table[0]:x}", str(on_gpu["table"])] in to_gpu
    assert (on_gpu["opt"] > 0) == ([f"0x{opt[0]:x}", str(on_gpu["opt"])] in to_gpu)


def test_hint_api_rejects_foreign_memory(built, tmp_path):
    res, out, calls = run(built, "hint", 4 * GB, 1_000_000, 2 * GB, 2, tmp_path / "s.json",
                          env={"TRANSIT_GPU_BUDGET": "8GB"})
    assert out["hint"] == "0" and out["hint_foreign"] == "-1" and out["stats"] == "0"


def test_device_buffer_comes_out_of_the_budget(built, tmp_path):
    """transit_device_alloc (the streamed step's ring, the host step's bounce buffers): plain
    cudaMalloc, not managed (the copy engines serve it), and its bytes come out of the budget: with 2.5 + 1 GB placed
    under a 4 GB budget, a 1.5 GB buffer sends the 1 GB allocation to the host; the table
    stays consistent, cudaMemGetInfo counts the buffer, one larger than the budget is
    refused, and it is given back once."""
    res, out, calls = run(built, "devbuf", 2_500_000_000, GB, 1_500_000_000, tmp_path / "s.json",
                          env={"TRANSIT_GPU_BUDGET": "4GB"})
    assert res.returncode == 0, res.stderr
    p, q, buf = (int(out[k], 16) for k in ("p", "q", "buf"))
    assert buf and out["too_large"] == "0x0" and out["last_error"] == "0"
    assert f"cudaMalloc 1500000000 0x{buf:x}" in calls  # plain device memory
    evict_q = f"cudaMemPrefetchAsync 0x{q:x} {GB} {LOC_HOST} 0 (nil)"
    assert calls.index(evict_q) < calls.index(f"cudaMalloc 1500000000 0x{buf:x}")  # room first
    assert not any(c.startswith(f"cudaMemPrefetchAsync 0x{p:x}") and f" {LOC_HOST} " in c for c in calls)
    assert out["table_check"].strip() == "0"
    assert int(out["total"]) == 4 * GB and int(out["free"]) == 4 * GB - 2_500_000_000 - 1_500_000_000
    s = stats_of(tmp_path / "s.json")
    assert s["budget_bytes"] == 4 * GB and s["device_buffer_bytes"] == 1_500_000_000
    assert s["device_placed_bytes"] == 2_500_000_000 and s["host_placed_bytes"] == GB
    assert s["device_placed_peak_bytes"] <= 4 * GB
    assert int(out["fake_device_used_peak"]) <= 4 * GB  # the runtime's own account, the buffer too
    assert out["freed"] == "0" and out["freed_again"] == "-1"
    assert sum(c == f"cudaFree 0x{buf:x}" for c in calls) == 1


@pytest.mark.parametrize("policy", ["base", "advise"])
def test_device_buffer_demotes_no_more_than_it_needs(built, tmp_path, policy):
    """3 GB and 1 GB placed under a 4 GB budget, a 1.5 GB buffer: demoting from the end takes
    the 1 GB and only the last 0.5 GB of the 3 GB (to the grain), not all of it (under base
    nothing would ever bring it back)."""
    res, out, calls = run(built, "devbuf", 3 * GB, GB, 1_500_000_000, tmp_path / "s.json", policy=policy,
                          env={"TRANSIT_GPU_BUDGET": "4GB"})
    assert res.returncode == 0 and int(out["buf"], 16), res.stderr
    s = stats_of(tmp_path / "s.json")
    kept = (3 * GB - (1_500_000_000 - GB)) // GRAIN * GRAIN
    assert s["device_placed_bytes"] == kept and s["host_placed_bytes"] == 4 * GB - kept
    assert s["device_buffer_bytes"] == 1_500_000_000
    assert out["table_check"].strip() == "0" and s["device_placed_peak_bytes"] <= 4 * GB
    assert int(out["fake_device_used_peak"]) <= 4 * GB  # the runtime's own account, the buffer too


@pytest.mark.parametrize("policy", ["base", "advise"])
def test_device_buffer_the_runtime_refuses_loses_nothing(built, tmp_path, policy):
    """The real cudaMalloc refuses the buffer (1 GB of plain memory on the card, the guard
    lifted): 0 for the adapter, no error left for the application, nothing counted, and what
    was demoted for it is back on the device."""
    res, out, calls = run(built, "devbuf", 2_500_000_000, GB, 1_500_000_000, tmp_path / "s.json", policy=policy,
                          env={"TRANSIT_GPU_BUDGET": "4GB", "FAKE_GPU_MEM": str(GB), "TRANSIT_ALLOW_OVERSUBSCRIBE": "1"})
    assert res.returncode == 0, res.stderr
    assert out["buf"] == "0x0" and out["last_error"] == "0" and "cudaMalloc 1500000000 -> oom" in calls
    s = stats_of(tmp_path / "s.json")
    assert s["device_buffer_bytes"] == 0 and s["device_placed_bytes"] == 3_500_000_000 and s["host_placed_bytes"] == 0
    assert out["table_check"].strip() == "0"


def test_device_buffer_before_any_cuda_call(built):
    """The adapter's first call may come before the application's first CUDA call: the
    runtime is resolved then, not dereferenced unresolved (it crashed the process)."""
    res, out, calls = run(built, "devbuf-first", GB, env={"TRANSIT_GPU_BUDGET": "4GB", "TRANSIT_ALLOW_OVERSUBSCRIBE": "1"})
    assert res.returncode == 0, res.stderr
    assert int(out["buf"], 16) and out["freed"] == "0"


def test_device_buffer_is_refused_when_the_shim_is_off(built, tmp_path):
    res, out, calls = run(built, "devbuf", GB, GB, GB, tmp_path / "s.json", policy="off")
    assert res.returncode == 0 and out["buf"] == "0x0" and out["freed"] == "-1"
    assert not any(c.startswith("cudaMalloc 1000000000 ") and "Managed" in c for c in calls)


def test_prefetch_replay_window_keeps_budget(built, tmp_path):
    """q (2 GB) is on the host under a 3 GB budget; the replay table prefetches parts of it
    before launches 5 and 10 of every iteration, within the 1 GB of room left."""
    res, out, calls = run(built, "loop", 3, 20, 2 * GB, "adapter", "replay", policy="prefetch",
                          env={"TRANSIT_GPU_BUDGET": "3GB", "TRANSIT_STATS": str(tmp_path / "s.json")})
    assert res.returncode == 0, res.stderr
    q = int(out["q"], 16)
    seq = [c for c in calls if c.startswith(("cudaLaunchKernel", "cudaMemPrefetchAsync"))]
    first = f"cudaMemPrefetchAsync 0x{q:x} {768 << 20} {LOC_DEVICE} 0 (nil)"
    second = f"cudaMemPrefetchAsync 0x{q + (1 << 30):x} {(512 << 20) + 4096} {LOC_DEVICE} 0 0x7"
    evict_first = f"cudaMemPrefetchAsync 0x{q:x} {768 << 20} {LOC_HOST} 0 0x7"
    i = seq.index(first)
    assert sum(s.startswith("cudaLaunchKernel") for s in seq[:i]) == 5  # right before launch 5
    j = seq.index(second)
    assert seq[j - 1] == evict_first  # 768 + 512 MB > 1 GB of room: the oldest goes back first
    assert sum(s.startswith("cudaLaunchKernel") for s in seq[:j]) == 10
    s = stats_of(tmp_path / "s.json")
    assert s["prefetch_calls"] == 6 and s["replay_positions"] == 2 and s["iteration_source"] == "adapter"


@pytest.mark.parametrize("spare", [0, 4096])
def test_replay_counts_the_pages_a_prefetch_moves(built, tmp_path, spare):
    """A prefetch moves whole pages (CUDA rounds its range out to the page size): a recorded
    8 MiB range 100 bytes into q covers 8 MiB and one page more. With exactly 8 MiB of room
    the window must not take it (it moved a page past the budget, the fake's count says); with
    that page spare it prefetches the rounded range."""
    gib = 1 << 30
    budget = 2 * gib + (8 << 20) + spare
    res, out, calls = run(built, "loop", 2, 20, 2 * gib, "adapter", "replay", "unaligned", "touch", policy="prefetch",
                          env={"TRANSIT_GPU_BUDGET": f"{budget}B"})
    assert res.returncode == 0, res.stderr
    q = int(out["q"], 16)
    to_gpu = [c for c in calls if c.startswith(f"cudaMemPrefetchAsync 0x{q:x}") and f" {LOC_DEVICE} 0 " in c]
    assert to_gpu == ([f"cudaMemPrefetchAsync 0x{q:x} {(8 << 20) + 4096} {LOC_DEVICE} 0 (nil)"] * 2 if spare else [])
    assert int(out["fake_device_used_peak"]) <= budget


def test_replay_ranges_never_span_two_allocations(built, tmp_path):
    """Two recorded ranges closer than TRANSIT_MERGE_GAP but in different allocations (the
    end of p, the start of q right after it) stay two prefetches: on a GPU the gap between
    allocations need not be managed memory, and one prefetch over both failed there."""
    gib = 1 << 30  # a multiple of the fake's 2 MiB alignment: q starts where p ends
    res, out, calls = run(built, "loop", 2, 20, 2 * gib, "adapter", "replay", "straddle", policy="prefetch",
                          env={"TRANSIT_GPU_BUDGET": "3GB"})
    assert res.returncode == 0, res.stderr
    p, q = int(out["p"], 16), int(out["q"], 16)
    assert q == p + 2 * gib  # adjacent, as the test means
    mb = 1 << 20
    pre = [c for c in calls if c.startswith("cudaMemPrefetchAsync") and f" {LOC_DEVICE} 0 " in c]
    assert f"cudaMemPrefetchAsync 0x{p + 2 * gib - mb:x} {mb} {LOC_DEVICE} 0 (nil)" in pre
    assert f"cudaMemPrefetchAsync 0x{q:x} {mb} {LOC_DEVICE} 0 (nil)" in pre
    assert not any(c.startswith(f"cudaMemPrefetchAsync 0x{p + 2 * gib - mb:x} {2 * mb} ") for c in calls)


def test_failed_prefetch_leaves_no_error_for_the_application(built, tmp_path):
    """A prefetch of the shim's that fails (on the H200: a replayed range over memory that
    was no longer managed) must not surface as the application's error after its next
    launch, which PyTorch reports as a CUDA error in whatever kernel ran."""
    res, out, calls = run(built, "loop", 3, 20, 2 * GB, "adapter", "replay", policy="prefetch",
                          env={"TRANSIT_GPU_BUDGET": "3GB", "TRANSIT_STATS": str(tmp_path / "s.json"),
                               "FAKE_PREFETCH_FAIL": "1"})
    assert res.returncode == 0, res.stderr
    assert out["last_error"] == "0"
    s = stats_of(tmp_path / "s.json")
    assert s["hint_errors"] == sum(c.startswith("cudaMemPrefetchAsync") for c in calls) > 0


def test_iterations_detected_from_kernel_sequence(built, tmp_path):
    res, out, _ = run(built, "loop", 100, 300, GB, env={"TRANSIT_STATS": str(tmp_path / "s.json")})
    s = stats_of(tmp_path / "s.json")
    assert s["iteration_source"] == "kernel-sequence" and s["detected_period"] == 300
    assert 30 <= s["iterations"] <= 100 and s["kernel_launches"] == 30000
    assert len(s["iteration_ms"]) == s["iterations"] - 1


def test_iteration_not_mistaken_for_a_layer(built, tmp_path):
    """40 identical layers of 8 launches and a 5-launch tail: the iteration is 325 launches."""
    run(built, "layers", 120, 40, env={"TRANSIT_STATS": str(tmp_path / "s.json")})
    s = stats_of(tmp_path / "s.json")
    assert s["detected_period"] == 40 * 8 + 5


def test_adapter_boundaries(built, tmp_path):
    run(built, "loop", 7, 50, GB, "adapter", env={"TRANSIT_STATS": str(tmp_path / "s.json")})
    s = stats_of(tmp_path / "s.json")
    assert (s["iterations"], s["iteration_source"], s["detected_period"]) == (7, "adapter", 0)


def test_thread_safety_under_concurrent_allocations(built, tmp_path):
    res, out, calls = run(built, "threads", 8, 2000, 1 << 20, env={"TRANSIT_STATS": str(tmp_path / "s.json")})
    assert res.returncode == 0 and out["done"] == "1"
    s = stats_of(tmp_path / "s.json")
    assert s["managed_allocs"] == s["cuda_free_calls"] == 16000
    assert s["managed_bytes"] == 0 and s["device_placed_bytes"] == 0
    assert sum(c.startswith("cudaMallocManaged") for c in calls) == 16000


def test_fork_child_allocates_and_only_parent_reports(built, tmp_path):
    stats = tmp_path / "s-%p.json"
    res, out, _ = run(built, "fork", GB, env={"TRANSIT_STATS": str(stats)})
    assert out["child"] == "0" and out["parent"] == "0"
    files = list(tmp_path.glob("s-*.json"))
    assert len(files) == 1 and stats_of(files[0])["managed_allocs"] == 1


@pytest.mark.parametrize("env,needle", [
    ({"FAKE_NO_MANAGED": "1"}, "no managed memory support: passing through"),
    ({"FAKE_RUNTIME_VERSION": "10020"}, "version 10020 is not supported"),
    ({"TRANSIT_POLICY": "turbo"}, "TRANSIT_POLICY=turbo is not one of"),
])
def test_pass_through_when_something_is_missing(built, tmp_path, env, needle):
    res, out, calls = run(built, "alloc", GB, env={"TRANSIT_LOG": "warn", "TRANSIT_STATS": str(tmp_path / "s.json")} | env)
    assert res.returncode == 0 and out["alloc0"] == "0"
    assert needle in res.stderr and res.stderr.count("\n") == 1  # one line, then silence
    assert [c.split()[0] for c in calls] == ["cudaMalloc", "cudaFree"]


def test_managed_failure_falls_back_to_plain_memory(built):
    res, out, calls = run(built, "alloc", GB, env={"FAKE_MANAGED_FAIL": "1"})
    assert out["alloc0"] == "0" and "using cudaMalloc for it" in res.stderr
    assert [c.split()[0] for c in calls] == ["cudaMalloc", "cudaFree"]


def test_build_without_a_compiler_is_skipped_with_a_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler")
    path, reason = shimbuild.build(tmp_path / "lib")
    assert path is None and "no C compiler found" in reason
    assert (tmp_path / "lib" / "BUILD_SKIPPED").is_file()


def test_build_without_headers_installs_and_doctor_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(shimbuild, "find_header", lambda *a, **k: None)
    path, reason = shimbuild.build(tmp_path / "lib")
    assert path is None and "cuda_runtime_api.h" in reason
    assert (tmp_path / "lib" / "BUILD_SKIPPED").read_text().strip() == reason
    monkeypatch.setattr(inject, "_PKG", tmp_path)
    monkeypatch.delenv("TRANSIT_SHIM", raising=False)
    check = doctor.check_shim()
    assert not check["ok"] and "cuda_runtime_api.h" in check["detail"]


def test_host_regions_are_pushed_off_the_gpu_once(built):
    """A GPU's first touch may populate host-preferred pages on the device: at the next
    iteration boundary every new host region is prefetched to the host, once: here the part of
    the second 2 GB that the 3 GB budget cannot take (its head, 1 GB to the grain, goes to
    the GPU)."""
    res, out, calls = run(built, "loop", 4, 20, 2 * GB, "adapter", env={"TRANSIT_GPU_BUDGET": "3GB"})
    q = int(out["q"], 16)
    head = GB // GRAIN * GRAIN
    assert sum(c.startswith(f"cudaMemPrefetchAsync 0x{q:x} {head} {LOC_DEVICE}") for c in calls) == 1
    evictions = [c for c in calls if c.startswith("cudaMemPrefetchAsync 0x") and f" {LOC_HOST} " in c]
    assert [c.split()[1:3] for c in evictions] == [[f"0x{q + head:x}", str(2 * GB - head)]]
    first_launch = next(i for i, c in enumerate(calls) if c.startswith("cudaLaunchKernel"))
    assert calls.index(evictions[0]) > first_launch + 19  # after the first iteration's 20 launches


def test_summary_separates_placement_from_memory_in_use():
    """The budget is the shim's placement; cudaMemGetInfo's in-use figure is shown beside it
    and flagged, not folded in (UVM keeps evicted chunks: bench/RESULTS.md)."""
    s = {"pid": 1, "policy": "advise", "passthrough": False, "budget_bytes": 10 * GB, "managed_peak_bytes": 20 * GB,
         "device_placed_peak_bytes": 10 * GB - 1, "host_placed_peak_bytes": 10 * GB, "zero_copy_mapped_peak_bytes": 0,
         "cold_hint_bytes": {"optimizer": 8 * GB}, "gpu_resident_peak_steady_bytes": 15 * GB, "prefetch_bytes": 0,
         "htod_bytes": 0, "iterations": 20, "iteration_source": "adapter", "iteration_ms": [1.0] * 19,
         "free_at_start_bytes": 140 * GB, "guard_limit_bytes": 139 * GB}
    text = runmod.summary_text(runmod.summary([s]))
    row = text.splitlines()[2].split()
    assert row[-3:] == ["yes", "no", "(*)"] and "UVM driver keeps" in text
    over = dict(s, device_placed_peak_bytes=10 * GB + 1)
    assert runmod.summary([over])["processes"][0]["budget_held"] is False
    assert "NO" in runmod.summary_text(runmod.summary([over])).splitlines()[2].split()


def test_run_command_summarizes_stats(built, tmp_path):
    env = dict(os.environ, TRANSIT_SHIM=str(built["shim"]), FAKE_CUDART_LOG=str(tmp_path / "log"))
    res = subprocess.run([sys.executable, "-m", "transit_launch", "run", "--policy", "advise", "--gpu-budget", "3GB",
                          "--json", "--", str(built["app"]), "loop", "5", "20", str(2 * GB), "adapter"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    summ = json.loads(res.stdout[res.stdout.index("{\n"):])
    p = summ["processes"][0]
    assert summ["returncode"] == 0 and p["policy"] == "advise" and p["budget_gb"] == 3.0
    assert p["iterations"] == 5 and p["host_placed_peak_gb"] == 2.0 and p["budget_held"]


def test_bindings_stage_nothing_with_an_older_shim(monkeypatch):
    """A site's older libtransit.so (API version 2, no device buffers) under a newer adapter:
    no ring (0), never a call of the missing symbol (it would end the adapter's hook)."""
    from transit_launch.adapter import transit_api

    class OldShim:
        def transit_api_version(self):
            return 2
    monkeypatch.setattr(transit_api, "_lib", OldShim())
    monkeypatch.setattr(transit_api, "available", True)
    assert transit_api.device_alloc(1 << 20) == 0 and transit_api.device_free(1) == -1
    assert transit_api.adapter_attach() is False  # API version 4's call, never made on an older shim


def test_python_bindings_declare_what_the_header_declares():
    """The adapter's cffi declarations and hint kinds are generated (transit_rules.py, from
    shim/transit_api.h and rules.py's HINT_KINDS; tests/test_rules.py checks the file is
    current): cffi takes them, they name every function the header declares, and the
    header's enum is made of the generated values (the shim's build compiles it)."""
    import re

    from transit_launch.adapter import transit_api
    header = (Path(__file__).resolve().parent.parent / "shim" / "transit_api.h").read_text()
    names = set(re.findall(r"^\s*[a-z][\w *]*?\b(transit_\w+)\(", header, flags=re.M))
    assert names and names == set(re.findall(r"\b(transit_\w+)\(", transit_api.CDEF))
    cffi = pytest.importorskip("cffi")
    cffi.FFI().cdef(transit_api.CDEF)  # a declaration cffi cannot read fails here
    for kind in ("HOT", "MASTER", "OPTIMIZER", "SPARSE"):
        assert f"TRANSIT_HINT_{kind} = TR_HINT_{kind}" in header
    # the values older adapters were built with (the C API keeps its ABI across versions)
    assert (transit_api.HOT, transit_api.MASTER, transit_api.OPTIMIZER, transit_api.SPARSE) == (0, 1, 2, 3)


def test_retired_staging_is_said_once_and_changes_nothing(built, tmp_path):
    """TRANSIT_STAGE (retired, docs/retired-experiments.md): a job that still sets it gets one
    line saying so and runs as without it. Its staging ranked the optimizer state off the GPU
    at every boundary and opened a side stream and events; here the 2 GB optimizer range stays
    on the GPU under an 8 GB budget (as in the test above) and no stream or event is made."""
    for value in ("1", "0"):
        res, out, calls = run(built, "place", 4 * GB, 0, tmp_path / "s.json", f"1000000:{2 * GB}:2",
                              env={"TRANSIT_GPU_BUDGET": "8GB", "TRANSIT_LOG": "warn", "TRANSIT_STAGE": value})
        assert out["stats"] == "0", res.stderr
        [line] = res.stderr.splitlines()
        assert line.endswith(f" warn: TRANSIT_STAGE={value} is retired and ignored (docs/retired-experiments.md): "
                             "TRANSIT_OVERLAP_STEP=stream (advise's default) or host moves the optimizer state "
                             "instead"), line
        assert not [c for c in calls if c.startswith(("cudaStream", "cudaEvent"))], calls
        s = stats_of(tmp_path / "s.json")
        assert s["device_placed_bytes"] == 4 * GB and s["zero_copy_mapped_bytes"] == 0 and "staging" not in s


def test_an_older_adapter_still_finds_the_retired_staging_calls(built):
    """Adapters of API versions 1-5 bind transit_stage_enabled/in/wait/out unconditionally (a
    missing symbol ended their step hook, or under ctypes their import, and with it every
    hint): the shim still exports them, as no-ops that answer "staging off". They are not in
    transit_api.h, so the bindings of today's adapter do not declare them."""
    code = ("import ctypes; lib = ctypes.CDLL(None); "
            "print(lib.transit_api_version(), lib.transit_stage_enabled(), lib.transit_stage_in(0), "
            "lib.transit_stage_wait(0), lib.transit_stage_out(0x77))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRANSIT_", "FAKE_"))}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**env, "LD_PRELOAD": str(built["shim"]), "TRANSIT_POLICY": "advise"})
    assert res.returncode == 0 and res.stdout.split() == ["10", "0", "0", "0", "0"], res.stderr  # version 10 today
    from transit_launch.adapter import transit_api
    assert "stage" not in transit_api.CDEF



ADAPTER_STATS = r"""
import ctypes, json, sys, threading
sys.path.insert(0, sys.argv[1])
import transit_api
lib = ctypes.CDLL(None)
out = sys.argv[2]
assert lib.transit_write_stats(f"{out}/before.json".encode()) == 0
said = [transit_api.adapter_stats({"mode": "host", "steps": 3, "cpu_s": 1.25})]
refused = [lib.transit_adapter_stats(t) for t in (None, b"", b"{", b"[1]", b"{\"a\": 1} ", b"{\"a\":\n1}",
                                                  b"{\"a\": \"\xc3\xa9\"}", b"{" + b" " * (64 << 10) + b"}", b"1}",
                                                  b"{\"a\": \"\x7f\"}")]
def send(i):  # threads replacing each other's counters: the report holds one of them, whole
    for _ in range(200):
        lib.transit_adapter_stats(json.dumps({"thread": i, "pad": "x" * 100}).encode())
ts = [threading.Thread(target=send, args=(i,)) for i in range(4)]
[t.start() for t in ts]
for _ in range(50):
    assert lib.transit_write_stats(f"{out}/during.json".encode()) == 0
    json.load(open(f"{out}/during.json"))
[t.join() for t in ts]
assert lib.transit_adapter_stats(b"{" + b" " * ((64 << 10) - 2) + b"}") == 0  # 64 KiB exactly: taken
assert lib.transit_adapter_stats(b'{"last": true}') == 0
assert lib.transit_write_stats(f"{out}/after.json".encode()) == 0
print(json.dumps({"said": said[0], "refused": refused}))
"""


def test_the_adapters_counters_go_into_the_stats_report(built, tmp_path):
    """transit_adapter_stats (API version 10): the adapter's counters are the report's
    "adapter" object (null before any call; the last call's after), through the adapter's own
    binding; text that is not one JSON object of printable ASCII, or is over 64 KiB, is
    refused and the report keeps what it had; calls from four threads while reports are
    written leave every report valid JSON."""
    from transit_launch.preload import inject

    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRANSIT_", "FAKE_"))}
    res = subprocess.run([sys.executable, "-c", ADAPTER_STATS, str(inject.adapter_dir()), str(tmp_path)],
                         capture_output=True, text=True, timeout=120,
                         env={**env, "LD_PRELOAD": str(built["shim"]), "TRANSIT_POLICY": "advise"})
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["said"] is True and out["refused"] == [-1] * 10
    assert stats_of(tmp_path / "before.json")["adapter"] is None
    assert stats_of(tmp_path / "after.json")["adapter"] == {"last": True}
    assert set(stats_of(tmp_path / "during.json")["adapter"]) in ({"thread", "pad"}, {"mode", "steps", "cpu_s"})


def test_the_plans_prediction_rides_in_the_stats_report(built, tmp_path):
    """TRANSIT_PLAN (the plan's prediction, set by render and submit) is the report's "plan"
    object, copied by the shim's own writer; a value that is not one JSON object of printable
    ASCII is one warning and no prediction (null), the job unharmed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRANSIT_", "FAKE_"))}
    code = "import ctypes, sys; sys.exit(ctypes.CDLL(None).transit_write_stats(sys.argv[1].encode()))"
    for i, (value, want) in enumerate((('{"nodes": 2, "offload_gb_per_gpu": 6.61}', {"nodes": 2, "offload_gb_per_gpu": 6.61}),
                                       ('[2]', None), ('{"a": "\u00e9"}', None), ("{" + " " * (64 << 10) + "}", None))):
        path = tmp_path / f"s{i}.json"
        res = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60,
                             env={**env, "LD_PRELOAD": str(built["shim"]), "TRANSIT_POLICY": "advise",
                                  "TRANSIT_PLAN": value})
        assert res.returncode == 0, res.stderr
        assert stats_of(path)["plan"] == want
        warned = [ln for ln in res.stderr.splitlines() if "TRANSIT_PLAN=" in ln]
        assert len(warned) == (0 if want else 1), res.stderr
