"""Probe: does `Cluster.place(..., strategy="tree")` choose the nodes Slurm 22.05 chooses
(select/cons_tres under topology/tree, racks as leaf switches)? (issue 54)

    python3 bench/probes/tree_placement_probe.py --out FILE.json     # root, Debian's Slurm; ~3 min

Starts the lab cluster of bench/sim_vs_slurm.py (tests/slurm_lab.py: 4 racks x 4 nodes
n1-n16 x 8 fake GPUs, topology/tree, sched/backfill at its defaults) and, for each case:
sets the nodes' state with one filler job a busy node (`sbatch -w nK --gres=gpu:G`, a
long sleep), waits until all run and checks the GPUs each node has in use, submits the
case's job as the replays submit (tests/sim_replay.sbatch_args: one node's GPUs, or whole
nodes `--exclusive`), reads the nodes Slurm gave it (scontrol), cancels everything and waits
for the nodes to be idle. The simulator's answer is `Cluster.place` on the same state
(nodes n1-n16 as 0-15). The cases: every one of tests/test_sim_placement.py's LAB_CASES, the
states of its test_tree_keeps_the_counts_by_rack sequence, and a few more, each derived by
hand below. The result file lists every case: its state, Slurm's nodes, `tree`'s and `pack`'s,
and whether Slurm and `tree` agree."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

NAME = "tree_placement_probe"
RACKS, NODES_PER_RACK, GPN = 4, 4, 8
N_NODES = RACKS * NODES_PER_RACK

# test_tree_keeps_the_counts_by_rack: its four jobs placed one after another on the empty lab,
# each case the state the one before left
COUNTS = [
    ({}, 1, 3, [0]),
    ({0: 3}, 2, 16, [1, 2]),
    ({0: 3, 1: 8, 2: 8}, 1, 8, [3]),
    ({0: 3, 1: 8, 2: 8, 3: 8}, 1, 5, [0]),
]
# more, derived by hand (tree's rule: of the racks with a node that fits, the fewest that
# hold the job, its first nodes; no rack holds it: the most, then the fewest for the rest)
EXTRA = [
    # one whole node a rack (n4, n8, n12, n16 idle): no rack holds 2; the most (all 1: rack 0),
    # then the fewest for 1: rack 1
    ({k: 8 for k in range(16) if k % 4 != 3}, 2, 16, [3, 7]),
    # whole nodes 4 / 3 / 2 / 1: no rack holds 6; rack 0, then the fewest for 2: rack 2 (pack:
    # rack 1's n6, n7)
    ({4: 8, 8: 8, 9: 8, 12: 8, 13: 8, 14: 8}, 6, 48, [0, 1, 2, 3, 10, 11]),
    # whole nodes 4 / 3 / 2 / 1 again, 3 nodes: rack 1 holds 3 exactly
    ({4: 8, 8: 8, 9: 8, 12: 8, 13: 8, 14: 8}, 3, 24, [5, 6, 7]),
    # 8 GPUs on one node (not --exclusive): nodes with 8 free: 3 / 1 / 4 / 4: rack 1's n8
    # (pack: n2, the lowest whole node)
    ({0: 1, 4: 8, 5: 8, 6: 8}, 1, 8, [7]),
    # 4 GPUs: nodes with 4 free or more: rack 0 n1 n3 n4 (3), rack 1 n5 n6 (2), racks 2, 3 4:
    # rack 1, its first, n5 (pack: n1, the one with exactly 4 free)
    ({0: 4, 1: 6, 5: 2, 6: 5, 7: 5}, 1, 4, [4]),
]


def cases() -> list[dict]:
    from tests.test_sim_placement import LAB_CASES
    out = []
    for label, group in (("LAB_CASES", LAB_CASES), ("counts", COUNTS), ("extra", EXTRA)):
        for i, (used, n, g, want) in enumerate(group):
            out.append({"name": f"{label}[{i}]", "used": dict(used), "nodes": n, "gpus": g, "by_hand": list(want)})
    return out


def simulated(used: dict, n: int, g: int, strategy: str):
    from transit_launch.sim.cluster import Cluster
    cl = Cluster(racks=RACKS, rack_gpus=NODES_PER_RACK * GPN, gpus_per_node=GPN)
    for node, k in used.items():
        cl._take(node, k)
    placed = cl.place(n, g, strategy)
    return None if placed is None else sorted(node for node, _ in placed[0])


def node_name(k: int) -> str:
    return f"n{k + 1}"


def node_index(name: str) -> int:
    if not (name.startswith("n") and name[1:].isdigit()) or not 1 <= int(name[1:]) <= N_NODES:
        raise ValueError(f"not a lab node: {name!r}")
    return int(name[1:]) - 1


def gres_used(text: str) -> int:
    """The GPUs in use from sinfo's GresUsed ("gpu:7(IDX:0-6)", "gpu:0(IDX:N/A)")."""
    for part in text.split(","):
        if part.startswith("gpu:"):
            count = part.split("(")[0].rsplit(":", 1)[1]
            return int(count) if count.isdigit() else 0
    return 0


def compare(case: dict, slurm: list | None) -> dict:
    tree = simulated(case["used"], case["nodes"], case["gpus"], "tree")
    pack = simulated(case["used"], case["nodes"], case["gpus"], "pack")
    return {**case, "used": {node_name(k): v for k, v in sorted(case["used"].items())},
            "slurm": None if slurm is None else [node_name(k) for k in slurm],
            "tree": None if tree is None else [node_name(k) for k in tree],
            "pack": None if pack is None else [node_name(k) for k in pack],
            "by_hand": [node_name(k) for k in case["by_hand"]],
            "agree": slurm is not None and slurm == tree, "tree_is_by_hand": tree == case["by_hand"]}


# --- the lab ------------------------------------------------------------------------------
def _job(lab, job_id: str) -> dict:
    res = lab.cmd("scontrol", "show", "job", "-o", job_id)
    return dict(kv.split("=", 1) for kv in res.stdout.split() if "=" in kv)


def _sbatch(lab, args: list) -> str:
    res = lab.cmd(*args)
    if res.returncode:
        raise RuntimeError(f"sbatch {' '.join(args[1:])}: {res.stderr.strip()}")
    return res.stdout.strip().split(";")[0]


def _until(ok, timeout: float, what: str) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if ok():
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what} not within {timeout:g} s")


def _in_use(lab) -> dict:
    out = {}
    for line in lab.cmd("sinfo", "-h", "-N", "-O", "NodeList:12,GresUsed:60").stdout.splitlines():
        name, gres = line.split()[:2]
        out[node_index(name)] = gres_used(gres)
    return out


def on_slurm(lab, case: dict, timeout: float) -> dict:
    from tests.sim_replay import sbatch_args
    fillers = [_sbatch(lab, ["sbatch", "--parsable", "--output=/dev/null", "--time=30", "--nodes=1", f"-w{node_name(k)}",
                             f"--gres=gpu:{g}", "--wrap", "sleep 3000"]) for k, g in sorted(case["used"].items())]
    _until(lambda: all(_job(lab, j).get("JobState") == "RUNNING" for j in fillers), timeout, "the filler jobs running")
    in_use = _in_use(lab)
    state_ok = all(in_use.get(k, 0) == case["used"].get(k, 0) for k in range(N_NODES))
    args = sbatch_args(case["gpus"], GPN, 10, 3000.0)
    job = _sbatch(lab, args)
    fields = {}

    def started():
        fields.update(_job(lab, job))
        return fields.get("JobState") not in (None, "PENDING")
    try:
        _until(started, timeout, "the case's job started")
    except RuntimeError:
        pass
    nodes = None
    if fields.get("JobState") == "RUNNING":
        names = lab.cmd("scontrol", "show", "hostnames", fields["NodeList"]).stdout.split()
        nodes = sorted(node_index(n) for n in names)
    lab.cmd("scancel", *fillers, job)
    _until(lambda: not lab.cmd("squeue", "-h", "-o", "%i").stdout.strip()
           and lab.cmd("sinfo", "-h", "-t", "idle", "-o", "%D").stdout.strip() == str(N_NODES),
           timeout, "the lab idle again")
    return {"sbatch": " ".join(a if " " not in a else repr(a) for a in args), "state_seen": state_ok,
            "in_use_seen": {node_name(k): v for k, v in sorted(in_use.items()) if v},
            "job_state": fields.get("JobState"), "reason": fields.get("Reason"),
            "nodelist": fields.get("NodeList"), "nodes": nodes}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="the result file (JSON)")
    ap.add_argument("--only", help="the cases to run, by name, comma-separated (default: all)")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds each wait may take (default 30)")
    ap.add_argument("--list", action="store_true", help="list the cases and the simulator's answers; no lab")
    a = ap.parse_args(argv)
    all_cases = cases()
    if a.only is not None:
        names = [s for s in a.only.split(",") if s]
        unknown = [s for s in names if s not in {c["name"] for c in all_cases}]
        if not names or unknown:
            print(f"{NAME}: --only: unknown case {', '.join(unknown) or repr(a.only)} "
                  f"(the cases: {', '.join(c['name'] for c in all_cases)})", file=sys.stderr)
            return 2
        all_cases = [c for c in all_cases if c["name"] in names]
    if not a.timeout > 0:
        print(f"{NAME}: --timeout must be above 0 (got {a.timeout:g})", file=sys.stderr)
        return 2
    if a.list:
        for c in all_cases:
            r = compare(c, None)
            print(f"{r['name']}: used {r['used']}, {r['nodes']} node(s) {r['gpus']} GPUs: tree {r['tree']}, "
                  f"pack {r['pack']}, by hand {r['by_hand']}")
        return 0
    if not a.out:
        print(f"{NAME}: --out FILE is needed (where the result goes)", file=sys.stderr)
        return 2
    out = Path(a.out)
    if out.is_dir() or not out.parent.is_dir():
        print(f"{NAME}: --out {a.out}: not a file in an existing directory", file=sys.stderr)
        return 2
    from tests.slurm_lab import SlurmLab, missing
    why = missing()
    if why:
        print(f"{NAME}: {why}", file=sys.stderr)
        return 2
    from bench.sim_vs_slurm import BENCH_LAB
    root = Path(tempfile.mkdtemp(prefix="transit-treeprobe-"))
    lab = SlurmLab(root, nodes=N_NODES, gpus=GPN, cpus=GPN, sched=BENCH_LAB.sched_params(), switches=RACKS)
    results, t0 = [], time.monotonic()
    try:
        lab.start()
        topology = (root / "etc/topology.conf").read_text()
        version = lab.cmd("scontrol", "--version").stdout.strip()
        for c in all_cases:
            seen = on_slurm(lab, c, a.timeout)
            r = {**compare(c, seen["nodes"]), "slurm_job": seen}
            results.append(r)
            print(f"{r['name']}: slurm {r['slurm']} tree {r['tree']} pack {r['pack']}"
                  f"{'' if r['agree'] else '  DIFFERENT'}{'' if seen['state_seen'] else '  (state not as set)'}",
                  flush=True)
    finally:
        lab.stop()
        shutil.rmtree(root, ignore_errors=True)
    agree = sum(r["agree"] for r in results)
    doc = {"probe": NAME, "slurm": version, "lab": f"{RACKS} racks x {NODES_PER_RACK} nodes x {GPN} GPUs, "
           f"{BENCH_LAB.sched_params()}", "topology_conf": topology, "seconds": round(time.monotonic() - t0, 1),
           "agree": agree, "cases_run": len(results), "cases": results}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{agree} of {len(results)} cases agree ({out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
