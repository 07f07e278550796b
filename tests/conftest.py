import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"


def run_cli(*args, env=None, timeout=60):
    """Run the real CLI in a subprocess: exit code, stdout, stderr as a user sees them."""
    full_env = dict(os.environ)
    for k, v in (env or {}).items():  # a value of None removes the variable
        if v is None:
            full_env.pop(k, None)
        else:
            full_env[k] = v
    res = subprocess.run([sys.executable, "-m", "transit_launch", *args], capture_output=True, text=True,
                         env=full_env, timeout=timeout, cwd=ROOT)
    return res.returncode, res.stdout, res.stderr


def check_golden(name: str, text: str) -> None:
    """Compare with tests/golden/NAME; TRANSIT_UPDATE_GOLDEN=1 rewrites the file."""
    path = GOLDEN / name
    if os.environ.get("TRANSIT_UPDATE_GOLDEN") == "1":
        path.write_text(text)
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
