"""Racks of a fixed GPU capacity made of nodes of 4 or 8 GPUs, and locality-aware placement.

A job of one node takes GPUs of one node (nodes are shared); a job of several nodes takes
whole nodes. Placement prefers a single rack:
  pack:   the node (single-node jobs) or rack (multi-node jobs) with the least free room
          that still fits, keeping large holes for large jobs;
  spread: the one with the most free room;
and falls back to several racks, taking the racks with the most whole free nodes first so
that as few racks as possible are spanned.
  tree:   Slurm 22.05's select/cons_tres under topology/tree with racks as leaf switches
          (src/plugins/select/cons_tres/job_test.c: _eval_nodes_topo, its leaf choice
          _topo_choose_best_switch and _topo_compare_switches): of the racks with a node
          that can take the job (for several nodes, a wholly free one), the one with the
          fewest such nodes that still holds it (the lowest index on ties), then its
          lowest-index such nodes. A one-node job so goes to the first node that fits in
          the rack with the fewest that fit, not to the fullest node. No rack holds a
          multi-node job: the rack with the most, then again the best fit for the rest.
          Its cases: tests/test_sim_placement.py (derived by hand), run on the lab's
          Slurm 22.05 with nine more by bench/probes/tree_placement_probe.py: 15 of 15
          agree (bench/results/2026-12-07/sim-placement/).
Nodes are kept in buckets by free GPUs (and, for tree, counted by rack and free GPUs), so a
fit check is O(GPUs per node) and a placement O(racks) (tree: O(racks x GPUs per node) at
C speed)."""

from __future__ import annotations

import collections
import itertools
import operator

_consume = collections.deque(maxlen=0).extend  # runs an iterator out at C speed (a loop of calls)
_NODE, _GPUS = operator.itemgetter(0), operator.itemgetter(1)  # of an allocation's (node, GPUs)


class Cluster:
    def __init__(self, racks: int, rack_gpus: int = 32, gpus_per_node: int = 8):
        if rack_gpus % gpus_per_node:
            raise ValueError("rack capacity must be a multiple of the GPUs per node")
        self.racks, self.gpn = racks, gpus_per_node
        self.nodes_per_rack = rack_gpus // gpus_per_node
        self.n_nodes = racks * self.nodes_per_rack
        self.total_gpus = self.n_nodes * gpus_per_node
        self.free = [gpus_per_node] * self.n_nodes
        self.bucket = [set() for _ in range(gpus_per_node + 1)]  # free GPUs -> nodes
        self.bucket[gpus_per_node] = set(range(self.n_nodes))
        self.rack_whole = [set(range(r * self.nodes_per_rack, (r + 1) * self.nodes_per_rack)) for r in range(racks)]
        # rack_count[v][r]: the nodes of rack r with v GPUs free (tree's counts)
        self.rack_count = [[0] * racks for _ in range(gpus_per_node)] + [[self.nodes_per_rack] * racks]
        self.whole = self.n_nodes
        self.free_gpus = self.total_gpus

    def rack_of(self, node: int) -> int:
        return node // self.nodes_per_rack

    def fits(self, nodes: int, gpus: int) -> bool:
        if nodes > 1:
            return self.whole >= nodes
        return self.free_gpus >= gpus and any(self.bucket[gpus:])  # a node with `gpus` free or more

    def fitting(self, gpus: int) -> list:
        """The nodes of each rack with `gpus` GPUs free or more (a new list)."""
        count = self.rack_count
        if gpus >= self.gpn:
            return count[self.gpn][:]
        return list(map(sum, zip(*count[gpus:])))

    def _take(self, node: int, g: int) -> None:
        v = self.free[node]
        self.bucket[v].discard(node)
        self.bucket[v - g].add(node)
        count, r = self.rack_count, node // self.nodes_per_rack
        count[v][r] -= 1
        count[v - g][r] += 1
        if v == self.gpn:
            self.rack_whole[node // self.nodes_per_rack].discard(node)
            self.whole -= 1
        self.free[node] = v - g
        self.free_gpus -= g

    def place(self, nodes: int, gpus: int, strategy: str = "pack"):
        """Returns (allocation, racks spanned) or None. allocation: [(node, gpus), ...]."""
        if nodes == 1:
            bucket = self.bucket
            if self.free_gpus < gpus or not any(bucket[gpus:]):  # fits(): no node has `gpus` free
                return None
            if strategy == "tree":
                fit = self.fitting(gpus)
                free, lo = self.free, fit.index(min(filter(None, fit))) * self.nodes_per_rack
                node = next(k for k in range(lo, lo + self.nodes_per_rack) if free[k] >= gpus)
            else:
                if strategy == "pack":  # the fullest node that fits
                    v = gpus
                    while not bucket[v]:
                        v += 1
                else:
                    v = self.gpn
                    while not bucket[v]:
                        v -= 1
                node = min(bucket[v])  # lowest index: deterministic, and packs racks in order
            self._take(node, gpus)
            return [(node, gpus)], 1
        if self.whole < nodes:
            return None
        chosen = racks_for(self.rack_count[self.gpn], nodes, strategy)  # whole nodes a rack (racks_for copies to change)
        gpn, empty, full = self.gpn, self.rack_count[0], self.rack_count[self.gpn]
        taken = []
        for r in chosen:  # whole nodes, taken a rack at a time (_take's effect, by set operations)
            whole = self.rack_whole[r]
            got = sorted(whole)
            if len(got) > nodes - len(taken):
                got = got[:nodes - len(taken)]
                whole.difference_update(got)
            else:
                whole.clear()
            full[r] -= len(got)
            empty[r] += len(got)
            taken.extend(got)
        self.bucket[gpn].difference_update(taken)
        self.bucket[0].update(taken)
        _consume(map(self.free.__setitem__, taken, itertools.repeat(0)))
        self.whole -= nodes
        self.free_gpus -= nodes * gpn
        return list(zip(taken, itertools.repeat(gpn))), len(chosen)

    def release(self, alloc) -> None:
        gpn, free = self.gpn, self.free
        if len(alloc) > 1:
            nodes = list(map(_NODE, alloc))
            if all(map(gpn.__eq__, map(_GPUS, alloc))) and not any(map(free.__getitem__, nodes)):
                self._release_whole(nodes)  # whole nodes, each given back whole
                return
        for node, g in alloc:
            v = self.free[node]
            self.bucket[v].discard(node)
            self.bucket[v + g].add(node)
            count, r = self.rack_count, node // self.nodes_per_rack
            count[v][r] -= 1
            count[v + g][r] += 1
            if v + g == self.gpn:
                self.rack_whole[node // self.nodes_per_rack].add(node)
                self.whole += 1
            self.free[node] = v + g
            self.free_gpus += g

    def _release_whole(self, nodes: list) -> None:
        """release() of whole nodes that had nothing free: a multi-node job's, by set operations."""
        gpn, npr, free = self.gpn, self.nodes_per_rack, self.free
        empty, full = self.rack_count[0], self.rack_count[gpn]
        self.bucket[0].difference_update(nodes)
        self.bucket[gpn].update(nodes)
        for r, group in itertools.groupby(nodes, npr.__rfloordiv__):  # node // npr
            group = list(group)
            self.rack_whole[r].update(group)
            full[r] += len(group)
            empty[r] -= len(group)
        _consume(map(free.__setitem__, nodes, itertools.repeat(gpn)))
        self.whole += len(nodes)
        self.free_gpus += len(nodes) * gpn


def racks_for(count: list, n: int, strategy) -> list:
    """The racks a job of n whole nodes takes, from the whole free nodes each rack has
    (`count`, summing to n at least), in the order it takes them (the last one's lowest
    nodes): one rack if one holds it (pack and tree: the one with the fewest, spread: the
    most; the lowest index on ties), else the racks with the most first (the lowest index
    on ties) until the next holds the rest: pack and spread then take the next with the
    most, tree the one with the fewest that holds the rest. strategy: a placement name, or
    True for pack and False for spread. C-speed builtins: it runs at every start and
    reservation of a multi-node job."""
    if strategy == "tree":
        c = min(filter(n.__le__, count), default=None)
        if c is not None:
            return [count.index(c)]
        count, chosen = list(count), []
        while True:
            r = count.index(max(count))
            chosen.append(r)
            n -= count[r]
            count[r] = 0
            c = min(filter(n.__le__, count), default=None)
            if c is not None:
                chosen.append(count.index(c))
                return chosen
    if strategy is True or strategy == "pack":
        c = min(filter(n.__le__, count), default=None)
    else:
        c = max(count)
        c = c if c >= n else None
    if c is not None:
        return [count.index(c)]
    chosen, got = [], 0
    for r in sorted(range(len(count)), key=count.__getitem__, reverse=True):  # stable: ties stay in index order
        chosen.append(r)
        got += count[r]
        if got >= n:
            break
    return chosen
