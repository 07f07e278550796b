import fcntl
import functools
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import shutil
import tempfile

import pytest

import transit_launch
from transit_launch import csrc
from transit_launch.preload import build as shimbuild

ROOT = Path(__file__).resolve().parent.parent  # the checkout, or the unpacked sdist under .ci/test
# .ci/test runs the suite against the wheel installed in a fresh venv: a transit_launch
# imported from the source tree would test what users do not get.
if os.environ.get("TRANSIT_TEST_INSTALLED") == "1" and ROOT in Path(transit_launch.__file__).resolve().parents:
    raise pytest.UsageError(f"transit_launch was imported from the source tree ({transit_launch.__file__}), "
                            "not from the installed wheel")
if ROOT in Path(transit_launch.__file__).resolve().parents:  # a run on the checkout: subprocesses import it too
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
# The adapter's modules import each other flat (`import transit_rules`), as in the job, whose
# PYTHONPATH has the adapter's directory first: the tests import them the same way.
ADAPTER = Path(transit_launch.__file__).resolve().parent / "adapter"
if str(ADAPTER) not in sys.path:
    sys.path.insert(0, str(ADAPTER))
# the CLI reads the site's and the user's config.toml (transit_launch/config.py): the suite's
# commands run without either, whatever this machine has (tests/test_config.py sets its own)
os.environ["TRANSIT_LAUNCH_SITE_CONFIG"] = os.devnull
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="transit-test-xdg-")
# One OpenMP (PyTorch intra-op) thread in the workers and the processes they start, where the
# caller set none: each worker's PyTorch otherwise runs a thread a core, and on the 2-core CI
# machine the two workers' spinning threads took the CPU from each other (issue 52: the adapter's
# four in-process test files took 105 s of CPU instead of 22 at -n 2; the trainer's tests set it
# for their ranks already). Tests of the adapter's thread rules set the counts they need.
os.environ.setdefault("OMP_NUM_THREADS", "1")
GOLDEN = Path(__file__).resolve().parent / "golden"
NEEDS_TORCH = "needs PyTorch (CPU build) for the example trainer: .ci/run installs it"


TORCH_ENV = "TRANSIT_TEST_TORCH"  # _torch's answer, inherited by nested runs (tests/test_mutations.py)


@functools.cache
def _torch() -> tuple[bool, bool]:
    """(this Python imports PyTorch, and it sees a CUDA GPU): asked once a process, in a
    subprocess (importing it here would slow every test that does not need it; the import
    takes 1.6 s of CPU), and not again in the test runs it starts with this Python
    (TORCH_ENV, which a process that hides PyTorch must drop: tests/test_package.py)."""
    known = os.environ.get(TORCH_ENV, "").split(":", 2)
    if known[2:] == [sys.executable]:
        return known[0] == "1", known[1] == "1"
    res = subprocess.run([sys.executable, "-c", "import torch; print(int(torch.cuda.is_available()))"],
                         capture_output=True, text=True)
    answer = res.returncode == 0, res.returncode == 0 and res.stdout.strip() == "1"
    os.environ[TORCH_ENV] = f"{int(answer[0])}:{int(answer[1])}:{sys.executable}"
    return answer


def torch_importable() -> bool:
    """Whether this Python imports PyTorch (_torch)."""
    return _torch()[0]


def torch_sees_a_gpu() -> bool:
    """Whether this Python imports PyTorch and torch.cuda.is_available() (_torch)."""
    return _torch()[1]


class _Torchless:
    """skipif's condition NO_TORCH: true where PyTorch does not import, asked when a test that
    carries it is about to run, not when its module is collected (the quick tier, which
    deselects those tests, then never pays for the check)."""

    def __bool__(self) -> bool:
        return not torch_importable()


NO_TORCH = _Torchless()


def run_cli(*args, env=None, timeout=60):
    """Run the real CLI in a subprocess: exit code, stdout, stderr as a user sees them."""
    full_env = dict(os.environ)
    for k, v in (env or {}).items():  # a value of None removes the variable
        if v is None:
            full_env.pop(k, None)
        else:
            full_env[k] = v
    res = subprocess.run([sys.executable, "-m", "transit_launch", *args], capture_output=True, text=True,
                         env=full_env, timeout=timeout, cwd=tempfile.gettempdir())
    return res.returncode, res.stdout, res.stderr


def check_golden(name: str, text: str) -> None:
    """Compare with tests/golden/NAME. TRANSIT_UPDATE_GOLDEN=1 rewrites the file and fails the
    test: the new golden counts only once its diff was reviewed and the suite runs without
    the switch (a rewrite that passed would compare the output with itself)."""
    path = GOLDEN / name
    if os.environ.get("TRANSIT_UPDATE_GOLDEN") == "1":
        path.write_text(text)
        pytest.fail(f"rewrote {path}: review `git diff {path.name}`, then run again without TRANSIT_UPDATE_GOLDEN")
    assert path.exists(), f"missing golden file {path} (run with TRANSIT_UPDATE_GOLDEN=1 once)"
    assert text == path.read_text()


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def write_json(tmp_path):
    def write(obj, name="config.json"):
        d = tmp_path / name.replace(".json", "")
        d.mkdir(exist_ok=True)
        p = d / "config.json"
        p.write_text(json.dumps(obj) if not isinstance(obj, str) else obj)
        return p
    return write


FAKECUDA = Path(__file__).resolve().parent / "fakecuda"
CUDA_INC = shimbuild.find_header("cuda_runtime_api.h")
C_SOURCES = csrc.root()  # shim/ and spank/: the installed package's copy under .ci/test


def have_cc() -> bool:
    return shutil.which("cc") is not None


def spank_include():
    from transit_launch.slurm import spank
    return spank.locate_spank_h()


# --- builds made once a run -------------------------------------------------------------

SHARED_ENV = "TRANSIT_TEST_SHARED"  # nested runs (tests/test_mutations.py) inherit the directory


def shared_root(tmp_path_factory) -> Path:
    """A directory every xdist worker of this run sees (the run's base temp), handed to
    nested runs through SHARED_ENV."""
    if os.environ.get(SHARED_ENV):
        root = Path(os.environ[SHARED_ENV])
    else:
        base = tmp_path_factory.getbasetemp()
        root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
        os.environ[SHARED_ENV] = str(root)
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    return root


def build_once(tmp_path_factory, name: str, inputs, flags, make) -> Path:
    """The directory `make(dir)` filled, made once for this run and its nested runs whatever
    the number of workers: keyed by the bytes of `inputs` (files, or directories' files)
    and `flags`, made under a file lock (the other workers wait and take it)."""
    h = hashlib.sha256()
    for part in (name, *map(str, flags), shutil.which("cc") or "", str(CUDA_INC)):
        h.update(part.encode() + b"\0")
    for top in map(Path, inputs):
        for f in sorted(top.rglob("*")) if top.is_dir() else [top]:
            if f.is_file() and "__pycache__" not in f.parts:
                h.update(str(f.relative_to(top)).encode() + b"\0" + f.read_bytes() + b"\0")
    root = shared_root(tmp_path_factory)
    d = root / f"{name}-{h.hexdigest()[:16]}"
    with open(root / f"{d.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (d / ".made").exists():
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(mode=0o755)
            os.chmod(d, 0o755)  # also used from Slurm job steps
            make(d)
            (d / ".made").touch()
    return d


FAKE_CFLAGS = ["-O1", "-Wall", "-Wextra"]


def build_fakes(d: Path, flags=FAKE_CFLAGS) -> None:
    """The fake libcudart and the test program linked against it, into d."""
    cc = ["cc", "-std=c11", *flags, f"-I{CUDA_INC}"]
    for args in (["-fPIC", "-shared", "-Wl,-soname,libcudart.so.13", "-o", str(d / "libcudart.so.13"),
                  str(FAKECUDA / "fake_cudart.c"), "-lpthread"],
                 ["-o", str(d / "app"), str(FAKECUDA / "app.c"), f"-L{d}", "-lcudart", f"-Wl,-rpath,{d}",
                  "-lpthread", "-ldl"]):
        if args[0] == "-o" and not (d / "libcudart.so").exists():
            (d / "libcudart.so").symlink_to("libcudart.so.13")
        res = subprocess.run([*cc, *args], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr


CACHED_CC_ENV = "TRANSIT_TEST_CACHED_CC"  # set by tests/test_mutations.py for its nested runs


def build_shim(d: Path, flags) -> None:
    """libtransit.so into d, its compiler's warnings in d/warnings.txt. In the mutants' nested
    runs (CACHED_CC_ENV) through tests/cached_cc.py: each file's object kept for the run in the
    shared directory, so that a mutant compiles only the file it changed."""
    cc = None
    if os.environ.get(CACHED_CC_ENV) and os.environ.get(SHARED_ENV) and shutil.which("cc"):
        root = Path(os.environ[SHARED_ENV])
        cc = root / f"cached-cc-{os.getpid()}"
        argv = [sys.executable, str(Path(__file__).with_name("cached_cc.py")), str(root / "shim-objects"), shutil.which("cc")]
        cc.write_text(f"#!/bin/sh\nexec {shlex.join(argv)} \"$@\"\n")
        cc.chmod(0o755)
    shim, warnings = shimbuild.build(d, cc=str(cc) if cc else None, extra_cflags=list(flags))
    assert shim, warnings
    (d / "warnings.txt").write_text(warnings)


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """The fake libcudart, the test program linked against it, and libtransit.so built from
    shim/ the way the package build does (plus -DTRANSIT_TESTING hooks): once a run."""
    if CUDA_INC is None or not shutil.which("cc"):
        pytest.skip("needs a C compiler and the CUDA runtime headers (cuda_runtime_api.h)")
    d = build_once(tmp_path_factory, "fakecuda", [FAKECUDA], FAKE_CFLAGS, build_fakes)
    flags = ["-DTRANSIT_TESTING"]
    lib = build_once(tmp_path_factory, "shim", [shimbuild.SRC], flags, lambda out: build_shim(out, flags))
    return {"dir": d, "app": d / "app", "shim": lib / "libtransit.so", "warnings": (lib / "warnings.txt").read_text()}


@pytest.fixture(scope="session")
def lab(built):
    """A real Slurm cluster (tests/slurm_lab.py) whose plugstack loads the SPANK plugin
    built from spank/, pointing at the test build of libtransit.so and the adapter."""
    from tests.slurm_lab import SlurmLab, missing
    from transit_launch.preload import inject
    from transit_launch.slurm import spank
    why = missing()
    if why:
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="transit-slurm-"))
    plugin = spank.build(root / "plugin")
    lab = SlurmLab(root, plugstack=spank.plugstack_line(plugin, built["shim"], inject.adapter_dir()))
    try:
        lab.start()
        lab.plugin = plugin
        lab.shim = str(built["shim"])
        yield lab
    finally:
        lab.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def _no_process_group_left():
    """A torch.distributed process group a module's tests left up (plan --measure's fake world
    stays up for its next measurement: planning/measure.py) ends with the module, so that the
    next module on the same xdist worker starts in a process without one."""
    yield
    dist = sys.modules.get("torch.distributed")  # never imported here: most modules run without torch
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# --- the run: interrupted cleanly, spread over xdist workers, in two tiers -------------------

def _terminated(signum, frame):
    """SIGTERM (a timeout's, or .ci/test's when it is ended itself) ends the run like Ctrl-C:
    the fixtures' teardown runs, the Slurm lab's stop() included."""
    signal.signal(signum, signal.SIG_DFL)  # a second one ends the process at once
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    try:
        signal.signal(signal.SIGTERM, _terminated)
    except ValueError:  # not the main thread: the run's own SIGTERM handling stays
        pass


# --- long waits begun early -------------------------------------------------------------------
# A test module may set EARLY = (fixture name, start): start(run_dir) begins a long wait on a
# thread (test_sim_slurm.py's replay: a minute of Slurm's clock, little CPU) and returns a
# join(interrupted). One process of the run (xdist's gw0, else the run itself) calls it once
# collection shows a selected test using that fixture, so the wait overlaps the other tests
# instead of holding a worker; the fixture, on whichever worker, reads what it left in run_dir.
# Workers take the tests using it last (pytest_collection_modifyitems), when it has ended.
_EARLY_JOINS = []


def run_dir(config) -> Path:
    """A directory every process of this run shares (xdist's workers' basetemps are in it)."""
    base = config._tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _reads_early(item) -> bool:
    early = getattr(getattr(item, "module", None), "EARLY", None)
    return bool(early) and early[0] in getattr(item, "fixturenames", ())


def pytest_collection_finish(session):
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0" or session.config.option.collectonly:
        return  # another worker's, or a run that only collects (test_package's: it waited a minute for the replay)
    for mod in dict.fromkeys(item.module for item in session.items if _reads_early(item)):
        _EARLY_JOINS.append(mod.EARLY[1](run_dir(session.config)))


def pytest_sessionfinish(session, exitstatus):
    """What began early ends before this process does: waited for, or stopped when the run was
    interrupted (its lab stopped either way)."""
    while _EARLY_JOINS:
        _EARLY_JOINS.pop()(interrupted=exitstatus == pytest.ExitCode.INTERRUPTED)


LAB_GROUP = "slurm-lab"  # one xdist worker runs every test of the lab: one lab a run
TITAN_GROUP = "torchtitan"  # the TorchTitan tests off the lab on one worker: their fork server started once
# The slow tier (deselected by the quick command, `-m "not slow"`): what starts the Slurm lab,
# needs PyTorch (its skip says so) or the TorchTitan venv, network namespaces, sanitizer or
# fuzz builds, nested test runs, and the tests that each take seconds of CPU (plans of the
# large models, the simulations behind the docs' figures).
SLOW_FIXTURES = {"lab", "titan", "sanitized", "pair"}
SLOW_MODULES = {"test_mutations.py", "test_shim_sanitizers.py", "test_node_loss.py", "test_trainer.py",
                "test_example_trainer_shapes.py", "test_adapter_fsdp2_ranks.py", "test_sweep.py", "test_scale_in.py",
                "test_lab_teardown.py", "test_doc_figures.py", "test_plan_rows.py", "test_measure.py"}
SLOW_TESTS = {"test_fuzz_parsers_seeded_under_asan_ubsan", "test_fuzz_parsers_with_libfuzzer",
              "test_the_suite_collects_without_torch",
              "test_children_forked_while_the_fill_runs_never_wait_on_its_lock",
              "test_submit_does_not_warn_about_the_count_it_recommends",
              "test_example_trainer_fsdp2_cpu_under_the_adapter",
              "test_recorder_marks_every_layer_forward_backward_and_the_optimizer",
              # 1.5-2.5 s of CPU each on the 2-core machine (the quick tier's top, measured): a plan
              # that searches every layout, a thread stress, builds of a variant shim or the plugin
              "test_model_that_never_fits", "test_guard_holds_at_every_instant_under_threads",
              "test_a_bench_builds_rest_between_registrations_keeps_every_region_ready",
              "test_the_end_cuts_a_rest_short_and_the_rest_holds_no_lock", "test_spank_build_and_install",
              # 3-10 s each in a quick-tier run beside other work (issue 52: the quick tier's top, measured;
              # together about a third of its CPU): plans and renders of the largest models and node
              # counts, simulations and their plots, PNGs drawn, a probe's or a sweep's subprocesses
              "test_the_host_memory_bound_and_a_count_above_the_minimum",
              "test_plan_render_and_submit_pick_one_node_count_whatever_scale_in_shows",
              "test_plan_plot_writes_png_of_the_json_data", "test_run_exits_128_plus_the_signal_that_killed_the_command",
              "test_cli_table_and_json", "test_plot_written", "test_changes_carry_absolutes_and_seed_spread",
              "test_reduced_cluster_rows_name_and_use_their_reference", "test_cli_preset_and_bad_combinations",
              "test_preset_matches_its_trace", "test_restore_kills_only_the_recorded_group",
              "test_a_journal_from_another_host_is_left_for_that_host", "test_bad_files_are_one_line_naming_the_file",
              "test_without_a_gpu_one_line", "test_plan_png_is_drawn_from_todays_plan", "test_bad_input_is_one_line",
              "test_one_budget_the_plan_assumes_and_the_job_gets", "test_the_tests_read_frozen_fixtures_not_bench",
              "test_build_out_writes_through_no_planted_link"}
# parametrized cases of quick tests that are slow alone: the README's 20,000-job simulation (5 s of CPU),
# simulate.md's 5,000-job one and the bad-input row that plans llama4-scout's every fsdp+ep layout (7-9 s each)
SLOW_CASES = ("simulate --synthetic 20000", "simulate --synthetic 5000",
              "plan --model llama4-scout --parallel fsdp+ep --local-batch 4")


@pytest.hookimpl(tryfirst=True)  # before -m deselects and xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if "lab" in names:
            item.add_marker(pytest.mark.xdist_group(LAB_GROUP))
        elif "titan" in names:
            item.add_marker(pytest.mark.xdist_group(TITAN_GROUP))
        name = getattr(item, "originalname", item.name)
        torch = any("needs PyTorch" in str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif"))
        if torch or names & SLOW_FIXTURES or item.path.name in SLOW_MODULES or name in SLOW_TESTS \
                or any(case in item.name for case in SLOW_CASES):
            item.add_marker(pytest.mark.slow)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # workers take tests in this order: the long ones first,
        # and last the tests that read what began early (taken first, they would wait for it)
        items.sort(key=lambda item: (_reads_early(item), item.get_closest_marker("slow") is None))
