"""`--placement tree`, placement as Slurm 22.05 places (issue 54): select/cons_tres under
topology/tree, racks as leaf switches (src/plugins/select/cons_tres/job_test.c,
_eval_nodes_topo): of the racks with a node that can take the job, the one with the fewest
such nodes that holds it, then its lowest nodes. Every lab case below was derived by hand
(re-derived in review) and run on the lab cluster of bench/sim_vs_slurm.py (4 racks x 4
nodes x 8 GPUs, nodes n1-n16 as 0-15 here) by bench/probes/tree_placement_probe.py: the state
set up with filler jobs pinned by `-w`, the job submitted as the replays submit; Slurm 22.05
chose the nodes given here in every one (2026-12-07, 15 of 15 cases with the states of
test_tree_keeps_the_counts_by_rack and five more; bench/results/2026-12-07/sim-placement/).
`pack` (the fullest node; for several racks the next with the most) chooses the ones in the
comments where it differs."""

import copy
import random

import pytest

from transit_launch.sim import backfill
from transit_launch.sim.cluster import Cluster
from transit_launch.sim.limits import SchedParams
from transit_launch.sim.scheduler import Scenario, simulate
from transit_launch.sim.trace import Trace


def lab(used: dict) -> Cluster:
    """The lab's shape with used[node] GPUs taken on each node."""
    cl = Cluster(racks=4, rack_gpus=32, gpus_per_node=8)
    for node, g in used.items():
        cl._take(node, g)
    return cl


def nodes(placed) -> list:
    return sorted(node for node, _ in placed[0])


# (GPUs used on each node, nodes, GPUs, the nodes Slurm chooses): bench/probes/tree_placement_probe.py
# runs each on the lab
LAB_CASES = [
    # every rack has 4 nodes that fit: the first rack, its first node (pack: n5, the fullest,
    # with 1 GPU left)
    ({4: 7}, 1, 1, [0]),
    # rack 0 has 2 nodes that fit (n1 and n4 full): rack 0, its first that fits, n2 (pack:
    # the fuller n3)
    ({0: 8, 1: 4, 2: 7, 3: 8}, 1, 1, [1]),
    # rack 0 fits on 2 nodes, rack 1 on 4 (n5 with one GPU left among them): rack 0 (pack: n5)
    ({0: 8, 1: 8, 4: 7}, 1, 1, [2]),
    # 6 whole nodes; racks hold 3, 2, 4, 1 whole: none holds 6, so the most (rack 2), then
    # the best fit for the other 2: rack 1 (pack: rack 0's n2, n3)
    ({0: 8, 4: 8, 5: 8, 12: 8, 13: 8, 14: 8}, 6, 48, [6, 7, 8, 9, 10, 11]),
    # 3 whole nodes a rack: no rack holds 4, the job starts now over two (no wait for a rack)
    ({0: 8, 4: 8, 8: 8, 12: 8}, 4, 32, [1, 2, 3, 5]),
    # 2 nodes: whole nodes 3 / 2 / 4 / 4 (a one-GPU job keeps n1 from being whole): rack 1
    ({0: 1, 4: 8, 5: 8}, 2, 16, [6, 7]),
]


@pytest.mark.parametrize("used,n,g,want", LAB_CASES)
def test_placement_is_slurms_on_the_lab(used, n, g, want):
    assert nodes(lab(used).place(n, g, "tree")) == want


def test_a_one_gpu_job_keeps_out_of_a_free_rack_and_a_rack_job_finds_it():
    # 2 racks of 4 eight-GPU nodes (n0-n3, n4-n7), a pass at every event, no rounding.
    # 0: A (3 nodes) takes rack 0's n0-n2 (both racks hold 3: the first); B (8 GPUs) n3
    #    (rack 0 has 1 node that fits, rack 1 4); C (4 GPUs) n4 (rack 1 alone fits).
    # 50: B ends, n3 is free. 60: D (2 GPUs): rack 0 has 1 node that fits (n3), rack 1 4
    #    (n4 with 4 free among them): D takes n3. pack (the fullest node) puts it on n4 beside C.
    # 100: C ends: n4-n7 are whole. 110: E (4 nodes) takes rack 1 alone; under pack the whole
    #    nodes are n3 and n5-n7, and E spans both racks.
    jobs = [(0, 1000, 24), (0, 50, 8), (0, 100, 4), (60, 1000, 2), (110, 100, 32)]
    t = Trace(submit=[j[0] for j in jobs], duration=[float(j[1]) for j in jobs], gpus=[j[2] for j in jobs],
              ids=[str(i) for i in range(len(jobs))], limits=[float(j[1]) for j in jobs], source="test")
    for strategy, racks in (("tree", [1, 1, 1, 1, 1]), ("pack", [1, 1, 1, 1, 2])):
        res = simulate(t, Scenario("t", racks=2, gpus_per_node=8, strategy=strategy,
                                   sched=SchedParams(bf_interval=0, bf_resolution=0)))
        assert res.start == [0, 0, 0, 60, 110]
        assert res.racks == racks


def test_tree_keeps_the_counts_by_rack():
    # 3 GPUs: every rack fits on 4 nodes, n0. 2 nodes: racks hold 3 / 4 / 4 / 4 whole nodes,
    # the fewest that hold 2: rack 0, n1 and n2. 8 GPUs: rack 0 fits on n3 alone. 5 GPUs: rack 0
    # on n0 alone (5 left).
    cl = lab({})
    jobs = [cl.place(1, 3, "tree"), cl.place(2, 16, "tree"), cl.place(1, 8, "tree"), cl.place(1, 5, "tree")]
    assert [nodes(j) for j in jobs] == [[0], [1, 2], [3], [0]]
    assert cl.fitting(1) == [0, 4, 4, 4]
    for j in jobs:
        cl.release(j[0])
    assert cl.rack_count == [[0] * 4] * 8 + [[4] * 4] and cl.whole == 16


@pytest.mark.parametrize("seed", range(30))
def test_a_reservation_chooses_as_place_would_then(seed):
    """backfill._choose for one node: the nodes given back (extra) and held (cover) as
    Cluster.place sees a cluster where they are given back and taken."""
    rng = random.Random(seed)
    gpn, npr = rng.choice((4, 8)), rng.choice((1, 2, 4))
    cl = Cluster(rng.randrange(1, 6), npr * gpn, gpn)
    for node in range(cl.n_nodes):
        cl._take(node, rng.randrange(gpn + 1))
    extra = {node: rng.randrange(1, gpn - cl.free[node] + 1)
             for node in rng.sample(range(cl.n_nodes), rng.randrange(cl.n_nodes + 1)) if cl.free[node] < gpn}
    cover = {node: 1 for node in rng.sample(range(cl.n_nodes), rng.randrange(cl.n_nodes // 2 + 1))}
    then = copy.deepcopy(cl)
    then.release(list(extra.items()))
    for node in cover:
        if then.free[node]:
            then._take(node, then.free[node])
    for g in range(1, gpn + 1):
        want = then.place(1, g, "tree") if then.fits(1, g) else None
        got = backfill._choose(cl, extra, cover, 1, g, "tree")
        assert got == (None if want is None else [want[0][0][0]])
        if want is not None:
            then.release(want[0])
