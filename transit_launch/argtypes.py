"""argparse pieces every subcommand shares: a parser whose errors are one line and exit 2
(through UsageError), value types that refuse bad input with a clear message, and the
types of output paths, checked when the options are parsed, before any work (the checks
themselves, and the writing of the files, are output_files.py's)."""

from __future__ import annotations

import argparse
import difflib
import math
import re
import shutil
import sys

from transit_launch import rules
from transit_launch.errors import UsageError
from transit_launch.output_files import output_dir_problem, output_problem


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        # argparse takes '-5GB' or '-inf' for an option and answers "expected one
        # argument"; no option of ours looks like this, so such words are values and get
        # the value's own message ("cannot parse '-5GB' as a size").
        self._negative_number_matcher = re.compile(r"^-(\.?[0-9]|inf|nan)", re.IGNORECASE)

    def error(self, message):  # one line, exit 2 (argparse would print usage + message)
        if message.startswith("unrecognized arguments: ") and not message.split()[2].startswith("-"):
            message += " (a command to run goes after --, e.g. -- python train.py)"  # most often so
        if "invalid choice" in message:  # hidden subcommands (_node-loss) are not offered
            message = re.sub(r"(, )?'_[\w-]*'(?=[,)])", "", message)
        raise UsageError(message)

    def _print_message(self, message, file=None):  # argparse drops write errors: --help > /dev/full said nothing
        from transit_launch.output import failed
        if message:
            file = file or sys.stderr
            try:
                file.write(message)
                file.flush()
            except BrokenPipeError:
                raise
            except OSError as e:
                raise failed(file, e) from None

    def parse_known_args(self, args=None, namespace=None):
        """An unknown option is reported first, by this parser (which knows the options to
        suggest): argparse reports missing required options before unknown ones, so
        `plan --modle x` said "required: --model" instead of naming the misspelt flag."""
        args = list(sys.argv[1:] if args is None else args)
        try:
            ns, extras = super().parse_known_args(args, namespace)
        except UsageError as e:
            if not str(e).startswith("the following arguments are required"):
                raise
            extras = self._extras_without_required(args)
            if not extras:
                raise
            ns = None
        if extras and extras[0].startswith("-"):
            self._unknown_option(extras)
        if ns is None:  # only extras that are no options (a command without --): the top parser says so
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns, extras

    def _extras_without_required(self, args: list[str]) -> list[str]:
        """What parsing would leave over if no option were required."""
        required = [a for a in self._actions if a.required]
        for a in required:
            a.required = False
        try:
            return super().parse_known_args(list(args), None)[1]
        except UsageError:
            return []
        finally:
            for a in required:
                a.required = True

    def _unknown_option(self, extras: list[str]):
        known = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        close = difflib.get_close_matches(extras[0].split("=", 1)[0], known, n=1, cutoff=0.7)
        self.error(f"unrecognized arguments: {' '.join(extras)}" + (f" (did you mean {close[0]}?)" if close else ""))


def number(cast, minimum, desc, maximum=None):
    """argparse type: a finite cast(text) in [minimum, maximum], else one clear line (argparse
    puts the option's name before it: "argument --tp: must be a positive integer, got '0'")."""
    def conv(text):
        try:
            v = cast(text) if text.isascii() else None  # int() and float() take any script's digits: '３'
        except (ValueError, OverflowError):
            v = None
        if v is None or not math.isfinite(v) or v < minimum or (maximum is not None and v > maximum):
            digits = "" if text.isascii() else " in ASCII digits"
            raise argparse.ArgumentTypeError(f"must be {desc}{digits}, got {text!r}")
        return v
    return conv


def positive_int(maximum=None):
    return number(int, 1, "a positive integer" + (f" of at most {maximum}" if maximum else ""), maximum)


def finite_float():
    """Any finite number: the range is the dataclass's to check (it names the rule once)."""
    return number(float, -math.inf, "a finite number")


nonneg_float = number(float, 0.0, "a non-negative number")
tcp_port = number(int, 1, "a TCP port from 1 to 65535", 65535)


def size(text):
    """argparse type: a size in the shared grammar (rules.py), as bytes."""
    try:
        return rules.parse_size(text)
    except rules.SizeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def gpu_budget(text):
    """argparse type of --gpu-budget: a size of at least rules.GPU_BUDGET_MIN (about a CUDA
    context; the SPANK plugin's --transit-budget has the same floor). Whether it fits the
    GPU is checked where the GPU is known (inject.check_budget)."""
    v = size(text)
    if v < rules.GPU_BUDGET_MIN:
        raise argparse.ArgumentTypeError(f"{text!r} is below {rules.format_size(rules.GPU_BUDGET_MIN)}, the least "
                                         "GPU budget (about what a CUDA context alone takes)")
    if v > rules.GPU_BUDGET_MAX:
        raise argparse.ArgumentTypeError(f"{text!r} is above {rules.format_size(rules.GPU_BUDGET_MAX)}, more than any "
                                         "GPU has (a budget emulates a smaller GPU)")
    return v


def overlap_mode(text):
    """argparse type of --overlap (its choices are rules.OVERLAP_MODES): a retired mode is
    refused as retired, with what remains, rather than as an unknown word."""
    if text in rules.RETIRED_OVERLAP_MODES:
        raise argparse.ArgumentTypeError(rules.overlap_refusal(text))
    return text


def fractions(flag, allow_zero=False):
    """Comma-separated fractions: in (0, 1), or [0, 1) with allow_zero."""
    def conv(text):
        try:
            if not text.isascii():  # float() takes any script's digits
                raise ValueError(text)
            vals = [float(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} takes fractions like 0.25,0.5, got {text!r}") from None
        low_ok = (lambda v: v >= 0) if allow_zero else (lambda v: v > 0)
        if not vals or any(not (low_ok(v) and v < 1) for v in vals):
            span = "must lie in [0, 1)" if allow_zero else "fractions must lie strictly between 0 and 1"
            raise argparse.ArgumentTypeError(f"{flag} {span}, got {text!r}")
        return vals
    return conv


def check_program(command: list[str]) -> None:
    """The program a command starts is there and executable (PATH lookup as exec does):
    run and sweep refuse it before they change or start anything."""
    if shutil.which(command[0]) is None:
        raise UsageError(f"cannot start {command[0]!r}: no such program (or not executable)")


# --- output paths ------------------------------------------------------------------

def _checked(problem):
    """An argparse type from problem(text) -> why it is refused, or None."""
    def conv(text):
        why = problem(text)
        if why:
            raise argparse.ArgumentTypeError(why)
        return text
    return conv


def output_file(suffixes: tuple[str, ...] = ()):
    """argparse type: a file we can create or replace, checked when the options are parsed,
    before the work. suffixes: the ones allowed (matplotlib would otherwise pick the format
    from the name, or append .png to a name without one: `--plot /tmp` wrote /tmp.png)."""
    return _checked(lambda text: output_problem(text, suffixes))


# argparse type: a directory checked before the work
output_dir = _checked(output_dir_problem)
