"""The framework adapter (transit_launch/adapter/sitecustomize.py) on its own, without the
shim: when the first optimizer is made it tells the shim that iterations come from the
optimizer steps."""

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
