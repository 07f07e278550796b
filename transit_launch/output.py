"""Standard output that fails in one line: a full disk (or > /dev/full) and an encoding
that cannot hold a character (PYTHONIOENCODING=ascii and a file name with an accent) are
errors of the run, not tracebacks."""

from __future__ import annotations

import contextlib
import os
import sys

from transit_launch.errors import UsageError


class _Checked:
    """sys.stdout, with write and flush errors turned into UsageError."""

    def __init__(self, f):
        self._f = f

    def __getattr__(self, name):
        return getattr(self._f, name)

    def write(self, s):
        try:
            return self._f.write(s)
        except UnicodeEncodeError as e:
            raise UsageError(f"standard output's encoding ({self._f.encoding}) cannot write "
                             f"{e.object[e.start:e.end]!r}: set PYTHONIOENCODING=utf-8 or a UTF-8 locale "
                             "(LC_ALL=C.UTF-8), or write to a file") from None
        except BrokenPipeError:
            raise
        except OSError as e:
            raise failed(self._f, e) from None

    def flush(self):
        try:
            self._f.flush()
        except BrokenPipeError:
            raise
        except OSError as e:
            raise failed(self._f, e) from None


def failed(f, e: OSError) -> UsageError:
    """The error, after pointing the descriptor at /dev/null: what the stream still buffers
    would fail again at exit (Python's "Exception ignored" lines and exit code 120)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        if f is sys.__stdout__:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, f.fileno())
            os.close(devnull)
    return UsageError(f"cannot write to standard output: {e.strerror or e}")


@contextlib.contextmanager
def checked_stdout():
    """sys.stdout checked for the block, and flushed at its end (a buffered write fails
    only then)."""
    real = sys.stdout
    if real is None:  # started with standard output closed (>&-)
        raise UsageError("standard output is closed: give it a file or a terminal")
    sys.stdout = _Checked(real)
    try:
        yield
        sys.stdout.flush()
    finally:
        sys.stdout = real
