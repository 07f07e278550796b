"""Jinja2 rendering of sbatch scripts and local torchrun commands with the shim injected."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import jinja2

from transit_launch import __version__
from transit_launch.errors import UsageError


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("transit_launch.slurm", "templates"),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             autoescape=False)
    env.filters["shq"] = lambda v: shlex.quote(str(v))
    return env


def torchrun_tail(command: list[str]) -> list[str]:
    """torchrun runs a script or a module itself: `python x.py` -> `x.py`,
    `python -m pkg` -> `-m pkg`; any other program goes through --no-python."""
    exe = Path(command[0]).name
    if re.fullmatch(r"python[0-9.]*", exe) and len(command) > 1:
        rest = command[1:]
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
    ctx["command"] = shlex.join(torchrun_tail(ctx["command"]))
    return _env().get_template(template).render(**ctx)
