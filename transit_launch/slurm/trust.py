"""What root builds, copies or loads: files and directories only root can change, checked
on open descriptors (openat with O_NOFOLLOW, then fstat), never by looking a path up twice.

The rule is the plugin's own (spank/args.c, unsafe()): every entry from / down is root's
and writable by no group or other, except a sticky directory on the way (/tmp), where only
an entry's owner can replace the entry, which must then be root's. A link is followed like
the kernel follows it, once the directory that holds it has passed. tests/test_spank.py
runs this walker and the plugin's on the same tree and expects the same verdicts.

Directories the installer makes are made here too: mkdir relative to a checked parent's
descriptor, then opened with O_NOFOLLOW and given their owner and mode through that
descriptor (fchown/fchmod), so a rename race cannot redirect a chmod to another file."""

from __future__ import annotations

import os
import secrets
import stat
from collections import deque
from dataclasses import dataclass

from transit_launch.errors import UsageError

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO must not block the open
MAX_LINKS = 40  # the kernel's limit, as in the plugin's walk


def unsafe(st: os.stat_result, final: bool) -> str | None:
    """Why anyone but root could change this entry (None when only root can)."""
    if st.st_uid != 0:
        return "is not owned by root"
    if stat.S_ISLNK(st.st_mode):
        return None  # a link cannot be changed, only replaced in its (checked) directory
    sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and not final
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky_dir:
        return "is writable by group or others"
    return None


class Untrusted(UsageError):
    """A path root must not use: one line naming what and why."""


@dataclass
class Opened:
    """An entry that passed, open: fd is what was checked (read from it, not from path)."""
    fd: int
    path: str  # the physical path, for messages and for compilers that need a name

    def close(self) -> None:
        os.close(self.fd)


def _parts(text: str) -> deque[str]:
    return deque(p for p in text.split("/") if p not in ("", "."))


def walk(what: str, path: str, *, want_dir: bool, create: bool = False, missing_ok: bool = False,
         check: bool = True) -> Opened | None:
    """Open path checking every entry on the way (see the module's note). create: make the
    directories that are missing (root's, 0755); missing_ok: a dry run that returns None at
    the first missing entry once everything above it passed; check=False: open the same
    way without asking who can change what (a user's build for that user). Raises Untrusted."""
    def unsafe_here(st, final):
        return unsafe(st, final) if check else None

    if not os.path.isabs(path):
        raise Untrusted(f"{what} {path!r} is not an absolute path")

    def refuse(where: str, why: str):
        raise Untrusted(f"{what} {path}: {where or '/'} {why} (it must be changeable by root only)")

    root = os.open("/", _DIR)
    stack: list[tuple[int, str]] = [(root, "")]
    todo, links = _parts(path), 0
    try:
        st = os.fstat(root)
        if (why := unsafe_here(st, not todo)):
            refuse("/", why)
        while todo:
            name = todo.popleft()
            cur_fd, cur = stack[-1]
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop()[0])
                continue
            here = f"{cur}/{name}"
            final = not todo
            try:
                lst = os.stat(name, dir_fd=cur_fd, follow_symlinks=False)
            except FileNotFoundError:
                if missing_ok:
                    return None
                if not create or (final and not want_dir):
                    refuse(here, "does not exist")
                try:
                    os.mkdir(name, 0o700, dir_fd=cur_fd)  # 0700 until it is root's and 0755
                except OSError as e:  # made or removed by someone else in between
                    refuse(here, f"changed while it was checked ({e.strerror})")
                lst = None
            except OSError as e:
                refuse(here, f"cannot be read ({e.strerror})")
            if lst is not None and stat.S_ISLNK(lst.st_mode):
                if (why := unsafe_here(lst, False)):
                    refuse(here, why)
                links += 1
                if links > MAX_LINKS:
                    refuse(here, "has too many links")
                try:
                    target = os.readlink(name, dir_fd=cur_fd)
                except OSError as e:
                    refuse(here, f"changed while it was checked ({e.strerror})")
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop()[0])
                todo.extendleft(reversed(_parts(target)))
                continue
            want = _DIR if (not final or want_dir) else _FILE
            if lst is not None and stat.S_ISDIR(lst.st_mode) != (want == _DIR):
                refuse(here, "is not a directory" if want == _DIR else "is not a regular file")
            try:
                fd = os.open(name, want, dir_fd=cur_fd)
            except OSError as e:  # a link or another entry put there since the lstat
                refuse(here, f"changed while it was checked ({e.strerror})")
            st = os.fstat(fd)
            if lst is not None and (st.st_dev, st.st_ino) != (lst.st_dev, lst.st_ino):
                os.close(fd)
                refuse(here, "changed while it was checked")
            if lst is None:  # ours: root's and 0755 through the descriptor, before anything goes in
                if os.geteuid() == 0:
                    os.fchown(fd, 0, 0)
                os.fchmod(fd, 0o755)
                st = os.fstat(fd)
            stack.append((fd, here))
            if (why := unsafe_here(st, final)):
                refuse(here, why)
            if final and not want_dir and not stat.S_ISREG(st.st_mode):
                refuse(here, "is not a regular file")
        fd, where = stack.pop()
        st = os.fstat(fd)
        why = unsafe_here(st, True)  # again as the last entry: '..' may have ended on a sticky directory
        if not why and want_dir and not stat.S_ISDIR(st.st_mode):
            why = "is not a directory"
        if why:
            os.close(fd)
            refuse(where, why)
        return Opened(fd, where or "/")
    finally:
        for fd, _ in stack:
            os.close(fd)


def check_dir_to_make(what: str, path: str) -> None:
    """The dry run for a directory the installer will make or use: everything that exists
    on the way passes (nothing is made). Raises Untrusted."""
    opened = walk(what, path, want_dir=True, missing_ok=True)
    if opened is not None:
        opened.close()


def entries(d: Opened, what: str, suffixes: tuple[str, ...], check: bool = True) -> dict[str, Opened]:
    """The regular files of an opened directory whose names end with one of suffixes, each
    open and checked (a link, a FIFO or another user's file among them is refused)."""
    out: dict[str, Opened] = {}
    try:
        for name in sorted(os.listdir(d.fd)):
            if not name.endswith(suffixes):
                continue
            here = f"{d.path}/{name}"
            try:
                fd = os.open(name, _FILE, dir_fd=d.fd)
            except OSError as e:
                raise Untrusted(f"{what} {here}: cannot be opened as a file ({e.strerror}); a link is not "
                                "followed here") from None
            out[name] = Opened(fd, here)
            st = os.fstat(fd)
            why = (unsafe(st, True) if check else None) or (None if stat.S_ISREG(st.st_mode) else "is not a regular file")
            if why:
                raise Untrusted(f"{what} {here} {why} (it must be changeable by root only)")
    except BaseException:
        for o in out.values():
            o.close()
        raise
    return out


def read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while (b := os.read(fd, 1 << 20)):
        chunks.append(b)
    return b"".join(chunks)


def put(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    """name in the opened directory, replaced by rename (a running job that maps the old
    file keeps it intact): written to a new entry made with O_EXCL|O_NOFOLLOW under a
    random name, root's when we are root, mode as given, then renamed over name."""
    tmp = f".{name}.{secrets.token_hex(8)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb", closefd=False) as out:
            out.write(data)
            out.flush()
            if os.geteuid() == 0:
                os.fchown(fd, 0, 0)
            os.fchmod(fd, mode)
            os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
