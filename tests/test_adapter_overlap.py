"""The optimizer step overlapped with backward (TRANSIT_OVERLAP_STEP=1,
transit_launch/adapter/transit_overlap.py), on CPU models: parameters, optimizer state
and losses bit-identical to the normal step for every supported optimizer path, with
gradient accumulation and under FSDP2 (one gloo rank); every case that could change the
result falls back to the normal step with one line saying why; deliberately broken
overlaps are caught by the same comparison."""

import importlib
import importlib.util
import sys
import warnings

import pytest

from tests.conftest import NEEDS_TORCH, torch_importable
from transit_launch import rules
from transit_launch.shim import inject

pytestmark = pytest.mark.skipif(not torch_importable(), reason=NEEDS_TORCH)
STEPS = 6  # learning ends after step 3 (transit_overlap.LEARN = 2 after adoption at step 1): 3 overlapped


def load(name):
    """An adapter module as the job imports it (flat: conftest put the adapter's directory on
    sys.path); sitecustomize, which site imports once, is run afresh from its file."""
    if name != "sitecustomize":
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location("transit_site_o", inject.adapter_dir() / "sitecustomize.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def T():
    return load("transit_overlap")


def mlp(seed=0):
    import torch
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def train(make_opt, ov=None, model=mlp, steps=STEPS, micro=2, between=None, step=None, sched=None,
          set_to_none=True, scaler=False, after=None):
    """`steps` optimizer steps of `micro` backwards each, with the overlap driver `ov`
    installed (None: the normal step). between(i, model, opt) runs between the last backward
    and the step (clipping, ...), after(i, model, opt) after the step; step(i, opt, loss_fn)
    replaces opt.step(); scaler: a CPU
    GradScaler scales the losses and steps the optimizer. Returns the losses, the
    parameters, the optimizer's state_dict and the scheduler's."""
    import torch
    m = model()
    opt = make_opt(m.parameters())
    lr = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s)) if sched else None
    scaler = torch.amp.GradScaler("cpu", init_scale=16.0) if scaler else None
    gen = torch.Generator().manual_seed(1)
    losses = []
    if ov:
        ov.install()
    try:
        for i in range(steps):
            data = [torch.randn(5, 8, generator=gen) for _ in range(micro)]

            def loss_fn(x):
                out = m(x)
                return (out.float() ** 2).mean()
            for x in data:
                loss = loss_fn(x)
                (scaler.scale(loss / micro) if scaler else loss / micro).backward()
                losses.append(loss.item())
            if between:
                between(i, m, opt)
            if step:
                step(i, opt, lambda: loss_fn(data[-1]))  # noqa: B023 (called within this iteration)
            elif scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            opt.zero_grad(set_to_none=set_to_none)
            if lr:
                lr.step()
            if after:
                after(i, m, opt)
    finally:
        if ov:
            ov.uninstall()
    params = [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for p in m.parameters()]
    return losses, params, opt.state_dict(), lr.state_dict() if lr else None


def same(a, b):
    """Bitwise equality of nested results (tensors with torch.equal, floats with ==)."""
    import torch
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def overlapped(T, make_opt, staged=False, **kw):
    """(the normal run, the overlapped run, the driver); staged: TRANSIT_OVERLAP_STEP=staged
    (on CPU tensors the same swap of the state through copies, without streams)."""
    ov = T.Overlap(staged=staged)
    return train(make_opt, **kw), train(make_opt, ov, **kw), ov


def optim(name, **kw):
    """A factory of torch.optim.NAME(params, **kw). torch is imported when the factory runs,
    not here: PATHS below is built at import, and without torch the module must still
    import so that its skip applies."""
    def make(ps):
        import torch
        return getattr(torch.optim, name)(ps, **kw)
    return make


PATHS = {
    "adamw-for-loop": optim("AdamW", lr=1e-2, foreach=False),
    "adamw-foreach": optim("AdamW", lr=1e-2, foreach=True),
    "adamw-fused": optim("AdamW", lr=1e-2, fused=True),  # torch 2.13 has a CPU fused AdamW
    "adam-amsgrad-l2-maximize": optim("Adam", lr=1e-2, weight_decay=0.1, amsgrad=True, maximize=True, foreach=True),
    "sgd": optim("SGD", lr=1e-2),
    "sgd-momentum-for-loop": optim("SGD", lr=1e-2, momentum=0.9, weight_decay=0.01, foreach=False),
    "sgd-momentum-dampening-foreach": optim("SGD", lr=1e-2, momentum=0.9, dampening=0.1, foreach=True),
    "sgd-nesterov-fused": optim("SGD", lr=1e-2, momentum=0.9, nesterov=True, fused=True),
}


@pytest.mark.parametrize("micro", [1, 3])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_overlapped_step_is_bit_identical(T, path, micro, capsys):
    normal, over, ov = overlapped(T, PATHS[path], micro=micro)
    assert same(normal, over)
    assert ov.early == 4 * (STEPS - 3)  # every parameter of the last 3 steps was updated during backward
    assert f"{micro} backward(s) a step" in capsys.readouterr().err


@pytest.mark.parametrize("micro", [1, 3])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_staged_early_updates_are_bit_identical(T, path, micro):
    """Every early update runs torch's step on copies of the parameter's state, which go back
    to the state's own tensors after it: parameters, state and losses equal the normal run."""
    normal, over, ov = overlapped(T, PATHS[path], staged=True, micro=micro)
    assert same(normal, over)
    # plain SGD keeps no state: nothing to stage, its updates run in place
    assert ov.early == 4 * (STEPS - 3) and ov.staging.staged == (0 if path == "sgd" else ov.early)


@pytest.mark.parametrize("inflight", [None, "2048"])
def test_staged_updates_in_batches(T, monkeypatch, inflight):
    """Staged updates of a group wait for one another until a batch's state bytes (a quarter
    of TRANSIT_OVERLAP_INFLIGHT) are pending; the rest are made when backward ends. Backward
    finalizes the MLP's last bias (32 bytes of AdamW state), last weight (512), first bias
    (128), first weight (1024): at 2048 bytes in flight two batches of two fill during
    backward; by default (1 GiB) all four wait for its end."""
    if inflight:
        monkeypatch.setenv(load("transit_staging").INFLIGHT_ENV, inflight)
    calls = []
    flush, flush_all = T.Overlap._flush, T.Overlap._flush_all
    monkeypatch.setattr(T.Overlap, "_flush", lambda self, plan, gi: (calls.append(len(plan.pending.get(gi, []))),
                                                                   flush(self, plan, gi)))
    monkeypatch.setattr(T.Overlap, "_flush_all", lambda self, plan: (calls.append("end"), flush_all(self, plan)))
    normal, over, ov = overlapped(T, PATHS["adamw-foreach"], staged=True, micro=2)
    assert same(normal, over) and ov.early == 12 and ov.staging.staged == 12
    assert calls == (["end", 4] * 3 if not inflight else [2, 2] * 3)


def test_a_broken_staging_is_caught_by_the_comparison(T, monkeypatch):
    """Not vacuous: staged updates whose copies are not written back change the result."""
    st = load("transit_staging")
    monkeypatch.setattr(st.Staging, "update",
                        lambda self, opt, items, step, ready=(): step({p: {k: opt.state[p][k].clone()
                                                                           for k in keys} for p, keys in items}))
    normal, over, ov = overlapped(T, PATHS["adamw-foreach"], staged=True, micro=2)
    assert ov.early > 0 and not same(normal[1], over[1])


def test_lr_scheduler_state_dict_and_zero_grad_stay_exact(T, capsys):
    """The early updates read the learning rate the scheduler set after the previous step;
    the scheduler still counts one step per optimizer.step() (no 'scheduler before
    optimizer' warning); zero_grad(set_to_none=False) keeps zeroed gradients as before."""
    kw = dict(sched=True, set_to_none=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        normal, over, ov = overlapped(T, optim("AdamW", lr=1e-2, weight_decay=0.1), **kw)
    assert same(normal, over) and ov.early == 12
    assert normal[3]["last_epoch"] == STEPS
    assert not [w for w in caught if "lr_scheduler" in str(w.message)]


def test_activation_checkpointing_both_kinds(T):
    """Checkpointed blocks recompute in backward; the reentrant kind accumulates their
    gradients in a nested backward of its own."""
    import torch
    from torch.utils.checkpoint import checkpoint

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a, self.b, self.head = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

        def forward(self, x):
            x = checkpoint(lambda t: torch.tanh(self.a(t)), x, use_reentrant=False)
            x = checkpoint(lambda t: torch.tanh(self.b(t)), x, use_reentrant=True)
            return self.head(x)
    normal, over, ov = overlapped(T, optim("AdamW", lr=1e-2), model=Net)
    assert same(normal, over) and ov.early == 6 * 3


@pytest.fixture(scope="module")
def gloo():
    import torch.distributed as dist
    # an earlier module on this worker left one up: tests/conftest.py ends them with their module
    assert not dist.is_initialized(), "a process group is already up"
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()


def fsdp_mlp():
    """examples/train_llama.py's FSDP2 setup on a small model: one shard per block, bf16
    compute, fp32 parameters and reduce-scatter."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    m = mlp()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    fully_shard(m[0], mp_policy=mp)
    fully_shard(m[2], mp_policy=mp)
    return fully_shard(m, mp_policy=mp)


@pytest.mark.parametrize("foreach", [None, True])
def test_fsdp2_sharded_parameters_after_their_reduce_scatter(T, gloo, foreach):
    """FSDP2 calls the sharded parameters' post-accumulate-grad hooks after each
    reduce-scatter; the gradients of one module are views of one buffer (a sibling's
    accumulation bumps the shared version counter: read at the end of backward)."""
    normal, over, ov = overlapped(T, optim("AdamW", lr=1e-2, weight_decay=0.1, foreach=foreach),
                                  model=fsdp_mlp, micro=2)
    assert same(normal, over) and ov.early == 12


@pytest.mark.parametrize("inflight", [None, "2048"])
def test_staged_updates_of_fsdp2_dtensor_states(T, gloo, monkeypatch, inflight):
    """Under FSDP2 the staged copies are wrapped as DTensors like the state they stand for;
    with 2048 bytes in flight batches are flushed inside FSDP2's gradient hooks (its
    reduce-scatter), reusing each state's wrapper, not only at the end of backward."""
    if inflight:
        monkeypatch.setenv(load("transit_staging").INFLIGHT_ENV, inflight)
    normal, over, ov = overlapped(T, optim("AdamW", lr=1e-2, weight_decay=0.1, foreach=True),
                                  model=fsdp_mlp, micro=2, staged=True)
    assert same(normal, over) and ov.early == 12 and ov.staging.staged == 12


# --- what falls back --------------------------------------------------------------------------

def clip_norm(i, m, opt):
    import torch
    torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05)


def clip_value(i, m, opt):
    import torch
    torch.nn.utils.clip_grad_value_(m.parameters(), 0.01)


def closure(i, opt, loss_fn):
    opt.step(loss_fn)


def ddp_mlp():
    import torch
    return torch.nn.parallel.DistributedDataParallel(mlp())


def clamp(m):
    """A weight constraint applied between backward and step (it belongs after the step)."""
    import torch
    with torch.no_grad():
        m[0].weight.clamp_(-0.2, 0.2)


FALLBACKS = {
    "clip_grad_norm_": (dict(between=clip_norm), "changed between its last backward and the step"),
    "clip_grad_value_": (dict(between=clip_value), "changed between its last backward and the step"),
    "closure": (dict(step=closure), "called with arguments (a closure"),
    # GradScaler: unscale_ changes the gradients in place, or with a fused optimizer the
    # unscaling and the inf check go into the step
    "GradScaler": (dict(scaler=True), "changed between its last backward and the step"),
    "GradScaler-fused": (dict(scaler=True, fused=True), "GradScaler steps it"),
    "scheduler-between": (dict(between=lambda i, m, o: o.param_groups[0].update(lr=0.5 / (i + 1))),
                          "hyper-parameters changed between backward and the step"),
    "grad.data-rescaled": (dict(between=lambda i, m, o: [p.grad.data.mul_(0.5) for p in m.parameters()]),
                           "changed between its last backward and the step"),
    "weight-constraint": (dict(between=lambda i, m, o: clamp(m)), "a parameter was changed in place between backward"),
}


@pytest.mark.parametrize("case", sorted(FALLBACKS))
def test_what_is_not_provably_identical_falls_back(T, case, capsys):
    kw, why = FALLBACKS[case]
    kw = dict(kw)
    make = optim("AdamW", lr=1e-2, fused=kw.pop("fused", None))
    normal, over, ov = overlapped(T, make, **kw)
    err = capsys.readouterr().err
    assert same(normal, over)
    assert ov.early == 0
    assert err.count("step overlap off for AdamW") == 1 and why in err and "its steps run normally" in err


def test_ddp_reduction_after_the_hooks_falls_back(T, gloo, capsys):
    """DDP writes the reduced gradients after the hooks, at the end of backward."""
    normal, over, ov = overlapped(T, optim("AdamW", lr=1e-2), model=ddp_mlp)
    assert same(normal, over) and ov.early == 0
    assert "changed between its last backward and the step" in capsys.readouterr().err


def test_refusals_at_the_first_step(T, capsys):
    import torch

    class MyAdamW(torch.optim.AdamW):
        pass
    cases = [(lambda ps: MyAdamW(ps, lr=1e-2), T.Overlap(), "MyAdamW is not torch.optim's"),
             (optim("Adam", lr=torch.tensor(1e-2), fused=True), T.Overlap(), "tensor hyper-parameters")]
    for make, ov, why in cases:
        assert same(train(make), train(make, ov)) and ov.early == 0
        assert why in capsys.readouterr().err
    p = torch.nn.Parameter(torch.ones(2))
    assert T.group_refusal({"params": [p], "differentiable": True}) == "differentiable=True"
    assert T.group_refusal({"params": [p], "capturable": True, "foreach": None}).startswith("capturable=True")
    assert "complex" in T.group_refusal({"params": [torch.nn.Parameter(torch.ones(2, dtype=torch.cfloat))],
                                          "foreach": None})


def test_compiled_autograd_falls_back(T, monkeypatch, capsys):
    """torch.compile's compiled autograd would trace the gradient hooks into its graph."""
    import torch._dynamo
    monkeypatch.setattr(torch._dynamo.config, "compiled_autograd", True)  # eager backward all the same
    normal, over, ov = overlapped(T, optim("AdamW", lr=1e-2))
    assert same(normal, over) and ov.early == 0
    assert "compiled autograd traces the gradient hooks" in capsys.readouterr().err


def test_a_group_whose_kernel_choice_depends_on_its_members_is_refused(T, monkeypatch):
    """torch picks foreach only when every parameter of the step qualifies (device, tensor
    type), so a mixed group could change kernels when stepped in parts: refused."""
    import torch
    from torch.optim import optimizer
    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    monkeypatch.setattr(optimizer, "_default_to_fused_or_foreach",
                        lambda ps, differentiable, use_fused=False: (False, all(p is a for p in ps)))
    assert T._path({"params": [a, b], "foreach": None}) is None
    assert T._path({"params": [a], "foreach": None}) == "foreach"
    assert "mixes devices" in T.group_refusal({"params": [a, b], "foreach": None})


def test_other_step_hooks_fall_back(T, capsys):
    """A step pre-hook of the application's could change gradients after the check."""
    import torch

    def hooked(ps):
        opt = torch.optim.AdamW(ps, lr=1e-2)
        opt.register_step_pre_hook(lambda *a: None)
        return opt
    ov = T.Overlap()
    assert same(train(hooked), train(hooked, ov)) and ov.early == 0
    assert "other optimizer step hooks" in capsys.readouterr().err


@pytest.mark.parametrize("other", ["SGD", "a subclass the overlap refuses"])
def test_parameters_shared_by_two_optimizers_fall_back(T, other, capsys):
    """Two optimizers stepping one parameter update it in the order of their steps, which
    an early update would change; found whether the other one is overlapped or not."""
    import torch

    class MySGD(torch.optim.SGD):
        pass

    def two(ps):
        ps = list(ps)
        two.other = (torch.optim.SGD if other == "SGD" else MySGD)(ps[:2], lr=1e-2)  # the first layer too
        return torch.optim.AdamW(ps, lr=1e-2)

    def both(i, opt, loss_fn):
        opt.step()
        two.other.step()
    ov = T.Overlap()
    assert same(train(two, step=both), train(two, ov, step=both)) and ov.early == 0
    assert "parameters shared with another optimizer" in capsys.readouterr().err


def test_sparse_gradients_fall_back(T, capsys):
    import torch

    class Bag(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.bag, self.head = torch.nn.EmbeddingBag(20, 8, mode="sum", sparse=True), torch.nn.Linear(8, 4)

        def forward(self, x):
            return self.head(self.bag(x.abs().mul(5).long() % 20))  # token ids from the random inputs
    ov = T.Overlap()
    assert same(train(optim("SGD", lr=1e-2), model=Bag), train(optim("SGD", lr=1e-2), ov, model=Bag))
    assert ov.early == 0 and "sparse gradients" in capsys.readouterr().err


def test_groups_added_later_run_normally_groups_changed_fall_back(T, capsys):
    import torch
    extra = {}

    def add_group(i, m, opt):
        if i == 3:  # the overlap is on from step 4: a group added then is updated by the step
            extra["p"] = torch.nn.Parameter(torch.ones(3))
            opt.add_param_group({"params": [extra["p"]], "lr": 0.1})
        if "p" in extra:
            extra["p"].grad = torch.full((3,), 0.5)
    normal, over, ov = overlapped(T, optim("AdamW", lr=1e-2), between=add_group)
    assert same(normal, over) and ov.early == 12 and "step overlap off" not in capsys.readouterr().err

    def regroup(i, m, opt):
        if i == 3:
            opt.param_groups[0]["params"].reverse()
    normal, over, ov = overlapped(T, optim("AdamW", lr=1e-2), after=regroup)
    err = capsys.readouterr().err
    assert same(normal, over) and ov.early == 4  # step 4 overlapped; step 5's first hook saw the change
    assert "its param groups changed; its steps run normally" in err


# --- what is detected too late, and deliberate breakage ---------------------------------------

def test_a_step_with_more_backwards_than_learned_is_reported(T, capsys):
    """Learned: 2 backwards a step. A later step with 3 had its early updates made at its
    2nd backward: that step is not identical and says so; the overlap stays off after it."""
    import torch
    ov = T.Overlap()
    m = mlp()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    ov.install()
    try:
        for micro in (2, 2, 2, 2, 3, 2, 2):
            for _ in range(micro):
                m(torch.randn(5, 8)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    finally:
        ov.uninstall()
    err = capsys.readouterr().err
    assert "more gradients in a step than in the learning steps; this step's early updates were already made, " \
           "so it is not bit-identical" in err
    assert ov.early == 4 + 4  # step 4, and step 5 before its third backward


def test_clipping_that_starts_after_learning_is_reported(T, capsys):
    normal, over, ov = overlapped(T, optim("AdamW", lr=1e-2),
                                  between=lambda i, m, o: clip_norm(i, m, o) if i == 4 else None)
    err = capsys.readouterr().err
    assert not same(normal[1], over[1])  # step 5's early updates used the unclipped gradients
    assert ov.early == 8  # steps 4 and 5; step 6 ran normally
    assert "changed between its last backward and the step (gradient clipping" in err
    assert "so it is not bit-identical" in err


def test_the_checksum_sums_in_chunks_and_sees_one_changed_bit(T):
    """A gradient longer than DIGEST_CHUNK is summed in chunks (no int64 copy of the whole
    gradient stays cached: the 0.53 GB advise-overlap reserved on the H200); the chunked sum
    equals the whole one and still changes with a single flipped bit."""
    import torch
    g = torch.randn(2 * T.DIGEST_CHUNK + 12345)
    whole = g.view(torch.int32).sum(dtype=torch.int64)
    assert torch.equal(T._digest(g), whole)
    flipped = g.clone()
    flipped.view(torch.int32)[T.DIGEST_CHUNK + 7] ^= 1
    assert not torch.equal(T._digest(flipped), whole)
    small = torch.randn(100)
    assert torch.equal(T._digest(small), small.view(torch.int32).sum(dtype=torch.int64))


@pytest.mark.parametrize("breakage", ["update-before-the-last-backward", "step-does-not-skip-what-was-done"])
def test_a_broken_overlap_is_caught_by_the_comparison(T, monkeypatch, breakage):
    """The bit-identity checks above are not vacuous: updating at the first of two backwards,
    or letting the step update a parameter again, changes the parameters."""
    if breakage == "update-before-the-last-backward":
        learn = T.Overlap._learn

        def early(self, plan):
            learn(self, plan)
            if plan.phase == "on":
                plan.learned = {k: v - 1 for k, v in plan.learned.items()}
        monkeypatch.setattr(T.Overlap, "_learn", early)
    else:
        monkeypatch.setattr(T.Overlap, "_hide_done", lambda self, plan: None)
    normal, over, ov = overlapped(T, PATHS["adamw-foreach"], micro=2)
    assert ov.early > 0
    assert not same(normal[1], over[1]) and not same(normal[2], over[2])


def test_an_error_in_a_hook_falls_back_and_the_job_goes_on(T, monkeypatch, capsys):
    def boom(*a, **k):
        raise RuntimeError("no stream")
    monkeypatch.setattr(T.Overlap, "_step_only", boom)
    normal, over, ov = overlapped(T, PATHS["adamw-fused"])
    assert same(normal, over) and ov.early == 0
    err = capsys.readouterr().err
    assert err.count("step overlap off") == 1 and "an error in its gradient hook: RuntimeError('no stream')" in err

    monkeypatch.setattr(T.Overlap, "_learn", boom)
    normal, over, ov = overlapped(T, PATHS["sgd"])
    assert same(normal, over) and ov.early == 0
    assert "an error in its step hook: RuntimeError('no stream')" in capsys.readouterr().err


@pytest.mark.parametrize("staged", [False, True])
def test_an_update_that_fails_part_way_is_not_applied_twice(T, monkeypatch, capsys, staged):
    """torch's foreach AdamW counts the step and decays the weights before a later kernel
    that can fail (out of memory in its temporaries): such an early update is not made again
    by the application's step (which would count the step twice and decay twice), and the
    line says the step is not bit-identical."""
    import torch
    real, calls, armed = torch._foreach_sqrt, [], []

    def sqrt_failing_once(*a, **k):
        calls.append(1)
        if armed and len(calls) == 4:  # steps 1-3 learn; the 4th call is step 4's first early update
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real(*a, **k)
    monkeypatch.setattr(torch, "_foreach_sqrt", sqrt_failing_once)
    normal_steps = train(PATHS["adamw-foreach"], micro=2)[2]["state"]
    calls.clear()
    armed.append(True)
    _, _, state, _ = train(PATHS["adamw-foreach"], T.Overlap(staged=staged), micro=2)
    err = capsys.readouterr().err
    assert "step overlap off" in err and "out of memory (injected)" in err and "not bit-identical" in err
    assert [s["step"] for s in state["state"].values()] == [s["step"] for s in normal_steps.values()]


# --- wiring ----------------------------------------------------------------------------------

class Api:
    def policy(self): return "advise"  # the shim's policy
    def device_alloc(self, size):  # the shim's plain device memory: none here
        return 0

    def device_free(self, ptr):
        return -1

    def state_alloc(self, on):  # marks nothing: no shim
        return False

    def host_state(self, ptr, size):
        return False


def test_the_rules_switch_is_wired_by_the_adapter(T, monkeypatch):
    """The variable and the modes rules.py names (the CLI's --overlap, the plan) drive the
    adapter: unset is advise's default, each mode its driver, anything else nothing."""
    env = rules.ENV["OVERLAP_STEP"]
    monkeypatch.syspath_prepend(str(inject.adapter_dir()))
    site = load("sitecustomize")  # installs nothing here: no shim is loaded
    monkeypatch.delenv(env, raising=False)  # unset: advise's default, the streamed step
    assert rules.DEFAULT_OVERLAP["advise"] == "stream"
    assert type(site._Hooks(Api()).overlap).__name__ == "StreamedStep"
    monkeypatch.setenv(env, "0")
    assert site._Hooks(Api()).overlap is None
    monkeypatch.setenv(env, "1")
    hooks = site._Hooks(Api())
    assert type(hooks.overlap).__name__ == "Overlap"
    assert hooks.overlap.ours == [hooks.post_step, hooks.pool.pre_step, hooks.pool.post_step]
    assert hooks.overlap.staging is None  # reading the state where it is
    monkeypatch.setenv(env, "staged")  # the experiment: the state staged through the copy engines
    ov = site._Hooks(Api()).overlap
    assert ov.staging is not None and ov.staging.limit == rules.STAGE_RING_BYTES  # what the plan counts
    assert ov.staging.device_memory[0](1 << 20) == 0  # the ring's memory comes from the shim's API
    monkeypatch.setenv(env, "yes")  # anything else leaves the step alone
    assert site._Hooks(Api()).overlap is None


DRIVER = r"""
import contextlib, importlib.util, io, json, os, runpy, sys
adapter, trainer, args = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.path.insert(0, adapter)
spec = importlib.util.spec_from_file_location("transit_site", os.path.join(adapter, "sitecustomize.py"))
site = importlib.util.module_from_spec(spec)
spec.loader.exec_module(site)

class Api:  # the shim's API as the adapter sees it, on a machine without the shim
    def policy(self): return "advise"  # the shim's policy
    HOT, MASTER, OPTIMIZER = 0, 1, 2
    def hint(self, ptr, size, kind): return 0
    def iteration(self): return 0
    def device_alloc(self, size): return 0
    def device_free(self, ptr): return -1
    def state_alloc(self, on): return False
    def host_state(self, ptr, size): return False

def losses():
    out = io.StringIO()
    sys.argv = [trainer, *args]
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(trainer, run_name="__main__")
        except SystemExit as e:
            assert e.code in (0, None), e.code
    return [json.loads(l)["loss"] for l in out.getvalue().splitlines() if l.startswith('{"step"')]

normal = losses()
os.environ["TRANSIT_OVERLAP_STEP"] = "1"
hooks = site._Hooks(Api())
hooks.register(sys.modules["torch.optim.optimizer"])
print(json.dumps({"normal": normal, "overlap": losses(), "early": hooks.overlap.early}))
"""


def test_example_trainer_fsdp2_cpu_under_the_adapter():
    """examples/train_llama.py unchanged (FSDP2 on one gloo rank, activation checkpointing,
    AdamW, 2 microbatches a step) with the adapter's hooks as the launcher installs them:
    the same losses, with steps 4-6 overlapped (their updates show in the losses of 5 and 6)."""
    import json
    import subprocess
    from tests.conftest import ROOT
    args = ["--device", "cpu", "--dp", "fsdp", "--dim", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2",
            "--ffn", "128", "--vocab", "256", "--seq-len", "16", "--batch", "2", "--accum", "2", "--steps", "6"]
    res = subprocess.run([sys.executable, "-c", DRIVER, str(inject.adapter_dir()), str(ROOT / "examples" / "train_llama.py"),
                          *args], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.splitlines()[-1])
    assert len(out["normal"]) == 6 and out["overlap"] == out["normal"]
    n_params = 2 * 9 + 3  # two blocks of 9, the embedding, the final norm, the output layer
    assert out["early"] == 3 * n_params
    assert "2 backward(s) a step" in res.stderr


@pytest.mark.parametrize("seed", range(5))
def test_ring_never_hands_out_bytes_still_in_use(T, seed):
    """The staging ring's bookkeeping, driven by random batch sizes: a buffer never overlaps
    one whose copy home has not been waited for (the events count up on one stream, so
    waiting for event k means every buffer up to k is free), every buffer lies inside the
    ring, and the first lap waits for nothing."""
    import random
    ring = load("transit_staging").Ring(1 << 20)
    rng, done_upto, live, first_lap = random.Random(seed), -1, [], True
    for k in range(2000):
        n = rng.choice([1, 511, 512, 4096, 100_000, 300_000, ring.size // 2, ring.size])
        off, wait = ring.take(n)
        if wait is not None:
            assert wait > done_upto  # only newer events are worth a wait
            done_upto, first_lap = wait, False
        elif first_lap:
            assert sum(b - a for a, b, _ in live) + n <= ring.size
        size = -(-n // 512) * 512
        assert off % 512 == 0 and 0 <= off and off + size <= ring.size
        live = [(a, b, e) for a, b, e in live if e > done_upto]
        assert all(off + size <= a or b <= off for a, b, _ in live), (k, off, size, live)
        live.append((off, off + size, k))
        ring.done(k)
    with pytest.raises(ValueError):
        ring.take(ring.size + 1)


def test_staging_without_room_for_its_ring_reads_the_state_in_place(T, capsys, monkeypatch):
    """The shim refuses the ring (no room in the budget): said once, and no update is
    staged (stageable is None), so the early updates read the state where it is. The ring
    is asked for on its own device (the shim allocates on the calling thread's)."""
    import contextlib
    import torch
    st = load("transit_staging")
    entered = []
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext(entered.append(d)))
    asked = []
    s = st.Staging(device_memory=(lambda n: asked.append(n) or 0, lambda p: -1))
    dev = torch.device("cuda", 1)
    assert s.ring(dev) is None and s.ring(dev) is None and asked == [st.STAGE_LIMIT] and entered == [dev]
    err = capsys.readouterr().err
    assert err.count(f"no room in the GPU budget for a {st.STAGE_LIMIT >> 20} MiB staging ring") == 1


def test_a_ring_smaller_than_one_buffer_is_not_made(T, capsys, monkeypatch):
    """TRANSIT_OVERLAP_INFLIGHT below one aligned buffer: no ring (its size would be 0 and
    every take a division by zero), said once, and the shim is not asked."""
    import torch
    st = load("transit_staging")
    monkeypatch.setenv(st.INFLIGHT_ENV, "100")
    asked = []
    s = st.Staging(device_memory=(lambda n: asked.append(n) or 1, lambda p: 0))
    assert s.ring(torch.device("cuda", 0)) is None and asked == []
    assert capsys.readouterr().err.count("less than one 512-byte staging buffer") == 1


@pytest.mark.parametrize("raw", ["lots", "0", "-5", "1.5e9"])
def test_a_bad_inflight_bound_is_said_and_the_default_used(T, monkeypatch, capsys, raw):
    st = load("transit_staging")
    monkeypatch.setenv(st.INFLIGHT_ENV, raw)
    assert st.Staging().limit == st.STAGE_LIMIT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "TRANSIT_OVERLAP_INFLIGHT" in err[0] and "not a positive number" in err[0]
    monkeypatch.setenv(st.INFLIGHT_ENV, "2048")
    assert st.Staging().limit == 2048 and capsys.readouterr().err == ""


def test_staging_lets_go_of_replaced_states(T, monkeypatch):
    """After load_state_dict replaces an optimizer's states, the next homing lets go of the
    old states' pinned homes and wrappers, and a freed optimizer takes its homes and kept
    storages with it (homing itself is a GPU path: stood in for here by recording the CPU
    state in place)."""
    import torch
    st = load("transit_staging")
    monkeypatch.setattr(st.Staging, "_homeable", staticmethod(lambda t: True))
    monkeypatch.setattr(st.Staging, "_home", lambda self, t, opt: (self.homes.__setitem__(t.data_ptr(), t),
                                                                   self.owner.__setitem__(t.data_ptr(), id(opt))))
    m = mlp()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    m(torch.randn(3, 8)).sum().backward()
    opt.step()
    s = st.Staging()
    assert s.home(opt) > 0 and len(s.homes) == 8  # exp_avg and exp_avg_sq of 4 parameters
    first = set(s.homes)
    s.wrappers[1] = (opt.state[m[0].weight]["exp_avg"], None)
    import copy
    opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # new state tensors (a resumed checkpoint)
    assert s.home(opt) > 0 and len(s.homes) == 8 and not first & set(s.homes) and s.wrappers == {}
    assert s.home(opt) == 0  # nothing new: nothing moves
    s.kept.append((id(opt), m[0].weight.untyped_storage()))  # what _home keeps of a state's old storage
    del opt
    import gc
    gc.collect()
    assert s.homes == {} and s.owner == {} and s.kept == [] and s.finalizers == {}  # the optimizer is gone


def test_state_born_in_pinned_memory_is_homed_in_place(T, monkeypatch):
    """A state the shim made in pinned host memory (host_state says so) is its own home: the
    home is a CPU view of the same bytes, nothing is copied, no storage is kept, the state
    tensor is untouched. A state the shim did not make there is asked about by its own
    address and size. (CPU tensors stand in for the mapped memory: the view is made from
    the address alone, as on the GPU.)"""
    import torch
    st = load("transit_staging")
    monkeypatch.setattr(st.Staging, "_homeable", staticmethod(lambda t: True))
    m = mlp()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    m(torch.randn(3, 8)).sum().backward()
    opt.step()
    states = [opt.state[p][k] for p in m.parameters() for k in ("exp_avg", "exp_avg_sq")]
    asked = []
    s = st.Staging(host_state=lambda ptr, n: asked.append((ptr, n)) or True)
    before = [(t.data_ptr(), t.clone()) for t in states]
    assert s.home(opt) == sum(t.numel() * t.element_size() for t in states) == s.in_place
    assert sorted(asked) == sorted((t.data_ptr(), t.numel() * t.element_size()) for t in states)
    assert s.kept == []
    for t, (ptr, values) in zip(states, before):
        home = s.homes[ptr]
        assert t.data_ptr() == ptr and torch.equal(t, values)  # the state did not move
        assert home.device.type == "cpu" and home.data_ptr() == ptr and home.dtype == t.dtype
        home.add_(1)  # the same bytes: a write through the home is the state's
        assert torch.equal(t, values + 1)


def test_a_mode_that_is_none_is_said_once_and_the_step_runs_as_without_the_adapter(T, monkeypatch, capsys):
    """A TRANSIT_OVERLAP_STEP that is no mode: one line when the adapter starts (its state pool
    and its step driver both ask for the mode), no step driver, the state not marked."""
    monkeypatch.syspath_prepend(str(inject.adapter_dir()))
    site = load("sitecustomize")
    monkeypatch.setenv(T.OVERLAP_ENV, "sideways")
    hooks = site._Hooks(Api())
    assert hooks.overlap is None and hooks.pool.mark is None
    err = capsys.readouterr().err.splitlines()
    assert err == ["transit adapter: TRANSIT_OVERLAP_STEP='sideways' is not one of 0, 1, staged, stream, host: the step "
                   "runs as without the adapter"], err


def test_retired_settings_are_said_once_and_ignored(T, monkeypatch, capsys):
    """TRANSIT_OVERLAP_STEP=serial and TRANSIT_OVERLAP_SMS (retired, docs/retired-experiments.md):
    a job that still sets them is told, a line each, when the adapter starts, and runs as if
    they were unset: advise's default for serial (the streamed step), a plain side stream
    whatever the SMs asked."""
    monkeypatch.syspath_prepend(str(inject.adapter_dir()))
    site = load("sitecustomize")  # installs nothing here: no shim is loaded
    monkeypatch.setenv(T.OVERLAP_ENV, "serial")
    monkeypatch.setenv("TRANSIT_OVERLAP_SMS", "16")
    assert type(site._Hooks(Api()).overlap).__name__ == "StreamedStep"
    err = capsys.readouterr().err.splitlines()
    assert err == ["transit adapter: TRANSIT_OVERLAP_STEP=serial is retired and ignored (docs/retired-experiments.md): "
                   "the optimizer step runs as if it were unset; the modes are 0, 1, staged, stream, host",
                   "transit adapter: TRANSIT_OVERLAP_SMS=16 is retired and ignored (docs/retired-experiments.md): "
                   "no green context is made (the early updates of 1 and staged run on a plain side stream)"], err
    monkeypatch.setenv(T.OVERLAP_ENV, "1")
    assert type(site._Hooks(Api()).overlap).__name__ == "Overlap"
    assert capsys.readouterr().err.count("\n") == 1  # the SMs' line only
    monkeypatch.delenv("TRANSIT_OVERLAP_SMS")
    assert T.retired({T.OVERLAP_ENV: "1"}) == [] and T.retired({"TRANSIT_OVERLAP_SMS": ""}) == []
