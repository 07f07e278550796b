"""The framework adapter's staging driver (transit_launch/adapter/sitecustomize.py,
TRANSIT_STAGE=1) on a CPU model: it finds the start of every backward without the
application's help and calls the shim's staging API at the right points of a step."""

import importlib.util

import pytest

from tests.conftest import NEEDS_TORCH, torch_importable
from transit_launch.shim import inject

pytestmark = pytest.mark.skipif(not torch_importable(), reason=NEEDS_TORCH)


def load_site():
    spec = importlib.util.spec_from_file_location("transit_site", inject.adapter_dir() / "sitecustomize.py")
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)  # installs nothing here: no shim is loaded
    return site


class Api:
    def policy(self): return "advise"  # the shim's policy
    def __init__(self):
        self.calls = []
        self.enabled = True

    def stage_enabled(self):
        return self.enabled

    def stage_in(self, stream):
        self.calls.append("in")

    def stage_wait(self, stream):
        self.calls.append("wait")

    def stage_out(self, stream):
        self.calls.append("out")


def stager(monkeypatch, stream=lambda: 0):
    """A _Stager on a recording Api, its CUDA stream replaced (CPU here)."""
    site = load_site()
    monkeypatch.setattr(site._Stager, "stream", staticmethod(stream))
    api = Api()
    return site._Stager(api), api


def train(st, model, steps, micro=1, after_backward=None, after_step=None):
    """`steps` optimizer steps of `micro` backward passes with the stager installed, calling
    step_end after each step as _Hooks.post_step does after the iteration boundary."""
    import torch
    width = next(model.parameters()).shape[-1]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    st.install()
    try:
        for i in range(steps):
            for _ in range(micro):
                model(torch.randn(4, width)).sum().backward()
                if after_backward:
                    after_backward()
            opt.step()
            if after_step:
                after_step(i)
            st.step_end()
    finally:
        st.uninstall()


def test_stager_lends_at_the_last_backward_of_each_step(monkeypatch):
    import torch
    st, api = stager(monkeypatch)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    train(st, model, 3, micro=2, after_backward=lambda: api.calls.append("bwd"))
    # step 1 counts the microbatches; from step 2 the state comes in at the last backward
    assert api.calls == ["bwd", "bwd", "wait", "out",
                         "bwd", "in", "bwd", "wait", "out",
                         "bwd", "in", "bwd", "wait", "out"]
    assert st.micro == 2 and not st.off


def test_stager_finds_the_backward_through_activation_checkpointing(monkeypatch):
    """Non-reentrant checkpointing recomputes blocks in backward: their forward pre-hooks
    run but the recompute stops before the post-hooks. Counting those left the depth
    above zero after the first step and staging never started (seen on the H200)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
                                              for _ in range(2))
            self.head = torch.nn.Linear(8, 1)

        def forward(self, x):
            for blk in self.blocks:
                x = checkpoint(blk, x, use_reentrant=False)
            return self.head(x)

    st, api = stager(monkeypatch)
    train(st, Net(), 3, micro=2)
    assert api.calls == ["wait", "out", "in", "wait", "out", "in", "wait", "out"]
    assert st.depth == 0 and st.micro == 2 and not st.off


def test_stager_stands_down_when_the_shim_stops_staging(monkeypatch):
    """After the shim stopped staging (a failed call or an overflow) the adapter calls
    nothing more, empty_cache included, and removes its hooks."""
    import torch
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    st, api = stager(monkeypatch)
    removed = []

    def shim_stops(step):
        if step == 1:
            api.enabled = False  # the shim stopped during step 2
        if step == 2:  # step 2's step_end has run: its hooks must be gone (not train's cleanup)
            removed.append(all(h.id not in h.hooks_dict_ref() for h in st.handles))
    train(st, torch.nn.Linear(8, 1), 4, after_step=shim_stops)
    assert api.calls == ["wait", "out", "in", "wait", "out"] and len(emptied) == 1
    assert st.off and removed == [True]


def test_a_failing_staging_hook_switches_staging_off_not_the_job(monkeypatch, capsys):
    import torch

    def broken():
        raise RuntimeError("no stream")
    st, _ = stager(monkeypatch, broken)
    train(st, torch.nn.Linear(4, 1), 2)
    assert st.off
    assert "staging disabled after an error: RuntimeError('no stream')" in capsys.readouterr().err


class AttachApi:
    def __init__(self, fail=False):
        self.attached, self.fail = 0, fail

    def adapter_attach(self):
        self.attached += 1
        if self.fail:
            raise OSError("an older libtransit.so")
        return True


def test_adapter_attaches_to_the_shim_when_the_first_optimizer_is_made(monkeypatch, capsys):
    """The shim stops guessing iterations from kernel sequences once told the adapter reports
    them (its guess under gradient accumulation started a recording that kept CUPTI from
    torch.profiler). Told at the first optimizer's construction, once, with the original
    __init__ back in place afterwards and every construction unchanged; a failing call is one
    line and the optimizer is still made."""
    site = load_site()
    monkeypatch.delenv("TRANSIT_OVERLAP_STEP", raising=False)

    class Module:  # what _Hooks.register sees of torch.optim.optimizer
        class Optimizer:
            def __init__(self, params, lr=0.1):
                self.params, self.lr = list(params), lr

        hooks = []

        @classmethod
        def register_optimizer_step_post_hook(cls, hook):
            cls.hooks.append(hook)

    class Sub(Module.Optimizer):
        def __init__(self, params):
            super().__init__(params, lr=0.5)

    original = Module.Optimizer.__init__
    api = AttachApi()
    site._Hooks(api).register(Module)
    assert api.attached == 0 and Module.Optimizer.__init__ is not original  # at import: not yet
    first = Sub([1, 2])
    assert api.attached == 1 and (first.params, first.lr) == ([1, 2], 0.5)
    assert Module.Optimizer.__init__ is original
    Sub([3]), Module.Optimizer([4], lr=0.2)
    assert api.attached == 1 and len(Module.hooks) == 1

    class Wrapped:  # another library wraps __init__ after the adapter: it still attaches, once
        def __init__(self, x):
            self.x = x
    again = AttachApi()
    site._Hooks(again)._attach_at_first_optimizer(Wrapped)
    ours = Wrapped.__init__
    Wrapped.__init__ = lambda self, x: ours(self, x + 1)
    assert Wrapped(1).x == 2 and Wrapped(2).x == 3 and again.attached == 1

    class Plain:
        def __init__(self, x):
            self.x = x
    bad = AttachApi(fail=True)
    site._Hooks(bad)._attach_at_first_optimizer(Plain)
    assert Plain(7).x == 7 and bad.attached == 1
    assert "could not attach to the shim: OSError('an older libtransit.so')" in capsys.readouterr().err
