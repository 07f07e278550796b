"""The restore journal of NIC caps: what was changed and how it looked before, written
(fsync'ed) before each change, with the host and node it was written on and the process
group of the job that ran under the caps, so that `transit-launch sweep --restore` undoes
a sweep that crashed and ends the job it left behind.

The journal is written as root into a directory only its owner can write: the file is
replaced by rename from a temporary file created with O_EXCL|O_NOFOLLOW relative to the
opened directory, so a link planted beside it is never followed."""

from __future__ import annotations

import glob
import json
import os
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

from transit_launch.errors import UsageError
from transit_launch.netcap.backends import CapError, Iface, backend


def node_name() -> str:
    """Slurm's name for this node inside a job step (several slurmd may share a host)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def host_name() -> str:
    return socket.gethostname()


DEFAULT_SPEC = "netcap-%n.json"


def state_dir() -> Path:
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "transit-launch"


def journal_path(spec: str | None) -> Path:
    """--journal PATH ('%n' becomes the node name), or the per-node default."""
    return Path((spec or str(state_dir() / DEFAULT_SPEC)).replace("%n", node_name()))


def open_journal(spec: str | None) -> "Journal":
    """The journal of --journal SPEC on this node. Only the default's directory is created
    (our own state directory); a --journal in a directory that does not exist is refused
    rather than made (a typo would otherwise create /nonexistent as root)."""
    return Journal(journal_path(spec), make_dir=spec is None)


def journal_paths(spec: str | None) -> list[Path]:
    """Every journal a --journal SPEC names: with '%n', the journal of each node (a sweep
    under Slurm leaves one per node)."""
    spec = spec or str(state_dir() / DEFAULT_SPEC)
    if "%n" not in spec:
        return [Path(spec)]
    return sorted(Path(p) for p in glob.glob(glob.escape(spec).replace("%n", "*")))


def _process_start(pid: int) -> str | None:
    """The start time of a process (field 22 of /proc/PID/stat), which tells a process
    from a later one that got the same id."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[-1].split()[19]


def identity(pid: int) -> dict | None:
    """What tells this process from any other that later gets its id: its start time, the
    user it runs as and its command line; None when it is gone."""
    start = _process_start(pid)
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return None
    if start is None or _process_start(pid) != start:  # it ended (and the id was taken) while we read
        return None
    return {"start": start, "uid": uid, "cmd": cmd}


def _not_ours(st: os.stat_result, kind: str, is_kind) -> str | None:
    """Why a journal's file or directory cannot be trusted (None: it can): only its owner,
    this user or root, may change it."""
    if not is_kind(st.st_mode):
        return f"is not {kind}"
    if st.st_uid not in (0, os.geteuid()):
        return f"is owned by uid {st.st_uid}, not by you or root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "is writable by others"
    return None


class Journal:
    """What was changed and how it looked before, written before each change."""

    def __init__(self, path: Path, make_dir: bool = False):
        self.path = Path(path)
        self.make_dir = make_dir  # create the directory (mode 0700) when it is missing

    def _load(self) -> dict:
        """The journal's content, read only after its directory and the file itself passed
        the ownership checks on open descriptors (root acts on what it says: it ends a
        process group and rewrites NIC settings)."""
        try:
            dfd = self._open_dir(missing_ok=True)
        except FileNotFoundError:
            return {"entries": []}
        try:
            try:
                fd = os.open(self.path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
            except FileNotFoundError:
                return {"entries": []}
            except OSError as e:  # ELOOP: a link planted at the journal's name
                raise UsageError(f"restore journal {self.path}: {e.strerror}; refusing to act on it") from None
        finally:
            os.close(dfd)
        why = _not_ours(os.fstat(fd), "a regular file", stat.S_ISREG)  # before fdopen: it raises on a directory
        if why:
            os.close(fd)
            raise UsageError(f"restore journal {self.path} {why}; refusing to act on it")
        with os.fdopen(fd, "rb") as f:
            raw = f.read()
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UsageError(f"restore journal {self.path} is damaged: {e}") from None
        if isinstance(data, list):  # the format before hosts and jobs were recorded
            data = {"entries": data}
        if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
            raise UsageError(f"restore journal {self.path} is damaged: no list of entries")
        return data

    def entries(self) -> list[dict]:
        return self._load()["entries"]

    def job(self) -> dict | None:
        return self._load().get("job")

    def host(self) -> str | None:
        return self._load().get("host")

    def _open_dir(self, missing_ok: bool = False) -> int:
        """The journal's directory, opened; refused when anyone but its owner (us or root)
        can write it, or when it is a link. missing_ok: a directory that does not exist
        raises FileNotFoundError (nothing to read) instead of the refusal."""
        d = self.path.parent
        if self.make_dir and not missing_ok:
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except FileNotFoundError:
            if missing_ok:
                raise
            raise UsageError(f"journal directory {d} does not exist (--journal {self.path})") from None
        except OSError as e:
            raise UsageError(f"journal directory {d}: {e.strerror}") from None
        why = _not_ours(os.fstat(fd), "a directory", stat.S_ISDIR)
        if why:
            os.close(fd)
            raise UsageError(f"journal directory {d} {why}: choose a directory only you can write (--journal)")
        return fd

    def check(self) -> None:
        """Refuse a journal directory others can write, before anything is changed."""
        os.close(self._open_dir())

    def _write(self, data: dict) -> None:
        dfd = self._open_dir()
        try:
            name = self.path.name
            if not data["entries"] and not data.get("job"):
                try:
                    os.unlink(name, dir_fd=dfd)
                except FileNotFoundError:
                    pass
                return
            data = {"version": 2, "host": host_name(), "node": node_name(), **data}
            for attempt in range(100):
                tmp = f".{name}.{os.getpid()}.{attempt}.tmp"
                try:
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
                    break
                except FileExistsError:
                    continue
            else:
                raise UsageError(f"cannot create a temporary file beside {self.path}")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(data, f, indent=1)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)  # rename: a link at name is replaced
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except OSError:
                    pass
                raise
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _update(self, **changes) -> None:
        data = self._load()
        data.update(changes)
        self._write(data)

    def record(self, backend: str, iface: Iface, state: dict) -> None:
        entries = [e for e in self.entries() if not (e["backend"] == backend and e["iface"] == str(iface))]
        self._update(entries=entries + [{"backend": backend, "iface": str(iface), "state": state}])

    def done(self, backend: str, iface: Iface) -> None:
        self._update(entries=[e for e in self.entries() if not (e["backend"] == backend and e["iface"] == str(iface))])

    def set_job(self, pgid: int | None) -> None:
        """The process group of the job running under the caps and its leader's identity
        (None: it has ended)."""
        self._update(job={"pgid": pgid, **(identity(pgid) or {"start": None})} if pgid else None)


def _members(pgid: int) -> list[int]:
    """The uids of the processes in process group pgid."""
    uids = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat_file.read_text().rsplit(")", 1)[-1].split()[2]) == pgid:
                uids.append(stat_file.parent.stat().st_uid)
        except (OSError, ValueError, IndexError):
            continue
    return uids


# what must still match for a process to be the recorded leader; its command line is
# recorded for people but not compared: the job execs (the sweep's gate becomes the job)
MATCHED = ("start", "uid")


def _group_alive(job: dict) -> bool:
    """Is the process group still the job's? Its leader with the recorded identity (the
    start time, which no later process with that id has, and the user), or, once the leader
    is gone, members that run as the recorded user (Linux does not reuse an id while a
    group has it)."""
    pgid = int(job["pgid"])
    lead = identity(pgid)
    if lead is not None:
        return all(lead[k] == job[k] for k in MATCHED if k in job)
    if _process_start(pgid) is not None:  # a process we cannot inspect holds the id: not ours to judge
        return False
    uids = _members(pgid)
    return bool(uids) and ("uid" not in job or all(u == job["uid"] for u in uids))


def end_orphan(job: dict | None, grace: float = 5.0) -> str | None:
    """End the process group a killed sweep left running, if it is still the same one:
    SIGTERM, then SIGKILL after grace seconds."""
    if not job or not job.get("pgid"):
        return None
    pgid = int(job["pgid"])
    if not _group_alive(job):
        return None
    try:
        os.killpg(pgid, signal.SIGTERM)
        t0 = time.time()
        while time.time() - t0 < grace and _group_alive(job):
            time.sleep(0.05)
        if _group_alive(job):
            os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:
        raise UsageError(f"cannot end process group {pgid}, which the journal names: it is not yours (run "
                         "`sweep --restore` as the user who ran the sweep, or root)") from None
    return f"ended the job the sweep left running (process group {pgid})"


def _vanished(iface: Iface) -> str | None:
    """Why the interface (and with it any cap on it) no longer exists, or None."""
    if iface.netns and not Path("/run/netns", iface.netns).exists():
        return f"network namespace {iface.netns} no longer exists"
    res = subprocess.run(iface.wrap(["ip", "link", "show", "dev", iface.name]), capture_output=True, text=True,
                         start_new_session=True)
    if res.returncode != 0 and "does not exist" in res.stderr:
        return f"interface {iface} no longer exists"
    return None


def restore_journal(journal: Journal) -> list[str]:
    """`sweep --restore`: end the job a killed sweep left, then undo its caps, newest
    first. Lines: what was done, 'WARNING ...' for an entry dropped because its interface
    is gone (and its cap with it), 'ERROR ...' for what could not be undone."""
    done, errors = [], []
    host = journal.host()
    if host and host != host_name():
        return [f"ERROR {journal.path} was written on {host}: run `transit-launch sweep --restore --journal "
                f"{journal.path}` there"]
    ended = end_orphan(journal.job())
    if ended:
        done.append(ended)
    if journal.job():
        journal.set_job(None)
    for e in reversed(journal.entries()):
        iface = Iface.parse(e["iface"])
        try:
            gone = _vanished(iface)
            if gone:
                journal.done(e["backend"], iface)
                done.append(f"WARNING {e['backend']} {iface}: {gone}; dropped its journal entry")
                continue
            backend(e["backend"]).restore(iface, e["state"])
            journal.done(e["backend"], iface)
            done.append(f"{e['backend']} {iface}")
        except (CapError, OSError, subprocess.SubprocessError) as err:
            errors.append(f"{e['backend']} {iface}: {err}")
    return done if not errors else done + ["ERROR " + x for x in errors]
