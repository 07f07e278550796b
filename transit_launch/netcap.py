"""NIC bandwidth caps with guaranteed restore: mlnx_qos (ConnectX), dcb maxrate (iproute2)
and tc (a tbf root qdisc on any netdev), behind one interface: read the state, apply a
cap, restore exactly what was there.

Every change is journaled before it is made (a JSON file, fsync'ed), so that
`transit-launch sweep --restore` undoes a sweep that crashed. An interface may be named
NETNS/IFACE to reach a network namespace (`ip netns exec NETNS ...`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from transit_launch.errors import UsageError

RATE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(bit|bps)?\s*$", re.I)
_SCALE = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_bandwidth(text: str, default_unit: str = "g") -> float:
    """'400' (Gbit/s by default), '100gbit', '1000mbit', '25G' -> bits per second (always bits)."""
    m = RATE_RE.match(str(text))
    if not m:
        raise UsageError(f"bandwidth {text!r} is not a number with an optional unit (400, 100gbit, 1000mbit)")
    value = float(m.group(1))
    unit = m.group(2).lower() if (m.group(2) or m.group(3)) else default_unit
    bps = value * _SCALE[unit]
    if bps <= 0:
        raise UsageError(f"bandwidth {text!r} must be positive")
    return bps


def fmt_rate(bps: float) -> str:
    for unit, scale in (("Gbit", 1e9), ("Mbit", 1e6), ("Kbit", 1e3)):
        if bps >= scale and (bps / scale).is_integer():
            return f"{int(bps / scale)}{unit}"
    return f"{int(bps)}bit"


@dataclass(frozen=True)
class Iface:
    name: str
    netns: str | None = None

    @classmethod
    def parse(cls, spec: str) -> "Iface":
        ns, _, name = spec.rpartition("/")
        if not name or not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", name):
            raise UsageError(f"interface {spec!r} is not a valid name (IFACE or NETNS/IFACE)")
        return cls(name, ns or None)

    def __str__(self):
        return f"{self.netns}/{self.name}" if self.netns else self.name

    def wrap(self, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *cmd] if self.netns else cmd

    def exists(self) -> bool:
        res = subprocess.run(self.wrap(["ip", "link", "show", "dev", self.name]), capture_output=True)
        return res.returncode == 0


def run(cmd: list[str], what: str) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        msg = (res.stderr or res.stdout).strip().splitlines()
        raise CapError(f"{what}: {' '.join(cmd)} failed: {msg[-1] if msg else res.returncode}")
    return res.stdout


class CapError(Exception):
    """A cap could not be read, applied or restored (runtime, not bad input)."""


class Backend:
    name = ""
    tool = ""

    def check(self, iface: Iface, bps: list[float]) -> None:
        """Refuse before anything is changed."""
        if not shutil.which(self.tool):
            raise UsageError(f"--cap {self.name} needs `{self.tool}` on PATH")
        if iface.netns and not shutil.which("ip"):
            raise UsageError("network namespaces need `ip` (iproute2)")
        if not iface.exists():
            raise UsageError(f"unknown interface {iface}")

    def read(self, iface: Iface) -> dict: ...
    def apply(self, iface: Iface, bps: float) -> None: ...
    def restore(self, iface: Iface, state: dict) -> None: ...


class MlnxQos(Backend):
    """mlnx_qos -i IFACE prints 'tc: N ratelimit: X Gbps' (or 'unlimited') per traffic
    class; -r r0,...,r7 sets eight integers in Gbps, 0 = unlimited."""
    name, tool = "mlnx_qos", "mlnx_qos"
    _TC = re.compile(r"tc:\s*(\d)\s+ratelimit:\s*(unlimited|[0-9.]+\s*[GM]bps)", re.I)

    def check(self, iface, bps):
        super().check(iface, bps)
        bad = [b for b in bps if b < 1e9 or not (b / 1e9).is_integer()]
        if bad:
            raise UsageError(f"mlnx_qos caps whole Gbit/s: {fmt_rate(bad[0])} is not one")

    def read(self, iface):
        out = run(iface.wrap(["mlnx_qos", "-i", iface.name]), "reading mlnx_qos")
        rates = [0] * 8
        found = 0
        for tc, val in self._TC.findall(out):
            v = val.lower()
            rates[int(tc)] = 0 if v == "unlimited" else round(float(v[:-4].strip()) / (1000 if "mbps" in v else 1))
            found += 1
        if not found:
            raise CapError(f"mlnx_qos -i {iface.name}: no 'tc: N ratelimit:' lines in its output")
        return {"rates_gbps": rates}

    def _set(self, iface, rates):
        run(iface.wrap(["mlnx_qos", "-i", iface.name, "-r", ",".join(str(r) for r in rates)]), "setting mlnx_qos")

    def apply(self, iface, bps):
        self._set(iface, [int(bps / 1e9)] * 8)

    def restore(self, iface, state):
        self._set(iface, state["rates_gbps"])


class Dcb(Backend):
    """dcb maxrate show dev IFACE -> 'tc-maxrate 0:25Gbit 1:25Gbit ...'; set takes the
    same TC:RATE pairs (0bit = unlimited)."""
    name, tool = "dcb", "dcb"

    def read(self, iface):
        out = run(iface.wrap(["dcb", "maxrate", "show", "dev", iface.name]), "reading dcb maxrate")
        pairs = re.findall(r"(\d):(\S+)", out.split("tc-maxrate", 1)[-1])
        if len(pairs) != 8:
            raise CapError(f"dcb maxrate show dev {iface.name}: expected 8 tc-maxrate entries, got {out.strip()!r}")
        return {"tc_maxrate": [rate for _, rate in sorted(pairs)]}

    def _set(self, iface, rates):
        run(iface.wrap(["dcb", "maxrate", "set", "dev", iface.name, "tc-maxrate",
                        *(f"{i}:{r}" for i, r in enumerate(rates))]), "setting dcb maxrate")

    def apply(self, iface, bps):
        self._set(iface, [fmt_rate(bps)] * 8)

    def restore(self, iface, state):
        self._set(iface, state["tc_maxrate"])


class Tc(Backend):
    """A tbf root qdisc (egress) under our handle. Restore deletes only what we added; the
    kernel's default root qdisc (handle 0:) comes back by itself. A custom root qdisc that
    someone configured is refused: tc cannot rebuild its tree from what it shows."""
    name, tool = "tc", "tc"
    HANDLE = "7a5:"  # ours: 0x7a5, unlikely to clash with a site's own

    def _root(self, iface):
        out = run(iface.wrap(["tc", "-j", "qdisc", "show", "dev", iface.name]), "reading tc qdiscs")
        qdiscs = json.loads(out or "[]")
        return next((q for q in qdiscs if q.get("root")), None)

    def check(self, iface, bps):
        super().check(iface, bps)
        root = self._root(iface)
        if root and root.get("handle") not in ("0:", self.HANDLE):
            raise UsageError(f"{iface} has a configured root qdisc ({root.get('kind')} {root.get('handle')}); "
                             "tc cannot restore it after a sweep: remove it or use --cap mlnx_qos/dcb")

    def read(self, iface):
        root = self._root(iface)
        return {"root": {"kind": root.get("kind"), "handle": root.get("handle")} if root else None}

    def apply(self, iface, bps):
        # burst: at least one MTU-sized packet per timer tick, 1 ms of traffic otherwise
        burst = max(32 * 1024, int(bps / 8 / 1000))
        run(iface.wrap(["tc", "qdisc", "replace", "dev", iface.name, "root", "handle", self.HANDLE, "tbf",
                        "rate", fmt_rate(bps), "burst", str(burst), "latency", "100ms"]), "setting tc tbf")

    def restore(self, iface, state):
        root = self._root(iface)
        if root and root.get("handle") == self.HANDLE:
            run(iface.wrap(["tc", "qdisc", "del", "dev", iface.name, "root"]), "removing tc tbf")


BACKENDS = {b.name: b for b in (MlnxQos(), Dcb(), Tc())}


def backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise UsageError(f"unknown cap backend {name!r}; known: {', '.join(BACKENDS)}")
    return BACKENDS[name]


# --- the restore journal ----------------------------------------------------------

def node_name() -> str:
    """Slurm's name for this node inside a job step (several slurmd may share a host)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def default_journal() -> Path:
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "transit-launch" / f"netcap-{node_name()}.json"


def journal_path(spec: str | None) -> Path:
    """--journal PATH ('%n' becomes the node name), or the per-node default."""
    return Path(spec.replace("%n", node_name())) if spec else default_journal()


def ifaces_for_node(spec: str, node: str | None = None) -> list[Iface]:
    """IFACE[,IFACE...]; an entry NODE=IFACE applies only on that Slurm node."""
    out = []
    for item in (x.strip() for x in spec.split(",") if x.strip()):
        target, sep, name = item.rpartition("=")
        if sep and node is not None and target != node:
            continue
        out.append(Iface.parse(name if sep else item))
    return out


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


class Capper:
    """Applies caps on a set of interfaces of this machine and restores all of them,
    whatever happens."""

    def __init__(self, be: Backend, ifaces: list[Iface], journal: Journal):
        self.be, self.ifaces, self.journal = be, ifaces, journal
        self.applied: list[Iface] = []

    def names(self) -> list[str]:
        return [str(i) for i in self.ifaces]

    def sample(self) -> dict:
        from transit_launch import counters
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
    from transit_launch import counters
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
