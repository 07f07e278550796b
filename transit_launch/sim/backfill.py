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

With bf_reserve_at slurm a reservation is placed as Slurm's is instead (slurm_reservation:
_will_run_test's batches of planned ends and the TRY_LATER retries): at the last end of the
batch of running jobs whose ending lets the job fit, which may be later than the earliest
time it fits, on the nodes free then. A whole-node job (several nodes) the pass starts is
then held in the pass's map as Slurm's backfill holds it (_start_job, then
_bf_reserve_running): its nodes from the pass to its planned end, both rounded down to
bf_resolution, so a later job's reservation leaves them out over that span and is tested
again from its end (`later_start`), not from the job's own planned end.

As Slurm's, the map is rebuilt at every pass and a job that would start later than
bf_window from now gets no reservation. A pass stops once no job left in the window could
start now (none fits the GPUs free now): further reservations would start nothing."""

from __future__ import annotations

import bisect
import collections
import functools
import itertools
import math
import operator

from transit_launch.sim.cluster import racks_for


_NODE = operator.itemgetter(0)  # an allocation's (node, GPUs) -> node
_ONE = (1).__eq__
_consume = collections.deque(maxlen=0).extend  # runs an iterator out at C speed (a loop of calls)
_NODE_OF_END = operator.itemgetter(1)  # Ends' (time, node) -> node
_GPUS = operator.itemgetter(1)  # an allocation's (node, GPUs) -> GPUs


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
        self.runs = None  # (version, slurm_reservation's memo of _will_run's answers then): backfill._memo
        # The start of made[0] when it is of whole nodes (inf when it is not), watched by a
        # replay whose cluster changes only as its running jobs do (None: not watched, the
        # node-failure replay): `moved` is set by the first start or end since made[0] was made
        # that changes which nodes are wholly free by then (_unmoved)
        self.watch = None
        self.moved = False

    def _watched(self, alloc) -> bool:
        """Whether one of the allocation's nodes is wholly free by `watch` (runs nothing, or
        nothing planned to end after it)."""
        per_node, watch = self.per_node, self.watch
        return any(not (planned := per_node[node]) or planned[-1] <= watch for node, _ in alloc)

    def add(self, alloc, end: float) -> None:
        self.version += 1
        if self.watch is not None and end > self.watch and not self.moved:
            self.moved = self._watched(alloc)  # a node free by `watch` before this start is not after
        per_node = self.per_node
        if len(alloc) > 1:
            nodes = list(map(_NODE, alloc))
            if not any(map(per_node.__getitem__, nodes)):  # every node ran nothing
                self._add_block(nodes, end)
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
        self._remove(alloc, end)
        if self.watch is not None and end > self.watch and not self.moved:
            self.moved = self._watched(alloc)  # a node not free by `watch` before this end is after

    def _remove(self, alloc, end: float) -> None:
        per_node = self.per_node
        if len(alloc) > 1:
            nodes = list(map(_NODE, alloc))
            if all(map(_ONE, map(len, map(per_node.__getitem__, nodes)))):  # each ran this job alone
                self._remove_block(nodes, end)
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

    def _by_rack(self, nodes: list):
        """The ascending nodes split by rack: (rack, its nodes), ascending."""
        return ((r, list(group)) for r, group in itertools.groupby(nodes, self.npr.__rfloordiv__))  # node // npr

    def _add_block(self, nodes: list, end: float) -> None:
        """add() for nodes that ran nothing (a multi-node job's whole nodes): they share the
        job's end, so their entries go in as one block, its place found once a list."""
        _consume(map(list.append, map(self.per_node.__getitem__, nodes), itertools.repeat(end)))
        nodes = sorted(nodes)
        _insert_block(self.order, end, nodes)
        for rack, group in self._by_rack(nodes):
            _insert_block(self.per_rack[rack], end, group)

    def _remove_block(self, nodes: list, end: float) -> None:
        """remove() for nodes that ran that job alone: their entries, all at its end, leave
        as one block."""
        _consume(map(list.clear, map(self.per_node.__getitem__, nodes)))
        _delete_block(self.order, end, nodes)
        for rack, group in self._by_rack(sorted(nodes)):
            _delete_block(self.per_rack[rack], end, group)


def _same_time(line: list, end: float) -> tuple[int, int]:
    """The slice of a sorted [(time, node)] whose entries are at `end`."""
    lo = bisect.bisect_left(line, (end,))
    return lo, bisect.bisect_left(line, (end, math.inf), lo)


def _insert_block(line: list, end: float, nodes: list) -> None:
    """(end, node) for the ascending `nodes` into the sorted `line`; merged with the other
    entries at that time where there are any (another job ending at the same time)."""
    lo, hi = _same_time(line, end)
    entries = list(zip(itertools.repeat(end), nodes))
    line[lo:hi] = entries if lo == hi else sorted(line[lo:hi] + entries)


def _delete_block(line: list, end: float, nodes: list) -> None:
    """(end, node) for each of `nodes` out of the sorted `line`."""
    lo, hi = _same_time(line, end)
    if hi - lo == len(nodes):
        del line[lo:hi]
    else:
        gone = set(nodes)
        line[lo:hi] = [x for x in line[lo:hi] if x[1] not in gone]


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
    if n == 1 and strategy == "tree":  # the rack with the fewest nodes that fit then, its first such
        npr, get = cl.nodes_per_rack, extra.get
        fit = cl.fitting(g)
        for node, x in extra.items():
            if free[node] < g <= free[node] + x and node not in cover:
                fit[node // npr] += 1
        for node in cover:
            if free[node] >= g:
                fit[node // npr] -= 1
        c = min(filter(None, fit), default=None)
        if c is None:
            return None
        lo = fit.index(c) * npr
        return [next(k for k in range(lo, lo + npr) if free[k] + get(k, 0) >= g and k not in cover)]
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
    for r in racks_for(count, n, strategy):
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
    if not resv:  # the loop below without reservations: its looks at now and at the short-th next node's end
        s = _nth_free(cl, ends, n, now)
        return (s, _whole_nodes_by(cl, ends, {}, n, s, strategy)) if s <= horizon else (math.inf, None)
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
        held = sum(1 for node in cover if free[node] == gpn or (p := per_node[node]) and p[-1] <= s)
        short = n - (cl.whole + i - held)
        if short <= 0:
            return s, _whole_nodes_by(cl, ends, cover, n, s, strategy)
        s = min(order[i + short - 1][0] if i + short - 1 < len(order) else math.inf,
                leave[x][0] if x < len(leave) else math.inf)
    return math.inf, None


def _nth_free(cl, ends, n: int, now: float) -> float:
    """When n whole nodes are free, no reservation in the way: now, or when the busy node
    that makes up the n-th is wholly free (inf: never)."""
    order = ends.order
    i = bisect.bisect_right(order, (now, math.inf))
    short = n - (cl.whole + i)
    return now if short <= 0 else order[i + short - 1][0] if i + short - 1 < len(order) else math.inf


def _whole_nodes_by(cl, ends, cover: dict, n: int, s: float, strategy) -> list:
    """The n whole nodes Cluster.place would choose at time s, from the nodes wholly free
    then (today's and those whose last planned end is by s) that `cover` leaves: counted
    by rack with a bisect each (Ends.per_rack), then read in the racks chosen alone. The
    caller has checked that enough are free. Returned in no order: only a rack whose
    nodes are not all taken is sorted, to take its lowest. strategy: as racks_for's."""
    gpn, free, per_node, npr = cl.gpn, cl.free, ends.per_node, cl.nodes_per_rack
    by = (s, math.inf)
    count = list(map(operator.add, cl.rack_count[gpn], map(bisect.bisect_right, ends.per_rack, itertools.repeat(by))))
    for node in cover:
        if free[node] == gpn or (p := per_node[node]) and p[-1] <= s:  # (none: completing, --epilog)
            count[node // npr] -= 1
    out = []
    for r in racks_for(count, n, strategy):
        busy = ends.per_rack[r]
        nodes = list(cl.rack_whole[r])
        nodes.extend(map(_NODE_OF_END, itertools.islice(busy, bisect.bisect_right(busy, by))))
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


# Slurm 22.05's _will_run_test (src/plugins/select/cons_common/job_test.c): the first window
# of job ends, in seconds; later windows double (bf_window_scale unset)
SLURM_TIME_WINDOW = 30


def _will_run_from(cl, planned, alloc, cover: int, n: int, g: int, strategy: str, memo: dict | None = None):
    """A job's start and nodes (a _Run) as Slurm 22.05's _will_run_test
    (src/plugins/select/cons_common/job_test.c) finds them on the nodes `cover` (a _mask) leaves it: now on
    the GPUs free now; else the running jobs with a node outside `cover` are given back in
    batches of planned ends (the first batch up to the first such end rounded up to a
    multiple of SLURM_TIME_WINDOW, plus the window; each later one up to that time plus the
    window doubled, and doubled again until the next job's end is inside), the job tested
    after each batch, and the start is the batch's last end, on the nodes chosen then
    (_choose); none if no batch lets it fit. As there, the window's edge is checked only
    on the job right after one given back, so a job after one passed over (all its nodes in
    `cover`) goes into the batch whatever its end.

    Under tree or for several nodes the job fits after a batch iff the batch gives back the
    job at which the last node it lacks outside `cover` reaches what it needs (_Reached): that
    job is found first (its planned end a bound under the start), and the batches are walked
    to the one that holds it (_batch_end) and the nodes chosen there only when asked (_Run).

    The start is the batch's last end, -inf for now, as no time but the start's floor depends
    on now: an answer holds while the running jobs and free GPUs do. memo: where _reach's
    lists are kept for as long (None: worked out for this call)."""
    if n == 1 and strategy != "tree":
        cover = _nodes(cover, cl.n_nodes)
        chosen = _choose(cl, {}, cover, n, g, strategy)
        return _Run.known(*((-math.inf, chosen) if chosen is not None else _walk(cl, planned, alloc, cover, n, g, strategy)))
    plan = memo.get("plan") if memo is not None else None
    if plan is None:
        plan = _Plan(planned, alloc)
        if memo is not None:
            memo["plan"] = plan
    target = cl.gpn if n > 1 else g
    reach = plan.reach.get(target)
    if reach is None:
        reach = plan.reach[target] = _reach(cl, planned, alloc, target)
    state = _Reached(cl, _bytes(cover, cl.n_nodes), n, g, strategy, reach)
    if state.lacking <= 0:  # it fits on the GPUs free now
        return _Run(-math.inf, state, plan, cover, 0)
    given = state.given_back_with(state.lacking)
    return _Run.known(math.inf, None) if given is None else _Run(plan.ends[given - 1], state, plan, cover, given)


class _Run:
    """_will_run_from's answer, worked out as far as it is asked: `bound`, a time the start is
    not before (None: the job fits after no batch); start(), the batch's last end (-inf: now);
    nodes(), those chosen then. slurm_reservation retries from `later_start` on the bound alone
    where it is past that, as most of its retries do, so the batches and the nodes of such an
    answer are never worked out."""

    __slots__ = ("bound", "_start", "_nodes", "_state", "_plan", "_cover", "_given")

    def __init__(self, bound: float, state, plan, cover: int, given: int):
        self.bound, self._state, self._plan, self._cover, self._given = bound, state, plan, cover, given
        self._start = self._nodes = None
        if not given:  # it fits now
            self._start = bound

    @classmethod
    def known(cls, start: float, nodes):
        """An answer worked out already ((inf, None): none)."""
        run = cls(None if nodes is None else start, None, None, 0, 0)
        run._nodes = nodes
        return run

    def start(self) -> float:
        if self._start is None:
            last, self._given = _batch_end(self._plan, self._cover, self._given)  # then the jobs gone over
            self._start = self._plan.ends[last]
        return self._start

    def nodes(self) -> list:
        if self._nodes is None:
            self.start()
            self._nodes = self._state.choose(self._given)
        return self._nodes


def _batch_end(plan, cover: int, need: int) -> tuple[int, int]:
    """The batch (_will_run_from's) that gives back the first `need` running jobs, in planned
    order, that is, the job need - 1 (one with a node outside `cover`): (its last job given
    back, the jobs the batches have gone over by then). Found from the sorted ends with a
    bisect, not job by job: a batch ends at the first job given back whose next job ends past
    end_time + window, i.e. at the first given back at or after bisect_right(ends, end_time +
    window) - 1. The last batch runs to the end of the list."""
    ends, masks, count = plan.ends, plan.masks, len(plan.ends)
    outside = (~cover).__and__  # a job's nodes outside cover: none, passed over, else given back

    def first_given(x):  # the first job from x on that is given back (count: none)
        return next(itertools.compress(itertools.count(x), map(outside, itertools.islice(masks, x, None))), count)

    f = first_given(0)
    window = SLURM_TIME_WINDOW
    end_time = ends[f] + (window - ends[f] % window)  # aligned to the window from the first end, once
    i = f
    while True:
        x = max(i, bisect.bisect_right(ends, end_time + window) - 1)
        j = first_given(x)
        if j >= count:  # none given back from x on: the batch runs to the end, its last given back before x
            j = x - 1
            while not outside(masks[j]):
                j -= 1
            return j, count
        if j + 1 >= need:
            return j, j + 1
        i = j + 1
        window *= 2
        while ends[i] > end_time + window:
            window *= 2


def _walk(cl, planned, alloc, cover, n: int, g: int, strategy: str):
    """_will_run_from job by job, with the GPUs given back kept for _choose (one node, pack or spread)."""
    state = _Given(cl, cover, g)
    give = state.give
    window, end_time = SLURM_TIME_WINDOW, None
    i, count = 0, len(planned)
    superset = cover.issuperset
    while i < count:
        last = nxt = None
        while i < count:
            e, k = planned[i]
            i += 1
            if superset(map(_NODE, alloc[k])):
                continue  # no usable node: passed over
            if end_time is None:  # aligned to the window from the first end, once
                end_time = e + (window - e % window)
            last = e
            give(alloc[k])
            if i >= count:
                nxt = None
                break
            nxt = planned[i][0]
            if nxt > end_time + window:
                break
        if last is None:
            break
        window *= 2
        while nxt is not None and nxt > end_time + window:
            window *= 2
        if state.changed:
            state.changed = False
            chosen = _choose(cl, state.extra, cover, n, g, strategy)
            if chosen is not None:
                return last, chosen
    return math.inf, None


class _Plan:
    """The running jobs as _will_run_from reads them: their planned ends in order, each one's
    nodes (a _mask), and _reach's lists by the GPUs reached; kept in a memo while the
    running jobs are the same."""

    def __init__(self, planned, alloc):
        self.ends = [e for e, _ in planned]
        self.masks = [_mask(map(_NODE, alloc[k])) for _, k in planned]
        self.reach = {}


def _reach(cl, planned, alloc, target: int):
    """For the running jobs given back in planned order: (pos, nodes, by): nodes[m] reaches
    `target` free GPUs once the first pos[m] are given back (not before; pos ascending), and
    by[node] that number. A node
    outside _will_run's cover has every job on it given back (none is passed over), so these
    are what it reaches there too, whatever the cover. A job of whole nodes (every GPU of
    each, so none free and no other job there) makes each reach any target: taken in a block."""
    free, gpn = cl.free, cl.gpn
    extra, pos, nodes, by = {}, [], [], {}
    get = extra.get
    for i, (_, k) in enumerate(planned, 1):
        a = alloc[k]
        if len(a) > 1 and all(map(gpn.__eq__, map(_GPUS, a))):
            whole = list(map(_NODE, a))
            nodes.extend(whole)
            pos.extend(itertools.repeat(i, len(whole)))
            by.update(zip(whole, itertools.repeat(i)))
            continue
        for node, v in a:
            x = get(node, 0)
            extra[node] = x + v
            if free[node] + x < target <= free[node] + x + v:
                pos.append(i)
                nodes.append(node)
                by[node] = i
    return pos, nodes, by


class _Given:
    """The GPUs _walk has given back (`extra`, for _choose); `changed`: a node outside `cover`
    reached the job's g GPUs since it was last cleared (else _choose's answer is still None)."""

    def __init__(self, cl, cover, g: int):
        self.free, self.cover, self.g = cl.free, cover, g
        self.extra, self.changed = {}, False

    def give(self, allocation) -> None:
        """A running job given back: its GPUs in `extra`."""
        extra, free, g, cover = self.extra, self.free, self.g, self.cover
        get = extra.get
        for node, v in allocation:
            x = get(node, 0)
            extra[node] = x + v
            if free[node] + x < g <= free[node] + x + v and node not in cover:
                self.changed = True


class _Reached:
    """_choose(cl, extra, cover, n, g, strategy) for n > 1, or one node under tree, once the
    first jobs in planned order are given back, from _reach's lists (`reach`): the nodes outside
    `cover` that are whole (n > 1) or have g GPUs (tree) now, counted by rack, and how many
    more the job lacks (`lacking`; none: it fits now). The job fits once the nodes outside
    `cover` that reach its need make up what it lacks: the nodes a job adds are all outside
    `cover` or all in it, as a node outside it has every job on it given back. cover: _bytes,
    read at C speed (`held`: 1 for a node in it)."""

    def __init__(self, cl, cover: bytes, n: int, g: int, strategy: str, reach):
        self.cl, self.n, self.g, self.strategy, self.reach = cl, n, g, strategy, reach
        self.held = held = cover.__getitem__
        npr, gpn, bucket = cl.nodes_per_rack, cl.gpn, cl.bucket
        if n > 1:
            self.gone = set(itertools.compress(bucket[gpn], map(held, bucket[gpn])))  # whole now, but left out
            count = list(map(len, cl.rack_whole))
            for node in self.gone:
                count[node // npr] -= 1
            self.count, self.lacking = count, n - (cl.whole - len(self.gone))
        else:
            fit = cl.fitting(g)
            for v in range(g, gpn + 1):
                for node in itertools.compress(bucket[v], map(held, bucket[v])):
                    fit[node // npr] -= 1
            self.count, self.lacking = fit, 0 if any(fit) else 1

    def given_back_with(self, k: int):
        """The running jobs (a count, in planned order) given back when the k-th node outside
        `cover` reaches the job's need; None: never."""
        pos, nodes, _ = self.reach
        m = next(itertools.islice(itertools.compress(itertools.count(), map(operator.not_, map(self.held, nodes))),
                                  k - 1, None), None)
        return None if m is None else pos[m]

    def choose(self, given: int) -> list:
        """_choose's nodes once the first `given` running jobs are given back (the job fits then)."""
        cl, held, n, npr = self.cl, self.held, self.n, self.cl.nodes_per_rack
        pos, nodes, by = self.reach
        added = sorted(itertools.filterfalse(held, itertools.islice(nodes, bisect.bisect_right(pos, given))))
        count = self.count[:]
        for r, k in collections.Counter(map(npr.__rfloordiv__, added)).items():  # node // npr
            count[r] += k
        if n > 1:
            out, gone = [], self.gone
            for r in racks_for(count, n, self.strategy):
                mine = added[bisect.bisect_left(added, r * npr):bisect.bisect_left(added, (r + 1) * npr)]
                nodes_r = sorted(list(cl.rack_whole[r] - gone if gone else cl.rack_whole[r]) + mine)
                out.extend(nodes_r[:n - len(out)])
            return out
        g, free, inf = self.g, cl.free, math.inf
        lo = count.index(min(filter(None, count))) * npr
        return [next(k for k in range(lo, lo + npr) if (free[k] >= g or by.get(k, inf) <= given) and not held(k))]


_BIT = bytes.maketrans(b"01", b"\x00\x01")  # a mask's binary digits as bytes that compress() reads


_BITS = [1 << k for k in range(4096)]  # node k's bit in a _mask (more nodes: made as asked)


def _mask(nodes) -> int:
    """A set of nodes as an int: bit k for node k (as Slurm's node bitmaps)."""
    try:
        return sum(map(_BITS.__getitem__, nodes))
    except IndexError:
        return sum(map((1).__lshift__, nodes))


def _bytes(mask: int, n_nodes: int) -> bytes:
    """A _mask as one byte a node (1: in it), made at C speed from its binary digits."""
    return format(mask, f"0{n_nodes}b").encode()[::-1].translate(_BIT)


def _nodes(mask: int, n_nodes: int) -> set:
    """The nodes of a _mask."""
    return set(itertools.compress(itertools.count(), _bytes(mask, n_nodes)))


class _Bounds:
    """Slurm's map of a pass's reservations (which only grow) as it reads it for many windows:
    the times reservations begin and end, sorted (`bounds`), and for each the nodes (masks,
    _mask) of the reservations over the span from it to the next (`span`) and of those ending
    then (`ending`), kept as reservations are added. A window's nodes are its spans' joined
    (cover), `later_start` the first bound where an ending one frees a node no span holds on,
    the overlap test the spans' over a reservation's own window. A reservation of no length
    (start = end) holds no span; it is kept aside (`points`) with the rules' plain tests."""

    def __init__(self, resv):
        self.resv, self.seen = resv, 0
        self.bounds, self.span, self.ending, self.points = [], [], [], []

    def _sync(self) -> None:
        span = self.span
        for rs, re, held in self.resv[self.seen:]:
            mask = _mask(held)
            if re <= rs:
                self.points.append((rs, re, mask))
            i = self._bound(rs)
            j = self._bound(re)
            span[i:j] = [m | mask for m in span[i:j]]
            self.ending[j] |= mask
        self.seen = len(self.resv)

    def _bound(self, t: float) -> int:
        """The index of bound t, added where new: its span holds what the one it splits held."""
        bounds = self.bounds
        i = bisect.bisect_left(bounds, t)
        if i == len(bounds) or bounds[i] != t:
            bounds.insert(i, t)
            self.span.insert(i, self.span[i - 1] if i else 0)
            self.ending.insert(i, 0)
        return i

    def _joined(self, lo: int, hi: int) -> int:
        """The nodes of spans lo..hi - 1."""
        return functools.reduce(operator.or_, itertools.islice(self.span, max(lo, 0), hi), 0)

    def overlaps(self, first: float, last: float, nodes) -> bool:
        """Whether a reservation over [first, last) (rs < last and re > first) holds one of `nodes`
        (_test_resv_overlap): those of the spans that meet it."""
        if self.seen != len(self.resv):
            self._sync()
        bounds = self.bounds
        mask = self._joined(bisect.bisect_right(bounds, first) - 1, bisect.bisect_left(bounds, last))
        for rs, re, held in self.points:
            if rs < last and re > first:
                mask |= held
        return bool(mask & _mask(nodes))

    def window(self, start: float, end: float, slide: "_Slide") -> tuple[int, float | None]:
        """For a window [start, end]: the nodes (a mask) of the reservations over it (re > start
        and rs <= end), those of the spans from the one holding `start` to the one holding `end`
        (joined by `slide`, one call's); and Slurm's `later_start` (backfill.c,
        _attempt_backfill's walk over its map of reservations, whose spans begin and end where
        reservations do): the first reservation end after `start` at which a node held just
        before is held by none just after, looked for up to the end of the first span that
        begins past `end` (Slurm merges two equal neighbouring spans now and then, which can
        move that end: not modelled); None: none. A bound frees a node where its `ending`
        has one its span has not, read at C speed."""
        if self.seen != len(self.resv):
            self._sync()
        bounds = self.bounds
        lo = bisect.bisect_right(bounds, start)
        past = bisect.bisect_right(bounds, end)
        mask = slide.joined(max(lo - 1, 0), past)
        for rs, re, held in self.points:
            if re > start and rs <= end:
                mask |= held
        hi = max(past + 2, lo)  # to the end of the first span that begins past `end`
        frees = map(operator.and_, itertools.islice(self.ending, lo, hi),
                    map(operator.invert, itertools.islice(self.span, lo, hi)))
        return mask, next(itertools.compress(itertools.islice(bounds, lo, hi), frees), None)


class _Slide:
    """The nodes of a _Bounds' spans lo..hi - 1 joined, for windows whose lo and hi only grow
    (one slurm_reservation call's, the map unchanged): a queue's two stacks, the spans from
    `mid` on joined as they come in (`back`), those before it joined from each to `mid`
    (`front`, made anew once lo reaches `mid`), so a retry costs the spans its window moved
    over instead of all it holds."""

    def __init__(self, bounds: _Bounds):
        self.span = bounds.span
        self.base = self.mid = self.hi = 0
        self.front, self.back = [], 0

    def joined(self, lo: int, hi: int) -> int:
        span = self.span
        if lo >= self.mid:  # the front is used up: made anew over lo..hi - 1
            self.front = list(itertools.accumulate(reversed(span[lo:hi]), operator.or_))[::-1]
            self.base, self.mid, self.hi, self.back = lo, hi, hi, 0
        elif hi > self.hi:
            self.back = functools.reduce(operator.or_, itertools.islice(span, self.hi, hi), self.back)
            self.hi = hi
        return (self.front[lo - self.base] if lo < self.mid else 0) | self.back


def slurm_reservation(cl, planned, alloc, resv, n: int, g: int, length: float, now: float, horizon: float,
                      strategy: str, sp, memo: dict | None = None):
    """(start, nodes) of a job's reservation as Slurm 22.05's backfill makes it
    (src/plugins/sched/backfill/backfill.c, _attempt_backfill and its TRY_LATER loop, with
    _will_run_test of src/plugins/select/cons_common/job_test.c); (inf, None) if none within
    `horizon`. From start_res = now: the nodes held by a reservation over [start_res,
    start_res + length] are left out; _will_run finds a start and nodes on the others, taken
    as start_res if earlier; if that is past `later_start` (_Bounds.window) the job is tested
    again from there, and if its nodes meet a reservation over its own rounded window
    (_test_resv_overlap) again from its start. A retry whose nodes left out are those of the
    one before has its answer. sp: SchedParams (bf_resolution). memo: _will_run's answers
    by (nodes left out, n, g), for as long as the running jobs and the free GPUs are the same
    (the caller gives a new one when they change: _memo), and the pass's _Bounds."""
    start_res = now
    bounds = None if memo is None else memo.get("bounds")
    if bounds is None or bounds.resv is not resv:
        bounds = _Bounds(resv)
        if memo is not None:
            memo["bounds"] = bounds
    was = None  # the nodes left out at the retry before
    slide = _Slide(bounds)
    while start_res <= horizon:
        end = start_res + length
        cover, later = bounds.window(start_res, end, slide)
        if cover != was:
            was = cover
            if memo is None:
                run = _will_run_from(cl, planned, alloc, cover, n, g, strategy)
            else:
                key = (cover, n, g)
                run = memo.get(key)
                if run is None:
                    run = memo[key] = _will_run_from(cl, planned, alloc, cover, n, g, strategy, memo)
        if run.bound is None:  # no nodes
            if later is None:
                break
            start_res = later
            continue
        if later is not None and max(run.bound, start_res) > later:  # its start is past later_start
            start_res = later
            continue
        s = max(run.start(), start_res)  # (start_res is now at least)
        if later is not None and s > later:
            start_res = later
            continue
        chosen = run.nodes()
        if s > now and bounds.overlaps(sp.reservation(s), sp.reservation(s + length), chosen):
            start_res = s
            continue
        return (s, chosen) if s <= horizon else (math.inf, None)
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
    before its start then, nor does now), or, for the first of whole nodes, made before jobs
    started and ended that change nothing of it (_unmoved); else worked out and kept."""
    if made is not None and k < len(made):
        version, j, s, chosen = made[k]
        if j == job and chosen is not None and s >= now:
            if version == ends.version:
                return s, chosen
            if k == 0 and n > 1 and ends.watch is not None and _unmoved(cl, ends, n, now, s):
                made[0] = (ends.version, j, s, chosen)
                return s, chosen
        del made[k:]
    if ends is not None and n > 1:
        s, chosen = _reservation_nodes(cl, ends, resv, n, length, now, horizon, strategy)
    else:
        s, chosen = reservation(cl, planned, alloc, resv, n, g, length, now, horizon, strategy)
    if made is not None:
        made.append((ends.version, job, s, chosen))
        if k == 0 and ends.watch is not None:  # watched from now on (_unmoved)
            ends.watch, ends.moved = (s if n > 1 and chosen is not None else math.inf), False
    return s, chosen


def _work_out(cl, ends, made, resv_jobs: list, resv: list, pending: list, nodes, gpus, plan, now: float,
              horizon: float, sp, strategy: str, planned, alloc, kept: tuple, limit: int, memo: dict) -> tuple:
    """The pending jobs' reservations, in order, added to `resv` (those that find none left
    out) and their jobs to `resv_jobs`; returns _tests' (starts, by_start, room) for the
    reservations then: `kept` when none was added, else its lists with the new ones in
    (_by_start) and room anew (off none of them: `limit`). memo: slurm_reservation's, kept by
    the pass until a job starts."""
    added, first = False, len(resv)
    slurm = sp.bf_reserve_at == "slurm"
    for p in pending:
        if slurm:  # none kept across passes: its batches change with any running job's end
            s, chosen = slurm_reservation(cl, planned, alloc, resv, nodes[p], gpus[p], plan[p], now, horizon,
                                          strategy, sp, memo)
        else:
            s, chosen = _reserve(cl, ends, made, len(resv_jobs), resv, p, nodes[p], gpus[p], plan[p],
                                 now, horizon, strategy, planned, alloc)
        resv_jobs.append(p)
        if chosen is not None:
            rs = sp.reservation(s)
            resv.append((rs, max(sp.reservation(s + plan[p]), rs + sp.bf_resolution), frozenset(chosen)))
            added = True
    if not added:
        return kept
    starts, by_start, _ = kept
    _by_start(starts, by_start, resv, first, now)
    return starts, by_start, {0: ((), limit)}


def _by_start(starts: list, by_start: list, resv: list, first: int, now: float) -> None:
    """resv[first:] into _tests' reservations by start (`starts`, and their indices
    `by_start`), those not over by now, in place: in sorted((start, index)) order, as a new
    one's index is the largest, it goes after those that start with it."""
    for k in range(first, len(resv)):
        rs, re, _ = resv[k]
        if re > now:
            i = bisect.bisect_right(starts, rs)
            starts.insert(i, rs)
            by_start.insert(i, k)


def _unmoved(cl, ends, n: int, now: float, s: float) -> bool:
    """Whether a pass's first reservation of n whole nodes (no reservation before it), with
    start s, is what _reservation_nodes would make now: so when no job started or ended since
    it was made changed which nodes are wholly free by s (Ends.moved: a start planned to end
    after s on a node that was free by then, or an end, planned after s, that leaves its node
    free by then; one planned to end by s changes no node's), and n whole nodes are free no
    earlier than s now (_nth_free). _reservation_nodes' answer is a function of its start and
    of the nodes wholly free by it (_whole_nodes_by counts and reads those alone), so the
    nodes chosen are those of then; an earlier start is what _nth_free would find."""
    return not ends.moved and _nth_free(cl, ends, n, now) == s


def _memo(ends) -> dict:
    """slurm_reservation's memo for a pass: that of the passes before while no job has started
    or ended since (Ends.version), where the cluster changes only as its running jobs do
    (Ends.watch set: the replay without --epilog or node failures); else a new one."""
    if ends is None or ends.watch is None:
        return {}
    if ends.runs is None or ends.runs[0] != ends.version:
        ends.runs = (ends.version, {})
    return ends.runs[1]


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
    turn (under bf_reserve_at earliest; under slurm at their turn), with the same result: a job whose reservation is pending has a bound under its
    start (`earliest`, rounded down), and while every pending bound lies past a job's
    window, the pending reservations cannot hold that job's nodes, and the job (ending
    before them) changes no pending reservation once started.

    A job that could not start on the GPUs free at the pass's start never will in it
    (starts in the pass only take GPUs), and once the pass has given its bf_reserve
    reservations such a job does nothing: the loop then goes over the jobs that could
    (`fitting`, from the queue's index by GPUs) alone, and over every job while
    reservations are left. Over the fitting ones, a job does something only if it fits now
    (its GPUs within `limit`) and is shorter than the last of its GPUs that failed to start
    (`failed`): the first lines test that alone. Over every job, a GPU count whose job fits
    nowhere now and could not start within the window (`earliest`, which starts only
    delay) does nothing for the rest of the pass (`dead`)."""
    if cl.free_gpus == 0:
        return
    cutoff = queue.last_tested(sp.bf_max_job_test)
    # the jobs that could start now (Cluster.fits with its counts read once: whole nodes,
    # and the most GPUs free on a node); a job's GPUs tell its nodes too (up to a node's
    # for one node, n x a node's for n), so one bound on them says it: with a whole node
    # free, every one-node job fits and n nodes iff n <= whole
    whole, most = cl.whole, _most(cl)
    limit = whole * cl.gpn if whole else most  # a job fits now iff its GPUs are within this
    fitting = queue.fitting(limit, cutoff, sp.bf_max_job_test)
    if not fitting:  # nothing can start: the pass does nothing
        return
    last = fitting[-1]
    resv, pending, bound, bounds, failed = [], [], math.inf, {}, {}
    resv_jobs = []  # the jobs whose reservations were worked out, in order (some found none)
    made = ends.made if ends is not None else None
    horizon = now + sp.bf_window
    cap, taken = sp.bf_reserve or math.inf, 0  # reservations a pass gives; made or pending
    # the reservations in the way of a window from now: those not over by now, their starts
    # ascending (`starts`, `by_start`: indices into resv); a window to now + L meets the
    # first bisect_right(starts, now + L) of them (a reservation holds a window that reaches
    # its start); made again when reservations are added
    starts, by_start = [], []
    # room[k]: (the nodes the first k hold, whole * GPUs a node if whole nodes are free off
    # them, else the most GPUs free on a node off them: a job fits off them iff its GPUs are
    # within it); emptied at a start and when reservations are added
    room = {0: ((), limit)}
    inf, failed_get = math.inf, failed.get
    slurm = sp.bf_reserve_at == "slurm"
    dead = set()  # GPU counts that fit nowhere now and would start past the window
    memo = _memo(ends)  # _will_run's answers while no job starts or ends (slurm_reservation)
    running = 0  # entries of resv for whole-node jobs the pass started (slurm: _bf_reserve_running)
    first = 0  # the jobs before this one are tested
    while first <= last:
        every = taken < cap  # every job (reservations left to give), else the fitting ones
        for j in (queue.between(first, cutoff) if every else fitting[bisect.bisect_left(fitting, first):]):
            shape = gpus[j]  # its GPUs tell its nodes too
            if every:
                if shape in dead:
                    if j >= last:
                        return
                    continue
            elif shape > limit or plan[j] >= failed_get(shape, inf):
                continue  # (the list ends at `last`)
            length, n = plan[j], nodes[j]
            # one that failed to start stays failed for a longer window (the pass only takes
            # GPUs and adds reservations); fits: Cluster.fits
            if shape <= limit and length < failed_get(shape, inf):
                if bound <= now + length:  # a pending reservation may hold this job's nodes: work them out
                    starts, by_start, room = _work_out(cl, ends, made, resv_jobs, resv, pending, nodes, gpus, plan, now,
                                                       horizon, sp, strategy, planned, alloc, (starts, by_start, room),
                                                       limit, memo)
                    pending, bound, taken = [], inf, len(resv) - running
                # start it on nodes no reservation holds while it would run
                k = bisect.bisect_right(starts, now + length) if starts else 0
                if k not in room:  # one reservation's nodes as they are, several's joined
                    blocked = (resv[by_start[0]][2] if k == 1
                               else frozenset().union(*(resv[r][2] for r in by_start[:k])))
                    whole_out, most_out = _room_outside(cl, blocked)
                    room[k] = (blocked, whole_out * cl.gpn if whole_out else most_out)
                blocked, limit_out = room[k]
                ok = False
                if shape <= limit_out:
                    held = _held(cl, blocked) if blocked else ()
                    for node, v in held:
                        cl._take(node, v)
                    ok = begin(j, now)
                    if held:
                        cl.release(held)
                if ok:
                    started.append(j)
                    if slurm and n > 1:  # Slurm's _bf_reserve_running: its whole nodes in the map to its planned end
                        rs = sp.reservation(now)
                        resv.append((rs, max(sp.reservation(now + length), rs + sp.bf_resolution),
                                     frozenset(map(_NODE, alloc[j]))))
                        running += 1
                        _by_start(starts, by_start, resv, len(resv) - 1, now)
                    if cl.free_gpus == 0:
                        return
                    bounds.clear()
                    memo = _memo(ends)
                    most = _most(cl)
                    limit = cl.whole * cl.gpn if cl.whole else most
                    room = {0: ((), limit)}
                    if (taken < cap) != every:
                        break
                    continue
                failed[shape] = length  # shorter than the last failure of its GPUs, or the first
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
            elif shape > limit:
                dead.add(shape)
            if every and (slurm or taken >= cap > 1):
                # the last reservation to give is pending: worked out now, as one that finds no
                # room (the others in its way) leaves one to give to a later job, and the jobs
                # the fitting ones' loop would skip are the ones to test for it. Under Slurm's
                # rule every one at its turn: the head's too may find none (its batch of ends
                # past the window), and a job that starts and ends before a pending one's start
                # can still move it, as its end may begin the first batch (_will_run)
                starts, by_start, room = _work_out(cl, ends, made, resv_jobs, resv, pending, nodes, gpus, plan, now,
                                                   horizon, sp, strategy, planned, alloc, (starts, by_start, room), limit,
                                                   memo)
                pending, bound, taken = [], inf, len(resv) - running
            if (taken < cap) != every:
                break
        else:
            return
        first = j + 1  # the loop broke off there to change what it goes over
