"""The backfill pass's indexes against brute force on random inputs: the queue's index by
GPUs (sim/waiting.py), the nodes' planned ends by rack (backfill.Ends.per_rack), and what a
reservation and a start read off them."""

import bisect
import math
import random

import pytest

from transit_launch.sim import backfill
from transit_launch.sim.cluster import Cluster
from transit_launch.sim.waiting import Waiting


def _queue_ops(rng, gpus, n_ops):
    """A Waiting and the plain sorted list it must equal, after random submissions,
    requeues, head starts and starts from anywhere."""
    q, plain, nxt = Waiting(gpus), [], 0
    for _ in range(n_ops):
        op = rng.random()
        if op < 0.45 and nxt < len(gpus):
            q.append(nxt)
            plain.append(nxt)
            nxt += 1
        elif op < 0.55 and nxt:  # a requeue: an index below the newest
            j = rng.randrange(nxt)
            if j not in plain:
                q.insort(j)
                bisect.insort(plain, j)
        elif op < 0.7 and plain:
            assert q.popleft() == plain.pop(0)
        elif plain:
            j = plain.pop(rng.randrange(min(len(plain), 600)))
            q.remove(j)
    return q, plain


@pytest.mark.parametrize("seed", range(6))
def test_the_queue_index_matches_a_walk(seed):
    rng = random.Random(seed)
    gpus = [rng.choice((1, 2, 3, 4, 8, 12, 16, 64)) for _ in range(3000)]
    q, plain = _queue_ops(rng, gpus, 6000)
    assert list(q) == plain and len(q) == len(plain)
    for line in q.by_gpus.values():
        assert list(line) == sorted(line)
    assert sorted(j for line in q.by_gpus.values() for j in line) == plain
    for tested in (1, 7, 500, 10_000):
        last = q.last_tested(tested)
        assert last == (plain[min(tested, len(plain)) - 1] if plain else -1)
        for most in (0, 1, 3, 4, 16, 1000):
            assert q.fitting(most, last) == [j for j in plain[:tested] if gpus[j] <= most]
        first = plain[len(plain) // 3] if plain else 0
        assert list(q.between(first, last)) == [j for j in plain[:tested] if j >= first]


def test_removing_a_job_not_waiting_is_refused():
    q = Waiting([1, 1, 1])
    q.append(0)
    q.append(2)
    with pytest.raises(ValueError):
        q.remove(1)


def _busy_cluster(rng, racks, gpn, npr):
    """A cluster with random jobs placed, and their planned ends in an Ends."""
    cl = Cluster(racks, npr * gpn, gpn)
    ends = backfill.Ends(cl.n_nodes, npr)
    running = []
    for _ in range(rng.randrange(cl.n_nodes * 2)):
        g = rng.choice((1, 2, gpn, 2 * gpn, 3 * gpn))
        n = -(-g // gpn)
        placed = cl.place(n, g if n == 1 else n * gpn, rng.choice(("pack", "spread")))
        if placed is not None:
            end = float(rng.randrange(1, 50))
            ends.add(placed[0], end)
            running.append((placed[0], end))
    for alloc, end in rng.sample(running, len(running) // 3):  # some end again
        cl.release(alloc)
        ends.remove(alloc, end)
    return cl, ends


@pytest.mark.parametrize("seed", range(20))
def test_ends_by_rack_and_the_reserved_nodes(seed):
    rng = random.Random(seed)
    gpn, npr = rng.choice((4, 8)), rng.choice((2, 4, 8))
    cl, ends = _busy_cluster(rng, rng.randrange(1, 9), gpn, npr)
    assert sorted(e for rack in ends.per_rack for e in rack) == ends.order
    for r, rack in enumerate(ends.per_rack):
        assert rack == sorted(rack) and all(node // npr == r for _, node in rack)
    for _ in range(20):
        s = float(rng.randrange(0, 60))
        cover = {node: 1 for node in rng.sample(range(cl.n_nodes), rng.randrange(cl.n_nodes // 2 + 1))}
        i = bisect.bisect_right(ends.order, (s, math.inf))
        became = {node: gpn - cl.free[node] for _, node in ends.order[:i]}
        free_then = cl.whole + i - sum(1 for node in cover if cl.free[node] == gpn or ends.per_node[node][-1] <= s)
        for n in range(2, free_then + 1):
            for strategy in ("pack", "spread"):
                want = backfill._choose(cl, became, cover, n, 0, strategy)
                got = backfill._whole_nodes_by(cl, ends, cover, n, s, strategy == "pack")
                assert sorted(got) == sorted(want)


@pytest.mark.parametrize("seed", range(20))
def test_the_room_outside_the_reserved_nodes(seed):
    rng = random.Random(seed)
    gpn = rng.choice((4, 8))
    cl, _ = _busy_cluster(rng, rng.randrange(1, 9), gpn, 4)
    for size in (0, 1, cl.n_nodes // 2, cl.n_nodes):
        blocked = frozenset(rng.sample(range(cl.n_nodes), size))
        (whole, most), held = backfill._room_outside(cl, blocked), backfill._held(cl, blocked)
        assert sorted(held) == sorted((node, cl.free[node]) for node in blocked if cl.free[node])
        assert whole == sum(1 for node in range(cl.n_nodes) if cl.free[node] == gpn and node not in blocked)
        assert most == max([cl.free[node] for node in range(cl.n_nodes) if node not in blocked] + [0])
