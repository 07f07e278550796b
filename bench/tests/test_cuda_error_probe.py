"""bench/probes/cuda_error_probe.c (the CUDA runtime's answers on a GPU, which back the fake
runtime's: tests/test_fake_residency.py reads its records)."""

import shutil
import subprocess

import pytest

from tests.conftest import CUDA_INC, ROOT


@pytest.mark.skipif(CUDA_INC is None or not shutil.which("cc"),
                    reason="needs a C compiler and the CUDA runtime headers (cuda_runtime_api.h)")
def test_the_probe_builds_against_the_shims_cuda_headers(tmp_path):
    """The probe, which runs only on a GPU machine, compiles warning-free against the headers the
    shim's build finds."""
    subprocess.run(["cc", "-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{CUDA_INC}", "-c",
                    str(ROOT / "bench" / "probes" / "cuda_error_probe.c"), "-o", str(tmp_path / "probe.o")], check=True)
