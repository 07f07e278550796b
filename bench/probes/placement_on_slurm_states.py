"""Probe: does `Cluster.place(..., "tree")` choose the nodes Slurm 22.05 chose, on the states
Slurm itself was in? (issue 54)

    python3 bench/probes/placement_on_slurm_states.py RUN.json     # a replay with Slurm's nodes

A recorded replay (bench/sim_vs_slurm.py's --json format with `nodes`, recorded since
2026-12-07) is played back on a Cluster in Slurm's own order (by recorded second: ends first,
then starts in job order), each job on the nodes Slurm gave it; before each start the
placement rules are asked where they would put the job on that state, and their answer is
compared with Slurm's. A start at once (within 1 s of its submission) met no reservation; a
later one may have been placed by backfill off nodes reserved for others, which this does not
know. A disagreement is tried again without the nodes on which a job ended in that same
second: Slurm's select (src/slurmctld/node_scheduler.c, _pick_best_nodes) leaves a COMPLETING
node (cg_node_bitmap: a job on it ended, its epilog not done) out of a shared job's
candidates and out of an exclusive one's (not idle), where the simulator frees a job's GPUs
at its end."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from transit_launch.sim.cluster import Cluster  # noqa: E402
from transit_launch.sim.scheduler import demand  # noqa: E402

RACKS, RACK_GPUS, GPN = 4, 32, 8  # bench/sim_vs_slurm.py's lab


def check(path: str, rules=("tree", "pack")) -> dict:
    d = json.loads(Path(path).read_text())
    s, gpus = d["slurm"], d["trace"][2]
    if not s.get("nodes"):
        raise SystemExit(f"{path}: no nodes recorded (replays record them since 2026-12-07)")
    n_jobs = len(gpus)
    events = sorted([(s["end"][i], 0, i) for i in range(n_jobs)] + [(s["start"][i], 1, i) for i in range(n_jobs)])
    held = {}  # job -> [(node, GPUs)] as Slurm gave it
    out = {r: {"at_once": [0, 0], "later": [0, 0], "completing_explains": 0} for r in rules}
    cases = []
    for t, kind, i in events:
        if kind == 0:
            held.pop(i)
            continue
        n, g = demand(gpus[i], GPN)
        want = sorted(s["nodes"][i])
        ended_now = {k for j in range(n_jobs) if s["end"][j] == t and j not in held for k in s["nodes"][j]}
        key = "at_once" if s["start"][i] - s["submit"][i] <= 1 else "later"
        for rule in rules:
            got = _place(held, n, g, rule, ())
            out[rule][key][1] += 1
            if got == want:
                out[rule][key][0] += 1
                continue
            again = _place(held, n, g, rule, ended_now) if ended_now else None
            out[rule]["completing_explains"] += again == want
            if rule == rules[0]:
                cases.append({"t": t, "job": i, "gpus": gpus[i], key: True, "slurm": want, rule: got,
                              "nodes_ended_that_second": sorted(ended_now), "without_them": again})
        held[i] = [(k, GPN if n > 1 else g) for k in want]
    return {"run": path, "rules": out, f"{rules[0]}_disagreements": cases}


def _place(held: dict, n: int, g: int, rule: str, leave_out) -> list | None:
    cl = Cluster(RACKS, RACK_GPUS, GPN)
    for alloc in held.values():
        for node, v in alloc:
            cl._take(node, v)
    for node in leave_out:  # a completing node takes nothing
        if cl.free[node]:
            cl._take(node, cl.free[node])
    p = cl.place(n, g, rule)
    return sorted(k for k, _ in p[0]) if p else None


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(json.dumps(check(p), indent=1))
