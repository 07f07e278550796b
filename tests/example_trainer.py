"""The example trainer (examples/train_llama.py) as the tests and the bench see it: its
defaults, its flags as the planner's model card and layout, its JSON lines, and its command
under `transit-launch run`. Shared by tests/ and bench/ (bench/common.py takes them from
here), so that tests need nothing from bench/."""

import json
import os
import sys
from pathlib import Path

from transit_launch.rules import format_size
from transit_launch.preload.inject import MULTICAST_OFF

ROOT = Path(__file__).resolve().parent.parent  # the checkout, or the unpacked sdist
TRAINER = [sys.executable, str(ROOT / "examples" / "train_llama.py")]
# examples/train_llama.py's defaults: its 1.0 B-parameter model
TRAINER_DEFAULTS = {"dim": 2048, "layers": 16, "heads": 16, "kv-heads": 4, "ffn": 7168, "vocab": 32000,
                    "seq-len": 2048, "batch": 2}


def env(**extra) -> dict:
    """The environment of every GPU run: NVLink multicast off, unbuffered output."""
    return dict(os.environ, **MULTICAST_OFF, PYTHONUNBUFFERED="1", **extra)


def transit(policy: str, cmd: list, stats: str | None = None, budget: int | None = None) -> list:
    """cmd under `transit-launch run --policy POLICY [--stats DIR] [--gpu-budget SIZE]` (budget
    in bytes, passed with its unit: a bare number is not a size)."""
    return [sys.executable, "-m", "transit_launch", "run", "--policy", policy, *(["--stats", stats] if stats else []),
            *(["--gpu-budget", format_size(budget)] if budget else []), "--", *cmd]


def trainer_records(stdout: str) -> tuple[list[dict], dict | None]:
    """The trainer's per-step records and its summary (None when it did not finish)."""
    recs = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return [r for r in recs if "step" in r], next((r["summary"] for r in recs if "summary" in r), None)


def trainer_flags(spec: str) -> dict:
    """The model and batch of a trainer flag string, over the trainer's defaults."""
    d, toks = dict(TRAINER_DEFAULTS, recompute="full"), spec.split()
    for i, tok in enumerate(toks):
        if tok == "--no-recompute":
            d["recompute"] = "none"
        elif tok.startswith("--") and i + 1 < len(toks) and not toks[i + 1].startswith("--"):
            d[tok[2:]] = int(toks[i + 1]) if toks[i + 1].isdigit() else toks[i + 1]
    return d


def trainer_card(f: dict):
    """The planner's model card of the trainer's model (untied embeddings)."""
    from transit_launch.planning.models import _card_from_dict
    return _card_from_dict({"name": "trainer", "arch": {
        "hidden": f["dim"], "layers": f["layers"], "heads": f["heads"], "kv_heads": f["kv-heads"],
        "head_dim": f["dim"] // f["heads"], "ffn": f["ffn"], "vocab": f["vocab"], "tied_embeddings": False}},
        "trainer flags")


def trainer_layout(spec: str, dp: int = 1):
    """(model card, planner layout) of a trainer flag string on dp GPUs (FSDP over dp)."""
    from transit_launch.planning import memory
    f = trainer_flags(spec)
    return trainer_card(f), memory.Layout(dp=dp, local_batch=f["batch"], seq_len=f["seq-len"],
                                          recompute=f["recompute"])


def planner_estimate(spec: str):
    """The planner's estimate of a trainer flag string on one GPU, and its allocator part
    (the total less the CUDA context and NCCL, which PyTorch's allocator does not reserve)."""
    from transit_launch.planning import memory
    est = memory.estimate(*trainer_layout(spec))
    return est, est.total - memory.CUDA_CONTEXT_BYTES - est.comm
