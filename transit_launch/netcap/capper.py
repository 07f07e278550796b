"""Applying NIC caps on this machine (Capper) or on every node of a Slurm allocation
(SlurmCapper, which runs `transit-launch netcap` once per node), and that per-node helper."""

from __future__ import annotations

import json
import os
import subprocess

from transit_launch.errors import UsageError
from transit_launch.netcap import counters
from transit_launch.netcap.backends import Backend, CapError, Iface, backend, parse_bandwidth
from transit_launch.netcap.journal import Journal, journal_path, node_name, restore_journal

def ifaces_for_node(spec: str, node: str | None = None) -> list[Iface]:
    """IFACE[,IFACE...]; an entry NODE=IFACE applies only on that Slurm node."""
    out = []
    for item in (x.strip() for x in spec.split(",") if x.strip()):
        target, sep, name = item.rpartition("=")
        if sep and node is not None and target != node:
            continue
        out.append(Iface.parse(name if sep else item))
    return out


class Capper:
    """Applies caps on a set of interfaces of this machine and restores all of them,
    whatever happens."""

    def __init__(self, be: Backend, ifaces: list[Iface], journal: Journal):
        self.be, self.ifaces, self.journal = be, ifaces, journal
        self.applied: list[Iface] = []

    def names(self) -> list[str]:
        return [str(i) for i in self.ifaces]

    def sample(self) -> dict:
        return counters.sample(self.ifaces)

    def apply(self, bps: float) -> None:
        for iface in self.ifaces:
            if iface not in self.applied:
                self.journal.record(self.be.name, iface, self.be.read(iface))
                self.applied.append(iface)
            self.be.apply(iface, bps)

    def restore(self) -> list[str]:
        """Restores every interface it touched; returns the errors (never raises)."""
        errors = []
        for iface in reversed(self.applied):
            try:
                state = next(e["state"] for e in self.journal.entries()
                             if e["backend"] == self.be.name and e["iface"] == str(iface))
                self.be.restore(iface, state)
                self.journal.done(self.be.name, iface)
            except (CapError, StopIteration, OSError, subprocess.SubprocessError) as e:
                errors.append(f"{iface}: {e}")
        self.applied = [i for i in self.applied if any(e["iface"] == str(i) for e in self.journal.entries())]
        return errors


def check_ready(be: Backend, ifaces: list, bws: list[float], journal: Journal, node: str | None = None) -> None:
    """Before anything is changed: every interface takes the caps, and no earlier sweep left
    caps here (node: the name said in a per-node helper's message)."""
    for i in ifaces:
        be.check(i, bws)
    if journal.entries():
        where, there = (f"{node}: ", " there") if node else ("", "")
        raise UsageError(f"{where}a previous sweep left caps in {journal.path}: run `transit-launch sweep "
                         f"--restore`{there} first")


class SlurmCapper:
    """The same on every node of a Slurm allocation: one task per node runs
    `transit-launch netcap ...` there (srun --overlap, inside the job's allocation); each
    node keeps its own journal."""

    def __init__(self, be: Backend, iface_spec: str, journal_spec: str | None, python: str):
        self.be, self.spec, self.journal_spec, self.python = be, iface_spec, journal_spec, python
        self.nodes = int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 1)
        self.ifaces = []

    def names(self) -> list[str]:
        return [f"{self.spec} on {self.nodes} nodes"]

    def _srun(self, *args: str) -> list[dict]:
        cmd = ["srun", "--overlap", f"--nodes={self.nodes}", f"--ntasks={self.nodes}", "--ntasks-per-node=1",
               self.python, "-m", "transit_launch", "netcap", *args, "--cap", self.be.name, "--iface", self.spec]
        if self.journal_spec:
            cmd += ["--journal", self.journal_spec]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        rows = [json.loads(l) for l in res.stdout.splitlines() if l.startswith("{")]
        if res.returncode != 0 or len(rows) != self.nodes:
            msg = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
            raise CapError(f"netcap {args[0]} on the allocation's nodes failed: {msg}")
        return rows

    def check(self, bws: list[float]) -> None:
        """check_ready on every node, before anything is changed."""
        self._srun("check", "--bandwidth", ",".join(f"{int(b)}bit" for b in bws))

    def apply(self, bps: float) -> None:
        self._srun("apply", "--bandwidth", f"{int(bps)}bit")

    def restore(self) -> list[str]:
        try:
            rows = self._srun("restore")
        except (CapError, OSError, subprocess.SubprocessError) as e:
            return [str(e)]
        return [f"{r['node']}: {err}" for r in rows for err in r.get("errors", [])]

    def sample(self) -> dict:
        out = {}
        for r in self._srun("counters"):
            for iface, c in r["counters"].items():
                out[f"{r['node']}:{iface}"] = c
        return out


def node_action(action: str, cap: str, iface_spec: str, bandwidth: str | None, journal_spec: str | None) -> dict:
    """What `transit-launch netcap ACTION` does on one node (one task per node under srun)."""
    be = backend(cap)
    node = node_name()
    ifaces = ifaces_for_node(iface_spec, node)
    journal = Journal(journal_path(journal_spec))
    row = {"node": node, "ifaces": [str(i) for i in ifaces]}
    if action == "check":
        check_ready(be, ifaces, [parse_bandwidth(b) for b in (bandwidth or "1gbit").split(",")], journal, node)
    elif action == "apply":
        try:
            Capper(be, ifaces, journal).apply(parse_bandwidth(bandwidth or ""))
        except CapError as e:
            raise UsageError(f"{node}: {e}") from None
    elif action == "restore":
        done = restore_journal(journal)
        row["restored"] = [d for d in done if not d.startswith("ERROR")]
        row["errors"] = [d for d in done if d.startswith("ERROR")]
    elif action == "counters":
        row["counters"] = counters.sample(ifaces)
    return row
