"""A small mutation check: each entry breaks one rule the product's safety or numbers rest on
(in a copy of the installed package), runs the tests that guard that rule against the
copy, and expects those very tests to fail. A control run of the unbroken copy on the same
tests must pass, so a failure means the breakage was caught, not that the copy is broken.

The breakages: the planner's optimizer-state term, the plugin's policy check, the tc
restore, the shim's guard against more managed memory than the GPU has free, its budget
when an allocation is placed and while a freed one is still the runtime's, the
installer's trust rule, the stats writer's rule for links on the way, advise's access probe
kept off where the state is pinned, placement's cut of a region at the budget's line, and the
background pre-fill's cap on host memory, its keeping above the regions taken and its device;
the size parser's refusal of sizes past 2^64 bytes (issue 52: 17179869185GiB read as 1 GiB) and
the simulator's checkpoint of a run that began with a restart (a job's second failure); the
host-state keep rule's device peak (activations freed before the state is made).""" 

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import transit_launch
from tests.conftest import CACHED_CC_ENV, SHARED_ENV, build_once, shared_root, torch_importable

TESTS = Path(__file__).resolve().parent
PKG = Path(transit_launch.__file__).resolve().parent
# one xdist worker runs the mutants: spread over workers, each worker's first mutant waited
# idle for the control run another worker was making (issue 52: 14-22 s of a worker each run)
pytestmark = pytest.mark.xdist_group("mutations")

# (id, file in the package, text, replacement, tests that must catch it)
MUTANTS = [
    ("planner-optimizer-term", "planning/memory.py", "params, optim = shard * bp, shard * 2 * bp",
     "params, optim = shard * bp, shard * 1 * bp", ["test_memory.py::test_states_mixed_and_bf16"]),
    ("plugin-policy-check", "_csrc/spank/args.c",
     "int tr_policy_allowed(const char *p) { return *p && in_list(p, tr_site.allowed); }",
     "int tr_policy_allowed(const char *p) { return *p != 0; }",
     ["test_spank.py::test_check_refuses_what_the_plugin_refuses"]),
    ("tc-restore", "netcap/backends.py",
     'run(iface.wrap(["tc", "qdisc", "del", "dev", iface.name, "root"]), "removing tc tbf")',
     "pass  # mutant: the cap stays", ["test_sweep.py::test_restore_after_a_crash"]),
    ("shim-guard", "_csrc/shim/ledger.c",
     "uint64_t tr_guard_room(void) { return less_buffers(tr_guard_limit()); }",
     "uint64_t tr_guard_room(void) { return UINT64_MAX / 2; }",
     ["test_shim.py::test_guard_refuses_beyond_free_memory"]),
    ("installer-trust-rule", "slurm/trust.py", 'if st.st_uid != 0:\n        return "is not owned by root"',
     "if False:\n        return None", ["test_spank.py::test_installer_walk_agrees_with_the_plugins"]),
    ("shim-budget-at-allocation", "_csrc/shim/place.c", "    if (tr_tab.dev_bytes + a->size <= tr_budget()) {",
     "    if (1) {", ["test_shim.py::test_budget_places_overflow_on_host_zero_copy",
                     "test_shim_stress.py::test_budget_holds_by_the_runtimes_account_on_one_thread"]),
    ("shim-freed-bytes-early", "_csrc/shim/interpose.c",
     "    size_t held = on && devPtr ? untrack(devPtr, &dev) : 0;\n    cudaError_t err = tr_real.free(devPtr);\n    if (held) /* counted by the guard and the budget until the runtime has the memory back */\n        release(held, dev);",
     "    size_t held = on && devPtr ? untrack(devPtr, &dev) : 0;\n    if (held)\n        release(held, dev);\n    cudaError_t err = tr_real.free(devPtr);",
     ["test_shim_stress.py::test_budget_holds_at_every_instant_under_threads"]),
    ("stats-link-rule", "_csrc/shim/stats.c",
     "if (fstat(fd, &ds) ||\n                !(dir_protects(&ds) || ((ds.st_mode & S_ISVTX) && owner_trusted(ds.st_uid) && "
     "owner_trusted(ls.st_uid))))", "if (fstat(fd, &ds))", ["test_root_trust.py::test_root_stats_follow_no_link_another_user_made"]),
    ("advise-probes-over-pinned-state", "_csrc/shim/state.c",
     "tr_count.hint_bytes[TR_COLD_OPT] == 0 && !tr_s.cold_reported;", "tr_count.hint_bytes[TR_COLD_OPT] == 0;",
     ["test_shim_host_state.py::test_hints_on_pinned_state_keep_advise_from_probing_access"]),
    ("placement-whole-regions", "_csrc/shim/place.c", "uint64_t fit = *room & ~(TR_PLACE_GRAIN - 1);",
     "uint64_t fit = 0;", ["test_shim.py::test_master_weights_keep_the_gpu_before_optimizer_states"]),
    ("prefill-host-cap", "_csrc/shim/prefill.c", "        if (len > room - total) /* total <= room */",
     "        if (0)",
     ["test_shim_prefill.py::test_the_pool_takes_at_most_half_the_available_memory_per_rank_its_last_segments"]),
    ("prefill-above-the-taken", "_csrc/shim/prefill.c", "    for (int i = pool.n - 1; i > pool.floor && pick < 0; i--) {",
     "    for (int i = pool.n - 1; i >= 0 && pick < 0; i--) {",
     ["test_shim_prefill.py::test_allocations_before_the_fill_make_their_own_regions_and_the_fill_keeps_above_them"]),
    ("prefill-device", "_csrc/shim/prefill.c", "        tr_real.set_device(pool.device);", "        (void)0;",
     ["test_shim_prefill.py::test_the_fill_registers_on_the_jobs_device"]),
    ("prefill-kept-on-device", "_csrc/shim/prefill.c", "        if (!r->keeps && c->made < c->pinned)\n            pick = i;",
     "        if (c->made < c->pinned || r->keeps)\n            pick = i;",
     ["test_shim_prefill.py::test_the_fill_makes_no_region_the_budget_would_keep_on_the_device"]),
    ("prefill-kept-after-the-state-began", "_csrc/shim/hoststate.c",
     "    uint64_t kept = began ? tr_count.host_state_first_room : state_room();", "    uint64_t kept = state_room();",
     ["test_shim_prefill.py::test_the_fill_makes_nothing_when_the_budget_keeps_all_the_state"]),
    ("prefill-prefix-rule", "_csrc/shim/prefill.c", "        else\n            c->pinned++;",
     "        else\n            c->pinned++, kept = room;",
     ["test_shim_prefill.py::test_the_greedy_rule_holds_only_what_the_budget_keeps"]),
    ("prefill-floor-at-the-region-taken", "_csrc/shim/prefill.c", "            slot = k;\n            break;",
     "            break;",
     ["test_shim_prefill.py::test_a_state_taking_a_later_ready_region_leaves_the_fill_its_earlier_ones"]),
    ("prefill-kept-after-the-first-take", "_csrc/shim/prefill.c", "    *held = 0;\n    pthread_mutex_unlock(&mu);",
     "    *held = 0;\n    if (pool.taken)\n        return last_region(R_FREE);\n    pthread_mutex_unlock(&mu);",
     ["test_shim_prefill.py::test_after_the_first_take_the_fill_still_makes_no_region_the_budget_keeps"]),
    ("prefill-class-count", "_csrc/shim/prefill.c", "        if (!r->keeps && c->made < c->pinned)",
     "        if (!r->keeps)",
     ["test_shim_prefill.py::test_states_that_took_the_kept_states_regions_leave_the_fill_nothing_to_make"]),
    ("prefill-fork", "_csrc/shim/prefill.c", "        pthread_mutex_init(&mu, NULL);", "        (void)0;",
     ["test_shim_prefill.py::test_children_forked_while_the_fill_runs_never_wait_on_its_lock"]),
    ("prefill-written-as-ready", "_csrc/shim/hoststate.c", "    if (ready != TR_PREFILL_READY) {",
     "    if (!ready) {",
     ["test_shim_prefill.py::test_a_region_written_but_not_yet_registered_is_registered_by_its_allocation"]),
    ("size-parser-past-2-64", "_csrc/shim/transit_size.h", "if (whole > TR_SIZE_MAX || whole > TR_SIZE_MAX / mult)",
     "if (whole > TR_SIZE_MAX)", ["test_rules.py::test_sizes_past_2_64_are_too_large_in_c_and_python"]),
    ("sim-second-failure-checkpoint", "sim/failures.py", " - (seg[i] - run_start[i]))", ")",
     ["test_sim_failures.py::test_a_job_that_fails_twice_requeues_twice_by_hand"]),
    ("host-state-room-device-peak", "_csrc/shim/hoststate.c",
     "    uint64_t placed = tr_tab.dev_bytes > peak ? tr_tab.dev_bytes : peak;", "    uint64_t placed = tr_tab.dev_bytes;",
     ["test_shim_host_state.py::test_activations_freed_before_the_state_still_keep_their_room"]),
]


def _copy(tmp_path: Path) -> Path:
    """The installed package copied under an import root, with the C sources inside it as
    a wheel has them (in a checkout they lie beside the package)."""
    root = tmp_path / "site"
    pkg = root / "transit_launch"
    shutil.copytree(PKG, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    if not (pkg / "_csrc").is_dir():
        for d in ("shim", "spank"):
            shutil.copytree(PKG.parent / d, pkg / "_csrc" / d)
    return root


def _run(root: Path, tests: list[str], shared: Path) -> subprocess.CompletedProcess:
    """pytest on the given tests, importing transit_launch from root (the copy); its builds
    come from this run's shared directory (the fakes, and the shim where the copy's C is
    unchanged: tests/conftest.py's build_once)."""
    torch_importable()  # asked once here: the nested runs inherit the answer (conftest's TORCH_ENV)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # not a worker itself
    env.update(PYTHONPATH=str(root), TRANSIT_TEST_INSTALLED="0", PYTHONDONTWRITEBYTECODE="1")
    env[SHARED_ENV] = str(shared)
    env[CACHED_CC_ENV] = "1"  # the shim linked from objects kept across the mutants (tests/cached_cc.py)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # none is needed; hypothesis's alone costs a second a run
    ids = [str(TESTS / t.split("::")[0]) + ("::" + t.split("::")[1] if "::" in t else "") for t in tests]
    # a test id without parameters selects every parametrization of it
    # --import-mode=append: the copy on PYTHONPATH wins over a checkout beside the tests
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfs",
                           "--import-mode=append", "--rootdir", str(TESTS.parent), *ids], capture_output=True,
                          text=True, env=env, timeout=600, cwd=root)


def _skipped_all(res) -> bool:
    return " passed" not in res.stdout and " failed" not in res.stdout and " skipped" in res.stdout


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    """The unbroken copy on every guarding test: green (or, where the machine lacks what a
    test needs, skipped), so the mutants' failures are theirs. Run once a run, whatever the
    xdist workers (tests/conftest.py: build_once)."""
    guards = sorted({t for *_, tests in MUTANTS for t in tests})

    def make(d):
        root = _copy(d)
        where = subprocess.run([sys.executable, "-c", "import transit_launch; print(transit_launch.__file__)"],
                               capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(root)), cwd=root)
        assert where.stdout.strip().startswith(str(root)), where.stdout  # the tests will import the copy
        res = _run(root, guards, shared_root(tmp_path_factory))
        assert res.returncode in (0, 5) and " failed" not in res.stdout, res.stdout[-3000:] + res.stderr[-2000:]
        (d / "stdout").write_text(res.stdout)

    return (build_once(tmp_path_factory, "mutation-control", [PKG, TESTS], guards, make) / "stdout").read_text()


@pytest.mark.parametrize("name,path,old,new,tests", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_the_suite_catches_the_breakage(control, tmp_path_factory, tmp_path, name, path, old, new, tests):
    root = _copy(tmp_path)
    f = root / "transit_launch" / path
    text = f.read_text()
    assert text.count(old) == 1, f"{name}: the code it breaks moved ({path}); update the mutant"
    f.write_text(text.replace(old, new))
    res = _run(root, tests, shared_root(tmp_path_factory))
    if _skipped_all(res):
        # CI (.ci/test) has what every guarding test needs: a breakage no test ran is not caught
        assert os.environ.get("TRANSIT_TEST_INSTALLED") != "1", \
            f"{name}: its guarding tests all skipped under .ci/test: {res.stdout.strip().splitlines()[-1]}"
        pytest.skip(f"the guarding tests skip here: {res.stdout.strip().splitlines()[-1]}")
    failed = [ln for ln in res.stdout.splitlines() if ln.startswith("FAILED")]
    wanted = [t.split("::")[-1] for t in tests]
    assert res.returncode == 1 and any(w in ln for ln in failed for w in wanted), \
        f"{name} was not caught:\n{res.stdout[-3000:]}{res.stderr[-1500:]}"
