"""What the step modes share (transit_launch/adapter/transit_step.py: the mode, the retired
settings, the verified step and its refusals), how sitecustomize wires TRANSIT_OVERLAP_STEP to
a driver, and the streamed step's ring and homes (transit_staging.py), on CPU. The modes
themselves: tests/test_adapter_streamed.py (stream, the default under advise) and
tests/test_adapter_host.py (host). The retired modes 1 and staged (docs/retired-experiments.md)
say one line and run the default."""

import importlib
import importlib.util

import pytest

from tests.conftest import NEEDS_TORCH, NO_TORCH
from tests.test_adapter_streamed import OPTIMIZERS, RING, STEPS, same, train
from transit_launch import rules
from transit_launch.preload import inject

pytestmark = pytest.mark.skipif(NO_TORCH, reason=NEEDS_TORCH)


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
    return load("transit_step")


def mlp(seed=0):
    import torch
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


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


class Api:
    """The shim's API as sitecustomize asks it, on a machine without the shim."""

    def __init__(self, policy="advise", pinned=False):
        self.name, self.pinned = policy, pinned

    def policy(self):
        return self.name

    def device_alloc(self, size):  # the shim's plain device memory: none here
        return 0

    def device_free(self, ptr):
        return -1

    def state_alloc(self, on):  # marks nothing: no shim
        return False

    def host_state(self, ptr, size):  # pinned: every state "made in pinned host memory" (the CPU's own)
        return self.pinned

    def state_on_host(self):
        return None


# --- the mode and its driver -------------------------------------------------------------------

def test_the_rules_switch_is_wired_by_the_adapter(T, monkeypatch):
    """The variable and the modes rules.py names (the CLI's --overlap, the plan) drive the
    adapter: unset is advise's default, each mode its driver, anything else nothing."""
    env = rules.ENV["OVERLAP_STEP"]
    assert T.MODES == ("stream", "host") and set(rules.RETIRED_OVERLAP_MODES) >= {"1", "staged"}
    monkeypatch.syspath_prepend(str(inject.adapter_dir()))
    site = load("sitecustomize")  # installs nothing here: no shim is loaded
    monkeypatch.delenv(env, raising=False)  # unset: advise's default, the streamed step
    assert rules.DEFAULT_OVERLAP["advise"] == "stream"
    hooks = site._Hooks(Api())
    assert type(hooks.overlap).__name__ == "StreamedStep"
    assert hooks.overlap.ours == [hooks.post_step, hooks.pool.pre_step, hooks.pool.post_step]
    assert hooks.overlap.staging.limit == rules.STAGE_RING_BYTES  # what the plan counts
    assert hooks.overlap.staging.device_memory[0](1 << 20) == 0  # the ring's memory comes from the shim's API
    monkeypatch.setenv(env, "0")
    assert site._Hooks(Api()).overlap is None
    monkeypatch.setenv(env, "stream")
    assert type(site._Hooks(Api()).overlap).__name__ == "StreamedStep"
    monkeypatch.setenv(env, "host")
    assert type(site._Hooks(Api()).overlap).__name__ == "Split"
    monkeypatch.setenv(env, "yes")  # anything else leaves the step alone
    assert site._Hooks(Api()).overlap is None


@pytest.mark.parametrize("retired", ["1", "staged"])
def test_a_retired_mode_says_one_line_and_the_default_runs(T, monkeypatch, capsys, retired):
    """TRANSIT_OVERLAP_STEP=1 or staged (retired, docs/retired-experiments.md): one line when the
    adapter starts, saying so and what runs instead; the job goes on with advise's default, the
    streamed step, which streams under clipping (where 1 and staged never engaged) and stays
    bit-identical (the CPU stands in for the GPU, as in tests/test_adapter_streamed.py)."""
    monkeypatch.syspath_prepend(str(inject.adapter_dir()))
    monkeypatch.setenv("TRANSIT_OVERLAP_INFLIGHT", str(RING))
    monkeypatch.setattr(load("transit_staging").Staging, "_homeable", staticmethod(lambda t: t.is_contiguous()))
    site = load("sitecustomize")
    monkeypatch.setenv(T.OVERLAP_ENV, retired)
    hooks = site._Hooks(Api(pinned=True))
    assert hooks.mode == "stream" and type(hooks.overlap).__name__ == "StreamedStep"
    assert hooks.pool.mark is not None  # the default's state marking, as when unset
    assert capsys.readouterr().err.splitlines() == [
        f"transit adapter: TRANSIT_OVERLAP_STEP={retired} is retired and ignored (docs/retired-experiments.md): "
        "the optimizer step runs as if it were unset (stream under advise, else the application's own step); "
        "the modes are 0, stream, host"]
    make = OPTIMIZERS["adamw-foreach"]
    same(train(make, hooks.overlap, clip=0.05), train(make, clip=0.05))  # clipping that binds: the default engages
    assert hooks.overlap.streamed == 4 * STEPS and hooks.overlap.said == {}  # every parameter, every step
    assert capsys.readouterr().err == ""  # said once, at the start
    monkeypatch.setenv(T.OVERLAP_ENV, retired)
    assert site._Hooks(Api("base")).overlap is None  # as if unset under base too: the application's step


def test_a_mode_that_is_none_is_said_once_and_the_step_runs_as_without_the_adapter(T, monkeypatch, capsys):
    """A TRANSIT_OVERLAP_STEP that is no mode: one line when the adapter starts (its state pool
    and its step driver both ask for the mode), no step driver, the state not marked."""
    monkeypatch.syspath_prepend(str(inject.adapter_dir()))
    site = load("sitecustomize")
    monkeypatch.setenv(T.OVERLAP_ENV, "sideways")
    hooks = site._Hooks(Api())
    assert hooks.overlap is None and hooks.pool.mark is None
    err = capsys.readouterr().err.splitlines()
    assert err == ["transit adapter: TRANSIT_OVERLAP_STEP='sideways' is not one of 0, stream, host: the step "
                   "runs as without the adapter"], err


def test_retired_settings_are_said_once_and_ignored(T, monkeypatch, capsys):
    """TRANSIT_OVERLAP_STEP=serial, TRANSIT_OVERLAP_SMS and TRANSIT_OVERLAP_EARLY (retired,
    docs/retired-experiments.md): a job that still sets them is told, a line each, when the
    adapter starts, and runs as if they were unset: advise's default for serial (the streamed
    step, which copies the state after backward), nothing for the SMs."""
    monkeypatch.syspath_prepend(str(inject.adapter_dir()))
    site = load("sitecustomize")  # installs nothing here: no shim is loaded
    monkeypatch.setenv(T.OVERLAP_ENV, "serial")
    monkeypatch.setenv("TRANSIT_OVERLAP_SMS", "16")
    monkeypatch.setenv("TRANSIT_OVERLAP_EARLY", "1")
    assert type(site._Hooks(Api()).overlap).__name__ == "StreamedStep"
    err = capsys.readouterr().err.splitlines()
    assert err == ["transit adapter: TRANSIT_OVERLAP_STEP=serial is retired and ignored (docs/retired-experiments.md): "
                   "the optimizer step runs as if it were unset (stream under advise, else the application's own "
                   "step); the modes are 0, stream, host",
                   "transit adapter: TRANSIT_OVERLAP_SMS=16 is retired and ignored (docs/retired-experiments.md): "
                   "no green context is made (the early updates it placed are retired too)",
                   "transit adapter: TRANSIT_OVERLAP_EARLY=1 is retired and ignored (docs/retired-experiments.md): "
                   "the streamed step copies the state after backward"], err
    monkeypatch.setenv(T.OVERLAP_ENV, "stream")
    assert type(site._Hooks(Api()).overlap).__name__ == "StreamedStep"
    assert capsys.readouterr().err.count("\n") == 2  # the SMs' and the early copies' lines only
    monkeypatch.delenv("TRANSIT_OVERLAP_SMS")
    monkeypatch.delenv("TRANSIT_OVERLAP_EARLY")
    assert T.retired({T.OVERLAP_ENV: "stream"}) == [] and T.retired({"TRANSIT_OVERLAP_SMS": ""}) == []


# --- the verified step and its refusals --------------------------------------------------------

def test_the_verified_step_is_torchs_own_for_the_known_classes_only(T):
    """raw_step: torch's undecorated step of exactly Adam, AdamW and SGD (a subclass may change
    step); is_container: an optimizer holding optimizers (TorchTitan's container)."""
    import torch

    class MyAdamW(torch.optim.AdamW):
        pass

    class Container(torch.optim.Optimizer):
        def __init__(self, opts):
            self.optimizers = opts
            super().__init__([p for o in opts for g in o.param_groups for p in g["params"]], {})
    ps = list(mlp().parameters())
    for cls in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD):
        raw = T.raw_step(cls(ps, lr=1e-2))
        assert raw is not None and raw.__qualname__ == T.KNOWN[(cls.__module__, cls.__name__)]
    assert T.raw_step(MyAdamW(ps, lr=1e-2)) is None and T.raw_step(torch.optim.RMSprop(ps, lr=1e-2)) is None
    inner = torch.optim.AdamW(ps, lr=1e-2)
    assert T.is_container(Container([inner])) and not T.is_container(inner)


def test_a_step_call_that_could_change_the_result_is_refused(T):
    """call_refusal, then every group's group_refusal (step_refusal): arguments (a closure,
    GradScaler's), GradScaler inside a fused step, step hooks not the adapter's."""
    import torch
    opt = torch.optim.AdamW(mlp().parameters(), lr=1e-2)
    mine = [lambda *a: None]
    assert T.step_refusal(opt, (opt,), {}, mine) is None
    assert "called with arguments" in T.step_refusal(opt, (opt, lambda: 0), {}, mine)
    assert "called with arguments" in T.step_refusal(opt, (opt,), {"closure": None}, mine)
    h = opt.register_step_pre_hook(lambda *a: None)
    assert "other optimizer step hooks" in T.step_refusal(opt, (opt,), {}, mine)
    h.remove()
    opt.grad_scale = torch.ones(())
    assert "GradScaler steps it" in T.step_refusal(opt, (opt,), {}, mine)
    del opt.grad_scale
    opt.param_groups[0]["lr"] = torch.tensor(1e-2)
    assert T.step_refusal(opt, (opt,), {}, mine) == "tensor hyper-parameters (not verified)"



def test_a_later_param_group_torch_would_step_differently_refuses_the_step(T):
    """step_refusal asks every group, not the first alone: an optimizer whose second group
    has a tensor learning rate, or differentiable=True, runs as the application made it
    (the streamed and the host step would step that group through the verified path)."""
    import torch
    m = mlp()
    opt = torch.optim.AdamW([{"params": m[0].parameters()}, {"params": m[2].parameters()}], lr=1e-2)
    mine = [lambda *a: None]
    assert T.step_refusal(opt, (opt,), {}, mine) is None
    opt.param_groups[1]["lr"] = torch.tensor(1e-2)
    assert T.step_refusal(opt, (opt,), {}, mine) == "tensor hyper-parameters (not verified)"
    opt.param_groups[1]["lr"] = 1e-2
    opt.param_groups[1]["differentiable"] = True
    assert T.step_refusal(opt, (opt,), {}, mine) == "differentiable=True"


def test_param_groups_torch_would_step_differently_are_refused(T):
    import torch
    p = torch.nn.Parameter(torch.ones(2))
    assert T.group_refusal({"params": [p], "foreach": None}) is None
    assert T.group_refusal({"params": [p], "differentiable": True}) == "differentiable=True"
    assert T.group_refusal({"params": [p], "capturable": True, "foreach": None}).startswith("capturable=True")
    assert T.group_refusal({"params": [p], "betas": (torch.tensor(0.9), 0.99), "foreach": None}) == \
        "tensor hyper-parameters (not verified)"
    assert "complex" in T.group_refusal({"params": [torch.nn.Parameter(torch.ones(2, dtype=torch.cfloat))],
                                          "foreach": None})


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


# --- the streamed step's ring and homes (transit_staging.py) -----------------------------------

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
    """The shim refuses the ring (no room in the budget): said once, and there is no ring, so
    the step reads the state where it is. The ring is asked for on its own device (the shim
    allocates on the calling thread's)."""
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
    assert err.count(f"the optimizer step on {dev} reads the state in place") == 1


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
    old states' pinned homes, and a freed optimizer takes its homes and kept
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
    import copy
    opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # new state tensors (a resumed checkpoint)
    assert s.home(opt) > 0 and len(s.homes) == 8 and not first & set(s.homes)
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
