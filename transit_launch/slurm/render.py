"""Jinja2 rendering of sbatch scripts and local torchrun commands with the shim injected."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from transit_launch import __version__
from transit_launch.errors import UsageError


def _env():
    import jinja2  # here, not at import: every CLI command imports this module, few render

    env = jinja2.Environment(loader=jinja2.PackageLoader("transit_launch.slurm", "templates"),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             autoescape=False)
    env.filters["shq"] = lambda v: shlex.quote(str(v))
    return env


# torchrun's own options a command may carry, when the script runs torchrun itself: what they
# take, and the ones the script decides (the rendezvous and the node count are its own)
_TORCHRUN_VALUE = {"--nproc-per-node", "--nproc_per_node"}
_TORCHRUN_FLAGS = {"--standalone"}  # a single-node rendezvous: the script's c10d one replaces it


def _adopt_torchrun(args: list[str], gpus_per_node: int | None) -> list[str]:
    """The user's `torchrun [OPTIONS] SCRIPT ...` (or `python -m torch.distributed.run`):
    its script and arguments, for the script's own torchrun; its --nproc-per-node must be the
    plan's GPUs a node, and any other torchrun option is refused (the script sets the
    rendezvous, the node count and the node rank itself)."""
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] not in ("-m", "--module", "--no-python", "--no_python"):
        opt, eq, val = args[i].partition("=")
        if opt in _TORCHRUN_FLAGS:
            i += 1
            continue
        if opt not in _TORCHRUN_VALUE:
            raise UsageError(f"the command's torchrun option {opt}: the script runs torchrun itself and sets its "
                             "rendezvous and node count; give the training script and its arguments (or only "
                             "--nproc-per-node)")
        if not eq:
            i += 1
            if i == len(args):
                raise UsageError(f"the command's torchrun {opt} has no value")
            val = args[i]
        if gpus_per_node is not None and val != str(gpus_per_node):
            raise UsageError(f"the command's torchrun {opt} {val}: the plan runs {gpus_per_node} GPUs a node "
                             "(--gpus-per-node); leave it out or make them equal")
        i += 1
    rest = args[i:]
    if not rest:
        raise UsageError("the command's torchrun names no training script")
    if rest[0] in ("--module", "--no_python"):
        rest = [{"--module": "-m", "--no_python": "--no-python"}[rest[0]], *rest[1:]]
    return rest


def torchrun_tail(command: list[str], gpus_per_node: int | None = None) -> list[str]:
    """What follows the script's `torchrun OPTIONS`: `python x.py` -> `x.py`, `python -m pkg`
    -> `-m pkg` (torchrun's Python runs them); an interpreter named by its path is kept
    (`--no-python /opt/venv/bin/python x.py`: the job runs in the environment the user
    named); the user's own torchrun (or `python -m torch.distributed.run`) is adopted, not
    nested; any other program goes through --no-python."""
    exe = Path(command[0]).name
    if exe == "torchrun":
        return _adopt_torchrun(command[1:], gpus_per_node)
    if re.fullmatch(r"python[0-9.]*", exe) and len(command) > 1:
        rest = command[1:]
        if rest[:2] in (["-m", "torch.distributed.run"], ["-m", "torch.distributed.launch"]):
            if rest[1] == "torch.distributed.launch":
                raise UsageError("the command runs torch.distributed.launch (deprecated): give the training script; "
                                 "the script runs torchrun itself")
            return _adopt_torchrun(rest[2:], gpus_per_node)
        if "/" not in command[0]:
            if rest[0] == "-m" and len(rest) > 1:
                return ["-m", *rest[1:]]
            if not rest[0].startswith("-"):
                return rest
    return ["--no-python", *command]


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _no_control(ctx: dict) -> None:
    """A newline in any value would start a new line of the script (a new #SBATCH line or
    shell command): refuse control characters everywhere. Values that reach the shell
    are quoted by the templates (shq, shlex.join)."""
    def walk(key, v):
        if isinstance(v, str | os.PathLike) and _CONTROL.search(str(v)):
            raise UsageError(f"{key}: {str(v)!r} holds a control character; it cannot go into a job script")
        if isinstance(v, dict):
            for k, x in v.items():
                walk(k, k)
                walk(k, x)
        elif isinstance(v, list | tuple):
            for x in v:
                walk(key, x)
    for k, v in ctx.items():
        walk(k, v)


def render(template: str, **ctx) -> str:
    ctx.setdefault("version", __version__)
    _no_control(ctx)
    ctx["command"] = shlex.join(torchrun_tail(ctx["command"], ctx.get("gpus_per_node")))
    return _env().get_template(template).render(**ctx)


# How the job gets the shim's environment: "script" exports it in the script itself;
# "spank" writes #SBATCH --transit=POLICY (and the budget and stats options) and the SPANK
# plugin sets it on the nodes from the site's shim; "auto" is spank where sbatch here offers
# the plugin's option, else script.
ROUTES = ("auto", "spank", "script")


def offers_transit(sbatch_help: str) -> bool:
    """Whether `sbatch --help` lists the SPANK plugin's --transit=POLICY: the plugin is in
    the plugstack this sbatch reads (Slurm lists a plugin's options after its own)."""
    from transit_launch.rules import PLUGIN_OPTIONS
    return re.search(rf"^\s*--{PLUGIN_OPTIONS['POLICY']}=POLICY\b", sbatch_help, re.MULTILINE) is not None


def plugin_installed(timeout: float = 15) -> bool:
    """Whether sbatch on this machine loads the SPANK plugin (no sbatch, or one that cannot
    reach its configuration: no)."""
    import subprocess
    try:
        res = subprocess.run(["sbatch", "--help"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0 and offers_transit(res.stdout)


def spank_route(route: str, local: bool, scale_in: bool) -> bool:
    """Whether the job takes the plugin's route (see ROUTES). --local runs no sbatch, and a
    scale-in job's attempts set the shim's environment for each new layout themselves."""
    if route not in ROUTES:
        raise UsageError(f"--inject {route!r} is not one of {', '.join(ROUTES)}")
    if route == "spank" and local:
        raise UsageError("--inject spank writes #SBATCH lines for the SPANK plugin; --local renders a torchrun "
                         "command without sbatch (leave out one of them)")
    if route == "spank" and scale_in:
        raise UsageError("--inject spank with --on-node-loss scale-in: each attempt sets the shim's environment for "
                         "its own layout; give --inject script")
    return route == "spank" or (route == "auto" and not local and not scale_in and plugin_installed())
