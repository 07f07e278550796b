"""advise's default step (the streamed step, the adapter's transit_streamed.py) under FSDP2 on
two CPU ranks (gloo, started by PyTorch's own launcher, torch.distributed.run):
examples/train_llama.py unchanged, with gradient accumulation; each rank installs the
adapter's optimizer hooks as sitecustomize does under the launcher. Rank 0's losses must
equal the run without the adapter bit for bit, and the step must have streamed on both
ranks (a world-size-1 test cannot see a rank whose shard's update diverges: here the shards
differ and the reduce-scatter mixes them)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import NEEDS_TORCH, NO_TORCH, ROOT
from transit_launch.preload import inject

# one worker takes both tests, so that the run without the adapter is made once (normal_losses)
pytestmark = [pytest.mark.skipif(NO_TORCH, reason=NEEDS_TORCH), pytest.mark.xdist_group("fsdp2-ranks")]

# One rank of the job: the adapter's hooks on a stand-in for the shim's API (no shim on a
# CPU machine: the API's calls are answered as a shim without staging answers them),
# then the trainer as `python train_llama.py` would run it.
RANK = r"""
import importlib.util, json, os, runpy, sys
mode, adapter, standin, trainer, out, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:]
hooks = None
if mode == "default":
    sys.path.insert(0, os.path.dirname(standin))
    hooks = __import__("adapter_standin").install(adapter, mode)
sys.argv = [trainer, *args]
try:
    runpy.run_path(trainer, run_name="__main__")
except SystemExit as e:
    assert e.code in (0, None), e.code
streamed = getattr(hooks.overlap, "streamed", 0) if hooks and hooks.overlap else 0
with open(os.path.join(out, f"{mode}-{os.environ['RANK']}.json"), "w") as f:
    json.dump({"streamed": streamed, "world": int(os.environ["WORLD_SIZE"])}, f)
"""

ARGS = ["--device", "cpu", "--dp", "fsdp", "--dim", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2",
        "--ffn", "128", "--vocab", "256", "--seq-len", "16", "--batch", "2", "--accum", "2", "--steps", "6"]


_NORMAL: list = []  # the run without the adapter, once a worker


def normal_losses(tmp_path):
    if not _NORMAL:
        steps, _, _ = job(tmp_path, "normal")
        _NORMAL.append([st["loss"] for st in steps])
    return _NORMAL[0]


def job(tmp_path, mode):
    driver = tmp_path / "rank.py"
    driver.write_text(RANK)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(driver), mode,
           str(inject.adapter_dir()), str(Path(__file__).with_name("adapter_standin.py")),
           str(ROOT / "examples" / "train_llama.py"), str(tmp_path), *ARGS]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    steps = [json.loads(line) for line in res.stdout.splitlines() if line.startswith('{"step"')]
    ranks = [json.loads((tmp_path / f"{mode}-{r}.json").read_text()) for r in (0, 1)]
    return steps, ranks, res.stderr


def test_the_default_streamed_step_is_bit_identical_on_two_fsdp2_ranks(tmp_path):
    """advise's default (TRANSIT_OVERLAP_STEP unset: the streamed step, transit_streamed.py) on
    two ranks: every sharded parameter streamed at each of the 6 steps (the first from
    zeros in the ring, its state made unfilled), each rank its own shard, losses bit for bit."""
    got, ranks, err = job(tmp_path, "default")
    assert [s["loss"] for s in got] == normal_losses(tmp_path)
    assert [r["world"] for r in ranks] == [2, 2]
    assert [r["streamed"] for r in ranks] == [6 * 21, 6 * 21], (ranks, err[-2000:])
