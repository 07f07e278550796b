"""The lint CI runs: ruff with ruff.toml (pyflakes' errors, syntax errors, bugbear's likely
bugs, pylint's errors) over the package, the tests and bench/, as the sdist carries them."""

import shutil
import subprocess

import pytest

from tests.conftest import ROOT


def _ruff():
    """ruff's command: the module of the test extra's wheel, else one on PATH."""
    try:
        from ruff.__main__ import find_ruff_bin
        return [find_ruff_bin()]
    except ImportError:
        exe = shutil.which("ruff")
        return [exe] if exe else None


def test_the_tree_is_clean_under_ruff():
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (pip install '.[test]' has it)")
    assert (ROOT / "ruff.toml").is_file(), "ruff.toml travels with the sources (MANIFEST.in)"
    res = subprocess.run([*ruff, "check", "--no-cache", "--output-format", "concise", "--config",
                          str(ROOT / "ruff.toml"), *(str(ROOT / d) for d in ("transit_launch", "tests", "bench"))],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-1000:]
