"""One backfill pass, as Slurm's sched/backfill runs it (src/plugins/sched/backfill/backfill.c,
_attempt_backfill): the queue's first bf_max_job_test jobs are tested in order, the head
included, against a map of the nodes that earlier jobs of the same pass reserved.

A job starts now if it fits on nodes that no reservation holds while it would run (its
window: now to now + its planned length). Otherwise it gets a reservation of its own: the
earliest time, among now, the running jobs' planned ends and the reservations' ends, at
which the nodes free then (as the running jobs planned to end by then give theirs back)
and held by no reservation over its window suffice; the nodes are chosen there as
Cluster.place would choose them. A reservation holds its nodes from its start to its
planned end, both rounded down to bf_resolution (at least one bf_resolution long), and
blocks every window that reaches its start (Slurm's `begin_time <= end_time`). Every later
job must leave those nodes alone for that time: conservative backfill over the window,
not EASY's reservation for the head only. Reservations hold whole nodes, as Slurm's map is
a bitmap of nodes: a pending one-GPU job keeps a later one off its node for its window
even where the GPUs would suffice for both.

As Slurm's, the map is rebuilt at every pass and a job that would start later than
bf_window from now gets no reservation. A pass stops once no job left in the window could
start now (none fits the GPUs free now): further reservations would start nothing."""

from __future__ import annotations

import bisect
import math
import operator

from transit_launch.sim.cluster import racks_for


class Ends:
    """When each busy node will be wholly free by the running jobs' planned ends, kept as jobs
    start and end: `order` is [(time, node)] sorted, one entry a node that runs something;
    `per_rack` the same entries split by rack, so that a rack's nodes wholly free by a time
    are counted with one bisect."""

    def __init__(self, n_nodes: int, nodes_per_rack: int):
        self.per_node = [[] for _ in range(n_nodes)]  # planned ends of the jobs on a node, sorted
        self.order = []
        self.npr = nodes_per_rack
        self.per_rack = [[] for _ in range(-(-n_nodes // nodes_per_rack))]
        self.version = 0  # counts starts and ends: the running jobs are the same while it is
        self.made = []    # the last passes' reservations in order: (version, job, start, nodes)

    def add(self, alloc, end: float) -> None:
        self.version += 1
        per_node = self.per_node
        if len(alloc) > 1 and all(not per_node[node] for node, _ in alloc):
            self._add_block([node for node, _ in alloc], end)
            return
        for node, _ in alloc:
            ends = self.per_node[node]
            if ends and end <= ends[-1]:
                bisect.insort(ends, end)
                continue
            rack = self.per_rack[node // self.npr]
            if ends:
                del self.order[bisect.bisect_left(self.order, (ends[-1], node))]
                del rack[bisect.bisect_left(rack, (ends[-1], node))]
            ends.append(end)
            bisect.insort(self.order, (end, node))
            bisect.insort(rack, (end, node))

    def remove(self, alloc, end: float) -> None:
        self.version += 1
        per_node = self.per_node
        if len(alloc) > 1 and all(len(per_node[node]) == 1 for node, _ in alloc):
            self._remove_block([node for node, _ in alloc], end)
            return
        for node, _ in alloc:
            ends = self.per_node[node]
            last = ends[-1]
            del ends[bisect.bisect_left(ends, end)]
            if not ends or ends[-1] != last:
                rack = self.per_rack[node // self.npr]
                del self.order[bisect.bisect_left(self.order, (last, node))]
                del rack[bisect.bisect_left(rack, (last, node))]
                if ends:
                    bisect.insort(self.order, (ends[-1], node))
                    bisect.insort(rack, (ends[-1], node))

    def _by_rack(self, nodes: list) -> dict:
        """The nodes split by rack, each rack's ascending."""
        out = {}
        for node in sorted(nodes):
            out.setdefault(node // self.npr, []).append(node)
        return out

    def _add_block(self, nodes: list, end: float) -> None:
        """add() for nodes that ran nothing (a multi-node job's whole nodes): they share the
        job's end, so their entries go in as one block, its place found once a list."""
        for node in nodes:
            self.per_node[node].append(end)
        _insert_block(self.order, end, sorted(nodes))
        for rack, group in self._by_rack(nodes).items():
            _insert_block(self.per_rack[rack], end, group)

    def _remove_block(self, nodes: list, end: float) -> None:
        """remove() for nodes that ran that job alone: their entries, all at its end, leave
        as one block."""
        for node in nodes:
            self.per_node[node].clear()
        _delete_block(self.order, end, nodes)
        for rack, group in self._by_rack(nodes).items():
            _delete_block(self.per_rack[rack], end, group)


def _same_time(line: list, end: float) -> tuple[int, int]:
    """The slice of a sorted [(time, node)] whose entries are at `end`."""
    lo = bisect.bisect_left(line, (end,))
    return lo, bisect.bisect_left(line, (end, math.inf), lo)


def _insert_block(line: list, end: float, nodes: list) -> None:
    """(end, node) for the ascending `nodes` into the sorted `line`; merged with the other
    entries at that time where there are any (another job ending at the same time)."""
    lo, hi = _same_time(line, end)
    entries = [(end, node) for node in nodes]
    line[lo:hi] = entries if lo == hi else sorted(line[lo:hi] + entries)


def _delete_block(line: list, end: float, nodes: list) -> None:
    """(end, node) for each of `nodes` out of the sorted `line`."""
    lo, hi = _same_time(line, end)
    if hi - lo == len(nodes):
        del line[lo:hi]
    else:
        gone = set(nodes)
        line[lo:hi] = [x for x in line[lo:hi] if x[1] not in gone]


def _overlapping(resv, s: float, e: float) -> tuple:
    """Which reservations [(start, end, nodes)] hold nodes in the window [s, e] (indices)."""
    return tuple(k for k, (rs, re, _) in enumerate(resv) if rs <= e and re > s)


def _room_outside(cl, blocked) -> tuple[int, int]:
    """(whole nodes free now, most GPUs free on one node now) off the blocked nodes: a job of
    n > 1 nodes fits there iff n <= the first, one of g GPUs iff g <= the second. The
    blocked nodes are counted by their free GPUs with a set intersection a bucket, at C
    speed: a job that does not fit there (the common case under a large reservation) then
    costs no walk over the nodes (_held walks them for one that does)."""
    gpn, bucket = cl.gpn, cl.bucket
    by_free = [0] * (gpn + 1)  # blocked nodes by their free GPUs
    for v in range(1, gpn + 1):
        if bucket[v]:
            by_free[v] = len(bucket[v].intersection(blocked))
    most = next((v for v in range(gpn, 0, -1) if len(bucket[v]) > by_free[v]), 0)
    return cl.whole - by_free[gpn], most


def _held(cl, blocked) -> list:
    """The blocked nodes' free GPUs [(node, GPUs)] (those with some), taken while a job is
    placed off them. The nodes with free GPUs are read instead of the blocked ones where
    they are fewer (a busy cluster, a large reservation): the same pairs, in another order."""
    gpn, free, bucket = cl.gpn, cl.free, cl.bucket
    if sum(len(bucket[v]) for v in range(1, gpn + 1)) < len(blocked):
        return [(node, v) for v in range(1, gpn + 1) for node in bucket[v] if node in blocked]
    return [(node, v) for node in blocked if (v := free[node])]


def _choose(cl, extra: dict, cover: dict, n: int, g: int, strategy: str):
    """The nodes a job of n nodes (g GPUs for one node) would get, as Cluster.place chooses
    them, with extra[node] GPUs given back to a node and the nodes in `cover` left out; None:
    no fit."""
    gpn, free, pack = cl.gpn, cl.free, strategy == "pack"
    if n == 1:
        best = None  # ((free GPUs, or minus them to spread), node)
        for node, x in extra.items():
            v = free[node] + x
            if v >= g and node not in cover:
                key = (v if pack else -v, node)
                if best is None or key < best:
                    best = key
        for v in (range(g, gpn + 1) if pack else range(gpn, g - 1, -1)):
            if best is not None and (v if pack else -v) > best[0]:
                break
            pick = min((node for node in cl.bucket[v] if node not in cover and node not in extra), default=None)
            if pick is not None:
                key = (v if pack else -v, pick)
                best = key if best is None or key < best else best
                break
        return None if best is None else [best[1]]
    # whole nodes a rack has then: today's, less the held ones, plus those given back whole
    count = list(map(len, cl.rack_whole))
    npr = cl.nodes_per_rack
    gone, added = set(), {}
    for node in cover:
        if free[node] == gpn:
            count[node // npr] -= 1
            gone.add(node)
    for node, x in extra.items():
        if x and free[node] + x == gpn and node not in cover:
            r = node // npr
            count[r] += 1
            added.setdefault(r, []).append(node)
    if sum(count) < n:
        return None
    out = []
    for r in racks_for(count, n, pack):
        nodes = sorted(list(cl.rack_whole[r] - gone if gone else cl.rack_whole[r]) + added.get(r, []))
        out.extend(nodes[:n - len(out)])
    return out


def _enter_leave(resv, length: float, now: float):
    """When each reservation starts and stops holding a window of `length` that starts then."""
    enter = sorted((max(now, rs - length), k) for k, (rs, _, _) in enumerate(resv))
    leave = sorted((re, k) for k, (_, re, _) in enumerate(resv))
    return enter, leave


def _cover(cover: dict, nodes) -> list:
    """A reservation's window starts holding `nodes`: their counts of holding reservations
    go up; the nodes held now that were not before."""
    new = []
    for node in nodes:
        c = cover.get(node, 0)
        cover[node] = c + 1
        if not c:
            new.append(node)
    return new


def _uncover(cover: dict, nodes) -> list:
    """A reservation ends: its nodes' counts go down; the nodes no reservation holds any more."""
    freed = []
    for node in nodes:
        c = cover[node] - 1
        if c:
            cover[node] = c
        else:
            del cover[node]
            freed.append(node)
    return freed


def _reservation_nodes(cl, ends, resv, n: int, length: float, now: float, horizon: float, strategy: str):
    """reservation() for a job of n > 1 whole nodes, from the times nodes become wholly free
    (Ends): the same answer without walking every running job's allocation. At a time s the
    nodes wholly free are today's and the first i of ends.order; those held are counted over
    the held nodes alone. A count short by d needs d more nodes: the next time worth a look
    is the d-th next node's, or a reservation's end."""
    gpn, free, order, per_node = cl.gpn, cl.free, ends.order, ends.per_node
    cover = {}
    enter, leave = _enter_leave(resv, length, now)
    e = x = 0
    s = now
    while s <= horizon:
        while e < len(enter) and enter[e][0] <= s:
            _cover(cover, resv[enter[e][1]][2])
            e += 1
        while x < len(leave) and leave[x][0] <= s:
            _uncover(cover, resv[leave[x][1]][2])
            x += 1
        i = bisect.bisect_right(order, (s, math.inf))
        held = sum(1 for node in cover if free[node] == gpn or per_node[node][-1] <= s)
        short = n - (cl.whole + i - held)
        if short <= 0:
            return s, _whole_nodes_by(cl, ends, cover, n, s, strategy == "pack")
        s = min(order[i + short - 1][0] if i + short - 1 < len(order) else math.inf,
                leave[x][0] if x < len(leave) else math.inf)
    return math.inf, None


def _whole_nodes_by(cl, ends, cover: dict, n: int, s: float, pack: bool) -> list:
    """The n whole nodes Cluster.place would choose at time s, from the nodes wholly free
    then (today's and those whose last planned end is by s) that `cover` leaves: counted
    by rack with a bisect each (Ends.per_rack), then read in the racks chosen alone. The
    caller has checked that enough are free. Returned in no order: only a rack whose
    nodes are not all taken is sorted, to take its lowest."""
    gpn, free, per_node, npr = cl.gpn, cl.free, ends.per_node, cl.nodes_per_rack
    by = (s, math.inf)
    count = [len(now) + bisect.bisect_right(busy, by) for now, busy in zip(cl.rack_whole, ends.per_rack)]
    for node in cover:
        if free[node] == gpn or per_node[node][-1] <= s:
            count[node // npr] -= 1
    out = []
    for r in racks_for(count, n, pack):
        busy = ends.per_rack[r]
        nodes = list(cl.rack_whole[r])
        nodes.extend(map(operator.itemgetter(1), busy[:bisect.bisect_right(busy, by)]))
        if cover:
            nodes = [node for node in nodes if node not in cover]
        if count[r] > n - len(out):
            nodes.sort()
        out.extend(nodes[:n - len(out)])
    return out


def reservation(cl, planned, alloc, resv, n: int, g: int, length: float, now: float, horizon: float,
                strategy: str):
    """(start, nodes) of the earliest time, up to `horizon`, a job of n nodes, g GPUs and
    `length` planned seconds fits as the running jobs [(planned end, job)] (sorted) give their
    allocations back, on nodes the reservations [(start, end, nodes)] leave it over its window;
    (inf, None) if none. Counts kept as the time advances: nodes given back whole (`whole`),
    wholly free nodes held (`held`), nodes with g GPUs free and not held (`good`)."""
    gpn, free = cl.gpn, cl.free
    extra, cover = {}, {}
    whole = held = 0
    good = sum(len(cl.bucket[v]) for v in range(g, gpn + 1))
    # a reservation holds a window from when the window reaches its start until its end
    enter, leave = _enter_leave(resv, length, now)
    i = e = x = 0
    s = now
    while s <= horizon:
        while i < len(planned) and planned[i][0] <= s:
            for node, v in alloc[planned[i][1]]:
                before = free[node] + extra.get(node, 0)
                extra[node] = extra.get(node, 0) + v
                after = before + v
                if after == gpn:
                    whole += 1
                    held += node in cover
                if before < g <= after and node not in cover:
                    good += 1
            i += 1
        while e < len(enter) and enter[e][0] <= s:
            for node in _cover(cover, resv[enter[e][1]][2]):
                v = free[node] + extra.get(node, 0)
                held += v == gpn
                good -= v >= g
            e += 1
        while x < len(leave) and leave[x][0] <= s:
            for node in _uncover(cover, resv[leave[x][1]][2]):
                v = free[node] + extra.get(node, 0)
                held -= v == gpn
                good += v >= g
            x += 1
        if (cl.whole + whole - held >= n) if n > 1 else good > 0:
            nodes = _choose(cl, extra, cover, n, g, strategy)
            if nodes is not None:
                return s, nodes
        s = min(planned[i][0] if i < len(planned) else math.inf, enter[e][0] if e < len(enter) else math.inf,
                leave[x][0] if x < len(leave) else math.inf)
    return math.inf, None


def earliest(cl, planned, alloc, n: int, g: int, now: float, horizon: float, ends=None) -> float:
    """The earliest time, up to `horizon`, a job of n nodes (g GPUs for one node) fits as the
    running jobs give their allocations back, with no reservation in its way (inf if none): a
    bound under its reservation's start, which reservations can only delay."""
    gpn, free = cl.gpn, cl.free
    if (cl.whole >= n) if n > 1 else any(cl.bucket[v] for v in range(g, gpn + 1)):
        return now
    if n > 1 and ends is not None:  # the (n - whole)-th node to become wholly free
        need = n - cl.whole
        if need > len(ends.order) or ends.order[need - 1][0] > horizon:
            return math.inf
        return max(ends.order[need - 1][0], now)
    extra, whole = {}, 0
    for e, k in planned:
        if e > horizon:
            break
        for node, v in alloc[k]:
            before = free[node] + extra.get(node, 0)
            extra[node] = extra.get(node, 0) + v
            if before + v == gpn:
                whole += 1
            if n == 1 and before + v >= g:
                return max(e, now)
        if n > 1 and cl.whole + whole >= n:
            return max(e, now)
    return math.inf


def _reserve(cl, ends, made, k: int, resv, job: int, n: int, g: int, length: float, now: float, horizon: float,
             strategy: str, planned, alloc):
    """The k-th reservation of a pass: the last pass's k-th when it was the same job's, made
    from the same running jobs after the same reservations and not before now (nothing fitted
    before its start then, nor does now), else worked out and kept."""
    if made is not None and k < len(made):
        version, j, s, chosen = made[k]
        if version == ends.version and j == job and chosen is not None and s >= now:
            return s, chosen
        del made[k:]
    if ends is not None and n > 1:
        s, chosen = _reservation_nodes(cl, ends, resv, n, length, now, horizon, strategy)
    else:
        s, chosen = reservation(cl, planned, alloc, resv, n, g, length, now, horizon, strategy)
    if made is not None:
        made.append((ends.version, job, s, chosen))
    return s, chosen


def _most(cl) -> int:
    """The most GPUs free on one node."""
    bucket = cl.bucket
    for v in range(cl.gpn, 0, -1):
        if bucket[v]:
            return v
    return 0


def run_pass(cl, queue, now: float, nodes, gpus, plan, planned, alloc, sp, strategy: str, begin,
             ends: Ends | None = None) -> None:
    """A pass at `now` over the first sp.bf_max_job_test jobs of `queue` (a Waiting, changed
    in place); begin(job, now) starts one (False: it did not fit); sp: SchedParams. The jobs it
    starts leave the queue once the pass is over: the pass reads the queue as it began."""
    started = []
    _tests(cl, queue, now, nodes, gpus, plan, planned, alloc, sp, strategy, begin, ends, started)
    for j in started:
        queue.remove(j)


def _tests(cl, queue, now: float, nodes, gpus, plan, planned, alloc, sp, strategy: str, begin, ends,
           started: list) -> None:
    """run_pass's tests, in queue order (ascending job index); the jobs started are added
    to `started`.

    Reservations are worked out when a job that could start now needs them, not at their
    turn, with the same result: a job whose reservation is pending has a bound under its
    start (`earliest`, rounded down), and while every pending bound lies past a job's
    window, the pending reservations cannot hold that job's nodes, and the job (ending
    before them) changes no pending reservation once started.

    A job that could not start on the GPUs free at the pass's start never will in it
    (starts in the pass only take GPUs), and once the pass has given its bf_reserve
    reservations such a job does nothing: the loop then goes over the jobs that could
    (`fitting`, from the queue's index by GPUs) alone, and over every job while
    reservations are left."""
    cutoff = queue.last_tested(sp.bf_max_job_test)
    # the jobs that could start now (Cluster.fits with its counts read once: whole nodes,
    # and the most GPUs free on a node); a job's GPUs tell its nodes too (up to a node's
    # for one node, n x a node's for n), so one bound on them says it: with a whole node
    # free, every one-node job fits and n nodes iff n <= whole
    whole, most = cl.whole, _most(cl)
    fitting = queue.fitting(whole * cl.gpn if whole else most, cutoff)
    last = fitting[-1] if fitting else -1
    resv, pending, bound, bounds, failed = [], [], math.inf, {}, {}
    resv_jobs = []  # the jobs whose reservations were worked out, in order (some found none)
    made = ends.made if ends is not None else None
    horizon = now + sp.bf_window
    cap, taken = sp.bf_reserve or math.inf, 0  # reservations a pass gives; made or pending
    room = {}  # (blocked nodes, _room_outside) by the reservations in a window's way; emptied at a start
    inf, failed_get = math.inf, failed.get
    first = 0  # the jobs before this one are tested
    while first <= last:
        every = taken < cap  # every job (reservations left to give), else the fitting ones
        for j in (queue.between(first, cutoff) if every else fitting[bisect.bisect_left(fitting, first):]):
            if cl.free_gpus == 0:
                return
            length, n = plan[j], nodes[j]
            shape = gpus[j]  # its GPUs tell its nodes too
            # one that failed to start stays failed for a longer window (the pass only takes
            # GPUs and adds reservations); fits: Cluster.fits
            if ((cl.whole >= n) if n > 1 else shape <= most) and length < failed_get(shape, inf):
                if bound <= now + length:  # a pending reservation may hold this job's nodes: work them out
                    for p in pending:
                        s, chosen = _reserve(cl, ends, made, len(resv_jobs), resv, p, nodes[p], gpus[p], plan[p],
                                             now, horizon, strategy, planned, alloc)
                        resv_jobs.append(p)
                        if chosen is not None:
                            rs = sp.reservation(s)
                            resv.append((rs, max(sp.reservation(s + plan[p]), rs + sp.bf_resolution),
                                         frozenset(chosen)))
                    pending, bound = [], inf
                    taken = len(resv)
                # start it on nodes no reservation holds while it would run
                which = _overlapping(resv, now, now + length) if resv else ()
                if which not in room:  # one reservation's nodes as they are, several's joined
                    if not which:  # none: the whole cluster as it is (`most` is kept current)
                        room[which] = ((), cl.whole, most)
                    else:
                        blocked = (resv[which[0]][2] if len(which) == 1
                                   else frozenset().union(*(resv[r][2] for r in which)))
                        room[which] = (blocked, *_room_outside(cl, blocked))
                blocked, whole_out, most_out = room[which]
                ok = False
                if (whole_out >= n) if n > 1 else shape <= most_out:
                    held = _held(cl, blocked) if blocked else ()
                    for node, v in held:
                        cl._take(node, v)
                    ok = begin(j, now)
                    if held:
                        cl.release(held)
                if ok:
                    started.append(j)
                    bounds.clear()
                    room.clear()
                    most = _most(cl)
                    if (taken < cap) != every:
                        break
                    continue
                failed[shape] = min(length, failed_get(shape, inf))
            if j >= last:
                return
            if taken >= cap:
                if every:
                    break
                continue
            if shape not in bounds:
                bounds[shape] = earliest(cl, planned, alloc, n, shape, now, horizon, ends)
            if bounds[shape] <= horizon:  # else it would start past the window: no reservation
                pending.append(j)
                taken += 1
                bound = min(bound, sp.reservation(bounds[shape]))
            if (taken < cap) != every:
                break
        else:
            return
        first = j + 1  # the loop broke off there to change what it goes over
