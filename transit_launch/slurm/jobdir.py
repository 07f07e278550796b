"""A scale-in job's own directory (transit-JOBID under its working directory): the
attempts' layouts, the transition records and the trainer's progress.

The working directory is often shared (a group's scratch), so the directory is made by
the job itself, exclusively and private (mode 0700): one that exists already was made by
someone else, or by an earlier run of this job, and is taken only when its owner is the
job's user and nobody else can write it. Every read and write goes through the directory
opened once and checked on its descriptor, and reads take only regular files of the same
owner that nobody else can write: a link or file planted there is refused, never followed.
The directory names its job (JOB_FILE, written when it is made): in a directory others can
write, the job's directory could be swapped for another of the same user's, which the
checks of owner and mode alone would take."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from transit_launch.errors import UsageError
from transit_launch.slurm import trust

JOB_FILE = ".job"  # the job id, written when the directory is made
READ_LIMIT = 64 << 20  # bytes: a record file larger than this is refused, not read into memory

def _untrusted(st: os.stat_result, uid: int) -> str | None:
    """Why a file or directory of a job whose user is uid cannot be trusted, or None."""
    if st.st_uid != uid:
        return f"is owned by uid {st.st_uid}, not by the job's user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "can be written by others"
    return None


class JobDir:
    """The job directory at path, opened and checked (uid: the job's user, default this
    process's; job: the job id it must name). create: make it, mode 0700, refused when
    anything is there already."""

    def __init__(self, path: str | os.PathLike, create: bool = False, uid: int | None = None, job: str = ""):
        self.path = Path(path)
        self.uid = os.geteuid() if uid is None else uid
        if create:
            self._make()
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise  # the caller's to say: no directory, no records
        except OSError as e:  # ELOOP/ENOTDIR: a link or a file where the directory should be
            raise UsageError(f"job directory {self.path}: {e.strerror}; refusing to use it") from None
        why = _untrusted(os.fstat(self.fd), self.uid)
        if why:
            os.close(self.fd)
            raise UsageError(f"job directory {self.path} {why}: refusing to use it (was it made before the job?)")
        if create:
            self.write(JOB_FILE, job)
        elif job:
            try:
                named = self.read(JOB_FILE)
            except UsageError:
                os.close(self.fd)
                raise
            if named != job:
                os.close(self.fd)
                raise UsageError(f"job directory {self.path} is not job {job}'s (it names "
                                 f"{'no job' if named is None else repr(named[:40])}): refusing to use it")

    def _make(self) -> None:
        parent = os.stat(self.path.parent)
        if parent.st_mode & stat.S_IWOTH and not parent.st_mode & stat.S_ISVTX:
            raise UsageError(f"{self.path.parent} can be written by every user and is not sticky: another user could "
                             "replace the job's directory there; submit from a directory only you can write")
        try:
            os.mkdir(self.path, 0o700)
        except FileExistsError:
            raise UsageError(f"job directory {self.path} exists already and this job did not make it: refusing to "
                             "use it (another user may have made it for this job id)") from None
        except OSError as e:
            raise UsageError(f"cannot make the job directory {self.path}: {e.strerror}") from None

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> "JobDir":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def read(self, name: str) -> str | None:
        """A record's text, or None when there is none; a file that is not a regular file of
        the job's user that only it can write is refused."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise UsageError(f"{self.path / name}: {e.strerror}; refusing to read it") from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            why = "is not a regular file" if not stat.S_ISREG(st.st_mode) else _untrusted(st, self.uid)
            if not why and st.st_size > READ_LIMIT:
                why = f"is larger than {READ_LIMIT >> 20} MiB"
            if why:
                raise UsageError(f"{self.path / name} {why}: refusing to read it")
            return f.read(READ_LIMIT + 1).decode(errors="replace")

    def write(self, name: str, text: str) -> None:
        """Replace name with text: a new file (O_EXCL, mode 0600) renamed into place."""
        try:
            trust.put(self.fd, name, text.encode(), 0o600)
        except OSError as e:
            raise UsageError(f"cannot write {self.path / name}: {e.strerror}") from None
