"""What the bench scripts share: the environment of every GPU run (NVLink multicast off),
running a command (under `transit-launch run` or not) and reading the example trainer's
JSON lines, and the model card of the trainer's flags for the planner."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # an installed transit_launch wins over the checkout

from transit_launch.rules import format_size  # noqa: E402
from transit_launch.shim.inject import MULTICAST_OFF  # noqa: E402
from transit_launch.netcap.sweep import stop_group  # noqa: E402

TRAINER = [sys.executable, str(ROOT / "examples" / "train_llama.py")]
# examples/train_llama.py's defaults: its 1.0 B-parameter model
TRAINER_DEFAULTS = {"dim": 2048, "layers": 16, "heads": 16, "kv-heads": 4, "ffn": 7168, "vocab": 32000,
                    "seq-len": 2048, "batch": 2}


def env(**extra) -> dict:
    return dict(os.environ, **MULTICAST_OFF, PYTHONUNBUFFERED="1", **extra)


def transit(policy: str, cmd: list, stats: str | None = None, budget: int | None = None) -> list:
    """cmd under `transit-launch run --policy POLICY [--stats DIR] [--gpu-budget SIZE]` (budget
    in bytes, passed with its unit: a bare number is not a size)."""
    return [sys.executable, "-m", "transit_launch", "run", "--policy", policy, *(["--stats", stats] if stats else []),
            *(["--gpu-budget", format_size(budget)] if budget else []), "--", *cmd]


def run(cmd: list, run_env: dict, timeout: float, preexec_fn=None) -> tuple[str, str, int | str]:
    """(stdout, stderr, returncode), returncode "timeout" with what was printed until then.
    The run gets its own process group and a timeout kills all of it: killing only the
    child left `transit-launch run`'s trainer running into the next measurement."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=run_env, cwd=ROOT,
                            preexec_fn=preexec_fn, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return out, err, proc.returncode
    except subprocess.TimeoutExpired:
        stop_group(proc)
        out, err = proc.communicate()
        return out or "", err or "", "timeout"


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


def split_trainer_args(argv: list) -> tuple[list, list]:
    """(the script's own arguments, the trainer's after `--`)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def run_trainer_here(args: list) -> int:
    """examples/train_llama.py in this process, so that hooks installed first see it; its exit code."""
    import runpy
    sys.argv = [TRAINER[1], *args]
    try:
        runpy.run_path(TRAINER[1], run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            return e.code if isinstance(e.code, int) else 1
    return 0


def is_module(module, name: str) -> bool:
    """Whether `module` is the trainer's class `name`, also once FSDP2 subclassed it."""
    return any(c.__name__ == name for c in type(module).__mro__)
