import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import shutil
import tempfile

import pytest

import transit_launch
from transit_launch import csrc
from transit_launch.shim import build as shimbuild

ROOT = Path(__file__).resolve().parent.parent  # the checkout, or the unpacked sdist under .ci/test
# .ci/test runs the suite against the wheel installed in a fresh venv: a transit_launch
# imported from the source tree would test what users do not get.
if os.environ.get("TRANSIT_TEST_INSTALLED") == "1" and ROOT in Path(transit_launch.__file__).resolve().parents:
    raise pytest.UsageError(f"transit_launch was imported from the source tree ({transit_launch.__file__}), "
                            "not from the installed wheel")
if ROOT in Path(transit_launch.__file__).resolve().parents:  # a run on the checkout: subprocesses import it too
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
GOLDEN = Path(__file__).resolve().parent / "golden"
NEEDS_TORCH = "needs PyTorch (CPU build) for the example trainer: .ci/run installs it"


@functools.cache
def torch_importable() -> bool:
    """Whether this Python imports PyTorch: checked once, in a subprocess (importing it here
    would slow every test that does not need it)."""
    return subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0


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


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """The fake libcudart, the test program linked against it, and libtransit.so built from
    shim/ the way the package build does (plus -DTRANSIT_TESTING hooks)."""
    if CUDA_INC is None or not shutil.which("cc"):
        pytest.skip("needs a C compiler and the CUDA runtime headers (cuda_runtime_api.h)")
    d = tmp_path_factory.mktemp("fakecuda")
    os.chmod(d, 0o755)  # also used from Slurm job steps
    cc = ["cc", "-std=c11", "-O1", "-Wall", "-Wextra", f"-I{CUDA_INC}"]
    subprocess.run([*cc, "-fPIC", "-shared", "-Wl,-soname,libcudart.so.13", "-o", str(d / "libcudart.so.13"),
                    str(FAKECUDA / "fake_cudart.c"), "-lpthread"], check=True)
    (d / "libcudart.so").symlink_to("libcudart.so.13")
    subprocess.run([*cc, "-o", str(d / "app"), str(FAKECUDA / "app.c"), f"-L{d}", "-lcudart", f"-Wl,-rpath,{d}",
                    "-lpthread", "-ldl"], check=True)
    shim, warnings = shimbuild.build(d / "lib", extra_cflags=["-DTRANSIT_TESTING"])
    assert shim, warnings
    return {"dir": d, "app": d / "app", "shim": shim, "warnings": warnings}


@pytest.fixture(scope="session")
def lab(built):
    """A real Slurm cluster (tests/slurm_lab.py) whose plugstack loads the SPANK plugin
    built from spank/, pointing at the test build of libtransit.so and the adapter."""
    from tests.slurm_lab import SlurmLab, missing
    from transit_launch.shim import inject
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
