"""What a user installs: the wheel carries every part (run under .ci/test, which installs
the wheel built from the sdist into a fresh venv), and its CLI runs the commands the
README promises from outside any source tree."""

import os
import shutil
import stat
import subprocess
import sys
from importlib import metadata, resources
from pathlib import Path

import pytest

import transit_launch
from tests.conftest import CUDA_INC, ROOT, TORCH_ENV, run_cli, spank_include

INSTALLED = os.environ.get("TRANSIT_TEST_INSTALLED") == "1"
needs_wheel = pytest.mark.skipif(not INSTALLED, reason="checks the installed wheel: run through .ci/test")
PKG = Path(transit_launch.__file__).resolve().parent


@needs_wheel
def test_imported_from_the_wheel_not_the_tree():
    assert ROOT not in PKG.parents
    assert "site-packages" in PKG.parts


@needs_wheel
@pytest.mark.parametrize("part", [
    "sim/run.py", "sim/trace.py", "preload/inject.py", "preload/build.py", "planning/cards/llama3-70b.toml", "slurm/templates/sbatch.j2",
    "slurm/templates/local.j2", "adapter/sitecustomize.py", "adapter/transit_api.py",
    *(f"adapter/{m}.py" for m in ("transit_step", "transit_staging", "transit_streamed",
                                   "transit_state_pool", "transit_sparse", "transit_host", "transit_split", "transit_rules")),
    "_csrc/spank/plugin.c", "_csrc/spank/transit_spank.map", "_csrc/shim/transit.h", "_csrc/shim/transit_size.h",
    "_csrc/shim/transit_rules.h", "_csrc/shim/exports.map",
    "examples/train_llama.py", "examples/model-card.toml",  # the README's run example runs from the wheel
])
def test_wheel_carries(part):
    assert (PKG / part).is_file()


@needs_wheel
def test_wheel_tag_matches_what_it_carries():
    tags = [l.split(": ", 1)[1] for l in metadata.distribution("transit-launch").read_text("WHEEL").splitlines()
            if l.startswith("Tag: ")]
    shim = PKG / "preload" / "lib" / "libtransit.so"
    if CUDA_INC is None:
        pytest.skip("no CUDA headers here: the wheel carries no shim")
    assert shim.is_file()
    assert tags and all(not t.endswith("-any") for t in tags), tags


def test_version():
    rc, out, _ = run_cli("--version")
    assert rc == 0 and out.strip() == f"transit-launch {metadata.version('transit-launch') if INSTALLED else transit_launch.__version__}"


@pytest.mark.parametrize("args,needle", [
    (["plan", "--model", "llama3-70b"], "Recommended: 3 nodes"),
    (["simulate", "--synthetic", "300", "--racks", "4", "--quiet"], "baseline"),
    (["render", "--model", "llama3-8b", "--", "python", "train.py"], "#SBATCH --nodes="),
    (["doctor"], "shim"),
])
def test_commands_run(args, needle):
    rc, out, err = run_cli(*args, timeout=120)
    assert rc == 0, err
    assert needle in out


@pytest.mark.skipif(not shutil.which("cc"), reason="needs a C compiler")
def test_spank_build_and_install(tmp_path):
    if spank_include() is None:
        pytest.skip("needs Slurm's spank.h (apt install libslurm-dev)")
    rc, out, err = run_cli("spank", "build", "--out", str(tmp_path / "b"))
    assert rc == 0, err
    assert (tmp_path / "b" / "transit_spank.so").is_file()
    from transit_launch.preload import inject
    if inject.shim_path() is None:
        pytest.skip("spank install needs libtransit.so: the package build makes it where CUDA headers exist")
    rc, out, err = run_cli("spank", "install", "--prefix", str(tmp_path / "p"), "--plugstack-dir",
                           str(tmp_path / "conf"))
    assert rc == 0, err
    conf = (tmp_path / "conf" / "transit.conf").read_text()
    assert "required " in conf and "transit_spank.so" in conf
    plugin = tmp_path / "p" / "lib" / "slurm" / "transit_spank.so"
    assert plugin.is_file() and not plugin.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def test_sources_found():
    from transit_launch import csrc
    assert (csrc.shim() / "transit.h").is_file() and (csrc.spank() / "plugin.c").is_file()
    assert resources.files("transit_launch.planning.cards").joinpath("llama3-70b.toml").is_file()


def test_the_suite_collects_without_torch(tmp_path):
    """The README's test command on a machine without PyTorch (issue 28: a module called
    torch at import, so collection stopped before its skip could apply). Here a torch that
    fails to import shadows the real one, for the collection and every process it starts
    (the modules' skip conditions ask a subprocess)."""
    fake = tmp_path / "hide" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch' (hidden by the test)\", "
                                      "name='torch')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(fake.parent), os.environ.get("PYTHONPATH")])))
    env.pop(TORCH_ENV, None)  # this process's answer (conftest) is not the hidden torch's
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "--import-mode=append", "--rootdir", str(ROOT), "--basetemp", str(tmp_path / "bt"),
                          str(ROOT / "tests"), str(ROOT / "bench" / "tests")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    last = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
    assert res.returncode == 0 and "collected" in last and "error" not in last, res.stdout[-3000:] + res.stderr[-2000:]
    assert "test_adapter_step.py::test_a_retired_mode_says_one_line_and_the_default_runs" in res.stdout
    assert "bench/tests/test_harness.py::" in res.stdout
    # a run that only collects begins nothing early (conftest's EARLY: the Slurm replay, a minute,
    # whose file would be in the run's directory once it had begun and been waited for)
    assert not list((tmp_path / "bt").glob("sim-slurm-replay*"))
    check = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert check.returncode != 0 and "hidden by the test" in check.stderr  # the hiding works
