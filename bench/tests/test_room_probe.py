"""bench/probes/room_probe.py (run by hand on a GPU): a missing --out or point, an unknown
point gets one line and exit 2, nothing written."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "bench" / "probes" / "room_probe.py"


def run(*args, cwd):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize("args,line", [((), "room_probe: --out FILE and at least one point are needed"),
                                       (("clip",), "room_probe: --out FILE and at least one point are needed"),
                                       (("--out", "r.json", "clip", "nope"),
                                        "room_probe: unknown point 'nope' (one of base, clip, clip-accum4, wide-clip)")])
def test_bad_arguments_one_line(tmp_path, args, line):
    res = run(*args, cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.strip() == line, res.stderr
    assert not (tmp_path / "r.json").exists()
