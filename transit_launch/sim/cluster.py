"""Racks of a fixed GPU capacity made of nodes of 4 or 8 GPUs, and locality-aware placement.

A job of one node takes GPUs of one node (nodes are shared); a job of several nodes takes
whole nodes. Placement prefers a single rack:
  pack:   the node (single-node jobs) or rack (multi-node jobs) with the least free room
          that still fits, keeping large holes for large jobs;
  spread: the one with the most free room;
and falls back to several racks, taking the racks with the most whole free nodes first so
that as few racks as possible are spanned. Nodes are kept in buckets by free GPUs, so a
fit check is O(GPUs per node) and a placement O(racks)."""

from __future__ import annotations


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
        self.whole = self.n_nodes
        self.free_gpus = self.total_gpus

    def rack_of(self, node: int) -> int:
        return node // self.nodes_per_rack

    def fits(self, nodes: int, gpus: int) -> bool:
        if nodes > 1:
            return self.whole >= nodes
        return self.free_gpus >= gpus and any(self.bucket[v] for v in range(gpus, self.gpn + 1))

    def _take(self, node: int, g: int) -> None:
        v = self.free[node]
        self.bucket[v].discard(node)
        self.bucket[v - g].add(node)
        if v == self.gpn:
            self.rack_whole[node // self.nodes_per_rack].discard(node)
            self.whole -= 1
        self.free[node] = v - g
        self.free_gpus -= g

    def place(self, nodes: int, gpus: int, strategy: str = "pack"):
        """Returns (allocation, racks spanned) or None. allocation: [(node, gpus), ...]."""
        if not self.fits(nodes, gpus):
            return None
        if nodes == 1:
            order = range(gpus, self.gpn + 1) if strategy == "pack" else range(self.gpn, gpus - 1, -1)
            v = next(v for v in order if self.bucket[v])
            node = min(self.bucket[v])  # lowest index: deterministic, and packs racks in order
            self._take(node, gpus)
            return [(node, gpus)], 1
        chosen = racks_for(list(map(len, self.rack_whole)), nodes, strategy == "pack")
        alloc = []
        for r in chosen:
            for node in sorted(self.rack_whole[r])[:nodes - len(alloc)]:
                alloc.append((node, self.gpn))
        for node, g in alloc:
            self._take(node, g)
        return alloc, len(chosen)

    def release(self, alloc) -> None:
        for node, g in alloc:
            v = self.free[node]
            self.bucket[v].discard(node)
            self.bucket[v + g].add(node)
            if v + g == self.gpn:
                self.rack_whole[node // self.nodes_per_rack].add(node)
                self.whole += 1
            self.free[node] = v + g
            self.free_gpus += g


def racks_for(count: list, n: int, pack: bool) -> list:
    """The racks a job of n whole nodes takes, from the whole free nodes each rack has
    (`count`, summing to n at least): one rack if one holds it (pack: the one with the
    fewest, spread: the most; the lowest index on ties), else the racks with the most first
    (the lowest index on ties) until they hold n. C-speed builtins: it runs at every start
    and reservation of a multi-node job."""
    if pack:
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
