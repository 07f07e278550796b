"""The streamed step's state copied in during backward and home under the next forward
(TRANSIT_OVERLAP_EARLY=1, transit_launch/adapter/transit_early.py) on CPU models: the results
stay bit-identical to the normal step with clipping and accumulation whether the state was
fetched, found no room, or was replaced between steps; the room rule and the forward's
pacing against hand-derived timelines. The CPU stands in for the GPU as in
test_adapter_streamed.py (a CPU ring, homes in the state's own memory, no streams); PyTorch's
allocator stats are a stand-in the test sets."""

import pytest

from tests.conftest import NEEDS_TORCH, NO_TORCH
from tests.test_adapter_streamed import OPTIMIZERS, RING, load, same, train

pytestmark = pytest.mark.skipif(NO_TORCH, reason=NEEDS_TORCH)
GB = 10**9


class Memory:
    """PyTorch's (allocated, reserved) on a device, as the test says they are."""

    def __init__(self, allocated=0, reserved=1 << 40):
        self.allocated, self.reserved = allocated, reserved

    def __call__(self, dev):
        return self.allocated, self.reserved


@pytest.fixture
def early(monkeypatch):
    """make(memory, slack) -> a StreamedStep with an EarlyState on CPU staging."""
    import torch
    monkeypatch.setenv("TRANSIT_OVERLAP_INFLIGHT", str(RING))
    st = load("transit_staging")
    ts = load("transit_streamed")
    te = load("transit_early")
    monkeypatch.setattr(ts, "_empty_like", lambda *a, **k: torch.full_like(*a, float("nan"), **k))
    monkeypatch.setattr(st.Staging, "_homeable", staticmethod(lambda t: t.is_contiguous()))

    def make(memory=None, slack=0):
        staging = st.Staging(host_state=lambda ptr, n: True)
        return ts.StreamedStep(staging, early=te.EarlyState(staging, memory=memory or Memory(), slack=slack))
    return make


@pytest.mark.parametrize("name", ["adamw-foreach", "adam-amsgrad", "sgd-momentum"])
@pytest.mark.parametrize("clip", [None, 0.05], ids=["no-clip", "clip"])
def test_state_fetched_in_backward_steps_bit_identical(early, name, clip):
    steps = 6
    ref = train(OPTIMIZERS[name], steps=steps, clip=clip)
    drv = early()
    got = train(OPTIMIZERS[name], drv, steps=steps, clip=clip)
    same(got, ref)
    # the hooks go on after the first streamed step; the next backward learns which hook is
    # final (2 microbatches: the second), the one after records the backward's timeline; from
    # then on each of the 4 parameters is fetched in every last backward. SGD's first step is
    # not streamed (its momentum starts as the gradient): one step later
    first = 2 if name.startswith("sgd") else 1
    fetching = steps - first - 2
    c = drv.counters()["early"]
    assert c["fetched_params"] == c["stepped_params"] == 4 * fetching, c
    assert c["no_room"] == 0 and c["unused"] == 0
    assert drv.streamed == 4 * (steps - first + 1)  # every step streamed all of them, fetched or not


def test_no_room_streams_after_backward_bit_identical(early):
    """The room rule: the allocated bytes plus a parameter's state plus what the rest of the
    backward took at the last step must stay under the reserved bytes; here the reserved bytes
    are 100 and the smallest state (4 floats of Adam: 32 bytes) with a slack of 80 does not fit."""
    steps = 5
    ref = train(OPTIMIZERS["adamw-foreach"], steps=steps, clip=0.05)
    drv = early(Memory(allocated=0, reserved=100), slack=80)
    got = train(OPTIMIZERS["adamw-foreach"], drv, steps=steps, clip=0.05)
    same(got, ref)
    c = drv.counters()["early"]
    assert c["fetched_params"] == 0
    assert c["no_room"] == 4 * (steps - 3)  # asked at every final gradient once the timeline is known


def test_state_replaced_between_steps_is_streamed_from_its_new_home(early):
    """A load_state_dict after a backward that fetched the old state: the fetched copy is
    dropped and the step streams the loaded state (the results equal the normal step's after
    the same load)."""
    import torch

    def run(drv):
        m = load_model()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        gen = torch.Generator().manual_seed(1)
        saved = {}
        if drv:
            drv.install()
        try:
            for step in range(6):
                m(torch.randn(5, 64, generator=gen)).square().mean().backward()
                if step == 4:  # the backward fetched the state; a checkpoint's state replaces it
                    opt.load_state_dict(saved[1])
                opt.step()
                opt.zero_grad()
                if step == 1:
                    saved[1] = {"state": {k: {n: v.clone() for n, v in s.items()} for k, s in
                                          opt.state_dict()["state"].items()},
                                "param_groups": opt.state_dict()["param_groups"]}
        finally:
            if drv:
                drv.uninstall()
        return [p.detach().clone() for p in m.parameters()]

    ref = run(None)
    drv = early()
    got = run(drv)
    assert all(torch.equal(a, b) for a, b in zip(got, ref))
    c = drv.counters()["early"]
    # fetched at steps 3-5 (0-based), the loaded state at step 4 not the one fetched: dropped
    assert (c["fetched_params"], c["stepped_params"]) == (3 * 4, 2 * 4), c


def load_model():
    from tests.test_adapter_streamed import model
    return model()


def test_the_forward_gives_back_held_buffers_where_its_next_point_needs_the_room(early):
    """Hand-derived: reserved 10 GB, slack 1 GB, two 3 GB buffers held; the last step's forward
    had 2, 4 and 7 GB allocated at its three points. At point 0 (2 GB allocated besides the 6
    held) the next point needs 4: 6 + 4 + 1 > 10, one buffer goes (3 + 4 + 1 <= 10). At point 1
    (4 GB besides 3 held) the next needs 7: 3 + 7 + 1 > 10, the other goes. The stream waits
    for each buffer's copy home before its blocks are reused."""
    import torch

    te = load("transit_early")
    st = load("transit_staging").Staging()
    mem = Memory(reserved=10 * GB)
    e = te.EarlyState(st, memory=mem, slack=1 * GB)
    dev = torch.device("cpu")
    waited = []

    class Stream:
        def wait_event(self, ev):
            waited.append(ev)

    bufs = [[torch.zeros(1)], [torch.zeros(1)]]
    e.held.extend([(dev, "copied-home-0", Stream(), bufs[0], 3 * GB), (dev, "copied-home-1", Stream(), bufs[1], 3 * GB)])
    e.held_bytes = 6 * GB
    e.limit[dev] = 10 * GB
    e.fwd.last = [2 * GB, 4 * GB, 7 * GB]
    mem.allocated = 2 * GB + 6 * GB
    e.pre_forward(None, ())
    assert (e.held_bytes, waited, bufs[0], len(bufs[1])) == (3 * GB, ["copied-home-0"], [], 1)
    mem.allocated = 4 * GB + 3 * GB
    e.pre_forward(None, ())
    assert (e.held_bytes, waited, bufs[1]) == (0, ["copied-home-0", "copied-home-1"], [])
    assert e.fwd.now == [2 * GB, 4 * GB]  # the points as this step had them (held bytes not counted)


def test_a_segment_added_while_holding_turns_it_off_said_once(early, capsys):
    import torch

    te = load("transit_early")
    mem = Memory(reserved=11 * GB)
    e = te.EarlyState(load("transit_staging").Staging(), memory=mem, slack=0)
    e.say = lambda text: print(f"transit adapter: {text}")
    dev = torch.device("cpu")
    e.held.append((dev, None, None, [torch.zeros(1)], GB))
    e.held_bytes = GB
    e.limit[dev] = 10 * GB
    e.fwd.last = [0, 0]
    e.pre_forward(None, ())
    e.pre_forward(None, ())
    assert not e.on and e.held_bytes == 0 and not e.held
    err = capsys.readouterr().out
    assert err.count("early state copies off: PyTorch reserved 1000000000 more bytes on cpu") == 1


def test_the_room_rule_counts_what_the_rest_of_the_backward_took(early):
    """Hand-derived: reserved 100 bytes, slack 10, a parameter of 4 floats whose Adam state is
    32 bytes, asked for at the backward's first final gradient with 50 bytes allocated. The last
    step's backward went on to 58 bytes at its second point: 50 + 32 + (58 - 50) + 10 = 100
    fits; at 59 it would not."""

    te = load("transit_early")

    def asked(later):
        st = load("transit_staging").Staging(host_state=lambda ptr, n: True)
        e = te.EarlyState(st, memory=Memory(allocated=50, reserved=100), slack=10)
        p, opt = adam_param(st, e)
        e.back.last = [50, later]
        e._fetch(p)
        return id(p) in e.fetched, e.stats["no_room"], e.back.now

    assert asked(58) == (True, 0, [50])
    assert asked(59) == (False, 1, [50])


def test_reading_the_state_gives_back_what_is_held(early):
    """After a step the early state's buffers are held into the next forward (their copies home
    may still run); state_dict() gives them back first (the stream waits for the copies)."""
    import torch

    drv = early()
    m = load_model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    drv.install()
    try:
        for _ in range(5):
            m(torch.randn(5, 64, generator=gen)).square().mean().backward()
            opt.step()
            opt.zero_grad()
        held = drv.early.held_bytes
        opt.state_dict()
        # all four parameters' Adam state: (64 x 1000 + 1000 + 1000 x 4 + 4) floats x 2 x 4 bytes
        assert (held, drv.early.held_bytes, len(drv.early.held)) == (69004 * 8, 0, 0)
    finally:
        drv.uninstall()


@pytest.mark.parametrize("raw,on,said", [("", False, False), ("0", False, False), ("1", True, False),
                                         ("yes", False, True), ("2", False, True), (" 1", False, True)])
def test_the_switch_is_0_or_1_and_anything_else_is_said_once_and_off(raw, on, said):
    te = load("transit_early")
    lines = []
    assert te.enabled({"TRANSIT_OVERLAP_EARLY": raw} if raw else {}, lines.append) is on
    assert lines == ([f"TRANSIT_OVERLAP_EARLY={raw!r} is not 0 or 1; the early state copies stay off"] if said else [])


def test_buffers_are_carved_as_the_allocator_takes_free_blocks():
    """Hand-derived (KiB, each a multiple of the allocator's 512 bytes): blocks of 300 and 100,
    state of 250 and 100: 250 takes the 300 (50 left), 100 takes the 100. 250 and 150: after the
    250, blocks of 50 and 100 are left and the 150 fits neither: a new segment, so no."""
    te = load("transit_early")
    K = 1024
    assert te.carve([300 * K, 100 * K], [100 * K, 250 * K]) == [50 * K]
    assert te.carve([300 * K, 100 * K], [250 * K, 150 * K]) is None
    assert te.carve([100 * K], [100 * K - 1]) == []  # rounded up to 512 bytes: the whole block
    assert te.carve([], [1]) is None


def test_no_free_block_in_the_applications_pool_means_no_fetch():
    """The room in bytes is there but the application's stream's pool has no block for the
    state's buffers (FSDP2's hooks run on the reduce-scatter stream, whose pool has none of the
    freed activations): no fetch, counted. The pool is looked at again only once the state's
    bytes have been freed since the last look."""
    te = load("transit_early")
    K = 1024
    looks = []

    def blocks(dev, stream):
        looks.append((dev, stream))
        return pool

    e = te.EarlyState(load("transit_staging").Staging(), memory=Memory(), slack=0, blocks=blocks)
    cuda = type("Dev", (), {"type": "cuda"})()
    e.app_stream[cuda] = "the application's stream"
    pool = [100 * K]
    assert not e._carve(cuda, 500 * K, [200 * K])
    assert not e._carve(cuda, 400 * K, [200 * K])  # 100 freed since: not looked at
    assert len(looks) == 1
    pool = [300 * K]
    assert e._carve(cuda, 300 * K, [200 * K])  # 200 freed since: looked at, and it fits
    assert looks == [(cuda, "the application's stream")] * 2
    assert e._carve(cuda, 300 * K, [200 * K]) and len(looks) == 3  # after a fit, looked at every time


def test_a_buffer_that_took_a_new_segment_is_given_back_and_the_cache_trimmed(early, capsys):
    """PyTorch's reserved bytes grew while the buffers were made: they are given back, the
    early copies go off (said once), and PyTorch's unused segments are released once (the new
    segment may be on the host); the step streams the state as without early copies."""
    import torch

    te = load("transit_early")

    class Growing(Memory):
        def __call__(self, dev):
            self.calls = getattr(self, "calls", 0) + 1
            return self.allocated, self.reserved + (self.calls > 1)

    trims = []
    st = load("transit_staging").Staging(host_state=lambda ptr, n: True)
    e = te.EarlyState(st, memory=Growing(allocated=0, reserved=100), slack=0, trim=lambda: trims.append(1))
    e.say = lambda text: print(f"transit adapter: {text}")
    p, opt = adam_param(st, e)
    e.back.last = [0]
    st.ring = lambda dev: (RingStandIn(), torch.zeros(64, dtype=torch.uint8))
    e._fetch(p)
    assert (e.fetched, e.on, trims, e.stats["fetched_params"]) == ({}, False, [1], 0)
    e._turn_off("again", grew=True)
    assert trims == [1]
    assert capsys.readouterr().out.count("early state copies off: a buffer took a new segment of 1 bytes on cpu") == 1


def adam_param(st, e):
    """A parameter of 4 floats whose Adam state (two moments, 32 bytes) is homed, under an
    optimizer e watches: (the parameter, the optimizer)."""
    import torch

    p = torch.nn.Parameter(torch.zeros(4))
    state = {"exp_avg": torch.zeros(4), "exp_avg_sq": torch.zeros(4)}
    for t in state.values():
        st.homes[t.data_ptr()] = t
    opt = type("Opt", (), {"state": {p: state}})()
    e._optimizers.add(opt)
    return p, opt  # e holds the optimizer weakly


class RingStandIn:
    """The staging ring's take/done on the CPU: every piece at offset 0, nothing to wait for."""
    size = 64

    def take(self, n):
        return 0, None

    def done(self, ev):
        pass
