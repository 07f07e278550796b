"""This installation's transit-launch as a command another process runs (an srun helper
on the nodes, doctor's node check, the node-loss launcher of a rendered job).

Such a command often runs as root, or as the job's owner in a directory others can
write. `python -m` and `python -c` put the working directory first on sys.path (and
srun falls back to /tmp when the caller's directory does not exist on the node), so a
planted `socket.py` there would run in our place. The command is this Python in isolated
mode (-I: no working directory, no user site-packages, no PYTHON* variables) with the
directory this package was imported from appended to sys.path, so that a checkout on
PYTHONPATH works the same as an installed wheel (appended: it never shadows the
standard library). Every srun step that does not need the caller's directory also runs
with --chdir=/ (SRUN_CHDIR)."""

from __future__ import annotations

import sys
from pathlib import Path

# srun's option for steps that read nothing of the caller's directory
SRUN_CHDIR = "--chdir=/"

# argv[1] is the directory that holds transit_launch; the rest are the CLI's arguments
_BOOT = ("import sys, runpy; d = sys.argv.pop(1); d in sys.path or sys.path.append(d); "
         "sys.argv[0] = 'transit-launch'; {prelude}runpy.run_module('transit_launch', run_name='__main__', "
         "alter_sys=True)")


def package_parent() -> str:
    """The directory transit_launch was imported from (site-packages, or a checkout)."""
    return str(Path(__file__).resolve().parent.parent)


def transit_launch_argv(*args: str, prelude: str = "") -> list[str]:
    """[python, -I, -c, BOOT, parent, *args]: `transit-launch ARGS` run by this Python,
    isolated. prelude: statements run first (ending in '; '), in the same isolation."""
    return [sys.executable, "-I", "-c", _BOOT.format(prelude=prelude), package_parent(), *args]
