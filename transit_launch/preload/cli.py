"""`run`, and the shim options (policy, budget, stats, log) that render and submit share."""

from __future__ import annotations

import argparse
import json
import signal
import sys

from transit_launch.argtypes import gpu_budget, overlap_mode
from transit_launch.rules import GPU_BUDGET_MIN, LOG_LEVELS, OVERLAP_MODES, POLICIES, format_size


def _stats_path(text: str) -> str:
    """argparse type of --stats: the shim reads an empty TRANSIT_STATS as unset, so '' would
    silently write no stats."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the stats path is empty: give a directory (or file) for the shim's stats")
    return text


def add_shim_args(sp, default_policy=None, policy_help=None, stats_help=None):
    g = sp.add_argument_group("shim")
    g.add_argument("--policy", choices=POLICIES, default=default_policy,
                   help=policy_help or "shim policy (default: advise below the no-offload minimum, off otherwise)")
    g.add_argument("--gpu-budget", type=gpu_budget, metavar="SIZE",
                   help="TRANSIT_GPU_BUDGET: managed bytes the shim lets reside on each GPU, with a unit (e.g. "
                        f"40GB, 64GiB); at least {format_size(GPU_BUDGET_MIN)} and at most the GPU's memory "
                        "(default: no budget)")
    g.add_argument("--stats", type=_stats_path,
                   help=stats_help or "TRANSIT_STATS: directory (or file) for the shim's per-rank stats JSON")
    g.add_argument("--log", choices=LOG_LEVELS, help="TRANSIT_LOG level")
    g.add_argument("--overlap", choices=OVERLAP_MODES, type=overlap_mode,
                   help="TRANSIT_OVERLAP_STEP: stream (advise's default) runs the step after clipping through "
                        "the copy engines for the state the budget cannot hold (torch's Adam, AdamW and SGD, "
                        "bit-identical; anything else falls back); 0 turns it off; host (an experiment) steps that "
                        "state on the host with torch's CPU optimizer (docs/environment.md)")


def cmd_run(a, command):
    from transit_launch.preload import inject, run as runmod
    from transit_launch.preload.options import ShimOptions
    inject.check_off(a.policy, a.overlap, a.gpu_budget)
    rc, stats = runmod.run(command, ShimOptions.from_args(a))
    summ = runmod.summary(stats)
    died = {"signal": signal.Signals(-rc).name} if rc < 0 and -rc in signal.valid_signals() else {}
    if a.json:
        print(json.dumps(summ | {"returncode": rc} | died, indent=2))
    else:
        print(runmod.summary_text(summ), file=sys.stderr)
    return 128 - rc if rc < 0 else rc  # a child killed by signal N exits 128+N, as a shell says it (OOM: 137)


def register(sub):
    sp = sub.add_parser("run", help="run a command here with the shim injected, then summarize its stats",
                        usage="transit-launch run [--policy P] [--gpu-budget SIZE] [--overlap MODE] -- COMMAND...")
    add_shim_args(sp, default_policy="advise", policy_help="shim policy (default advise)",
                  stats_help="directory for the shim's stats JSON, one file per process (made if absent; "
                             "default: a temporary directory)")
    sp.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    sp.set_defaults(func=cmd_run, takes_command=True)
