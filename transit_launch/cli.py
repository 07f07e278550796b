"""Command line: builds the parser from the modules that own the subcommands, then
dispatches. Bad input anywhere becomes one line on stderr and exit code 2."""

from __future__ import annotations

import sys

from transit_launch import __version__, config, doctor, report
from transit_launch.argtypes import Parser
from transit_launch.errors import UsageError
from transit_launch.netcap import cli as netcap_cli
from transit_launch.output import checked_stdout
from transit_launch.planning import cli as planning_cli
from transit_launch.preload import cli as preload_cli
from transit_launch.sim import cli as sim_cli
from transit_launch.slurm import cli as slurm_cli

# In help order: planning, jobs, the shim, a job's stats, clusters, NIC sweeps, the machine.
OWNERS = (planning_cli, slurm_cli, preload_cli, report, sim_cli, netcap_cli, doctor)


def build_parser() -> Parser:
    p = Parser(prog="transit-launch", description="Transparent scale-in for PyTorch training on Slurm.")
    p.add_argument("--version", action="version", version=f"transit-launch {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    for owner in OWNERS:
        owner.register(sub)
    # a subcommand named _x is for scripts transit-launch renders, not for people: not listed
    sub.metavar = "{" + ",".join(name for name in sub.choices if not name.startswith("_")) + "}"
    p.commands = sub.choices
    return p


def one_line(message: str) -> str:
    """Messages quote what users typed (file names, values): a newline or a terminal
    control character in it must not break the one line an error is."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in " ".join(message.splitlines()))


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    command = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1:]
    applied = {}
    try:
        parser = build_parser()
        applied = config.apply(parser.commands)  # the site's and the user's config.toml: defaults flags override
        a = parser.parse_args(argv)
        if command and not getattr(a, "takes_command", False):
            raise UsageError(f"{a.cmd} takes no command after --")
        with checked_stdout():  # a full disk or an ASCII-only encoding: one line
            return a.func(a, command)
    except UsageError as e:
        print(f"transit-launch: error: {one_line(config.attribute(str(e), applied, argv))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("transit-launch: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
