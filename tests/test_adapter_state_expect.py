"""The adapter tells the shim how much optimizer state the first step will make
(transit_state_pool.StateExpect, the shim's transit_state_expect, API version 7), with real
torch optimizers on CPU and a stand-in for the shim's API that records the calls. The
expected bytes are derived by hand from the models' shapes."""

import importlib.util

import pytest

from tests.conftest import NEEDS_TORCH, torch_importable
from transit_launch.shim import inject

pytestmark = pytest.mark.skipif(not torch_importable(), reason=NEEDS_TORCH)

# Linear(8, 16) + Linear(16, 4): weights and biases
NUMEL = 8 * 16 + 16 + 16 * 4 + 4


def _model(dtype=None):
    import torch
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return m.to(dtype) if dtype else m


def _pool_module():
    spec = importlib.util.spec_from_file_location("transit_state_pool_e", inject.adapter_dir() / "transit_state_pool.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def everything(t):
    return True  # CPU parameters count as the GPU's here


def test_adam_and_adamw_expect_two_copies_of_each_parameter_sgd_with_momentum_one():
    import torch
    mod = _pool_module()
    size = lambda opt: mod.expected_state_bytes(opt, everything)  # noqa: E731
    assert size(torch.optim.AdamW(_model().parameters())) == 2 * 4 * NUMEL
    assert size(torch.optim.Adam(_model().parameters())) == 2 * 4 * NUMEL
    assert size(torch.optim.Adam(_model(torch.bfloat16).parameters())) == 2 * 2 * NUMEL  # the parameter's dtype
    assert size(torch.optim.AdamW(_model().parameters(), amsgrad=True)) == 3 * 4 * NUMEL  # max_exp_avg_sq too
    assert size(torch.optim.SGD(_model().parameters(), lr=0.1, momentum=0.9)) == 4 * NUMEL
    assert size(torch.optim.SGD(_model().parameters(), lr=0.1)) == 0  # no momentum: no state
    assert size(torch.optim.RMSprop(_model().parameters())) == 0  # not covered: nothing known
    frozen = _model()
    frozen[0].weight.requires_grad_(False)  # no gradient, no state
    assert size(torch.optim.AdamW(frozen.parameters())) == 2 * 4 * (NUMEL - 8 * 16)
    # per group: a group without momentum makes none
    m = _model()
    opt = torch.optim.SGD([{"params": m[0].parameters(), "momentum": 0.9}, {"params": m[2].parameters()}], lr=0.1)
    assert size(opt) == 4 * (8 * 16 + 16)
    # by default only the GPU's parameters count: these are the CPU's
    assert mod.expected_state_bytes(torch.optim.AdamW(_model().parameters())) == 0


class ExpectApi:
    """The shim's API as the adapter's hooks use it; records transit_state_expect's calls."""
    HOT, MASTER, OPTIMIZER, SPARSE = 0, 1, 2, 3

    def __init__(self, fail=False):
        self.expects, self.fail = [], fail

    def _since(self, version): return True
    def policy(self): return "advise"
    def adapter_attach(self): return True
    def hint(self, ptr, size, kind): return 0
    def iteration(self): return 0
    def apply(self): return None
    def device_alloc(self, size): return 0
    def device_free(self, ptr): return -1
    def state_alloc(self, on): return True
    def host_state(self, ptr, size): return False

    def state_expect(self, n):
        self.expects.append(n)
        if self.fail:
            raise OSError("the shim refused")
        return True


@pytest.fixture
def hooks_for(monkeypatch):
    """The adapter's hooks on ExpectApi, the first-optimizer wrapper on torch.optim.Optimizer
    itself (put back after the test), the step post hook registered globally."""
    import torch
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as o

    monkeypatch.syspath_prepend(str(inject.adapter_dir()))
    spec = importlib.util.spec_from_file_location("transit_site_e", inject.adapter_dir() / "sitecustomize.py")
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)  # installs nothing here: no shim is loaded
    monkeypatch.setattr(torch.optim.Optimizer, "__init__", torch.optim.Optimizer.__init__)
    handles, before = [], len(nn_module._global_forward_pre_hooks)

    def make(api, mode=None):
        if mode is None:
            monkeypatch.delenv("TRANSIT_OVERLAP_STEP", raising=False)
        else:
            monkeypatch.setenv("TRANSIT_OVERLAP_STEP", mode)
        hooks = site._Hooks(api)
        if hooks.expect:
            hooks.expect.counted = everything
        hooks._attach_at_first_optimizer(torch.optim.Optimizer)
        handles.append(o.register_optimizer_step_post_hook(hooks.post_step))
        return hooks
    yield make
    for h in handles:
        h.remove()
    assert len(nn_module._global_forward_pre_hooks) == before, "a forward hook was left behind"


def _container(parts, inner=None):
    """TorchTitan's OptimizersContainer in miniature: an Optimizer over all parameters that
    steps one inner optimizer per part."""
    import torch
    inner = inner or (lambda ps: torch.optim.AdamW(ps, lr=1e-3))

    class Container(torch.optim.Optimizer):
        def __init__(self):
            self.inner = [inner(p.parameters()) for p in parts]
            super().__init__([p for m in parts for p in m.parameters()], {})

        def step(self, closure=None):
            for o in self.inner:
                o.step()
    return Container()


def _train_step(parts, opt, seen=None):
    import torch
    for m in parts:
        m(torch.randn(3, 8)).sum().backward()
    if seen is not None:
        seen.append(("forward+backward done", None))
    opt.step()
    opt.zero_grad()


def test_the_sum_over_a_containers_optimizers_is_sent_once_at_the_first_forward(hooks_for):
    """Two model parts, an AdamW each, inside a container (an Optimizer itself, which counts 0):
    one call, the sum, at the first forward; expect(0) after the second part's first step (the
    adapter's first boundary, after the first part's, is too early); nothing later; the
    Optimizer's __init__ back as it was."""
    import torch
    init = torch.optim.Optimizer.__init__
    api = ExpectApi()
    hooks = hooks_for(api)
    parts = [_model(), _model()]
    opt = _container(parts)
    assert api.expects == []  # made, not yet told: more optimizers may come
    assert torch.optim.Optimizer.__init__ is not init  # collecting
    calls = []
    inner_steps = [o.register_step_post_hook(lambda o, a, k, i=i: calls.append(("stepped", i, list(api.expects))))
                   for i, o in enumerate(opt.inner)]
    _train_step(parts, opt)
    assert torch.optim.Optimizer.__init__ is init
    assert calls == [("stepped", 0, [2 * 2 * 4 * NUMEL]), ("stepped", 1, [2 * 2 * 4 * NUMEL])]
    assert api.expects == [2 * 2 * 4 * NUMEL, 0] and hooks.expect.ended
    for _ in range(2):
        _train_step(parts, opt)
    assert api.expects == [2 * 2 * 4 * NUMEL, 0]
    for h in inner_steps:
        h.remove()


def test_sgd_with_momentum_sends_its_one_copy_and_ends_after_its_step(hooks_for):
    import torch
    api = ExpectApi()
    hooks_for(api)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _train_step([model], opt)
    assert api.expects == [4 * NUMEL, 0]


def test_an_optimizer_not_covered_sends_nothing(hooks_for):
    """RMSprop's state is not estimated: no call at all, not even the closing 0."""
    import torch
    api = ExpectApi()
    hooks = hooks_for(api)
    model = _model()
    opt = torch.optim.RMSprop(model.parameters())
    for _ in range(2):
        _train_step([model], opt)
    assert api.expects == [] and hooks.expect.ended


@pytest.mark.parametrize("mode", ["0", "1"])
def test_modes_that_keep_the_state_managed_send_nothing(hooks_for, mode):
    """Where the state is not marked (plain advise's step, the overlapped one) nothing is pinned."""
    import torch
    api = ExpectApi()
    hooks = hooks_for(api, mode)
    assert hooks.expect is None
    model = _model()
    opt = torch.optim.AdamW(model.parameters())
    _train_step([model], opt)
    assert api.expects == []


def test_a_failing_call_is_one_line_and_training_goes_on(hooks_for, capsys):
    import torch
    api = ExpectApi(fail=True)
    hooks_for(api)
    model = _model()
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        _train_step([model], opt)
    assert api.expects == [2 * 4 * NUMEL]  # the closing 0 is not sent after a refusal
    err = capsys.readouterr().err.splitlines()
    assert err == ["transit adapter: the optimizer state's size not told to the shim: OSError('the shim refused')"]
    assert len(opt.state) == 4


def test_bindings_call_nothing_on_an_older_shim(monkeypatch):
    """A libtransit.so of API version 6 has no transit_state_expect: never called."""
    from transit_launch.adapter import transit_api

    class OldShim:
        def transit_api_version(self):
            return 6
    monkeypatch.setattr(transit_api, "_lib", OldShim())
    monkeypatch.setattr(transit_api, "available", True)
    assert transit_api.state_expect(1 << 30) is False and transit_api.state_expect(0) is False
