"""`sweep` (NIC caps, rho) and `netcap` (the per-node helper sweeps run under Slurm)."""

from __future__ import annotations

import json
import os

from transit_launch.argtypes import check_program, nonneg_float, output_file, positive_int
from transit_launch.errors import UsageError
from transit_launch.output_files import require_matplotlib
from transit_launch.netcap.backends import BACKENDS

DEFAULT_CAP = "tc"


def cmd_sweep(a, command):
    from transit_launch.netcap import backends, capper, journal as jn, sweep
    if a.restore:  # every journal the spec names: with %n (the default), each node's
        unused = [flag for flag, v in _sweep_only(a) if v] + (["a command after --"] if command else [])
        if unused:  # they would be ignored: --restore replays the journal, it runs no sweep
            raise UsageError(f"--restore only undoes the caps the journal records (it takes --journal); "
                             f"{', '.join(unused)} would do nothing with it")
        parent = os.path.dirname(a.journal or "") or "."
        if a.journal and "%n" not in parent and not os.path.isdir(parent):  # a typo: no sweep writes there
            raise UsageError(f"--journal {a.journal}: directory {parent} does not exist, so no sweep left a journal "
                             "there (a sweep refuses such a --journal)")
        done = [line for path in jn.journal_paths(a.journal) for line in jn.restore_journal(jn.Journal(path))]
        for line in done or ["nothing to restore"]:
            print(line)
        return 1 if any(line.startswith("ERROR") for line in done) else 0
    journal = jn.open_journal(a.journal)
    if not command:
        raise UsageError("sweep needs the job after --, e.g. -- python examples/train_llama.py --device cpu")
    if not a.bandwidths or not a.iface:
        raise UsageError("sweep needs --bandwidths and --iface")
    check_program(command)  # a job that cannot start would fail every run, each under a cap
    if a.plot:
        require_matplotlib("--plot")
    bws = [backends.parse_bandwidth(b) for b in a.bandwidths.split(",") if b.strip()]
    if len(set(bws)) < len(bws):
        raise UsageError("--bandwidths lists a bandwidth twice")
    be = backends.backend(a.cap or DEFAULT_CAP)
    if a.metric_regex:
        import re
        try:
            groups = re.compile(a.metric_regex).groups
        except re.error as e:
            raise UsageError(f"--metric-regex: {e}") from None
        if groups < 1:
            raise UsageError("--metric-regex needs one group that captures the number")
    slurm_mode = a.slurm or int(os.environ.get("SLURM_JOB_NUM_NODES") or 0) > 1
    if slurm_mode:
        if not os.environ.get("SLURM_JOB_ID"):
            raise UsageError("--slurm runs inside a Slurm allocation (sbatch/salloc)")
        cap = capper.SlurmCapper(be, a.iface, a.journal)
        cap.check(bws)
    else:
        ifaces = capper.ifaces_for_node(a.iface, jn.node_name())
        if not ifaces:
            raise UsageError(f"--iface {a.iface}: no interface for this node ({jn.node_name()})")
        capper.check_ready(be, ifaces, bws, journal)
        cap = capper.Capper(be, ifaces, journal)
    report = sweep.sweep(cap, bws, command, a.repeat or 1, a.timeout, a.metric_regex, a.fail_fast)
    if a.plot:
        sweep.plot(report, a.plot)
    print(json.dumps(report, indent=2) if a.json else sweep.text(report))
    if report["interrupted"]:
        return 130
    # 1: a cap left behind, a bandwidth without one good run (it has no throughput), or no rho
    measured = all(b["ok"] for b in report["bandwidths"])
    return 1 if report["restore_errors"] or not measured or not report["rho"] and len(bws) > 1 else 0


def _sweep_only(a) -> list[tuple[str, object]]:
    """(flag, whether it was given) of the options that only a sweep uses."""
    return [("--bandwidths", a.bandwidths), ("--cap", a.cap is not None), ("--iface", a.iface),
            ("--repeat", a.repeat is not None), ("--timeout", a.timeout is not None),
            ("--metric-regex", a.metric_regex), ("--fail-fast", a.fail_fast), ("--slurm", a.slurm),
            ("--plot", a.plot), ("--json", a.json)]


def cmd_netcap(a, command):
    """The per-node helper of sweeps under Slurm: JSON lines."""
    from transit_launch.netcap import backends, capper, journal as jn
    if a.action == "hold":
        node = jn.node_name()
        return capper.hold(backends.backend(a.cap), capper.ifaces_for_node(a.iface, node),
                           jn.open_journal(a.journal), backends.parse_bandwidth(a.bandwidth or ""), node)
    print(json.dumps(capper.node_action(a.action, a.cap, a.iface, a.bandwidth, a.journal)))
    return 0


def register(sub):
    sp = sub.add_parser("sweep", help="run a job under NIC bandwidth caps and compute rho",
                        usage="transit-launch sweep --bandwidths 400,100 --cap tc --iface IFACE -- COMMAND...")
    sp.add_argument("--bandwidths", help="comma-separated bits a second, Gbit/s unless a unit is given (400,100 or "
                                         "1000mbit,100mbit; not bytes: 100MBps is refused)")
    # --cap and --repeat default to None, so that --restore can tell they were given
    sp.add_argument("--cap", choices=tuple(BACKENDS), help=f"how the NICs are capped (default {DEFAULT_CAP})")
    sp.add_argument("--iface", help="IFACE[,IFACE...]; NETNS/IFACE for an interface inside a network namespace")
    sp.add_argument("--repeat", type=positive_int(), help="runs at each bandwidth (default 1)")
    sp.add_argument("--timeout", type=nonneg_float, help="seconds one run may take")
    sp.add_argument("--metric-regex", help="throughput from the job's stdout: a regex whose first group is the number")
    sp.add_argument("--fail-fast", action="store_true", help="stop at the first failed run")
    sp.add_argument("--journal", help="restore journal, %%n = node name "
                                      "(default ~/.local/state/transit-launch/netcap-NODE.json)")
    sp.add_argument("--restore", action="store_true", help="undo the caps a crashed sweep left, then exit")
    sp.add_argument("--slurm", action="store_true",
                    help="cap every node of the Slurm allocation (default when the allocation has several nodes)")
    sp.add_argument("--plot", type=output_file((".png",)), metavar="FILE.png",
                    help="also draw the throughput at each bandwidth (needs matplotlib)")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(func=cmd_sweep, takes_command=True)

    sp = sub.add_parser("netcap", help="per-node cap helper that sweeps run under Slurm")
    sp.add_argument("action", choices=("check", "hold", "restore", "counters"),
                    help="check: would the caps apply; hold: apply, wait for stdin to close, restore; restore: "
                         "replay this node's journal; counters: the interfaces' traffic counters")
    sp.add_argument("--cap", choices=tuple(BACKENDS), required=True, help="how the NICs are capped")
    sp.add_argument("--iface", required=True, help="IFACE[,IFACE...]; NODE=IFACE for one node only")
    sp.add_argument("--bandwidth", help="check and hold: the cap, e.g. 100gbit (check: comma-separated)")
    sp.add_argument("--journal", help="restore journal, %%n = node name (default as in sweep)")
    sp.set_defaults(func=cmd_netcap)
