"""The restore journal of NIC caps: what was changed and how it looked before, written
(fsync'ed) before each change, so that `transit-launch sweep --restore` undoes a sweep
that crashed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

from transit_launch.errors import UsageError
from transit_launch.netcap.backends import CapError, Iface, backend

def node_name() -> str:
    """Slurm's name for this node inside a job step (several slurmd may share a host)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def default_journal() -> Path:
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "transit-launch" / f"netcap-{node_name()}.json"


def journal_path(spec: str | None) -> Path:
    """--journal PATH ('%n' becomes the node name), or the per-node default."""
    return Path(spec.replace("%n", node_name())) if spec else default_journal()



class Journal:
    """What was changed and how it looked before, written before each change."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def entries(self) -> list[dict]:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        except json.JSONDecodeError as e:
            raise UsageError(f"restore journal {self.path} is damaged: {e}") from None

    def _write(self, entries: list[dict]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(entries, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        if not entries:
            self.path.unlink(missing_ok=True)

    def record(self, backend: str, iface: Iface, state: dict) -> None:
        entries = [e for e in self.entries() if not (e["backend"] == backend and e["iface"] == str(iface))]
        self._write(entries + [{"backend": backend, "iface": str(iface), "state": state}])

    def done(self, backend: str, iface: Iface) -> None:
        self._write([e for e in self.entries() if not (e["backend"] == backend and e["iface"] == str(iface))])


def restore_journal(journal: Journal) -> list[str]:
    """`sweep --restore`: undo what a crashed sweep left, newest first."""
    done, errors = [], []
    for e in reversed(journal.entries()):
        iface = Iface.parse(e["iface"])
        try:
            backend(e["backend"]).restore(iface, e["state"])
            journal.done(e["backend"], iface)
            done.append(f"{e['backend']} {iface}")
        except (CapError, OSError, subprocess.SubprocessError) as err:
            errors.append(f"{e['backend']} {iface}: {err}")
    return done if not errors else done + ["ERROR " + x for x in errors]
