"""The framework adapter (transit_launch/adapter/sitecustomize.py) on its own, without the
shim: when the first optimizer is made it tells the shim that iterations come from the
optimizer steps."""

import importlib.util

import pytest

from tests.conftest import NEEDS_TORCH, NO_TORCH
from transit_launch.preload import inject

pytestmark = pytest.mark.skipif(NO_TORCH, reason=NEEDS_TORCH)


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


class HintApi:
    """The shim's API as the adapter's hooks use it, recording nothing but what they ask."""
    HOT, MASTER, OPTIMIZER, SPARSE = 0, 1, 2, 3

    def __init__(self):
        self.iterations = 0

    def since(self, version): return True
    def policy(self): return "advise"
    def adapter_attach(self): return True
    def hint(self, ptr, size, kind): return 0
    def state_alloc(self, on): return None
    def host_state(self, ptr, size): return False

    def iteration(self):
        self.iterations += 1
        return self.iterations


def test_embedding_tables_read_only_by_their_gather_are_hinted_sparse(monkeypatch):
    """From the first optimizer's creation to its first step the adapter watches module calls
    (forward and the recomputation of checkpointed blocks): a table only an nn.Embedding or
    nn.EmbeddingBag holds is read in part (its rows) and is hinted SPARSE; a table tied by
    attribute to an output Linear, and every other weight, stays MASTER. The watch ends at the
    first step: a module called afterwards changes nothing, and no global hook is left."""
    import torch
    import torch.nn as nn
    from torch.nn.modules import module as nn_module
    from torch.utils.checkpoint import checkpoint

    monkeypatch.setenv("TRANSIT_OVERLAP_STEP", "0")
    monkeypatch.syspath_prepend(str(inject.adapter_dir()))  # as the launcher's PYTHONPATH has it
    site = load_site()
    hooks_before = len(nn_module._global_forward_pre_hooks)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.bag = nn.Embedding(100, 8), nn.EmbeddingBag(30, 8)
            self.tied, self.head = nn.Embedding(50, 8), nn.Linear(8, 50, bias=False)
            self.head.weight = self.tied.weight  # tied by attribute: read whole by the head
            self.block = nn.Linear(8, 8)

        def forward(self, x):
            h = self.emb(x) + self.tied(x % 50) + self.bag(x % 30).unsqueeze(1)
            h = checkpoint(self.block, h, use_reentrant=False)
            return self.head(h)

    torch.manual_seed(0)
    model = Model()
    api = HintApi()
    hooks = site._Hooks(api)

    class Adam(torch.optim.AdamW):  # the hooks' first-optimizer wrapper, on a class of this test's own
        pass
    hooks._attach_at_first_optimizer(Adam)
    opt = Adam(model.parameters(), lr=1e-3)
    assert len(nn_module._global_forward_pre_hooks) == hooks_before + 1  # watching
    x = torch.randint(0, 100, (2, 5))
    model(x).square().mean().backward()
    opt.step()
    hooks.post_step(opt, (), {})
    assert len(nn_module._global_forward_pre_hooks) == hooks_before  # the watch is over
    assert hooks.sparse_ids == {id(model.emb.weight), id(model.bag.weight)}
    kinds = {n: hooks._master_kind(p) for n, p in model.named_parameters()}
    assert kinds == {"emb.weight": 3, "bag.weight": 3, "tied.weight": 1, "block.weight": 1, "block.bias": 1}
    later = nn.Linear(8, 100, bias=False)
    later.weight = model.emb.weight  # held by a Linear only after the first step: not seen
    later(torch.zeros(1, 8))
    assert hooks._master_kind(model.emb.weight) == 3 and api.iterations == 1


def test_a_table_another_module_holds_is_not_sparse():
    """transit_sparse on its own: a weight seen as an Embedding's and also held by a Linear is
    dense; a DTensor-like parameter (it has to_local: FSDP2 reads the whole shard) never sparse."""
    import torch
    import torch.nn as nn

    from transit_launch.adapter import transit_sparse

    reads = transit_sparse.SparseReads()
    reads.start()
    try:
        emb, lin, lone = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False), nn.Embedding(6, 4)
        lin.weight = emb.weight
        x = torch.tensor([[1, 2]])
        lin(emb(x)), lone(x)

        class Sharded(nn.Parameter):
            def to_local(self):
                return self
        shard = nn.Embedding(6, 4)
        shard.weight = Sharded(shard.weight.detach())
        shard(x)
    finally:
        got = reads.finish()
    assert got == {id(lone.weight)}
    assert reads.finish() == got and reads.done  # finishing again changes nothing


def test_a_failure_in_the_adapter_is_one_line_and_the_job_goes_on(capsys):
    """sitecustomize's one error path (_Guard): an exception is said in one line and stops
    there, the caller learns that it failed, a guarded function gives None; an interrupt or
    an exit is the job's, and goes on up."""
    site = load_site()
    with site._Guard("step overlap not installed") as g:
        raise RuntimeError("no ring")
    assert g.failed
    with site._Guard("nothing wrong") as ok:
        pass
    assert not ok.failed

    @site._Guard("no sparse reads")
    def broken(x):
        return 1 / x
    assert broken(2) == 0.5 and broken(0) is None
    assert capsys.readouterr().err.splitlines() == [
        "transit adapter: step overlap not installed: RuntimeError('no ring')",
        "transit adapter: no sparse reads: ZeroDivisionError('division by zero')"]
    for stop in (KeyboardInterrupt(), SystemExit(3)):
        with pytest.raises(type(stop)):
            with site._Guard("never said"):
                raise stop
    assert capsys.readouterr().err == ""


def test_sitecustomize_has_one_error_path():
    """Every failure in sitecustomize goes through _Guard: no try statement of its own, which
    could swallow an error silently or say it in another form."""
    import ast
    tree = ast.parse((inject.adapter_dir() / "sitecustomize.py").read_text())
    assert not [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Try)]
