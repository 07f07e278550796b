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
            self.rack_whole[self.rack_of(node)].discard(node)
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
        fitting = [r for r in range(self.racks) if len(self.rack_whole[r]) >= nodes]
        if fitting:
            key = (lambda r: (len(self.rack_whole[r]), r)) if strategy == "pack" else (lambda r: (-len(self.rack_whole[r]), r))
            chosen = [min(fitting, key=key)]
        else:  # several racks, fewest first: the racks with the most whole free nodes
            chosen, got = [], 0
            for r in sorted(range(self.racks), key=lambda r: (-len(self.rack_whole[r]), r)):
                if not self.rack_whole[r]:
                    break
                chosen.append(r)
                got += len(self.rack_whole[r])
                if got >= nodes:
                    break
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
                self.rack_whole[self.rack_of(node)].add(node)
                self.whole += 1
            self.free[node] = v + g
            self.free_gpus += g
