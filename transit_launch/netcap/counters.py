"""Per-node traffic from NIC counters: psutil's per-NIC counters for netdevs (iproute2's
statistics inside a network namespace), and for RDMA devices
/sys/class/infiniband/DEV/ports/N/counters/port_{xmit,rcv}_data, which count 4-byte words."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from transit_launch.errors import UsageError
from transit_launch.netcap.backends import Iface

IB = Path("/sys/class/infiniband")


def _netdev(iface: Iface) -> tuple[int, int]:
    """(tx, rx) bytes; an interface that is not there is an error, not zero traffic."""
    missing = UsageError(f"--iface {iface}: no such network interface" + (f" in namespace {iface.netns}"
                                                                        if iface.netns else " on this node"))
    if iface.netns:
        res = subprocess.run(["ip", "-n", iface.netns, "-j", "-s", "link", "show", "dev", iface.name],
                             capture_output=True, text=True, timeout=10)
        if res.returncode != 0 or not res.stdout.strip():
            raise missing
        stats = json.loads(res.stdout)[0].get("stats64", {})
        return stats.get("tx", {}).get("bytes", 0), stats.get("rx", {}).get("bytes", 0)
    import psutil
    c = psutil.net_io_counters(pernic=True).get(iface.name)
    if c is None:
        raise missing
    return c.bytes_sent, c.bytes_recv


def rdma_devices(iface: Iface, root: Path = IB) -> list[Path]:
    """RDMA ports behind a netdev (RoCE): /sys/class/net/IFACE/device/infiniband/*."""
    dev = Path("/sys/class/net", iface.name, "device", "infiniband")
    names = [p.name for p in dev.iterdir()] if dev.is_dir() and not iface.netns else []
    return [port for n in names for port in sorted((root / n / "ports").glob("*"))]


def rdma_bytes(ports: list[Path]) -> tuple[int, int]:
    tx = rx = 0
    for port in ports:
        c = port / "counters"
        tx += 4 * int((c / "port_xmit_data").read_text())
        rx += 4 * int((c / "port_rcv_data").read_text())
    return tx, rx


def sample(ifaces: list[Iface]) -> dict:
    out = {}
    for i in ifaces:
        tx, rx = _netdev(i)
        rtx, rrx = rdma_bytes(rdma_devices(i))
        out[str(i)] = {"tx": tx, "rx": rx, "rdma_tx": rtx, "rdma_rx": rrx}
    return out


def delta(before: dict, after: dict) -> dict:
    return {k: {f: after[k][f] - before[k][f] for f in after[k]} for k in after if k in before}
