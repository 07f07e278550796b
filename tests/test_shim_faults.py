"""The shim under threads, faults and bad settings (issue 17; the shim's settings of issue
15), against the fake runtime, which keeps its own tally of managed memory and answers
like CUDA 13's runtime (tests/fakecuda/fake_cudart.c): the guard holds at every instant,
a refused or malformed cudaMalloc looks like the runtime's own failure, no value a user
can set crashes the process or passes silently."""

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import CUDA_INC, FAKECUDA, build_once, shimbuild
from tests.test_shim import run, stats_of

GB, MiB, GiB = 10**9, 1 << 20, 1 << 30
RESERVE = GiB  # TRANSIT_RESERVE's default
SIZE_MAX = (1 << 64) - 1
ERR_INVALID_VALUE, ERR_MEMORY_ALLOCATION = 1, 2

pytestmark = pytest.mark.skipif(CUDA_INC is None or not shutil.which("cc"),
                                reason="needs a C compiler and the CUDA runtime headers (cuda_runtime_api.h)")


def build_fake_cupti(out_dir: Path, cflags=()) -> Path | None:
    """tests/fakecuda/fake_cupti.c as out_dir/libcupti.so (found first through
    LD_LIBRARY_PATH); None without CUPTI headers, where the shim is built without CUPTI."""
    inc = shimbuild.find_header("cupti.h", ("extras/CUPTI/include",))
    if inc is None:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cc", "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", *cflags, f"-I{CUDA_INC}", f"-I{inc}",
                    "-fPIC", "-shared", "-o", str(out_dir / "libcupti.so"), str(FAKECUDA / "fake_cupti.c"),
                    "-ldl", "-lpthread"], check=True)
    return out_dir


@pytest.fixture(scope="module")
def cupti(tmp_path_factory):
    if shimbuild.find_header("cupti.h", ("extras/CUPTI/include",)) is None:
        pytest.skip("needs CUPTI headers (cupti.h): the shim is built without the recorder")
    return build_once(tmp_path_factory, "fakecupti", [FAKECUDA], [], build_fake_cupti)


def tally(out):
    """The fake runtime's own account, printed by the test program."""
    return {k[5:]: int(v) for k, v in out.items() if k.startswith("fake_")}


def warnings(stderr):
    return [line for line in stderr.splitlines() if " warn: " in line or " error: " in line]


# ---- the guard -------------------------------------------------------------------

def test_guard_holds_at_every_instant_under_threads(built, tmp_path):
    """8 threads, each holding up to 4 allocations of ~24 MiB, against a 512 MiB guard
    (free memory 1.5 GiB less the 1 GiB reserve): the fake runtime never holds more
    managed memory than the guard, at any instant (its own peak), and the shim's peak
    covers it. Before the fix the shim checked, unlocked, then allocated."""
    guard = 512 * MiB
    res, out, _ = run(built, "threads", 8, 5000, 24 * MiB, 4,
                      env={"FAKE_GPU_MEM": str(guard + RESERVE), "TRANSIT_LOG": "error",
                           "TRANSIT_STATS": str(tmp_path / "s.json")})
    assert res.returncode == 0 and out["done"] == "1", res.stderr
    fake, s = tally(out), stats_of(tmp_path / "s.json")
    assert s["guard_limit_bytes"] == guard and s["guard_refusals"] > 0
    assert fake["managed_peak"] <= s["managed_peak_bytes"] <= guard, (fake, s["managed_peak_bytes"])
    assert fake["managed_live"] == fake["live_ptrs"] == fake["bad_frees"] == fake["bad_ranges"] == 0
    assert s["managed_bytes"] == 0 and out["table_check"].startswith("0")


def test_guard_is_not_bypassed_by_wraparound(built, tmp_path):
    """managed + size wrapped around for a size near SIZE_MAX and passed the guard."""
    huge = SIZE_MAX - GB // 2
    res, out, calls = run(built, "alloc", GB, huge, env={"FAKE_GPU_MEM": str(10 * GB),
                                                         "TRANSIT_STATS": str(tmp_path / "s.json")})
    assert (out["alloc0"], out["alloc1"]) == ("0", str(ERR_MEMORY_ALLOCATION))
    assert f"refusing cudaMalloc({huge})" in res.stderr
    assert stats_of(tmp_path / "s.json")["guard_refusals"] == 1
    assert not [c for c in calls if c.startswith(f"cudaMallocManaged {huge}")]  # never asked the runtime


def test_guard_refusal_looks_like_the_runtimes_own(built, tmp_path):
    """The runtime's own out-of-memory leaves cudaErrorMemoryAllocation for cudaGetLastError
    (PyTorch reads it back); after the guard's refusal it said success."""
    env = {"FAKE_GPU_MEM": str(10 * GB)}
    _, plain, _ = run(built, "alloc", 11 * GB, policy="off", env=env)
    assert (plain["alloc0"], plain["last0"]) == (str(ERR_MEMORY_ALLOCATION),) * 2  # the fake, like CUDA 13
    res, out, _ = run(built, "alloc", 6 * GB, 6 * GB, GB, env=env)
    assert (out["alloc1"], out["last1"]) == (plain["alloc0"], plain["last0"]), res.stderr
    assert (out["alloc2"], out["last2"]) == ("0", "0")  # read once, like the runtime's


@pytest.mark.parametrize("free,reserve_said", [
    (10 * GB, f"less the {RESERVE}-byte reserve (TRANSIT_RESERVE)"),
    (512 * MiB, f"none kept for TRANSIT_RESERVE ({RESERVE} bytes): less than that was free"),
])
def test_guard_message_says_what_was_reserved(built, free, reserve_said):
    """"less the reserve" was printed even when nothing was subtracted (free < reserve)."""
    res, out, _ = run(built, "alloc", free + 1, env={"FAKE_GPU_MEM": str(free), "TRANSIT_LOG": "warn"})
    assert out["alloc0"] == str(ERR_MEMORY_ALLOCATION)
    [line] = warnings(res.stderr)
    assert reserve_said in line and "refusing cudaMalloc" in line


# ---- cudaMalloc's contract ---------------------------------------------------------

@pytest.mark.parametrize("size", [4096, 100 * GB, SIZE_MAX])
def test_null_devptr_gets_the_runtimes_answer(built, size):
    """cudaMalloc(NULL, n) crashed (SIGSEGV) when the guard refused n, and took the
    not-supported fallback with a warning otherwise; the runtime says cudaErrorInvalidValue."""
    env = {"FAKE_GPU_MEM": str(10 * GB), "TRANSIT_LOG": "warn"}
    _, plain, _ = run(built, "alloc", f"null:{size}", policy="off", env=env)
    assert (plain["alloc0"], plain["last0"]) == (str(ERR_INVALID_VALUE),) * 2
    res, out, _ = run(built, "alloc", f"null:{size}", env=env)
    assert res.returncode == 0, res.stderr
    assert (out["alloc0"], out["last0"]) == (plain["alloc0"], plain["last0"])
    assert warnings(res.stderr) == []


def test_not_supported_fallback_warns_once_then_counts(built, tmp_path):
    res, out, calls = run(built, "alloc", GB, GB, GB, env={"FAKE_MANAGED_FAIL": "1", "TRANSIT_LOG": "warn",
                                                           "TRANSIT_STATS": str(tmp_path / "s.json")})
    assert [out[f"alloc{i}"] for i in range(3)] == ["0"] * 3
    assert [out[f"last{i}"] for i in range(3)] == ["0"] * 3  # the shim's own failure is not the application's
    [line] = warnings(res.stderr)
    assert "using cudaMalloc" in line
    stats = stats_of(tmp_path / "s.json")
    assert stats["managed_fallbacks"] == 3
    from transit_launch.preload import run as runmod  # `transit-launch run` says so too
    summ = runmod.summary([stats])
    assert summ["processes"][0]["managed_fallbacks"] == 3
    assert "3 allocation(s) could not be managed memory" in runmod.summary_text(summ)


def test_managed_out_of_memory_is_passed_on(built, tmp_path):
    """The runtime's own refusal of managed memory: its code, its last error, counted, and
    the guard's reservation given back (managed bytes return to zero)."""
    res, out, _ = run(built, "alloc", GB, GB, GB, env={"FAKE_MANAGED_OOM_EVERY": "2", "TRANSIT_STATS":
                                                       str(tmp_path / "s.json")})
    assert [(out[f"alloc{i}"], out[f"last{i}"]) for i in range(3)] == [("0", "0"), ("2", "2"), ("0", "0")]
    s = stats_of(tmp_path / "s.json")
    assert s["failed_allocs"] == 1 and s["managed_bytes"] == 0 and s["managed_peak_bytes"] == 2 * GB


# ---- replay ---------------------------------------------------------------------

def test_replay_window_forgets_freed_memory(built, tmp_path):
    """prefetch's window sent its oldest range back to the host before a new prefetch even
    when that range had been freed since (a segment given back): on a GPU the runtime
    refuses the range, or it moves whatever was allocated there next. p (1 GiB) fills the
    1.5 GiB budget's device side, q and r are on the host; half of q is replayed before
    launch 5, half of r before launch 10 (q's half leaves first); r is freed after the
    first iteration, while its half is in the window."""
    res, out, calls = run(built, "loop", 3, 20, GiB, "adapter", "replay", "refree", policy="prefetch",
                          env={"TRANSIT_GPU_BUDGET": f"{3 * GiB // 2}B", "TRANSIT_STATS": str(tmp_path / "s.json")})
    assert res.returncode == 0 and out["last_error"] == "0", res.stderr
    r = out["r"]
    freed = calls.index(f"cudaFree {r}")
    assert calls[:freed].count(f"cudaMemPrefetchAsync {r} {GiB // 2} 1 0 0x7") == 1  # it was replayed
    assert not [c for c in calls[freed:] if c.startswith(f"cudaMemPrefetchAsync {r} ")]
    s = stats_of(tmp_path / "s.json")
    assert s["hint_errors"] == 0 and s["prefetch_calls"] == 4  # q's half: in every iteration; r's: once


# ---- stats path ------------------------------------------------------------------

def test_stats_path_with_a_long_rank(built, tmp_path):
    """%r with a 5000-character RANK wrote past the path buffer on the stack (ASan:
    stack-buffer-overflow in expand; tests/test_shim_sanitizers.py runs this under ASan)."""
    res, out, _ = run(built, "alloc", GB, env={"TRANSIT_STATS": str(tmp_path / "s-%r-%p.json"), "RANK": "7" * 5000,
                                               "TRANSIT_LOG": "warn"})
    assert res.returncode == 0 and out["alloc0"] == "0"
    [line] = warnings(res.stderr)
    assert "TRANSIT_STATS" in line and "too long" in line
    assert list(tmp_path.iterdir()) == []
    res, _, _ = run(built, "alloc", GB, env={"TRANSIT_STATS": str(tmp_path / "s-%r.json"), "RANK": "3"})
    assert stats_of(tmp_path / "s-3.json")["managed_allocs"] == 1


# ---- CUPTI -----------------------------------------------------------------------

@pytest.mark.parametrize("code,said,not_said", [
    (999, "CUPTI_ERROR_UNKNOWN", "another profiler"),
    (39, "another profiler", None),
])
def test_cupti_error_is_named_not_guessed(built, cupti, code, said, not_said):
    """Error 999 (unknown, e.g. no GPU behind the driver) was blamed on "another profiler"."""
    res, out, _ = run(built, "loop", 3, 20, GB, "adapter", policy="prefetch",
                      env={"LD_LIBRARY_PATH": str(cupti), "FAKE_CUPTI_ERROR": str(code), "TRANSIT_LOG": "warn"})
    assert res.returncode == 0 and out["last_error"] == "0"
    [line] = warnings(res.stderr)
    assert f"error {code}" in line and said in line
    assert not_said is None or not_said not in line


def test_recording_with_cupti_builds_a_replay(built, cupti, tmp_path):
    """The fake CUPTI's records tie migrations to launch positions: prefetch's warm-up
    builds a replay table from them (the recorder's path, also run under the sanitizers)."""
    res, out, calls = run(built, "loop", 5, 40, 2 * GiB, "adapter", policy="prefetch",
                          env={"LD_LIBRARY_PATH": str(cupti), "TRANSIT_GPU_BUDGET": "3GB",
                               "TRANSIT_STATS": str(tmp_path / "s.json")})
    assert res.returncode == 0 and out["last_error"] == "0", res.stderr
    s = stats_of(tmp_path / "s.json")
    assert s["replay_positions"] > 0 and s["htod_bytes"] > 0 and s["hint_errors"] == 0
    assert "cuptiFinalize" in calls and "cuptiActivityPopExternalCorrelationId -> unbalanced" not in calls


@pytest.mark.parametrize("attach", [False, True])
def test_an_attached_adapter_keeps_cupti_free_under_gradient_accumulation(built, cupti, tmp_path, attach):
    """advise with 80 microbatches a step (of 300 launches: the shim looks for a period from
    16K launches on): the kernel sequence repeats before the adapter's
    first step, so the shim guessed a boundary, had no optimizer hint yet, and started its
    warm-up recording; on the H200 torch.profiler then got CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_
    NOT_SUPPORTED for the rest of the job, cuptiFinalize notwithstanding (bench/LOG.md,
    "torch.profiler under the shim loses CUPTI at more than one microbatch"). Once the
    adapter attached (it does at the first optimizer's construction) the shim guesses
    nothing and never touches CUPTI. Without attaching, the
    recorder starts (the case the fix is for)."""
    res, out, calls = run(built, "loop", 240, 300, GB, "adapter", "accum=80", *(["attach"] if attach else []),
                          env={"LD_LIBRARY_PATH": str(cupti), "TRANSIT_STATS": str(tmp_path / "s.json")})
    assert res.returncode == 0 and out["last_error"] == "0", res.stderr
    s = stats_of(tmp_path / "s.json")
    assert (s["iterations"], s["iteration_source"]) == (3, "adapter")
    cupti_calls = [c for c in calls if c.startswith("cupti")]
    if attach:
        assert cupti_calls == [] and "guessed" not in res.stderr and "CUPTI recording" not in res.stderr
        assert s["detected_period"] == 0
    else:
        assert "CUPTI recording started" in res.stderr and "dropping" in res.stderr
        assert "cuptiActivityRegisterCallbacks" in cupti_calls and "cuptiFinalize" in cupti_calls


@pytest.mark.parametrize("onhost", [False, True])
def test_state_on_the_host_keeps_advise_from_probing(built, cupti, tmp_path, onhost):
    """The host step (TRANSIT_OVERLAP_STEP=host) keeps the optimizer state in the application's
    host memory, so advise found no state hinted and probed access: its recording sent every
    managed byte to the host at the first boundary (on the H100: 32 GB evicted, a 14.9 s second
    step). transit_state_on_host names the state as a hint would: no recording, nothing evicted,
    though both allocations fit the budget either way."""
    res, out, calls = run(built, "loop", 4, 40, GB, "adapter", "attach", *(["onhost"] if onhost else []),
                          env={"LD_LIBRARY_PATH": str(cupti), "TRANSIT_GPU_BUDGET": "4GB",
                               "TRANSIT_STATS": str(tmp_path / "s.json")})
    assert res.returncode == 0 and out["last_error"] == "0", res.stderr
    s = stats_of(tmp_path / "s.json")
    cupti_calls = [c for c in calls if c.startswith("cupti")]
    if onhost:
        assert cupti_calls == [] and "CUPTI recording" not in res.stderr
        assert s["evict_calls"] == 0 and s["host_placed_peak_bytes"] == 0
    else:
        assert "CUPTI recording started" in res.stderr and "cuptiActivityRegisterCallbacks" in cupti_calls
        assert s["evict_bytes"] >= 2 * GB  # both allocations sent to the host for the recording


# ---- the shim's own settings (issue 15) ------------------------------------------

BAD_SETTINGS = [
    ("TRANSIT_LOG", "bogus", "using warn"),
    ("TRANSIT_WARMUP_ITERS", "abc", "using 2"),
    ("TRANSIT_WARMUP_ITERS", "-3", "using 2"),
    ("TRANSIT_WARMUP_ITERS", "0", "using 2"),
    ("TRANSIT_WARMUP_ITERS", "99999999999", "using 2"),
    ("TRANSIT_WARMUP_ITERS", "2x", "using 2"),
    ("TRANSIT_ALLOW_OVERSUBSCRIBE", "yes", "using 0"),
    ("TRANSIT_GPU_BUDGET", "0", "using no budget"),
    ("TRANSIT_GPU_BUDGET", "0.5", "using no budget"),
    ("TRANSIT_GPU_BUDGET", "1e30", "using no budget"),
    ("TRANSIT_GPU_BUDGET", "inf", "using no budget"),
    ("TRANSIT_GPU_BUDGET", "nan", "using no budget"),
    ("TRANSIT_GPU_BUDGET", "-5GB", "using no budget"),
    ("TRANSIT_GPU_BUDGET", "70", "using no budget"),  # a bare number is no size, not 70 bytes
    ("TRANSIT_RESERVE", "lots", "using 1GiB"),
    ("TRANSIT_RESERVE", "0", "using 1GiB"),
    ("TRANSIT_RESERVE", "1073741824", "using 1GiB"),
    ("TRANSIT_MERGE_GAP", "1e3", "using 128KiB"),
    ("TRANSIT_MERGE_GAP", "4096", "using 128KiB"),
    ("TRANSIT_COLD_TAIL", "nan", "using 0.02"),
    ("TRANSIT_COLD_TAIL", "1.5", "using 0.02"),
    ("TRANSIT_COLD_TAIL", "0", "using 0.02"),
    ("TRANSIT_COLD_TAIL", "1e-2", "using 0.02"),
    ("TRANSIT_STATS", "/tmp/" + "x" * 5000, "using no stats"),
]


@pytest.mark.parametrize("var,value,used", BAD_SETTINGS, ids=[f"{v}={x[:12]}" for v, x, _ in BAD_SETTINGS])
def test_a_setting_the_shim_cannot_honour_gets_one_line(built, var, value, used):
    res, out, _ = run(built, "alloc", GB, env={"TRANSIT_LOG": "warn", var: value})
    assert res.returncode == 0 and out["alloc0"] == "0", res.stderr
    [line] = res.stderr.splitlines()
    shown = value if len(value) < 100 else value[:40]
    assert f"{var}={shown}" in line and line.endswith(f": {used}"), line
    if var == "TRANSIT_GPU_BUDGET":  # not a budget of 2^63 shown to the application
        assert int(out["total"]) == 80 * GB


def test_a_bare_number_is_refused_by_name_not_read_as_bytes(built):
    """TRANSIT_GPU_BUDGET=70 was a budget of 70 bytes; now the warning says why it is not
    honoured, and the job runs without a budget (the shim never stops the job)."""
    res, out, _ = run(built, "alloc", GB, env={"TRANSIT_LOG": "warn", "TRANSIT_GPU_BUDGET": "70"})
    assert res.returncode == 0 and out["alloc0"] == "0" and int(out["total"]) == 80 * GB
    [line] = res.stderr.splitlines()
    assert "TRANSIT_GPU_BUDGET=70 has no unit (a size needs one: 40GB, 40GiB, or 40B for bytes): using no budget" \
        in line, line


def test_a_budget_above_the_cli_and_plugin_bound_is_refused_in_the_variable_too(built):
    """TRANSIT_GPU_BUDGET set in a job's environment (which the SPANK plugin's option check
    never sees) is held to the same bound as --gpu-budget and --transit-budget
    (rules.GPU_BUDGET_MAX): one warning, the job runs without a budget."""
    for value, refused in (("2TiB", True), ("1TiB", False)):
        res, out, _ = run(built, "alloc", GB, env={"TRANSIT_LOG": "warn", "TRANSIT_GPU_BUDGET": value})
        assert res.returncode == 0 and out["alloc0"] == "0", res.stderr
        said = [ln for ln in res.stderr.splitlines() if ln.endswith(f"TRANSIT_GPU_BUDGET={value} is above 1TiB: "
                                                                     "using no budget")]
        assert len(said) == refused, res.stderr  # 1TiB itself: taken (the guard then caps it at the free memory)


@pytest.mark.parametrize("var,value", [
    ("TRANSIT_LOG", "ERROR"), ("TRANSIT_WARMUP_ITERS", "3"), ("TRANSIT_ALLOW_OVERSUBSCRIBE", "0"),
    ("TRANSIT_ALLOW_OVERSUBSCRIBE", "1"), ("TRANSIT_GPU_BUDGET", "40GB"),
    ("TRANSIT_GPU_BUDGET", "40 GB"), ("TRANSIT_GPU_BUDGET", "40000000000B"), ("TRANSIT_RESERVE", "512MiB"),
    ("TRANSIT_MERGE_GAP", "4096B"), ("TRANSIT_COLD_TAIL", "0.05"),
    ("TRANSIT_COLD_TAIL", ".1"), ("TRANSIT_GPU_BUDGET", ""), ("TRANSIT_WARMUP_ITERS", ""),
])
def test_a_good_setting_is_silent(built, var, value):
    res, out, _ = run(built, "alloc", GB, env={"TRANSIT_LOG": "warn", var: value})
    assert res.returncode == 0 and out["alloc0"] == "0" and res.stderr == ""


@pytest.mark.parametrize("value", ["1", "0", "true", "x" * 300])
def test_a_retired_setting_gets_one_line_and_the_job_runs(built, value):
    """TRANSIT_STAGE (rules.RETIRED_ENV, docs/retired-experiments.md), whatever its value:
    one line that it is retired and ignored; set empty it is unset, and silent."""
    res, out, _ = run(built, "alloc", GB, env={"TRANSIT_LOG": "warn", "TRANSIT_STAGE": value})
    assert res.returncode == 0 and out["alloc0"] == "0", res.stderr
    [line] = res.stderr.splitlines()
    assert f"TRANSIT_STAGE={value[:100]}" in line and "is retired and ignored" in line, line
    assert len(line) < 400
    res, _, _ = run(built, "alloc", GB, env={"TRANSIT_LOG": "warn", "TRANSIT_STAGE": ""})
    assert res.stderr == ""
