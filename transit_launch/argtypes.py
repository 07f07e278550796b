"""argparse pieces every subcommand shares: a parser whose errors are one line and exit 2
(through UsageError), value types that refuse bad input with a clear message, and the
checks of output paths that must run before any work (a run of minutes must not end in
"cannot write")."""

from __future__ import annotations

import argparse
import difflib
import errno
import math
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from transit_launch import rules
from transit_launch.errors import UsageError


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


def output_problem(text: str, suffixes: tuple[str, ...] = ()) -> str | None:
    """Why `text` cannot be written as a file, or None."""
    if not text:
        return "the file name is empty"
    path = Path(text)
    # os.path's tests, not Path's: these raise on a directory the user cannot search
    if os.path.isdir(path):
        return f"{text} is a directory; give a file name" + (f" ending in {suffixes[0]}" if suffixes else "")
    if suffixes and path.suffix.lower() not in suffixes:
        return f"{text}: the file name must end in {' or '.join(suffixes)}"
    if not os.path.isdir(path.parent):
        return f"{text}: {_not_a_directory(path.parent)}"
    special = _not_regular(path)
    if special:
        return special
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return f"{text}: not writable"
    return _probe(path.parent, text)


def _not_regular(path) -> str | None:
    """Why an existing `path` (a link followed) must not be replaced by a file: the rename that
    writes it would put a regular file in place of a device, pipe or socket (as root,
    `-o /dev/null` replaced the device)."""
    import stat
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # absent (or unreadable: the write says why)
    if stat.S_ISREG(mode):
        return None
    return f"{path} is not a regular file (a device, pipe or socket): give a file name"


def _not_a_directory(d: Path) -> str:
    """Why d, which os.path.isdir refused, is no directory to write in."""
    try:
        os.stat(d)
    except OSError as e:
        return f"directory {d} does not exist" if e.errno == errno.ENOENT else f"cannot reach {d} ({e.strerror})"
    return f"{d} is not a directory"


def output_dir_problem(text: str) -> str | None:
    """Why `text` cannot be used as a directory that exists or can be made in an existing
    one: a missing parent is refused, as for output files (a typo in it would otherwise make
    a tree of directories, silently)."""
    if not text:
        return "the directory name is empty"
    path = Path(text)
    if os.path.exists(path):
        return _probe(path, text) if os.path.isdir(path) else f"{text} exists and is not a directory"
    if not os.path.isdir(path.parent):
        return f"{text}: {_not_a_directory(path.parent)}"
    return _probe(path.parent, text)


# argparse type: a directory checked before the work
output_dir = _checked(output_dir_problem)


def _probe(directory: Path, text: str) -> str | None:
    """Whether a file can be created in `directory`, by creating and removing one: the
    permission bits do not tell (root passes os.access on /proc, where nothing can be
    created)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".transit-probe-")
    except OSError as e:
        return f"{text}: cannot create files in {directory} ({e.strerror})"
    os.close(fd)
    os.unlink(tmp)
    return None


def write_text_atomically(path: str, text: str) -> None:
    """Write through a temporary file in the same directory and rename it into place, so a
    failure leaves no partial file behind (and an old one untouched)."""
    write_atomically(path, lambda f: f.write(text.encode()))


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomically(path: str, write) -> None:
    """write(f) fills a new file (binary, open) next to `path`, which then replaces `path`.
    The file is made with O_EXCL under a random name (mkstemp), so a link or a file someone
    planted in a shared directory is neither written through nor reused; the rename
    replaces a link at `path` instead of following it."""
    target = Path(path)
    special = _not_regular(target)
    if special:
        raise UsageError(special)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            os.fchmod(f.fileno(), 0o666 & ~_umask())  # what open() would have given
        os.replace(tmp, target)
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def save_figure(fig, path: str, dpi: int, metadata: dict[str, str] | None = None) -> None:
    """A matplotlib figure to `path`, laid out, written atomically, then released.
    metadata: text the file carries besides matplotlib's own (a PNG's text chunks)."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fmt = Path(path).suffix.lstrip(".").lower() or None  # matplotlib takes the format from the name
    write_atomically(path, lambda f: fig.savefig(f, dpi=dpi, format=fmt, metadata=metadata))
    plt.close(fig)


def require_matplotlib(flag: str):
    """matplotlib.pyplot on the Agg backend, or one line saying how to get it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError(f"{flag} needs matplotlib (pip install 'transit-launch[plot]')") from None
    return plt
