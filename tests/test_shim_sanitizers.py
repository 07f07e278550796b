"""The shim, the fake runtime, the fake CUPTI and the test program built with
AddressSanitizer + UndefinedBehaviorSanitizer (GCC's `undefined` leaves out
float-cast-overflow: added) and, separately, with ThreadSanitizer, all with -Werror, then
the fake-runtime scenarios (threads, fork, faults, hints, launches, device buffers,
recording, bad and retired settings, the stress) under each. Any sanitizer report fails:
the exit code is checked, and the output searched for the reports' headers.

A sanitizer runtime must come first in the process, and LD_PRELOAD puts libtransit.so
ahead of the program's own libraries: the runtime's absolute path
(`cc -print-file-name=libasan.so`) goes first in LD_PRELOAD, and the program and the
fakes are instrumented too, so every piece is checked and the order is right whichever
way the loader looks at it. Skipped, with the reason, only where the compiler has no
such runtime."""

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import CUDA_INC, FAKECUDA, build_once, shimbuild
from tests.test_shim import run
from tests.test_shim_prefill import BUDGET_1_5_STATES, BUDGET_3_5_STATES  # hand-derived rooms there
from tests.test_shim_faults import SIZE_MAX, build_fake_cupti
from tests.test_shim_stress import stress

GB, MiB, GiB = 10**9, 1 << 20, 1 << 30
WERROR = ["-Wall", "-Wextra", "-Werror"]
# no_huge_pages_for_shadow=0: the shadow may take huge pages, which changes nothing the
# sanitizers check; with 4 KiB pages a fork copies the page tables of GBs of shadow (the
# fork scenarios spent 45 s of system time in 300 forks under TSan, 4 s with it)
SANITIZERS = {
    "asan+ubsan": (["-fsanitize=address,undefined", "-fsanitize=float-cast-overflow", "-fno-sanitize-recover=all",
                    "-fno-omit-frame-pointer"], "libasan.so",
                   {"ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1:exitcode=86:strict_string_checks=1:"
                                    "no_huge_pages_for_shadow=0",
                    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}),
    "tsan": (["-fsanitize=thread"], "libtsan.so",
             {"TSAN_OPTIONS": "halt_on_error=1:exitcode=86:second_deadlock_stack=1:no_huge_pages_for_shadow=0"}),
}
REPORTS = ("runtime error", "ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "WARNING: ThreadSanitizer",
           "ThreadSanitizer:", "AddressSanitizer:", "UndefinedBehaviorSanitizer")

pytestmark = pytest.mark.skipif(CUDA_INC is None or not shutil.which("cc"),
                                reason="needs a C compiler and the CUDA runtime headers (cuda_runtime_api.h)")


def cc(*args, **kw):
    return subprocess.run(["cc", "-std=c11", *args], capture_output=True, text=True, **kw)


def build_fakes(d: Path, flags) -> dict:
    """The fake libcudart and the test program, as tests/conftest.py's `built` makes them,
    with extra flags; -Werror: every C file of the tests builds clean."""
    common = ["-O1", *WERROR, *flags, f"-I{CUDA_INC}"]
    for args in (["-fPIC", "-shared", "-Wl,-soname,libcudart.so.13", "-o", str(d / "libcudart.so.13"),
                  str(FAKECUDA / "fake_cudart.c"), "-lpthread"],
                 ["-o", str(d / "app"), str(FAKECUDA / "app.c"), f"-L{d}", "-lcudart", f"-Wl,-rpath,{d}", "-lpthread",
                  "-ldl"]):
        if args[0] == "-o" and not (d / "libcudart.so").exists():
            (d / "libcudart.so").symlink_to("libcudart.so.13")
        res = cc(*common, *args)
        assert res.returncode == 0, res.stderr
    return {"dir": d, "app": d / "app"}


@pytest.fixture(scope="module", params=list(SANITIZERS))
def sanitized(request, tmp_path_factory):
    name = request.param
    flags, runtime_name, options = SANITIZERS[name]
    runtime = cc(f"-print-file-name={runtime_name}").stdout.strip()
    d = tmp_path_factory.mktemp(name.replace("+", "-"))
    probe = d / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    if not Path(runtime).is_absolute() or cc(*flags, "-o", str(d / "probe"), str(probe)).returncode != 0:
        pytest.skip(f"the C compiler has no {name} runtime ({runtime_name}); install it (e.g. apt install "
                    f"{'libasan8 libubsan1' if 'asan' in name else 'libtsan2'}) to run these")

    def make(out):  # once a run (tests/conftest.py: build_once), whatever the workers
        build_fakes(out, flags)
        shim, warnings = shimbuild.build(out / "lib", extra_cflags=[*flags, "-DTRANSIT_TESTING", "-Werror"])
        assert shim, warnings
        build_fake_cupti(out / "cupti", flags)

    out = build_once(tmp_path_factory, f"sanitized-{name.replace('+', '-')}", [FAKECUDA, shimbuild.SRC], flags,
                     make)
    b = {"dir": out, "app": out / "app", "shim": out / "lib" / "libtransit.so",
         "cupti": out / "cupti" if (out / "cupti" / "libcupti.so").exists() else None}
    b["env"] = {"LD_PRELOAD": f"{runtime} {b['shim']}", **options}
    b["name"] = name
    return b


def clean(res):
    """No sanitizer report: exit code and output."""
    reports = [line for line in res.stderr.splitlines() if any(r in line for r in REPORTS)]
    assert not reports, res.stderr[-6000:]
    assert res.returncode == 0, res.stderr[-6000:]


STATS = "@stats"  # replaced by a path in the test's directory
PINNED = {"TRANSIT_GPU_BUDGET": f"{4 * GB + 32 * MiB}B"}  # the 4 GB fit, no 64 MiB state beside them: pinned
SCENARIOS = {
    # name: (program arguments, policy, environment, needs the fake CUPTI)
    "guard-threads": (("threads", 8, 1500, 24 * MiB, 4), "advise", {"FAKE_GPU_MEM": str(512 * MiB + GiB)}, False),
    # transit_adapter_stats from 8 threads while the main thread writes 50 reports (its lock)
    "adapter-stats": (("adapter-stats", 8, STATS), "advise", {}, False),
    "refusals": (("alloc", 6 * GB, 6 * GB, GB, "null:4096", "null:100000000000", SIZE_MAX - 5), "advise",
                 {"FAKE_GPU_MEM": str(10 * GB)}, False),
    "small-free": (("alloc", 600 * MiB), "base", {"FAKE_GPU_MEM": str(512 * MiB)}, False),
    "fork": (("fork", GB), "advise", {}, False),
    "hint": (("hint", GB, 1_000_000, GB // 2, 2, STATS), "advise", {}, False),
    "place": (("place", 4 * GB, 3 * GB, STATS, f"1000000:{2 * GB}:2", f"late:{GB}"), "advise",
              {"TRANSIT_GPU_BUDGET": "5100MB"}, False),
    "device-buffer": (("devbuf", 2_500_000_000, GB, 1_500_000_000, STATS), "advise", {"TRANSIT_GPU_BUDGET": "4GB"},
                      False),
    "device-buffer-refused": (("devbuf", 2_500_000_000, GB, 1_500_000_000, STATS), "base",
                              {"TRANSIT_GPU_BUDGET": "4GB", "FAKE_GPU_MEM": str(GB), "TRANSIT_ALLOW_OVERSUBSCRIBE": "1"},
                              False),
    "device-buffer-first": (("devbuf-first", GB), "advise", {"TRANSIT_GPU_BUDGET": "4GB",
                                                              "TRANSIT_ALLOW_OVERSUBSCRIBE": "1"}, False),
    "host-state": (("state", 4 * GB, 64 * MiB, 3, STATS), "advise", {"TRANSIT_GPU_BUDGET": "6GB"}, False),
    "host-state-refused": (("state", 4 * GB, 64 * MiB, 3, STATS), "advise",
                           {"TRANSIT_GPU_BUDGET": "6GB", "FAKE_HOST_REGISTER_FAIL": "1"}, False),
    # the segments made ready in the background (prefill.c): taken ready, one made as before,
    # threads at once while the fill runs, the fill kept above what was taken (-idle, gated),
    # regions written and registered by their allocations (the registrar gated), the fill
    # holding at a region the budget keeps on the device, a fill thread that cannot start, every
    # registration refused with threads allocating, children forked during the fill and after it,
    # a wrong prediction, and the end left to the shim's exit
    "host-state-prefill": (("state", 4 * GB, 64 * MiB, 3, STATS, "segs-ready:s,s,s"), "advise", PINNED, False),
    "host-state-prefill-small": (("state", 4 * GB, 64 * MiB, 3, STATS, "segs:s,s"), "advise", PINNED, False),
    "host-state-prefill-threads": (("state-threads", 4 * GB, 64 * MiB, 8, STATS, "segs:s,s,s,s,s,s,s,s"), "advise",
                                   PINNED, False),
    "host-state-prefill-stop": (("state", 4 * GB, 64 * MiB, 1, STATS, f"segs:s,{GiB}"), "advise", PINNED, False),
    "host-state-prefill-idle": (("state", 4 * GB, 64 * MiB, 3, STATS, f"segs-idle:{GiB},s,s,s,s"), "advise",
                                {**PINNED, "APP_PREFILL_GATE": "1"}, False),
    "host-state-prefill-written": (("state", 4 * GB, 64 * MiB, 3, STATS, "segs-ready:s,s,s"), "advise",
                                   {**PINNED, "APP_PREFILL_GATE": "2"}, False),
    "host-state-prefill-kept": (("state", 4 * GB, 64 * MiB, 3, STATS, "segs-ready:s,s,s"), "advise",
                                {"TRANSIT_GPU_BUDGET": f"{BUDGET_1_5_STATES}B"}, False),
    "host-state-prefill-all-kept": (("state", 4 * GB, 64 * MiB, 3, STATS, "segs-idle:s,s,s"), "advise",
                                    {"TRANSIT_GPU_BUDGET": f"{BUDGET_3_5_STATES}B"}, False),
    "host-state-prefill-later-ready": (("state", 4 * GB, 64 * MiB, 3, STATS, "segs-ready:s,s,s"), "advise",
                                       {**PINNED, "APP_PREFILL_GATE": "4", "APP_PREFILL_OPEN_AFTER_FIRST": "1"},
                                       False),
    "host-state-prefill-no-writer": (("state-threads", 4 * GB, 64 * MiB, 8, STATS, "segs:s,s,s,s,s,s,s,s"), "advise",
                                     {**PINNED, "TRANSIT_TEST_PREFILL_THREAD_FAIL": "2"}, False),
    "host-state-prefill-refused-threads": (("state-threads", 4 * GB, 64 * MiB, 8, STATS, "segs:s,s,s,s,s,s,s,s"),
                                           "advise", {**PINNED, "FAKE_HOST_REGISTER_FAIL": "1"}, False),
    "host-state-prefill-fork": (("state", 4 * GB, 64 * MiB, 3, STATS, f"segs-fork:{GiB},s,s,s"), "advise", PINNED,
                                False),
    "host-state-prefill-fork-after": (("state", 4 * GB, 64 * MiB, 3, STATS, "segs-fork:s"), "advise", PINNED, False),
    "host-state-prefill-wrong": (("state", 4 * GB, 64 * MiB, 3, STATS, f"segs:{66 * MiB},{66 * MiB}"), "advise",
                                 PINNED, False),
    "host-state-prefill-exit": (("state-threads", 4 * GB, 64 * MiB, 2, STATS, f"segs-exit:{GiB},s,s"), "advise",
                                PINNED, False),
    "launches-adapter": (("loop", 5, 50, 2 * GB, "adapter"), "advise", {"TRANSIT_GPU_BUDGET": "3GB"}, False),
    "launches-replay": (("loop", 3, 20, 2 * GiB, "adapter", "replay", "straddle"), "prefetch",
                        {"TRANSIT_GPU_BUDGET": "3GB"}, False),
    "launches-period": (("layers", 60, 40), "advise", {}, False),
    "retired-stage": (("place", 4 * GB, 0, STATS, f"1000000:{2 * GB}:2"), "advise",
                      {"TRANSIT_GPU_BUDGET": "8GB", "TRANSIT_STAGE": "1" * 300}, False),
    "fault-not-supported": (("alloc", GB, GB), "advise", {"FAKE_MANAGED_FAIL": "1"}, False),
    "fault-oom": (("threads", 4, 500, MiB, 2), "advise", {"FAKE_MANAGED_OOM_EVERY": "3"}, False),
    "fault-prefetch": (("loop", 3, 20, 2 * GiB, "adapter", "replay"), "prefetch",
                       {"TRANSIT_GPU_BUDGET": "3GB", "FAKE_PREFETCH_FAIL": "1"}, False),
    "fault-no-managed": (("alloc", GB), "advise", {"FAKE_NO_MANAGED": "1"}, False),
    "stats-long-rank": (("alloc", GB), "advise", {"TRANSIT_STATS": "@dir/s-%r-%p.json", "RANK": "7" * 5000}, False),
    "bad-settings": (("alloc", GB), "advise", {"TRANSIT_GPU_BUDGET": "1e30", "TRANSIT_WARMUP_ITERS": "99999999999",
                                               "TRANSIT_RESERVE": "inf", "TRANSIT_LOG": "bogus",
                                               "TRANSIT_COLD_TAIL": "nan", "TRANSIT_STATS": "/" + "x" * 5000}, False),
    "recording-prefetch": (("loop", 5, 40, 2 * GiB, "adapter"), "prefetch", {"TRANSIT_GPU_BUDGET": "3GB"}, True),
    "recording-advise-nan-tail": (("loop", 5, 40, 2 * GiB, "adapter"), "advise",
                                  {"TRANSIT_GPU_BUDGET": "3GB", "TRANSIT_COLD_TAIL": "nan"}, True),
    "recording-period": (("loop", 70, 300, GiB), "prefetch", {}, True),
    "recording-refused": (("loop", 3, 20, GiB, "adapter"), "prefetch", {"FAKE_CUPTI_ERROR": "999"}, True),
    # gradient accumulation: a guessed boundary starts the recorder, the adapter's first one drops it;
    # attached first, neither happens
    "accum-takeover": (("loop", 160, 300, GiB, "adapter", "accum=80"), "advise", {}, True),
    "accum-attached": (("loop", 160, 300, GiB, "adapter", "accum=80", "attach"), "advise", {}, True),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_is_sanitizer_clean(sanitized, tmp_path, scenario):
    args, policy, env, needs_cupti = SCENARIOS[scenario]
    if needs_cupti and sanitized["cupti"] is None:
        pytest.skip("needs CUPTI headers (cupti.h) for the fake CUPTI")
    args = [str(tmp_path / "s.json") if a == STATS else a for a in args]
    env = {k: v.replace("@dir", str(tmp_path)) for k, v in env.items()}
    if needs_cupti:
        env["LD_LIBRARY_PATH"] = str(sanitized["cupti"])
    res, _, _ = run(sanitized, *args, policy=policy, env={**sanitized["env"], **env})
    clean(res)


@pytest.mark.parametrize("name", ["advise", "prefetch-replay", "prefetch-recording"])
def test_stress_is_sanitizer_clean(sanitized, tmp_path, name):
    env = dict(sanitized["env"])
    if name == "prefetch-recording":
        if sanitized["cupti"] is None:
            pytest.skip("needs CUPTI headers (cupti.h) for the fake CUPTI")
        env["LD_LIBRARY_PATH"] = str(sanitized["cupti"])
    stress(sanitized, tmp_path, name, seed=3, ops=2000, env=env)


@pytest.mark.parametrize("extra", [[], ["-DTRANSIT_TESTING", "-DTRANSIT_NO_CUPTI", "-O0"]])
def test_every_c_file_builds_clean_with_werror(tmp_path, extra):
    """The shim (as the package builds it, and the test build without CUPTI at -O0), the fake
    runtime, the fake CUPTI and the test program: no warning under -Wall -Wextra."""
    shim, warnings = shimbuild.build(tmp_path / "lib", extra_cflags=["-Werror", *extra])
    assert shim, warnings
    build_fakes(tmp_path, extra)
    build_fake_cupti(tmp_path / "cupti", extra)
