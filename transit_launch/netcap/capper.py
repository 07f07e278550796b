"""Applying NIC caps on this machine (Capper) or on every node of a Slurm allocation
(SlurmCapper), and the per-node helper `transit-launch netcap` that SlurmCapper runs.

Under Slurm the caps of one bandwidth are held by one step with a task per node
(`netcap hold`): each task applies its node's caps, reports, and restores them when its
stdin closes (the sweep is done with that bandwidth) or when its step is signalled
(scancel, the end of the job). A node's caps so live no longer than the task that holds
them, whatever happens to the sweep; only a SIGKILL before its restore leaves them, and
the node's journal for `sweep --restore`."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

from transit_launch.errors import UsageError
from transit_launch.isolated import SRUN_CHDIR, transit_launch_argv
from transit_launch.netcap import counters
from transit_launch.netcap.backends import Backend, CapError, Iface, backend, parse_bandwidth
from transit_launch.netcap.journal import Journal, node_name, open_journal, restore_journal
from transit_launch.units import n_nodes


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

    def job_started(self, pgid: int | None) -> None:
        """The job's process group goes into the journal while it runs (None: it ended),
        so that `sweep --restore` can end a job whose sweep was killed."""
        self.journal.set_job(pgid)

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
            except (CapError, StopIteration, OSError, subprocess.SubprocessError, UsageError) as e:
                errors.append(f"{iface}: {e}")
        try:
            left = self.journal.entries()
        except UsageError as e:
            return errors + [str(e)]
        self.applied = [i for i in self.applied if any(e["iface"] == str(i) for e in left)]
        return errors


def check_ready(be: Backend, ifaces: list, bws: list[float], journal: Journal, node: str | None = None) -> None:
    """Before anything is changed: every interface takes the caps, and no earlier sweep left
    caps here (node: the name said in a per-node helper's message)."""
    journal.check()  # first: it needs no tool, and a --journal typo is the likelier mistake
    for i in ifaces:
        be.check(i, bws)
    if journal.entries():
        where, there = (f"{node}: ", " there") if node else ("", "")
        raise UsageError(f"{where}a previous sweep left caps in {journal.path}: run `transit-launch sweep "
                         f"--restore`{there} first")


def by_nodes(said: dict[str, str], nodes: int, names: int = 4) -> str:
    """What failing nodes said, each message once after the nodes that said it: "all 4
    nodes: ...", "n1, n3: ...; n2: ..." (up to `names` names, then how many more)."""
    groups: dict[str, list[str]] = {}
    for node in sorted(said, key=lambda n: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", n)]):
        groups.setdefault(said[node], []).append(node)
    out = []
    for msg, who in groups.items():
        if len(who) == nodes > 1:
            out.append(f"all {nodes} nodes: {msg}")
        else:
            more = f" and {len(who) - names} more" if len(who) > names else ""
            out.append(f"{', '.join(who[:names])}{more}: {msg}")
    return "; ".join(out)


ERROR = "transit-launch: error: "  # how the per-node helper's refusals start (cli.main)


class SlurmCapper:
    """The same on every node of a Slurm allocation: one task per node runs
    `transit-launch netcap ...` there (srun --overlap, inside the job's allocation); each
    node keeps its own journal."""

    APPLY_TIMEOUT = 120
    RESTORE_TIMEOUT = 60

    def __init__(self, be: Backend, iface_spec: str, journal_spec: str | None):
        # the helpers run from / (below): a relative --journal is the caller's
        self.be, self.spec = be, iface_spec
        self.journal_spec = os.path.abspath(journal_spec) if journal_spec else None
        self.nodes = int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 1)
        self.ifaces = []
        self.hold: subprocess.Popen | None = None
        self.lines: queue.Queue = queue.Queue()
        self.done: list[dict] = []  # the holding step's rows that reported a restore already
        self.ended = False  # the holding step's output has ended: no row comes any more

    def names(self) -> list[str]:
        return [f"{self.spec} on {n_nodes(self.nodes)}"]

    def job_started(self, pgid: int | None) -> None:
        """The job runs in this batch step: Slurm ends it with the job."""

    def _cmd(self, *args: str) -> list[str]:
        """The helper step: root on every node, so this installation's Python isolated from
        the caller's directory, run from / (isolated.py)."""
        cmd = ["srun", "--overlap", f"--nodes={self.nodes}", f"--ntasks={self.nodes}", "--ntasks-per-node=1",
               SRUN_CHDIR, *transit_launch_argv("netcap", *args, "--cap", self.be.name, "--iface", self.spec)]
        return cmd + (["--journal", self.journal_spec] if self.journal_spec else [])

    def _srun(self, *args: str) -> list[dict]:
        res = subprocess.run(self._cmd(*args), capture_output=True, text=True, timeout=120)
        rows = [json.loads(l) for l in res.stdout.splitlines() if l.startswith("{")]
        if res.returncode != 0 or len(rows) != self.nodes:
            lines = res.stderr.strip().splitlines()
            # the helpers' own one-line errors (each once: the nodes often say the same), not
            # srun's "task 1: Exited with exit code 2" after them
            said = list(dict.fromkeys(ln.removeprefix(ERROR) for ln in lines if ln.startswith(ERROR)))
            msg = "; ".join(said) or (lines or [f"exit {res.returncode}"])[-1]
            raise CapError(f"netcap {args[0]} on the allocation's nodes failed: {msg}")
        return rows

    def check(self, bws: list[float]) -> None:
        """check_ready on every node, before anything is changed: refused like bad input here
        (one line, exit 2), with what the nodes said."""
        try:
            self._srun("check", "--bandwidth", ",".join(f"{int(b)}bit" for b in bws))
        except CapError as e:
            raise UsageError(str(e)) from None

    def _rows(self, want: int, timeout: float) -> list[dict]:
        """Up to `want` JSON rows of the holding step, within timeout seconds; none once its
        output has ended (a later call would otherwise wait out its whole timeout)."""
        rows, end = [], time.time() + timeout
        while len(rows) < want and not self.ended:
            try:
                line = self.lines.get(timeout=max(0.0, end - time.time()))
            except queue.Empty:
                break
            if line is None:  # the step ended
                self.ended = True
                break
            if line.startswith("{"):
                rows.append(json.loads(line))
        return rows

    def apply(self, bps: float) -> None:
        """Start the step that holds this bandwidth's caps on every node; returns once every
        node has applied them (CapError otherwise: restore() still releases what was held)."""
        proc = subprocess.Popen(self._cmd("hold", "--bandwidth", f"{int(bps)}bit"), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.hold, self.lines, self.err, self.ended = proc, queue.Queue(), [], False
        lines = self.lines

        def pump(stream, sink):
            for line in stream:
                sink(line.strip())
            if stream is proc.stdout:
                lines.put(None)

        for stream, sink in ((proc.stdout, lines.put), (proc.stderr, self.err.append)):
            threading.Thread(target=pump, args=(stream, sink), daemon=True).start()
        rows = self._rows(self.nodes, self.APPLY_TIMEOUT)
        # a node that failed has restored already: its one row says so (restore() counts it)
        self.done = [r for r in rows if "restored" in r]
        failed = {r["node"]: r["error"] for r in rows if r.get("error")}
        if failed or len(rows) < self.nodes:
            raise CapError(by_nodes(failed, self.nodes) or f"netcap hold: {len(rows)} of {self.nodes} nodes applied "
                           "the cap" + (f" ({self.err[-1]})" if self.err else ""), failed)

    def restore(self) -> list[str]:
        """Release the holding step (its tasks restore their nodes) and check that every
        node says it restored; a node that does not say so is an error, never assumed."""
        if self.hold is None:
            return []
        proc, self.hold = self.hold, None
        try:
            proc.stdin.close()
        except OSError:
            pass
        rows, self.done = self.done, []
        rows += self._rows(self.nodes - len(rows), self.RESTORE_TIMEOUT)
        if len(rows) < self.nodes and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # srun passes it to the tasks, which restore on it
            rows += self._rows(self.nodes - len(rows), 20)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        errors = [f"{r['node']}: {e}" for r in rows for e in r.get("errors", [])]
        said = {r["node"] for r in rows if "restored" in r}
        if len(said) < self.nodes:
            why = self.err[-1] if self.err else f"srun exit {proc.returncode}"
            errors.append(f"{self.nodes - len(said)} of {self.nodes} nodes did not confirm their restore "
                          f"({why}); their journals are left for `transit-launch sweep --restore`")
        return errors

    def sample(self) -> dict:
        out = {}
        for r in self._srun("counters"):
            for iface, c in r["counters"].items():
                out[f"{r['node']}:{iface}"] = c
        return out


class _Release(Exception):
    pass


def hold(be: Backend, ifaces: list[Iface], journal: Journal, bps: float, node: str) -> int:
    """`netcap hold`: apply, report, wait for stdin to close or a signal, restore, report.
    Only the wait can be interrupted: a signal during the apply skips the wait, signals
    during the restore are counted, not acted on."""
    signals: list[int] = []
    waiting = [False]

    def release(signum, frame):
        signals.append(signum)
        if waiting[0]:
            waiting[0] = False
            raise _Release

    handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
    old = {s: signal.signal(s, release) for s in handled}
    cap = Capper(be, ifaces, journal)
    row: dict = {"node": node}
    try:
        try:
            cap.apply(bps)
            print(json.dumps({"node": node, "applied": [str(i) for i in ifaces]}), flush=True)
            waiting[0] = True
            if not signals:
                sys.stdin.buffer.read()  # until the sweep closes it
        except _Release:
            pass
        except (CapError, UsageError, OSError) as e:
            row["error"] = str(e)
        finally:
            waiting[0] = False
        row["errors"] = cap.restore()
        row["restored"] = [str(i) for i in ifaces if i not in cap.applied]
        if signals:
            row["signal"] = signal.Signals(signals[0]).name
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    try:
        print(json.dumps(row), flush=True)
    except OSError:
        pass  # the sweep is gone; the journal says what is left
    return 1 if row.get("error") or row["errors"] else 0


def node_action(action: str, cap: str, iface_spec: str, bandwidth: str | None, journal_spec: str | None) -> dict:
    """What `transit-launch netcap ACTION` does on one node (one task per node under srun)."""
    be = backend(cap)
    node = node_name()
    ifaces = ifaces_for_node(iface_spec, node)
    journal = open_journal(journal_spec)
    row = {"node": node, "ifaces": [str(i) for i in ifaces]}
    if action == "check":
        check_ready(be, ifaces, [parse_bandwidth(b) for b in (bandwidth or "1gbit").split(",")], journal, node)
    elif action == "restore":
        done = restore_journal(journal)
        row["restored"] = [d for d in done if not d.startswith("ERROR")]
        row["errors"] = [d for d in done if d.startswith("ERROR")]
    elif action == "counters":
        row["counters"] = counters.sample(ifaces)
    return row
