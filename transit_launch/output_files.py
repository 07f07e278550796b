"""The files a command writes: the checks of an output path that run when the options are
parsed, before any work (a run of minutes must not end in "cannot write"), the atomic write
every output file goes through (a temporary file renamed into place, so a failure leaves no
partial file), and matplotlib figures saved that way. The argparse types that call the
checks are argtypes.py's (output_file, output_dir)."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from transit_launch.errors import UsageError


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
