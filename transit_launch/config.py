"""Options users repeat, from TOML files: the site's, then the user's, then the flags (each
later one wins). A key is the flag's name without its dashes (gpu, gpus-per-node or
gpus_per_node, partition, account, min-efficiency); a value is what the flag takes. A file
that does not exist is skipped; one that cannot be read or holds an unknown key is one line."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from transit_launch.errors import UsageError

SITE = "/etc/transit-launch/config.toml"
SITE_ENV = "TRANSIT_LAUNCH_SITE_CONFIG"  # another site file (tests, a site that keeps /etc read-only)
# the options a file may set, and the commands it sets them for (not `_node-loss`: the
# rendered script passes it every option the job was planned with)
KEYS = ("gpu", "gpus_per_node", "partition", "account", "min_efficiency")
COMMANDS = ("plan", "render", "submit", "doctor")


def paths(environ=os.environ) -> list[Path]:
    """The files read, in order: the site's, then the user's (XDG_CONFIG_HOME or ~/.config)."""
    user_root = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return [Path(environ.get(SITE_ENV) or SITE), Path(user_root) / "transit-launch" / "config.toml"]


def _load(path: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        return {}
    except IsADirectoryError:
        raise UsageError(f"config {path} is a directory, not a TOML file") from None
    except OSError as e:
        raise UsageError(f"config {path}: cannot read it ({e.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"config {path} is not TOML: {e}") from None
    out = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in KEYS:
            raise UsageError(f"config {path}: unknown key {key!r} (known: {', '.join(k.replace('_', '-') for k in KEYS)})")
        if isinstance(value, (dict, list)) or isinstance(value, bool):
            raise UsageError(f"config {path}: {key} must be a string or a number, got {value!r}")
        out[name] = str(value)
    return out


def defaults(environ=os.environ) -> tuple[dict, dict]:
    """(key -> value as the flag's text, key -> the file it came from), later files winning."""
    values, origin = {}, {}
    for path in paths(environ):
        for k, v in _load(path).items():
            values[k], origin[k] = v, path
    return values, origin


def apply(commands: dict[str, argparse.ArgumentParser], environ=os.environ) -> dict[str, Path]:
    """Sets the files' values as the defaults of the commands that take them, each parsed by
    its flag's own type (a bad value is one line naming the file). Returns flag -> file."""
    values, origin = defaults(environ)
    applied = {}
    if not values:
        return applied
    for name in COMMANDS:
        parser = commands.get(name)
        if parser is None:
            continue
        for action in parser._actions:
            if action.dest not in values or not action.option_strings:
                continue
            text = values[action.dest]
            try:
                value = action.type(text) if action.type else text
            except (UsageError, ValueError, argparse.ArgumentTypeError) as e:
                raise UsageError(f"config {origin[action.dest]}: {action.dest.replace('_', '-')} = {text!r}: {e}") from None
            if action.dest == "gpu":  # --gpu is checked with --gpu-mem later; a file's name is checked here
                from transit_launch.planning.hardware import GPUS
                if value not in GPUS:
                    raise UsageError(f"config {origin['gpu']}: gpu = {text!r} is not a known GPU ({', '.join(GPUS)})")
            if action.choices is not None and value not in action.choices:
                raise UsageError(f"config {origin[action.dest]}: {action.dest.replace('_', '-')} = {text!r} is not one "
                                 f"of {', '.join(map(str, action.choices))}")
            parser.set_defaults(**{action.dest: value})
            applied[max(action.option_strings, key=len)] = origin[action.dest]
    return applied


def attribute(message: str, applied: dict[str, Path], argv: list[str]) -> str:
    """An error about a flag the command line did not give but a file did names the file
    (the range checks run after parsing, where the value's origin is not known)."""
    for flag, path in applied.items():
        given = any(a == flag or a.startswith(flag + "=") for a in argv)
        if message.startswith(flag) and not given:
            return f"{message} (set in {path})"
    return message
