"""The optimizer state's private pool (transit_launch/adapter/transit_state_pool.py) on
CPU optimizers, with a stand-in for torch.cuda's pool API that records what it is asked:
which calls run inside the pool, for which optimizers, and that nothing else does. The
same on a GPU, with PyTorch's real pools and the allocator's own segment records, is in
tests/test_gpu.py."""

import importlib.util

import pytest

from tests.conftest import NEEDS_TORCH, NO_TORCH
from transit_launch import rules
from transit_launch.preload import inject

pytestmark = pytest.mark.skipif(NO_TORCH, reason=NEEDS_TORCH)


def load_pool_module():
    """transit_state_pool as the job imports it (flat: conftest put the adapter's directory on sys.path)."""
    return importlib.import_module("transit_state_pool")


class FakeCuda:
    """torch.cuda's MemPool and use_mem_pool as far as the pool uses them: records which
    pool each routed call got and what the optimizer state held on entry and exit."""

    def __init__(self):
        self.inside = None  # the pool being used now
        self.events = []
        self.pools = 0

    def MemPool(self):  # noqa: N802 (torch's name)
        self.pools += 1
        return f"pool{self.pools}"

    def use_mem_pool(self, pool, device=None):
        fake = self

        class Ctx:
            def __enter__(self):
                assert fake.inside is None, "pools nested"
                fake.inside = pool
                fake.events.append(("enter", pool, str(device)))

            def __exit__(self, *exc):
                fake.events.append(("exit", pool))
                fake.inside = None
        return Ctx()


@pytest.fixture
def pool(monkeypatch):
    """A StatePool on the fake, installed as torch.optim's global hooks; CPU parameters
    count as the GPU's (the module only asks which device they are on)."""
    import torch
    from torch.optim import optimizer as o
    mod = load_pool_module()
    monkeypatch.setattr(mod, "_cuda_device", lambda opt: "cuda:0")
    fake = FakeCuda()
    sp = mod.StatePool(torch_cuda=fake, mark=lambda on: fake.events.append(("mark", on)))
    handles = [o.register_optimizer_step_pre_hook(sp.pre_step), o.register_optimizer_step_post_hook(sp.post_step)]
    # every state tensor AdamW makes, and whether the pool was in use when it was made
    made = []
    real = torch.zeros_like

    def zeros_like(*a, **k):
        t = real(*a, **k)
        made.append(fake.inside)
        return t
    monkeypatch.setattr(torch, "zeros_like", zeros_like)
    yield sp, fake, made
    for h in handles:
        h.remove()


def _model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _step(model, opt):
    import torch
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    opt.zero_grad()


def test_the_first_step_makes_the_state_inside_the_pool_and_nothing_after(pool):
    import torch
    sp, fake, made = pool
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _step(model, opt)
    # AdamW makes exp_avg and exp_avg_sq for each of the 4 parameters, all in the pool
    assert made == ["pool1"] * 8, made
    # the state's allocations are marked for the shim, inside the pool and only there
    assert fake.events == [("enter", "pool1", "cuda:0"), ("mark", True), ("mark", False), ("exit", "pool1")]
    assert "_init_group" not in vars(opt), "the wrapper outlived the first step"
    made.clear()
    for _ in range(3):
        _step(model, opt)
    assert made == [] and len(fake.events) == 4 and sp.routed == 1
    assert sum(len(s) for s in opt.state.values()) == 12  # step, exp_avg, exp_avg_sq each


def test_the_results_are_those_of_the_plain_optimizer(pool):
    """Routing changes where the state lives, not what the step computes."""
    import torch
    ref_model, model = _model(), _model()
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sp, fake, made = pool
    for i in range(4):
        torch.manual_seed(i)
        _step(model, opt)
    sp.failed = True  # the reference steps with the pool out of the way
    for i in range(4):
        torch.manual_seed(i)
        _step(ref_model, ref_opt)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(p, q)


def _container(parts):
    """TorchTitan's OptimizersContainer in miniature: an Optimizer over all parameters that
    steps one inner optimizer per part."""
    import torch

    class Container(torch.optim.Optimizer):
        def __init__(self):
            self.inner = [torch.optim.AdamW(p.parameters(), lr=1e-3) for p in parts]
            super().__init__([p for m in parts for p in m.parameters()], {})

        def step(self, closure=None):
            for o in self.inner:
                o.step()
    return Container()


def test_each_inner_optimizer_of_a_container_gets_its_pool_once(pool):
    import torch
    sp, fake, made = pool
    parts = [_model(), _model()]
    opt = _container(parts)
    for _ in range(3):
        for m in parts:
            m(torch.randn(3, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    assert made == ["pool1"] * 16  # two parts, 4 parameters, 2 states each, made in step 1
    routed = [("enter", "pool1", "cuda:0"), ("mark", True), ("mark", False), ("exit", "pool1")]
    assert fake.events == routed * 2  # one pool per device
    assert sp.routed == 2  # the container itself has no _init_group: left alone


def test_a_first_step_that_raises_does_not_keep_routing(pool):
    """A step pre-hook of the application's raises after ours ran: the post hook never
    comes, and the next step puts the optimizer's own _init_group back before it runs."""
    import torch
    sp, fake, made = pool
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def refuse(*args):
        raise RuntimeError("the application's hook")
    handle = opt.register_step_pre_hook(refuse)
    model(torch.randn(3, 8)).sum().backward()
    with pytest.raises(RuntimeError, match="application's hook"):
        opt.step()
    handle.remove()
    assert "_init_group" in vars(opt) and fake.inside is None
    _step(model, opt)
    assert "_init_group" not in vars(opt) and sp.routed == 2  # routed again: the first step never ended
    assert made == ["pool1"] * 8
    assert fake.events == [("enter", "pool1", "cuda:0"), ("mark", True), ("mark", False), ("exit", "pool1")]


def test_a_state_allocation_that_raises_unmarks_the_thread(pool, monkeypatch):
    """Out of memory inside _init_group: the mark is lifted on the way out, so the
    application's next allocations are not taken for optimizer state."""
    import torch
    sp, fake, made = pool
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def oom(*a, **k):
        raise torch.OutOfMemoryError("no room")
    monkeypatch.setattr(torch, "zeros_like", oom)
    model(torch.randn(3, 8)).sum().backward()
    with pytest.raises(torch.OutOfMemoryError):
        opt.step()
    assert fake.events == [("enter", "pool1", "cuda:0"), ("mark", True), ("mark", False), ("exit", "pool1")]


def test_off_switch_and_name_are_the_rules(monkeypatch):
    mod = load_pool_module()
    monkeypatch.delenv(rules.ENV["STATE_POOL"], raising=False)
    assert mod.enabled()
    monkeypatch.setenv(rules.ENV["STATE_POOL"], "0")
    assert not mod.enabled()


def test_the_step_driver_counts_the_pool_hooks_as_the_adapters_own(monkeypatch):
    """The streamed step turns itself off when foreign step hooks are registered; the
    pool's are the adapter's."""
    spec = importlib.util.spec_from_file_location("transit_site_t", inject.adapter_dir() / "sitecustomize.py")
    site = importlib.util.module_from_spec(spec)
    monkeypatch.syspath_prepend(str(inject.adapter_dir()))
    spec.loader.exec_module(site)
    monkeypatch.setenv("TRANSIT_OVERLAP_STEP", "stream")

    class Api:
        def policy(self): return "advise"  # the shim's policy
        device_alloc = device_free = state_alloc = host_state = None
    hooks = site._Hooks(Api())
    assert hooks.pool is not None and hooks.overlap is not None
    assert hooks.pool.pre_step in hooks.overlap.ours and hooks.pool.post_step in hooks.overlap.ours
