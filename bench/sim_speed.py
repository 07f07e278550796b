"""The planner's latency and the simulator's speed as a user runs them: each command in a
fresh process, its wall time, the CPU seconds it used (user + system, from the kernel's
accounting of the child) and its peak resident memory, against the target each has.

    python3 bench/sim_speed.py [--only NAME,...] --out FILE.json
    python3 bench/sim_speed.py --report FILE.json    # the table bench/RESULTS.md shows
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import out_option  # noqa: E402 (bench/ is the script's folder: on sys.path)

SIM = ("simulate", "--synthetic", "1000000", "--seed", "1", "--quiet")
# name -> (the CLI's arguments, runs, target seconds of wall time, what it is)
COMMANDS = {
    "plan": (("plan", "--model", "llama3-70b"), 20, 2.0, "planner latency (median of the runs)"),
    "idle": (SIM + ("--reductions", "0"), 1, 60.0, "simulator, one million jobs, one scenario, idle"),
    "racks32": (SIM + ("--reductions", "0", "--racks", "32", "--load", "1.0"), 1, 60.0,
                "simulator, one million jobs, one scenario, 32 racks at load 1.0"),
    "congested": (("simulate", "--synthetic", "1000000", "--preset", "kalos", "--load", "1.2", "--racks", "32",
                   "--quiet", "--no-band", "--json"), 1, 60.0,
                  "simulator, one million jobs, three scenarios, Kalos at load 1.2 on 32 racks"),
}


def cli() -> list:
    exe = shutil.which("transit-launch")
    return [exe] if exe else [sys.executable, "-m", "transit_launch"]


def measure(args: tuple) -> dict:
    """One run: wall seconds, the CPU seconds and peak RSS (MB) of that child alone (wait4)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cli() + list(args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, use = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"sim_speed: {' '.join(args)} exited {proc.returncode}")
    return {"wall_s": wall, "cpu_s": use.ru_utime + use.ru_stime, "max_rss_mb": use.ru_maxrss / 1024}


def drive(a) -> list:
    rows = []
    for name in a.only.split(","):
        args, runs, target, what = COMMANDS[name]
        got = [measure(args) for _ in range(runs)]
        rows.append({"name": name, "what": what, "command": "transit-launch " + " ".join(args), "runs": runs,
                     "target_s": target, "wall_s": statistics.median(g["wall_s"] for g in got),
                     "wall_max_s": max(g["wall_s"] for g in got), "cpu_s": statistics.median(g["cpu_s"] for g in got),
                     "max_rss_mb": max(g["max_rss_mb"] for g in got)})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def report(d: dict) -> str:
    out = [f"{d['machine']}, {d['date']}, commit {d['commit']}:", "",
           "| what | command | wall s | CPU s | peak RSS MB | target (wall) |", "| --- | --- | --- | --- | --- | --- |"]
    for r in d["rows"]:
        met = "met" if r["wall_s"] < r["target_s"] else "**not met**"
        runs = f" (median of {r['runs']}, max {r['wall_max_s']:.3f})" if r["runs"] > 1 else ""
        out.append(f"| {r['what']} | `{r['command']}` | {r['wall_s']:.3f}{runs} | {r['cpu_s']:.1f} | "
                   f"{r['max_rss_mb']:.0f} | < {r['target_s']:g} s: {met} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(COMMANDS), help=f"comma list of {', '.join(COMMANDS)}")
    ap.add_argument("--report", help="print the table of a results file")
    out_option(ap, "sim_speed")
    a = ap.parse_args()
    if a.report:
        print(report(json.loads(Path(a.report).read_text())))
        return
    bad = [n for n in a.only.split(",") if n not in COMMANDS]
    if bad:
        ap.error(f"--only: no command named {', '.join(bad)} (the commands: {', '.join(COMMANDS)})")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent).stdout.strip() or "unknown"
    d = {"machine": f"{os.cpu_count()}-core {os.uname().machine} VM", "date": time.strftime("%Y-%m-%d"),
         "commit": commit, "rows": drive(a)}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(d, indent=1))
    print(report(d))


if __name__ == "__main__":
    main()
