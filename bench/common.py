"""What the bench scripts share: running a command in its own process group, running the
example trainer in this process, and (from tests/example_trainer.py, which the tests use
too) the environment of every GPU run, the trainer's command, JSON lines and model card."""

import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # an installed transit_launch wins over the checkout

from transit_launch.netcap.sweep import stop_group  # noqa: E402


def _example_trainer():
    """tests/example_trainer.py by its path: a `tests` package of some installed wheel must
    not stand in for the checkout's."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("example_trainer", ROOT / "tests" / "example_trainer.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_et = _example_trainer()
TRAINER, TRAINER_DEFAULTS, env = _et.TRAINER, _et.TRAINER_DEFAULTS, _et.env
trainer_records, trainer_flags, trainer_card = _et.trainer_records, _et.trainer_flags, _et.trainer_card
trainer_layout, planner_estimate = _et.trainer_layout, _et.planner_estimate


def gpu_here() -> bool:
    """Whether this machine has an NVIDIA GPU (its driver's control device)."""
    return Path("/dev/nvidiactl").exists()


def transit(policy: str, cmd: list, stats: str | None = None, budget: int | None = None) -> list:
    """cmd under `transit-launch run` (tests/example_trainer.py's), refused on a GPU machine
    without the shim: `run` warns and goes on without it, which would measure a policy run as
    the reference (a GPU call whose carried tree had lost its build did). Without a GPU (the
    bench's plumbing on CPU ranks) the shim has nothing to place and may be absent."""
    from transit_launch.preload import inject
    if policy != "off" and inject.shim_path() is None and gpu_here():
        print(f"bench: no libtransit.so to measure {policy} with ({inject.shim_missing_reason()})", file=sys.stderr)
        sys.exit(2)
    return _et.transit(policy, cmd, stats, budget)


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


def out_option(ap, name: str) -> None:
    """--out, the result file of a run. Results enter bench/results/ only through the runner
    (`python3 -m bench SUITE` writes there; `python3 -m bench --file-in DIR` files a hand run):
    a hand run without --out writes into a scratch folder, never into the record."""
    scratch = Path(tempfile.gettempdir()) / "transit-bench"
    scratch.mkdir(exist_ok=True)
    ap.add_argument("--out", default=str(scratch / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"),
                    help=f"the result file (default: {scratch}/{name}-TIME.json; the runner files results)")


def host_memory() -> dict:
    """What the run held of the host's memory: the process's peak resident bytes (pinned pages
    are resident) and torch's pinned-memory cache (blocks rounded up to a power of two): its
    peak, what it holds at the end and what of that is in use (the split's re-plans free host
    copies into the cache, which keeps them)."""
    import resource

    import torch

    out = {"host_peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    stats = getattr(torch.cuda, "host_memory_stats", lambda: {})()
    for key, name in (("allocated_bytes.peak", "pinned_peak"), ("allocated_bytes.current", "pinned_held"),
                      ("active_bytes.current", "pinned_in_use")):
        if key in stats:
            out[name] = stats[key]
    return out
