"""Bandwidth sweeps: run the same job with NICs capped at each bandwidth, collect its
throughput and per-node traffic, and compute the sensitivity ratio of the paper's
section 4.2: rho(B1, B2) = throughput at B1 / throughput at B2 (1.0: insensitive).

Guarantee: whatever happens (the job fails, times out, Ctrl-C, SIGTERM from Slurm),
every cap applied is restored before the next bandwidth or the exit, the failure goes
into the report, and the other bandwidths still run unless --fail-fast."""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

from transit_launch.netcap import counters
from transit_launch.netcap.backends import CapError, fmt_rate
from transit_launch.netcap.capper import Capper
from transit_launch.table import table


class Interrupted(Exception):
    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def throughput(stdout: str, metric_regex: str | None) -> float | None:
    """From --metric-regex (median of its first group), else the example trainer's JSON
    lines (tokens per second of its median step)."""
    if metric_regex:
        vals = [float(m.group(1)) for m in re.finditer(metric_regex, stdout)]
        return statistics.median(vals) if vals else None
    for line in reversed(stdout.splitlines()):
        if line.startswith('{"summary"'):
            s = json.loads(line)["summary"]
            return s["tokens_per_step"] / s["median_step_time"]
    steps = [json.loads(l)["tokens_per_s"] for l in stdout.splitlines() if l.startswith('{"step"')]
    return statistics.median(steps[1:] or steps) if steps else None


@dataclass
class Run:
    bandwidth: float
    repeat: int
    rc: int | None = None
    throughput: float | None = None
    traffic: dict = field(default_factory=dict)
    failure: str | None = None
    seconds: float = 0.0
    node_failures: dict = field(default_factory=dict)  # under Slurm: node -> what it said when its cap failed


class Signals:
    """SIGINT and SIGTERM during a sweep. The first one interrupts the job's run, and only
    that: one that arrives while caps are applied or restored is noted and acted on once
    that is done; a second one makes the job's end a SIGKILL at once; none interrupts a
    restore."""

    HANDLED = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received: list[int] = []
        self.armed = False
        self.old = {}

    def __enter__(self):
        self.old = {s: signal.signal(s, self._on) for s in self.HANDLED}
        return self

    def __exit__(self, *exc):
        for s, h in self.old.items():
            signal.signal(s, h)

    def _on(self, signum, frame):
        self.received.append(signum)
        if self.armed:
            self.armed = False
            raise Interrupted(signum)

    def pending(self) -> None:
        """Raise the signal that came while it could not interrupt."""
        if self.received:
            raise Interrupted(self.received[0])


# The job's first process waits for the sweep's word before it becomes the job (exec, same
# process and group): its group is journaled before it can run, and a sweep killed before
# the word leaves a gate that exits instead of a job nobody recorded.
_GATE = """import os, sys
fd = int(sys.argv[1])
go = os.read(fd, 1)
os.close(fd)
if not go:
    os._exit(125)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as e:
    sys.stderr.write("cannot start %r: %s\\n" % (sys.argv[2], e.strerror or e))
    os._exit(127)
"""


def run_one(command: list[str], timeout: float | None, sig: Signals | None = None,
            started=None) -> tuple[int | None, str, str]:
    """Run the job in its own process group; whatever happens, the group is ended before
    this returns (started(pgid) and started(None) bracket its life)."""
    gate, go = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _GATE, str(gate), *command],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, pass_fds=(gate,))
    except OSError as e:
        os.close(go)
        return None, "", f"cannot start {command[0]!r}: {e.strerror or e}"
    finally:
        os.close(gate)
    force = (lambda: len(sig.received) > 1) if sig else None
    try:
        try:
            if started:
                started(proc.pid)  # journaled before the job runs: a sweep killed now leaves nothing unrecorded
            try:
                os.write(go, b"1")
            except BrokenPipeError:  # the gate is gone already; communicate collects why
                pass
        finally:
            os.close(go)
        try:
            if sig:
                sig.armed = True
                if sig.received:  # came in before it could interrupt
                    sig.pending()
            out, err = proc.communicate(timeout=timeout)
        finally:  # disarmed however it ends: a signal in stop_group below must not skip its SIGKILL
            if sig:
                sig.armed = False
        stop_group(proc, force)  # what the job left in its group
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        stop_group(proc, force)
        return None, "", f"timed out after {timeout} s"
    except BaseException:
        stop_group(proc, force)
        raise
    finally:
        if started:
            started(None)


# how long a SIGKILLed group may take to be gone (its members exit, init reaps the orphans);
# a bound so that a process stuck in the kernel cannot hold the restore forever
GROUP_EXIT_S = 10.0


def stop_group(proc: subprocess.Popen, force=None, grace: float = 10.0) -> None:
    """Stop a command started with start_new_session and everything it started: SIGTERM
    to its process group (Slurm's and torchrun's way), SIGKILL after grace seconds or as
    soon as force() says so; then SIGKILL to whatever is left in the group, and wait until
    the group is gone (a grandchild killed with it may still be exiting when its parent
    has been reaped: the restore must not begin under a job that still runs)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    end = time.time() + grace
    while proc.poll() is None and time.time() < end and not (force and force()):
        time.sleep(0.05)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    gone = time.time() + GROUP_EXIT_S
    while time.time() < gone:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.01)


def sweep(capper: Capper, bandwidths: list[float], command: list[str], repeat: int = 1,
          timeout: float | None = None, metric_regex: str | None = None, fail_fast: bool = False,
          log=sys.stderr) -> dict:
    runs: list[Run] = []
    restore_errors: list[str] = []
    interrupted = None
    total, n = len(bandwidths) * repeat, 0
    with Signals() as sig:
        try:
            for bw in bandwidths:
                for r in range(1, repeat + 1):
                    sig.pending()
                    n += 1
                    run = Run(bw, r)
                    runs.append(run)
                    print(f"sweep: [{n}/{total}] {fmt_rate(bw)}/s, run {r}/{repeat}", file=log, flush=True)
                    t0 = time.time()
                    try:
                        capper.apply(bw)
                        before = capper.sample()
                        run.rc, out, err = run_one(command, timeout, sig, capper.job_started)
                        run.traffic = counters.delta(before, capper.sample())
                        run.throughput = throughput(out, metric_regex)
                        if run.rc != 0:  # None: it did not finish, or did not start (err says which)
                            tail = err.strip().splitlines()[-1:] if err.strip() else []
                            run.failure = ": ".join(([] if run.rc is None else [f"exit {run.rc}"]) + tail) or "no exit"
                        elif run.throughput is None:
                            run.failure = "no throughput in the job's output"
                    except CapError as e:
                        run.failure, run.node_failures = str(e), e.nodes
                    finally:
                        run.seconds = round(time.time() - t0, 2)
                        restore_errors += capper.restore()
                    if run.failure:
                        print(f"sweep: {fmt_rate(bw)}/s run {r} failed: {run.failure}", file=log, flush=True)
                        if fail_fast:
                            raise StopIteration
            sig.pending()
        except StopIteration:
            pass
        except Interrupted as e:
            interrupted = e
            if runs and not runs[-1].failure:
                runs[-1].failure = f"interrupted by {e}"
        finally:
            restore_errors += capper.restore()
    report = summarize(runs, bandwidths)
    report["restore_errors"] = restore_errors
    report["interrupted"] = str(interrupted) if interrupted else None
    report["cap"] = capper.be.name
    report["ifaces"] = capper.names()
    return report


def summarize(runs: list[Run], bandwidths: list[float]) -> dict:
    per_bw = []
    for bw in bandwidths:
        rs = [r for r in runs if r.bandwidth == bw]
        good = [r.throughput for r in rs if r.throughput is not None and not r.failure]
        med = statistics.median(good) if good else None
        traffic = {}
        for r in rs:
            if r.failure:
                continue
            for iface, c in r.traffic.items():
                t = traffic.setdefault(iface, {"tx": [], "rx": []})
                t["tx"].append(c["tx"] + c.get("rdma_tx", 0))
                t["rx"].append(c["rx"] + c.get("rdma_rx", 0))
        per_bw.append({
            "bandwidth_bps": bw, "bandwidth": fmt_rate(bw), "runs": len(rs), "ok": len(good),
            "throughput_median": med,
            "throughput_spread": (max(good) - min(good)) / med if good and med else None,
            "traffic_bytes": {i: {"tx": statistics.median(v["tx"]), "rx": statistics.median(v["rx"])}
                              for i, v in traffic.items()},
            "failures": [f"run {r.repeat}: {r.failure}" for r in rs if r.failure],
        })
    rho = []
    for i, a in enumerate(per_bw):
        for b in per_bw[i + 1:]:
            hi, lo = (a, b) if a["bandwidth_bps"] >= b["bandwidth_bps"] else (b, a)
            if hi["throughput_median"] and lo["throughput_median"]:
                rho.append({"b1": hi["bandwidth"], "b2": lo["bandwidth"],
                            "rho": round(hi["throughput_median"] / lo["throughput_median"], 3)})
    return {"bandwidths": per_bw, "rho": rho,
            "runs": [r.__dict__ for r in runs]}


def failures_cell(runs: list[dict]) -> str:
    """One bandwidth's failed runs for the table: each distinct message once, after the runs
    that ended with it ("run 2: ...", "runs 1, 3: ...", "all 3 runs: ..."); distinct ones
    apart by " | ". --json keeps every run's own (and under Slurm each node's)."""
    by_message: dict[str, list[int]] = {}
    for r in runs:
        if r["failure"]:
            by_message.setdefault(r["failure"], []).append(r["repeat"])
    cells = []
    for message, repeats in by_message.items():
        who = (f"all {len(runs)} runs" if len(repeats) == len(runs) > 1 else
               f"run{'s' if len(repeats) > 1 else ''} {', '.join(map(str, repeats))}")
        cells.append(f"{who}: {message}")
    return " | ".join(cells)


def text(report: dict) -> str:
    rows = []
    for b in report["bandwidths"]:
        traffic = sum(v["tx"] + v["rx"] for v in b["traffic_bytes"].values())
        rows.append([b["bandwidth"], f"{b['ok']}/{b['runs']}",
                     f"{b['throughput_median']:.1f}" if b["throughput_median"] else "-",
                     f"{b['throughput_spread']:.1%}" if b["throughput_spread"] is not None else "-",
                     f"{traffic / 1e6:.1f}",
                     failures_cell([r for r in report["runs"] if r["bandwidth"] == b["bandwidth_bps"]])])
    out = [f"cap: {report['cap']} on {', '.join(report['ifaces'])}",
           table(["bandwidth", "ok", "throughput", "spread", "traffic MB (tx+rx, all ifaces)", "failures"], rows,
                 "lrrrrl")]
    if report["rho"]:
        out += ["", table(["B1", "B2", "rho(B1, B2)"], [[r["b1"], r["b2"], f"{r['rho']:.2f}"] for r in report["rho"]],
                          "llr")]
    if report["restore_errors"]:
        out += ["", "RESTORE ERRORS (run `transit-launch sweep --restore`): " + "; ".join(report["restore_errors"])]
    if report["interrupted"]:  # a restore is claimed only when every one was confirmed
        out += ["", f"interrupted by {report['interrupted']}; "
                    + ("NOT every cap was restored (above)" if report["restore_errors"] else "every cap was restored")]
    out += ["", "throughput: the job's metric (tokens/s for the example trainer), median over repeats; "
                "rho = throughput at B1 / at B2."]
    return "\n".join(out)


def plot(report: dict, path: str) -> None:
    from transit_launch.output_files import require_matplotlib, save_figure
    plt = require_matplotlib("--plot")
    bws = report["bandwidths"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar([b["bandwidth"] for b in bws], [b["throughput_median"] or 0 for b in bws])
    ax.set_ylabel("throughput")
    ax.set_title(", ".join(f"rho({r['b1']},{r['b2']})={r['rho']:.2f}" for r in report["rho"]) or "sweep")
    save_figure(fig, path, dpi=120)  # written atomically: a failed write leaves no partial file
