"""NIC bandwidth caps with guaranteed restore: mlnx_qos (ConnectX), dcb maxrate (iproute2)
and tc (a tbf root qdisc on any netdev), behind one interface: read the state, apply a
cap, restore exactly what was there.

Every change is journaled before it is made (a JSON file, fsync'ed), so that
`transit-launch sweep --restore` undoes a sweep that crashed. An interface may be named
NETNS/IFACE to reach a network namespace (`ip netns exec NETNS ...`)."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass

from transit_launch.errors import UsageError

RATE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(bit(/s)?)?\s*$", re.I)
# bytes, or tc's bps (bytes a second there, bits to most people): refused, with the bits
BYTES_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(bps|b/s|b|bytes?(/s)?)\s*$", re.IGNORECASE)
_SCALE = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_bandwidth(text: str, default_unit: str = "g") -> float:
    """'400' (Gbit/s by default), '100gbit', '1000mbit', '25G' -> bits per second (always bits)."""
    m = RATE_RE.match(str(text))
    b = None if m else BYTES_RE.match(str(text))
    if b:
        v, unit = float(b.group(1)), b.group(2).lower()
        raise UsageError(f"bandwidth {text!r}: bandwidths are bits a second, and {b.group(3)!r} reads as bytes "
                         f"(tc's mbps is megabytes a second): {fmt_rate(v * 8 * _SCALE[unit])} is {b.group(1)} "
                         f"{unit.upper()}B/s, {fmt_rate(v * _SCALE[unit])} is {b.group(1)} {unit.upper()}bit/s")
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
        if not self.netns:  # this namespace: asked of the kernel, so mlnx_qos needs no iproute2
            try:
                socket.if_nametoindex(self.name)
                return True
            except OSError:
                return False
        res = subprocess.run(self.wrap(["ip", "link", "show", "dev", self.name]), capture_output=True,
                             start_new_session=True)
        return res.returncode == 0


def run(cmd: list[str], what: str) -> str:
    # its own session: a Ctrl-C at the terminal goes to the sweep, which finishes the
    # restore it is in, instead of killing a tc or mlnx_qos half-way
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=30, start_new_session=True)
    if res.returncode != 0:
        msg = (res.stderr or res.stdout).strip().splitlines()
        raise CapError(f"{what}: {' '.join(cmd)} failed: {msg[-1] if msg else res.returncode}")
    return res.stdout


class CapError(Exception):
    """A cap could not be read, applied or restored (runtime, not bad input). nodes: under
    Slurm, what each node that failed said (node -> its message)."""

    def __init__(self, message: str, nodes: dict[str, str] | None = None):
        super().__init__(message)
        self.nodes = dict(nodes or {})


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
