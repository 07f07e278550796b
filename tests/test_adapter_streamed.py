"""The optimizer step streamed through the staging ring (TRANSIT_OVERLAP_STEP=stream,
transit_launch/adapter/transit_streamed.py) on CPU models: parameters, optimizer state
and losses bit-identical to the normal step with clipping, gradient accumulation, a
TorchTitan-like container of optimizers and parameters cut into many slices; what cannot
stream steps normally, said once. The CPU stands in for the GPU: the ring is a CPU tensor,
the homes views of the state's own memory (as the shim's pinned state is), no streams; the
same on the H200 is bench/titan_steps.py with the mode, and tests/test_gpu.py."""

import importlib

import pytest

from tests.conftest import NEEDS_TORCH, NO_TORCH
from transit_launch.preload import inject

pytestmark = pytest.mark.skipif(NO_TORCH, reason=NEEDS_TORCH)
STEPS = 4
RING = 256 << 10  # a small ring: a batch holds 64 KiB of state, so the 64 x 1000 weight streams in slices


def load(name):
    """An adapter module as the job imports it (flat: conftest put the adapter's directory on sys.path)."""
    return importlib.import_module(name)


@pytest.fixture
def streamed(monkeypatch):
    """A StreamedStep on CPU staging: the state homed in place (host_state says every state
    is the shim's pinned memory), homes asked for are recorded; the first step's state is made
    NaN where torch would write zeros (a zero the streamed step missed shows in the results)."""
    import torch
    monkeypatch.setenv("TRANSIT_OVERLAP_INFLIGHT", str(RING))
    st = load("transit_staging")
    ts = load("transit_streamed")
    monkeypatch.setattr(ts, "_empty_like", lambda *a, **k: torch.full_like(*a, float("nan"), **k))
    monkeypatch.setattr(st.Staging, "_homeable", staticmethod(lambda t: t.is_contiguous()))
    return lambda: ts.StreamedStep(st.Staging(host_state=lambda ptr, n: True))


def model(seed=0):
    import torch
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 1000), torch.nn.Tanh(), torch.nn.Linear(1000, 4))


class Container:
    """TorchTitan's OptimizersContainer in miniature: an Optimizer over every parameter whose
    step calls one AdamW per model part."""

    def __new__(cls, parts, **kw):
        import torch

        class OptimizersContainer(torch.optim.Optimizer):
            def __init__(self):
                self.optimizers = [torch.optim.AdamW(p.parameters(), **kw) for p in parts]
                super().__init__([q for p in parts for q in p.parameters()], {})

            def step(self, closure=None):
                for o in self.optimizers:
                    o.step()

            def zero_grad(self, set_to_none=True):
                for o in self.optimizers:
                    o.zero_grad(set_to_none)
        return OptimizersContainer()


def train(make_opt, drv=None, steps=STEPS, micro=2, clip=None):
    """Returns the losses, the parameters and each optimizer's state after `steps` steps."""
    import torch
    m = model()
    opt = make_opt(m)
    gen = torch.Generator().manual_seed(1)
    losses = []
    if drv:
        drv.install()
    try:
        for _ in range(steps):
            for _ in range(micro):
                loss = m(torch.randn(5, 64, generator=gen)).square().mean() / micro
                loss.backward()
                losses.append(loss.item())
            if clip:
                torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
            opt.step()
            opt.zero_grad()
    finally:
        if drv:
            drv.uninstall()
    opts = getattr(opt, "optimizers", [opt])
    states = [{k: v.clone() for st in o.state.values() for k, v in st.items()} for o in opts]
    # by parameter, in the groups' order (what state_dict() numbers), not the state's insertion order
    state_list = [[(k, v.clone()) for g in o.param_groups for q in g["params"] for k, v in sorted(o.state.get(q, {}).items())]
                  for o in opts]
    return losses, [p.detach().clone() for p in m.parameters()], state_list, states


def same(a, b):
    import torch
    la, pa, sa, _ = a
    lb, pb, sb, _ = b
    assert la == lb
    assert all(torch.equal(x, y) for x, y in zip(pa, pb))
    assert [[k for k, _ in o] for o in sa] == [[k for k, _ in o] for o in sb]
    assert all(torch.equal(x, y) for oa, ob in zip(sa, sb) for (_, x), (_, y) in zip(oa, ob))


OPTIMIZERS = {
    "adamw-foreach": lambda m: __import__("torch").optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1, foreach=True),
    "adamw-for-loop": lambda m: __import__("torch").optim.AdamW(m.parameters(), lr=1e-2, foreach=False),
    "adam-amsgrad": lambda m: __import__("torch").optim.Adam(m.parameters(), lr=1e-2, amsgrad=True, foreach=True),
    "sgd-momentum": lambda m: __import__("torch").optim.SGD(m.parameters(), lr=1e-2, momentum=0.9, nesterov=True),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
@pytest.mark.parametrize("clip", [None, 0.05], ids=["no-clip", "clip"])
def test_streamed_step_is_bit_identical(streamed, name, clip):
    ref = train(OPTIMIZERS[name], clip=clip)
    drv = streamed()
    got = train(OPTIMIZERS[name], drv, clip=clip)
    same(got, ref)
    # every step streamed all 4 parameters, Adam's first too (its state made unfilled, started
    # from zeros in the ring), SGD's from its second (its momentum starts as the gradient); the
    # 64 x 1000 weight and the 1000 x 4 one in slices of a 64 KiB batch
    streamed_steps = STEPS - 1 if name.startswith("sgd") else STEPS
    assert drv.streamed == 4 * streamed_steps
    per_elem = 12 if name == "adam-amsgrad" else (4 if name.startswith("sgd") else 8)
    step_elems = max(4096, (RING // 4) // per_elem // 4096 * 4096)
    slices = sum(-(-n // step_elems) for n in (64000, 1000, 4000, 4))
    assert drv.slices == slices * streamed_steps, (drv.slices, slices)
    assert drv.said == {}  # nothing refused


@pytest.mark.parametrize("clip", [None, 0.05], ids=["no-clip", "clip"])
def test_state_the_budget_holds_is_stepped_in_place(monkeypatch, clip):
    """Only the overflow streams: the shim pinned the 64 x 1000 weight's state alone (host_state
    says so for its 256,000-byte tensors) and kept the rest on the device. That parameter is
    streamed, the other three are left to the application's step, nothing is said, and the
    result is bit-identical to the plain step's."""
    staging, drv = kept_run(monkeypatch, lambda ptr, n: n == 64000 * 4)
    ref = train(OPTIMIZERS["adamw-foreach"], clip=clip)
    got = train(OPTIMIZERS["adamw-foreach"], drv, clip=clip)
    same(got, ref)
    assert drv.streamed == STEPS and drv.resident == 3 * STEPS and drv.said == {}
    # exp_avg and exp_avg_sq: the weight's homed where they are, nothing copied, the rest kept
    assert staging.in_place == 2 * 64000 * 4 and staging.kept == []
    assert staging.homes == {} and staging.resident == {}  # forgotten with their optimizer


def kept_run(monkeypatch, host_state):
    """A CPU StreamedStep whose shim pinned what host_state(ptr, nbytes) says, in the order the
    states are homed (exp_avg, then exp_avg_sq, of each parameter); the first step's state NaN
    where torch would write zeros, as in `streamed`."""
    import torch
    monkeypatch.setenv("TRANSIT_OVERLAP_INFLIGHT", str(RING))
    st = load("transit_staging")
    ts = load("transit_streamed")
    monkeypatch.setattr(ts, "_empty_like", lambda *a, **k: torch.full_like(*a, float("nan"), **k))
    monkeypatch.setattr(st.Staging, "_homeable", staticmethod(lambda t: t.is_contiguous()))
    staging = st.Staging(host_state=host_state)
    return staging, ts.StreamedStep(staging)


@pytest.mark.parametrize("name", ["adamw-foreach", "adam-amsgrad"])
def test_a_parameter_with_part_of_its_state_kept_streams_the_rest(monkeypatch, name):
    """The state pool's segments are decided one by one, so one parameter's exp_avg can be
    pinned and its exp_avg_sq kept on the GPU (every other state pinned here). Each parameter
    streams its pinned keys through the ring and reads the kept ones in place: bit-identical,
    all four streamed, half the state homed."""
    import itertools
    turn = itertools.cycle([True, False])
    staging, drv = kept_run(monkeypatch, lambda ptr, n: next(turn))
    ref = train(OPTIMIZERS[name], clip=0.05)
    got = train(OPTIMIZERS[name], drv, clip=0.05)
    same(got, ref)
    assert drv.streamed == 4 * STEPS and drv.resident == 0 and drv.said == {}
    # the cycle over (exp_avg, exp_avg_sq[, max_exp_avg_sq]) of the 64000, 1000, 4000 and 4
    # element parameters: AdamW pins every exp_avg; amsgrad's three keys shift it by one a parameter
    pinned = {"adamw-foreach": 64000 + 1000 + 4000 + 4, "adam-amsgrad": 2 * 64000 + 1000 + 2 * 4000 + 4}[name]
    assert staging.in_place == 4 * pinned and staging.kept == []


def test_clipping_that_binds_changes_the_result(streamed):
    """The clip of the test above binds (the comparison would not see a streamed step that
    ignored the clipped gradients otherwise)."""
    import torch
    a = train(OPTIMIZERS["adamw-foreach"], clip=0.05)
    b = train(OPTIMIZERS["adamw-foreach"])
    assert not all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


def test_a_container_streams_its_optimizers(streamed, capsys):
    """TorchTitan's case: the container is not streamed itself (its step calls its
    optimizers'), each inner AdamW is, with clipping and accumulation; one line about
    nothing."""
    def make(m):
        return Container([m[0], m[2]], lr=1e-2, weight_decay=0.1)
    ref = train(make, clip=0.05)
    drv = streamed()
    got = train(make, drv, clip=0.05)
    same(got, ref)
    assert drv.streamed == 4 * STEPS and drv.said == {}
    assert "step streaming off" not in capsys.readouterr().err


def test_a_deliberately_wrong_slice_is_caught(streamed, monkeypatch):
    """The comparison sees a streamed step that drops a slice's update (what a wrong offset
    would do)."""
    ts = load("transit_streamed")
    real = ts.StreamedStep._slices

    def drop_last(self, opt, items, cap):
        batches = list(real(self, opt, items, cap))
        return batches[:-1]
    monkeypatch.setattr(ts.StreamedStep, "_slices", drop_last)
    ref = train(OPTIMIZERS["adamw-foreach"])
    got = train(OPTIMIZERS["adamw-foreach"], streamed())
    with pytest.raises(AssertionError):
        same(got, ref)


@pytest.mark.parametrize("case,why", [
    ("rmsprop", "not torch.optim's Adam, AdamW or SGD (RMSprop)"),
    ("hook", "other optimizer step hooks are registered"),
    ("closure", "called with arguments (a closure"),
])
def test_what_cannot_stream_steps_normally_said_once(streamed, capsys, case, why):
    import torch

    def make(m):
        if case == "rmsprop":
            return torch.optim.RMSprop(m.parameters(), lr=1e-3)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        if case == "hook":
            opt.register_step_pre_hook(lambda *a: None)
        if case == "closure":
            real = opt.step
            opt.step = lambda closure=None: real(lambda: None)
        return opt
    ref = train(make)
    drv = streamed()
    got = train(make, drv)
    same(got, ref)
    assert drv.streamed == 0
    err = capsys.readouterr().err
    assert err.count("step streaming off") == 1 and why in err, err


def test_the_mode_is_wired_by_the_adapter(monkeypatch):
    """TRANSIT_OVERLAP_STEP=stream makes the streamed step, its staging
    asks the shim for the ring and for pinned state, and the state pool marks the state."""
    monkeypatch.syspath_prepend(str(inject.adapter_dir()))
    spec = importlib.util.spec_from_file_location("transit_site_s", inject.adapter_dir() / "sitecustomize.py")
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)
    calls = []

    class Api:
        def __init__(self, policy="advise"): self.name = policy
        def policy(self): return self.name
        def device_alloc(self, n): return calls.append(("alloc", n)) or 0
        def device_free(self, p): return -1
        def state_alloc(self, on): calls.append(("mark", on))
        def host_state(self, p, n): return False
    monkeypatch.setenv("TRANSIT_OVERLAP_STEP", "stream")
    hooks = site._Hooks(Api())
    assert type(hooks.overlap).__name__ == "StreamedStep"
    assert hooks.overlap.staging.device_memory[0](4096) == 0 and calls == [("alloc", 4096)]
    assert hooks.pool.mark is not None
    monkeypatch.setenv("TRANSIT_OVERLAP_STEP", "0")  # the opt-out: nothing of the step's own, state managed
    assert site._Hooks(Api()).pool.mark is None and site._Hooks(Api()).overlap is None
    monkeypatch.delenv("TRANSIT_OVERLAP_STEP")  # unset: advise streams its step, base and prefetch do not
    default = site._Hooks(Api())
    assert type(default.overlap).__name__ == "StreamedStep" and default.pool.mark is not None
    for policy in ("base", "prefetch"):
        assert site._Hooks(Api(policy)).pool.mark is None and site._Hooks(Api(policy)).overlap is None


def test_an_error_inside_a_streamed_step_never_updates_a_parameter_twice(streamed, capsys, monkeypatch):
    """torch's step fails on the second batch of the second streamed step (out of memory in its
    temporaries, say): the first batch's slices were written and the application's step must
    not write them again. The first slice of the 64 x 1000 weight equals the reference's after
    that step (updated once); the line says the step is not bit-identical; later steps run
    unstreamed."""
    import torch
    ov = load("transit_step")
    real = ov.raw_step
    drv = streamed()
    seen = []  # the streamed steps done when each batch steps

    def failing(opt):
        raw = real(opt)

        def step(o):
            seen.append(drv.steps)
            if seen.count(1) == 2:
                raise torch.OutOfMemoryError("no room for the step's temporaries")
            return raw(o)
        return step if raw is not None else None
    monkeypatch.setattr(ov, "raw_step", failing)
    make = OPTIMIZERS["adamw-foreach"]
    ref = train(make, steps=2)
    got = train(make, drv, steps=2)
    first = 8192  # elements of a slice: 64 KiB of state / 8 bytes an element
    w_ref, w_got = ref[1][0].view(-1), got[1][0].view(-1)
    assert torch.equal(w_got[:first], w_ref[:first])  # written once, by the streamed slice
    assert not torch.equal(w_got, w_ref)  # the rest of it was not stepped again either
    err = capsys.readouterr().err
    assert err.count("step streaming off") == 1 and "this step is not bit-identical" in err, err


def test_an_error_in_the_first_step_leaves_zeros_where_no_slice_wrote(streamed, capsys, monkeypatch):
    """The first step's state is made unfilled (NaN, by the fixture) and fails on its second
    batch: the state no slice wrote is zeros, as torch's init makes it, and the next steps
    (unstreamed) keep every value finite."""
    import torch
    ov = load("transit_step")
    real = ov.raw_step
    calls = [0]

    def failing(opt):
        raw = real(opt)

        def step(o):
            calls[0] += 1
            if calls[0] == 2:
                raise torch.OutOfMemoryError("no room for the step's temporaries")
            return raw(o)
        return step if raw is not None else None
    monkeypatch.setattr(ov, "raw_step", failing)
    drv = streamed()
    _, params, state_list, _ = train(OPTIMIZERS["adamw-foreach"], drv, steps=2)
    assert all(torch.isfinite(p).all() for p in params)
    assert len(state_list[0]) == 4 * 3 and all(torch.isfinite(v).all() for _, v in state_list[0])
    assert "this step is not bit-identical" in capsys.readouterr().err
