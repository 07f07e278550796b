"""The adapter tells the shim which segments the first step's optimizer state will be
allocated in (transit_state_pool.StateExpect, the shim's transit_state_segments, API version
8), with real torch optimizers on CPU and a stand-in for the shim's API that records the calls.
The requests are derived by hand from the models' shapes, the segments by hand from the caching
allocator's documented rules (c10/cuda/CUDACachingAllocator.cpp); the GPU test
(tests/test_gpu.py) checks the prediction against PyTorch's own allocator."""

import importlib.util

import pytest

from tests.conftest import NEEDS_TORCH, NO_TORCH
from transit_launch.preload import inject

pytestmark = pytest.mark.skipif(NO_TORCH, reason=NEEDS_TORCH)



def _model(dtype=None):
    import torch
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return m.to(dtype) if dtype else m


def _pool_module():
    """transit_state_pool as the job imports it (flat: conftest put the adapter's directory on sys.path)."""
    return importlib.import_module("transit_state_pool")


def everything(t):
    return True  # CPU parameters count as the GPU's here


SIZES = [8 * 16 * 4, 16 * 4, 16 * 4 * 4, 4 * 4]  # the parameters' bytes, in order (fp32)
MiB = 1 << 20


def test_adam_and_adamw_request_two_copies_of_each_parameter_in_order():
    import torch
    mod = _pool_module()
    req = lambda opt: mod.state_requests(opt, everything)  # noqa: E731
    pairs = [n for n in SIZES for _ in range(2)]
    assert req(torch.optim.AdamW(_model().parameters())) == pairs
    assert req(torch.optim.Adam(_model().parameters())) == pairs
    assert req(torch.optim.Adam(_model(torch.bfloat16).parameters())) == [n // 2 for n in pairs]  # the parameter's dtype
    assert req(torch.optim.AdamW(_model().parameters(), amsgrad=True)) == [n for n in SIZES for _ in range(3)]
    # fused or capturable: the step count lives on the device, made before the parameter's state
    assert req(torch.optim.AdamW(_model().parameters(), capturable=True)) == [x for n in SIZES for x in (4, n, n)]
    frozen = _model()
    frozen[0].weight.requires_grad_(False)  # no gradient, no state
    assert req(torch.optim.AdamW(frozen.parameters())) == pairs[2:]
    # SGD makes its momentum in the step from the gradient, outside _init_group; others are not known
    assert req(torch.optim.SGD(_model().parameters(), lr=0.1, momentum=0.9)) == []
    assert req(torch.optim.RMSprop(_model().parameters())) == []
    # by default only the GPU's parameters count: these are the CPU's
    assert mod.state_requests(torch.optim.AdamW(_model().parameters())) == []


@pytest.mark.parametrize("requests, segments", [
    ([], []),
    ([0], []),                                      # an empty tensor allocates nothing
    ([4, 16384, 16384, 300], [2 * MiB]),            # small requests share one 2 MiB segment
    ([MiB, MiB, 1], [2 * MiB, 2 * MiB]),            # 1 MiB is small: two fill two segments
    ([MiB + 1], [20 * MiB]),                        # above 1 MiB and below 10: a 20 MiB segment
    ([5 * MiB] * 4, [20 * MiB]),                    # ... split for the next: four in one
    ([5 * MiB] * 5, [20 * MiB] * 2),
    ([5 * MiB, 15 * MiB], [20 * MiB]),              # 10 MiB or more fits a remainder too
    ([10 * MiB], [10 * MiB]),                       # from 10 MiB a segment of its own
    ([11 * MiB], [12 * MiB]),                       # rounded to 2 MiB; a 1 MiB remainder is not split
    ([11 * MiB, 2 * MiB], [12 * MiB, 20 * MiB]),
    ([11 * MiB - 4096, MiB + 1024], [12 * MiB]),    # the 1 MiB + 4 KiB remainder serves a large request
    ([470 * MiB + 1, 470 * MiB + 1], [472 * MiB] * 2),
])
def test_allocator_segments_follow_the_caching_allocators_rules(requests, segments):
    assert _pool_module().allocator_segments(requests) == segments


def test_a_llama_layers_state_is_one_segment_per_large_tensor_and_one_small():
    """Llama3-8B's layer in fp32 as fused AdamW makes its state (step counts on the device):
    every projection's moments get a segment of their own, exactly their size (their sizes are
    whole MiB), and the steps and the norms' moments share one small segment."""
    mod = _pool_module()
    d, kv, ffn = 4096, 1024, 14336
    params = [d * d, kv * d, kv * d, d * d, ffn * d, d * ffn, ffn * d, d, d]  # wq wk wv wo w1 w2 w3, two norms
    requests = [x for n in params for x in (4, 4 * n, 4 * n)]
    big = [4 * n for n in params if 4 * n > MiB]
    assert mod.allocator_segments(requests) == [2 * MiB] + [n for n in big for _ in range(2)]


class ExpectApi:
    """The shim's API as the adapter's hooks use it; records transit_state_segments's calls."""
    HOT, MASTER, OPTIMIZER, SPARSE = 0, 1, 2, 3

    def __init__(self, fail=False):
        self.expects, self.fail = [], fail

    def since(self, version): return True
    def policy(self): return "advise"
    def adapter_attach(self): return True
    def hint(self, ptr, size, kind): return 0
    def iteration(self): return 0
    def apply(self): return None
    def device_alloc(self, size): return 0
    def device_free(self, ptr): return -1
    def state_alloc(self, on): return True
    def host_state(self, ptr, size): return False

    def state_segments(self, sizes):
        self.expects.append(list(sizes))
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


def test_a_containers_optimizers_are_sent_once_at_the_first_forward_as_one_pool(hooks_for):
    """Two model parts, an AdamW each, inside a container (an Optimizer itself, which has no
    state): one list at the first forward, the two optimizers' requests as one stream (they
    share the state pool: their small state shares one 2 MiB segment, not two); the empty list
    after the second part's first step (the adapter's first boundary, after the first part's,
    is too early); nothing later; the Optimizer's __init__ back as it was."""
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
    assert calls == [("stepped", 0, [[2 * MiB]]), ("stepped", 1, [[2 * MiB]])]
    assert api.expects == [[2 * MiB], []] and hooks.expect.ended
    for _ in range(2):
        _train_step(parts, opt)
    assert api.expects == [[2 * MiB], []]
    for h in inner_steps:
        h.remove()


def test_large_state_is_sent_as_its_segments_in_order(hooks_for):
    """A Linear of 3 MiB of weight and one of 12 MiB, AdamW fused off (the step counts on the
    CPU): the first's two moments take a 20 MiB segment, whose 14 MiB left hold the second's
    first moment; its second gets a 12 MiB segment of its own. The list is those segments, in
    the order the step will make them."""
    import torch
    api = ExpectApi()
    hooks_for(api)
    model = torch.nn.Sequential(torch.nn.Linear(768, 1024, bias=False), torch.nn.Linear(1024, 3072, bias=False))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 768)).sum().backward()
    opt.step()
    assert api.expects == [[20 * MiB, 12 * MiB], []]


def test_sgd_with_momentum_sends_nothing(hooks_for):
    """SGD makes its momentum in the step from the gradient, outside _init_group (the state
    pool's and the shim's mark): nothing is made ready for it, and nothing is sent."""
    import torch
    api = ExpectApi()
    hooks = hooks_for(api)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _train_step([model], opt)
    assert api.expects == [] and hooks.expect.ended


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


@pytest.mark.parametrize("mode", ["0", "sideways"])
def test_modes_that_keep_the_state_managed_send_nothing(hooks_for, mode):
    """Where the state is not marked (plain advise's step, or no mode at all) nothing is pinned."""
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
    assert api.expects == [[2 * MiB]]  # the closing list is not sent after a refusal
    err = capsys.readouterr().err.splitlines()
    assert err == ["transit adapter: the optimizer state's segments not told to the shim: OSError('the shim refused')"]
    assert len(opt.state) == 4


def test_bindings_call_nothing_on_an_older_shim(monkeypatch):
    """A libtransit.so of API version 7 has no transit_state_segments: never called."""
    from transit_launch.adapter import transit_api

    class OldShim:
        def transit_api_version(self):
            return 7
    monkeypatch.setattr(transit_api, "_lib", OldShim())
    monkeypatch.setattr(transit_api, "available", True)
    assert transit_api.state_segments([1 << 30]) is False and transit_api.state_segments([]) is False
