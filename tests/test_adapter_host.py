"""The host update path (TRANSIT_OVERLAP_STEP=host, transit_launch/adapter/transit_host.py and its split, transit_split.py)
on CPU models: the result equals torch's own fused CPU step on a copy of the model with the
same clipping, accumulation, schedule and shared parameters, bit for bit, and the gradients
copied at their final hook are used (scaled by the clip's coefficient) rather than copied
again; a state torch's step would not see, or a step it refuses, runs as without it. The CPU
stands in for the GPU (no streams, no pinning); on a GPU it is bench/offload.py's
`transit-host` run."""

import sys

import pytest

from tests.conftest import NEEDS_TORCH, NO_TORCH
from tests.test_adapter_streamed import load, streamed  # noqa: F401 (streamed: a fixture)

pytestmark = pytest.mark.skipif(NO_TORCH, reason=NEEDS_TORCH)
STEPS, MICRO = 5, 3


@pytest.fixture
def host():
    h = load("transit_host").HostStep()
    h.install()
    yield h
    h.uninstall()


class Tied:
    """Wider than bench's blocks, with a weight used twice (a shared parameter)."""

    def __new__(cls, seed=0):
        import torch

        torch.manual_seed(seed)
        m = torch.nn.ModuleDict({"a": torch.nn.Linear(48, 512), "b": torch.nn.Linear(512, 48)})

        def forward(x):
            y = m["b"](torch.tanh(m["a"](x)))
            z = torch.tanh(torch.nn.functional.linear(torch.tanh(y), m["b"].weight.t()))  # b's weight, again
            return y + torch.nn.functional.linear(z, m["b"].weight)

        m.fwd = forward
        return m


def train(m, opt, sched, clip, micro=MICRO, steps=STEPS):
    import torch

    torch.manual_seed(1)
    losses = []
    for _ in range(steps):
        for _ in range(micro):
            x = torch.randn(16, 48)
            loss = m.fwd(x).pow(2).mean()
            loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _opt(cls, m, fused):
    import torch

    kw = {"momentum": 0.9, "weight_decay": 0.01} if cls is torch.optim.SGD else {"weight_decay": 0.1}
    opt = cls(m.parameters(), lr=1e-2, fused=fused, **kw)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))


@pytest.mark.parametrize("name", ["AdamW", "Adam", "SGD"])
@pytest.mark.parametrize("clip", [0.05, None], ids=["clip-binds", "no-clip"])
def test_the_host_step_is_torchs_own_cpu_step(host, name, clip):
    """The application's optimizer (default kernels) under the host path gives what torch's
    fused CPU step gives on a copy: every parameter and state tensor equal, bit for bit,
    with clipping that binds (a step with the unclipped gradients would differ)."""
    import torch

    cls = getattr(torch.optim, name)
    ref_m = Tied()
    ref_opt, ref_s = _opt(cls, ref_m, fused=True)
    host.uninstall()
    ref_loss = train(ref_m, ref_opt, ref_s, clip)
    host.install()
    m = Tied()
    opt, s = _opt(cls, m, fused=None)
    loss = train(m, opt, s, clip)
    assert loss == ref_loss
    for (n, p), q in zip(m.named_parameters(), ref_m.parameters()):
        assert torch.equal(p, q), n
    for p, q in zip(m.parameters(), ref_m.parameters()):
        st, ref = opt.state[p], ref_opt.state[q]
        assert st.keys() == ref.keys() and all(torch.equal(st[k], ref[k]) for k in st)
    assert host.stats["steps"] == STEPS and host.stats["host_params"] == 4
    # the first step copies every gradient at the step (no hooks yet); from the second the copy
    # made at the final hook is used (the second copies at every hook, as it has not learned
    # the microbatches, and its last copy counts)
    assert host.stats["recopied"] == 4
    assert host.stats["clipped"] == ((STEPS - 1) * 4 if clip else 0)
    unclipped = Tied()
    u_opt, u_s = _opt(cls, unclipped, fused=True)
    host.uninstall()
    train(unclipped, u_opt, u_s, None)
    if clip:
        assert not all(torch.equal(p, q) for p, q in zip(m.parameters(), unclipped.parameters()))


@pytest.mark.parametrize("bounce", [1000, 5000, 1 << 20], ids=["pieces", "ring", "whole"])
def test_copies_through_a_bounce_buffer_are_exact(bounce):
    """With the shim's plain device memory (here torch's CPU memory) every gradient down and
    parameter up passes through the bounce buffers, in pieces when a tensor is larger (1000
    bytes: floats cut across pieces, a last short piece): the result is still torch's fused
    step, bit for bit (the bench's host runs show the buffers' effect on a GPU)."""
    import torch

    th = load("transit_host")
    ref_m = Tied()
    ref_opt, ref_s = _opt(torch.optim.AdamW, ref_m, fused=True)
    ref_loss = train(ref_m, ref_opt, ref_s, 0.05)
    h = th.HostStep(device_memory=(lambda n: pytest.fail("a CPU buffer is torch's"), None))
    h.bounce_bytes = bounce
    h.install()
    try:
        m = Tied()
        opt, s = _opt(torch.optim.AdamW, m, fused=None)
        loss = train(m, opt, s, 0.05)
    finally:
        h.uninstall()
    assert loss == ref_loss
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), ref_m.parameters()))
    down, up = h.bounces[torch.device("cpu")]
    assert down.mem.numel() == up.mem.numel() == bounce
    assert down.piece == up.piece <= max(512, bounce // 4)
    assert down.mem.any() and up.mem.any()  # written: the last pieces are still in them
    assert not h.hook_failed and h.stats["recopied"] == 4  # every copy after the first step went through the ring
    assert h.stats["clipped"] == (STEPS - 1) * 4


def test_a_gradient_changed_after_backward_is_copied_again(host):
    """Anything but one clip (here a scale of the gradient in place) after the copy: the
    step reads the gradient the application left, as torch's step would."""
    import torch

    ref_m, m = Tied(), Tied()
    ref_opt, ref_s = _opt(torch.optim.AdamW, ref_m, fused=True)
    opt, s = _opt(torch.optim.AdamW, m, fused=None)

    def run(model, o, sched):
        torch.manual_seed(1)
        for _ in range(4):
            model.fwd(torch.randn(8, 48)).pow(2).mean().backward()
            for p in model.parameters():
                p.grad.mul_(0.5)  # a hand-made change, no clip function
            o.step()
            sched.step()
            o.zero_grad()

    host.uninstall()
    run(ref_m, ref_opt, ref_s)
    host.install()
    run(m, opt, s)
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), ref_m.parameters()))
    assert host.stats["recopied"] == 4 * 4 and host.stats["clipped"] == 0


def test_the_state_dict_holds_the_host_state_and_loads_back(host):
    """opt.state is the host state (one dict), so state_dict() is torch's; a state loaded
    into the application's optimizer is taken in at the next step."""
    import torch

    m = Tied()
    opt, s = _opt(torch.optim.AdamW, m, fused=None)
    train(m, opt, s, 0.05, steps=3)
    sd = opt.state_dict()
    assert len(sd["state"]) == 4 and all(int(v["step"]) == 3 for v in sd["state"].values())
    saved = {k: {n: t.clone() for n, t in v.items()} for k, v in sd["state"].items()}
    for v in opt.state.values():
        v["exp_avg"].fill_(7.0)
    opt.load_state_dict({"state": saved, "param_groups": sd["param_groups"]})
    train(m, opt, s, 0.05, steps=1)
    assert all(int(v["step"]) == 4 for v in opt.state_dict()["state"].values())
    assert not any((v["exp_avg"] == 7.0).any() for v in opt.state.values())


def test_what_the_host_step_refuses_runs_as_without_it(host, capsys):
    """A closure, and an optimizer class that is not verified: torch's step, said once."""
    import torch

    m = Tied()
    opt = torch.optim.RMSprop(m.parameters(), lr=1e-3)
    m.fwd(torch.randn(4, 48)).sum().backward()
    opt.step()
    m2 = Tied()
    opt2 = torch.optim.AdamW(m2.parameters(), lr=1e-3)

    def closure():
        opt2.zero_grad()
        loss = m2.fwd(torch.randn(4, 48)).sum()
        loss.backward()
        return loss

    opt2.step(closure)
    opt2.step(closure)
    err = capsys.readouterr().err
    assert err.count("host step off for RMSprop: not torch.optim's Adam, AdamW or SGD") == 1
    assert err.count("host step off for AdamW: optimizer.step() called with arguments") == 1
    assert host.stats["steps"] == 0 and all(opt2.state[p]["step"] == 2 for p in m2.parameters())


def test_the_state_the_budget_holds_stays_with_torchs_step():
    """room(device) holds the state of the first two parameters (by group order): those step
    in the application's own step (its kernels), the other two on the host (fused CPU). One
    step: after it the model is a mix of the two references, whose next gradients differ."""
    import torch

    first_two = sum(p.numel() * 4 * 2 for p in list(Tied().parameters())[:2])
    told = []  # the shim is told, before the first step's boundary, that state is on the host
    h = load("transit_host").HostStep(room=lambda dev: first_two, on_host=lambda: told.append(h.stats["steps"]))
    refs = {}
    for fused in (None, True):
        refs[fused] = Tied()
        o, sch = _opt(torch.optim.AdamW, refs[fused], fused=fused)
        train(refs[fused], o, sch, 0.05, steps=1)
    h.install()
    try:
        m = Tied()
        opt, s = _opt(torch.optim.AdamW, m, fused=None)
        train(m, opt, s, 0.05, steps=1)
    finally:
        h.uninstall()
    assert (h.stats["resident_params"], h.stats["host_params"]) == (2, 2)
    assert told == [0]  # once, at adoption (before the step counted)
    ps = list(m.parameters())
    assert all(torch.equal(p, q) for p, q in zip(ps[:2], list(refs[None].parameters())[:2]))
    assert all(torch.equal(p, q) for p, q in zip(ps[2:], list(refs[True].parameters())[2:]))


def test_the_bounce_buffers_go_back_to_the_budget_with_the_last_plan(monkeypatch, capsys):
    """The bounce buffers are the shim's device memory, out of the GPU budget: held after the
    host path has given its last optimizer back, they would keep as much of what the budget held
    on the host, read zero-copy, to the end of the job. They go back when the last plan does,
    once; while another optimizer is still on the host path they stay."""
    import gc

    import torch

    th = load("transit_host")
    st = th.transit_staging
    freed = []

    def device_buffer(device_memory, dev, nbytes, owner, what):  # the shim's memory, on a CPU
        mem = torch.zeros(nbytes, dtype=torch.uint8)
        st.held(owner, freed.append, mem.data_ptr())
        return mem, None

    monkeypatch.setattr(st, "device_buffer", device_buffer)
    h = th.HostStep(device_memory=(None, None))
    h.install()
    try:
        models = [Tied(), Tied(1)]
        opts = [_opt(torch.optim.AdamW, m, fused=None) for m in models]
        for m, (opt, sched) in zip(models, opts):
            train(m, opt, sched, None, steps=2)
        assert len(h.plans) == 2
        [(down, _up)] = h.bounces.values()
        ptr = down.mem.data_ptr()
        for i, (m, (opt, _)) in enumerate(zip(models, opts)):
            def closure(m=m, opt=opt):  # a step with a closure: refused, the plan given back
                opt.zero_grad()
                loss = m.fwd(torch.randn(4, 48)).pow(2).mean()
                loss.backward()
                return loss
            opt.step(closure)
            assert len(h.plans) == 1 - i
            assert freed == ([ptr] if i else []), (i, freed)  # the first give-back leaves them to the other plan
        assert h.bounces == {}
        assert capsys.readouterr().err.count("host step off for AdamW") == 2
    finally:
        h.uninstall()
    del h, down, _up
    gc.collect()
    assert freed == [ptr]  # once: not again with their owner


def test_a_step_refused_after_adoption_gives_the_state_back(host, capsys):
    """Two host steps, then one with a closure (refused): the state goes back to the
    application's optimizer, which steps on with it (its step count continues)."""
    import torch

    m = Tied()
    opt, s = _opt(torch.optim.AdamW, m, fused=None)
    train(m, opt, s, 0.05, steps=2)
    assert host.stats["steps"] == 2

    def closure():
        opt.zero_grad()
        loss = m.fwd(torch.randn(4, 48)).pow(2).mean()
        loss.backward()
        return loss

    opt.step(closure)
    assert "host step off for AdamW: optimizer.step() called with arguments" in capsys.readouterr().err
    assert host.stats["steps"] == 2 and not host.plans
    for p in m.parameters():
        st = opt.state[p]
        assert int(st["step"]) == 3 and st["exp_avg"].device == p.device and st["exp_avg"].abs().sum() > 0


def on_worker(host, monkeypatch, before):
    """before(cpu optimizer) runs on the host step's worker right before each of its CPU steps."""
    import threading

    ov = load("transit_step")
    real, main = ov.raw_step, threading.current_thread()

    def raw_step(opt):
        f = real(opt)
        if f is None:
            return None

        def step(o):
            if threading.current_thread() is not main:
                before(o)
            return f(o)
        return step

    monkeypatch.setattr(ov, "raw_step", raw_step)


@pytest.fixture
def held(host, monkeypatch):
    """The host step's worker held at each CPU step until the test's timer lets it go, and
    the order of what happened: "returned" (opt.step() came back on the application's
    thread), "stepped" (the worker ran a chunk's CPU step)."""
    import threading

    log, go = [], threading.Event()

    def hold(o):
        go.wait(5)
        log.append("stepped")
    on_worker(host, monkeypatch, hold)

    def step(opt):  # opt.step(), the worker held until a timer after it returned
        go.clear()
        opt.step()
        log.append("returned")
        threading.Timer(0.2, go.set).start()
    return log, step


def test_the_step_returns_before_the_cpu_and_the_next_forward_waits(host, held):
    """opt.step() comes back while the worker still steps on the CPU; the next forward (and
    a read between steps, as an EMA does) waits for the parameters it reads: the losses, the
    parameters and the state equal torch's fused CPU step's, bit for bit, with clipping."""
    import torch

    log, held_step = held
    ref_m, m = Tied(), Tied()
    ref_opt, ref_s = _opt(torch.optim.AdamW, ref_m, fused=True)
    opt, s = _opt(torch.optim.AdamW, m, fused=None)

    def run(model, o, sched, hold):
        torch.manual_seed(1)
        out = []
        for _ in range(4):
            for _ in range(2):
                loss = model.fwd(torch.randn(16, 48)).pow(2).mean()
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            held_step(o) if hold else o.step()
            out.append((loss.item(), model["b"].weight.detach().clone()))  # a read between steps
            sched.step()
            o.zero_grad()
        return out

    host.uninstall()
    ref = run(ref_m, ref_opt, ref_s, False)
    host.install()
    got = run(m, opt, s, True)
    assert [x for x, _ in got] == [x for x, _ in ref]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(got, ref))
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), ref_m.parameters()))
    got_sd, ref_sd = opt.state_dict()["state"], ref_opt.state_dict()["state"]
    assert all(torch.equal(got_sd[i][k], ref_sd[i][k]) for i in ref_sd for k in ref_sd[i])
    # every step came back before its first CPU step ran (a step that waited for the CPU
    # would log "stepped" first); a step's chunks ran before the next step returned
    assert log[0] == "returned" and log.count("returned") == 4
    assert all(log[i + 1] == "stepped" for i, e in enumerate(log) if e == "returned"), log
    assert host.stats["held_s"] > 0  # the application's thread waited at the gate


def test_a_containers_optimizers_step_on_the_host_and_nothing_is_said(host, capsys):
    """TorchTitan's OptimizersContainer in miniature: the container's step only calls its
    AdamWs', each adopted on its own; the container itself is neither adopted nor refused
    (no line about it), and the result is torch's fused CPU step's, bit for bit."""
    import types

    import torch

    from tests.test_adapter_streamed import Container

    def run(m, fused):
        opt = Container([m["a"], m["b"]], lr=1e-2, weight_decay=0.1)
        for o in opt.optimizers:
            for g in o.param_groups:
                g["fused"] = fused
        return train(m, opt, types.SimpleNamespace(step=lambda: None), 0.05)  # no schedule

    host.uninstall()
    ref_m = Tied()
    ref = run(ref_m, True)
    host.install()
    m = Tied()
    assert run(m, None) == ref
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), ref_m.parameters()))
    assert host.stats["host_params"] == 4 and not host.said
    assert "host step off" not in capsys.readouterr().err


def test_the_counters_reach_the_shims_report_at_exit(host):
    """sitecustomize's exit handler sends the step's mode and counters to the shim
    (api.adapter_stats: the report's "adapter" object)."""
    import importlib.util

    import torch

    from transit_launch.preload import inject

    spec = importlib.util.spec_from_file_location("transit_site_h", inject.adapter_dir() / "sitecustomize.py")
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)  # installs nothing here: no shim is loaded
    m = Tied()
    opt, s = _opt(torch.optim.AdamW, m, fused=None)
    train(m, opt, s, 0.05, steps=2)

    class Api:
        sent = []

        def adapter_stats(self, counters):
            self.sent.append(counters)
            return True

    hooks = object.__new__(site._Hooks)
    hooks.api, hooks.mode, hooks.overlap = Api(), "host", host
    hooks.send_stats()
    [sent] = Api.sent
    assert sent["mode"] == "host" and sent["steps"] == 2 and sent["host_params"] == 4 and sent["clipped"] == 4
    assert sent["cpu_s"] == round(host.stats["cpu_s"], 3)


def test_the_worker_steps_chunks_in_forwards_order_with_a_core_left(host, monkeypatch):
    """One chunk a parameter (CHUNK_BYTES lowered): once their gradients are down (on the
    CPU at once) the worker steps them in the order the next forward reads them, the first
    layer first, with the application's intra-op threads less one (the core the
    application's thread keeps)."""

    import torch

    monkeypatch.setattr(sys.modules["transit_host"], "CHUNK_BYTES", 1)
    seen = []
    on_worker(host, monkeypatch, lambda o: seen.append(
        ([tuple(p.shape) for g in o.param_groups for p in g["params"]], torch.get_num_threads())))
    before = torch.get_num_threads()
    torch.set_num_threads(max(2, before))  # a core to leave (the suite runs one thread: conftest)
    try:
        m = Tied()
        opt, s = _opt(torch.optim.AdamW, m, fused=None)
        threads = torch.get_num_threads()
        train(m, opt, s, None, steps=2)
        [p.sum() for p in m.parameters()]  # read: the gate waits for the last step's chunks
    finally:
        torch.set_num_threads(before)
    order = [shape for shape, _ in seen]
    assert order == [[(512, 48)], [(512,)], [(48, 512)], [(48,)]] * 2, order  # a.weight, a.bias, b.weight, b.bias
    assert {n for _, n in seen} == {threads - 1}, seen


def test_the_copies_up_run_beside_the_next_cpu_step(host, monkeypatch):
    """One chunk a parameter: a chunk's copies up are issued by the sender thread while the
    worker steps the next chunk (each send is held until the worker has begun the next CPU
    step: a worker that issued its own copies between steps would never begin it), a read
    of a parameter between steps waits for its chunk's copies, and the parameters and the
    state equal torch's fused CPU step's, bit for bit."""
    import threading

    import torch

    th = sys.modules["transit_host"]
    monkeypatch.setattr(th, "CHUNK_BYTES", 1)
    began, cond = [0], threading.Condition()

    def begin(o):
        with cond:
            began[0] += 1
            cond.notify_all()
    on_worker(host, monkeypatch, begin)
    real, sent, beside = th.HostStep._send_up, [], []

    def send_up(self, job, c):
        k = job.chunks.index(c)
        if k < len(job.chunks) - 1:  # the last chunk has no next CPU step to wait for
            with cond:
                beside.append(cond.wait_for(lambda: began[0] >= len(sent) + 2, timeout=2))
        real(self, job, c)
        sent.append(c)
    monkeypatch.setattr(th.HostStep, "_send_up", send_up)
    ref_m, m = Tied(), Tied()
    ref_opt, ref_s = _opt(torch.optim.AdamW, ref_m, fused=True)
    host.uninstall()
    train(ref_m, ref_opt, ref_s, 0.05, steps=3)
    host.install()
    opt, s = _opt(torch.optim.AdamW, m, fused=None)
    train(m, opt, s, 0.05, steps=3)
    read = [p.detach().clone() for p in m.parameters()]  # the gate: after the last step's copies up
    assert beside and all(beside), beside
    assert len(sent) == 3 * 4 and began[0] == 3 * 4
    assert all(torch.equal(p, q) for p, q in zip(read, ref_m.parameters()))
    for p, q in zip(m.parameters(), ref_m.parameters()):
        st, ref = opt.state[p], ref_opt.state[q]
        assert all(torch.equal(st[k], ref[k]) for k in st)


def test_a_step_in_flight_as_the_interpreter_exits_still_sends_its_parameters_up(host, capsys):
    """At the interpreter's exit the sender thread is told to end (concurrent.futures refuses
    new work) while the last step's CPU work may still run: its chunks are sent up by the
    worker itself, and the step is whole (no error said, the parameters equal torch's)."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    ref_m, m = Tied(), Tied()
    ref_opt, ref_s = _opt(torch.optim.AdamW, ref_m, fused=True)
    host.uninstall()
    train(ref_m, ref_opt, ref_s, None, steps=3)
    host.install()
    host.sender = ThreadPoolExecutor(1)
    host.sender.shutdown()  # as concurrent.futures' exit handler leaves it
    opt, s = _opt(torch.optim.AdamW, m, fused=None)
    train(m, opt, s, None, steps=3)
    read = [p.detach().clone() for p in m.parameters()]  # waits for the last step's chunks
    assert all(torch.equal(p, q) for p, q in zip(read, ref_m.parameters()))
    assert "error" not in capsys.readouterr().err


def test_an_op_given_a_parameter_by_keyword_waits_for_it(host, held):
    """The gate looks at keyword arguments too: torch.mul(input=p, other=1) right after the
    step reads the stepped parameter, as torch's fused CPU step left it."""
    import torch

    _, held_step = held
    ref_m, m = Tied(), Tied()
    ref_opt, _ = _opt(torch.optim.AdamW, ref_m, fused=True)
    opt, _ = _opt(torch.optim.AdamW, m, fused=None)
    host.uninstall()
    torch.manual_seed(1)
    ref_m.fwd(torch.randn(16, 48)).pow(2).mean().backward()
    ref_opt.step()
    host.install()
    torch.manual_seed(1)
    m.fwd(torch.randn(16, 48)).pow(2).mean().backward()
    held_step(opt)
    with torch.no_grad():
        got = torch.mul(input=m["a"].weight, other=1.0)  # the parameter reaches the op by keyword only
    assert torch.equal(got, ref_m["a"].weight.detach())


@pytest.fixture
def gloo():
    import torch.distributed as dist

    assert not dist.is_initialized(), "a process group is already up"
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()


def test_the_shims_hints_after_a_step_leave_the_cpu_step_in_flight(host, gloo, held):
    """Under the shim, sitecustomize's own post-step hook hints the master weights after every
    step; with FSDP2 they are DTensors whose shards it reads. It reads them without an op the
    gate holds, so opt.step() still comes back before the CPU step runs (a to_local() there
    held the application until the whole CPU step was done: on an H100 the next forward then
    had nothing left to overlap)."""
    import importlib.util

    import torch
    from torch.optim import optimizer as o

    from tests.test_adapter_step import fsdp_mlp
    from transit_launch.preload import inject

    spec = importlib.util.spec_from_file_location("transit_site_g", inject.adapter_dir() / "sitecustomize.py")
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)  # installs nothing here: no shim is loaded

    class Api:
        OPTIMIZER, MASTER, SPARSE = 1, 2, 3
        boundaries = 0

        def hint(self, ptr, size, kind):
            pass

        def iteration(self):
            Api.boundaries += 1
            return 0

    hooks = object.__new__(site._Hooks)
    hooks.api, hooks.reported, hooks.first, hooks.failed = Api(), {}, None, False
    hooks.sparse, hooks.sparse_ids, hooks.expect = None, set(), None
    host.ours.append(hooks.post_step)  # as sitecustomize makes it: the adapter's hook is not foreign
    log, held_step = held
    m = fsdp_mlp()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    handle = o.register_optimizer_step_post_hook(hooks.post_step)
    try:
        for _ in range(3):
            m(torch.randn(4, 8)).pow(2).mean().backward()
            held_step(opt)
            opt.zero_grad()
        [p.sum() for p in m.parameters()]  # read: waits for the last step's chunk
    finally:
        handle.remove()
    assert Api.boundaries == 3 and not hooks.failed and host.stats["host_params"] == 4 and not host.said
    assert log.count("returned") == 3 and log.count("stepped") >= 3
    assert all(log[i + 1] == "stepped" for i, e in enumerate(log) if e == "returned"), log


@pytest.mark.parametrize("clip", [None, 0.05], ids=["no-clip", "clip"])
def test_the_split_steps_the_last_layers_on_the_host_and_streams_the_rest(streamed, clip, monkeypatch):
    """TRANSIT_OVERLAP_STEP=host's split: with half the offloaded bytes given to the CPU
    (Linear(64, 1000) and Linear(1000, 4): 69,004 parameters; from the last, 4 + 4,000 + 1,000
    are within half, the first weight's 64,000 would pass it), the CPU steps the last three
    parameters and the streamed step the first weight at every step; the losses, parameters
    and state equal torch's fused step's bit for bit, and the share was asked knowing whether
    a clip ran before the first step."""
    import torch

    from tests.test_adapter_streamed import same, train

    asked = []

    def share(opt, clipped, timing):
        asked.append((clipped, timing))
        return 0.5

    th, ts = load("transit_host"), load("transit_split")
    monkeypatch.setattr(th, "TIMED_DEVICES", ("cuda", "cpu"))  # the CPU's steps timed as a GPU's
    host = th.HostStep(share=share)
    drv = ts.Split(host, streamed())
    make = lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1, fused=True)  # noqa: E731
    ref = train(make, steps=STEPS, clip=clip)
    got = train(make, drv, steps=STEPS, clip=clip)
    same(got, ref)
    assert [len(o) for o in got[2]] == [3 * 4]  # exp_avg, exp_avg_sq, step of each of the 4 parameters
    # the first LEARN_STEPS steps streamed whole, timed: the share asked once, at the next,
    # with the window (the CPU's forward and backward) and the streamed step's seconds
    learn = ts.LEARN_STEPS
    assert [(c, n) for c, (_, _, n) in asked] == [(clip is not None, 69004 * 4)]
    assert all(t > 0 for t in asked[0][1][:2]) and host.stats["steps"] == STEPS - learn
    assert (host.stats["host_params"], host.stats["stream_params"], host.stats["resident_params"]) == (3, 1, 0)
    streamed = learn * 4 + STEPS - learn  # all four parameters while learning, then the first weight
    assert drv.stream.streamed == streamed and drv.counters()["stream"]["streamed_params"] == streamed


def test_the_split_share_balances_the_cpu_and_the_link():
    """Clipped, the CPU's step and the streamed step's copies start together at backward's
    end: at 3 ns a parameter byte on the CPU and 1 ns on the link, a quarter on the CPU
    (0.25 x 3 = 0.75 x 1) ends both together. Unclipped, the CPU steps during backward: all."""
    s = load("transit_split").SplitShare()
    s.measured = (3e-9, 1e-9)
    assert s(None, True) == pytest.approx(0.25) and s(None, False) == 1.0


def test_the_split_share_balances_the_timed_steps():
    """Timed (the steps streamed whole): at 3 ns a parameter byte on the CPU for 1e8 bytes
    (0.3 s), a 0.2 s forward and backward and a 0.1 s streamed step: unclipped the CPU steps
    from the gradients' landing until the next forward, 0.75 x 0.3 = 0.2 + 0.25 x 0.1; clipped
    it starts after backward and the forward's first third runs on the streamed layers,
    s x (0.3 + 0.2 / 3) = 0.2 / 3 + (1 - s) x 0.1; a window longer than the CPU needs: all."""
    s = load("transit_split").SplitShare()
    s.measured = (3e-9, 1e-9)
    assert s(None, False, (0.2, 0.1, 1e8)) == pytest.approx(0.75)
    assert s(None, True, (0.2, 0.1, 1e8)) == pytest.approx((0.2 / 3 + 0.1) / (0.3 + 0.2 / 3 + 0.1))
    assert s(None, False, (1.0, 0.1, 1e8)) == 1.0 and s(None, True, (0.0, 0.0, 1e8)) == 0.0
    # revised from the CPU's rate as the host steps ran (here 5 ns a byte: 0.5 s), not the calibration's
    assert s.revise(False, (0.2, 0.1, 1e8), 5e-9) == pytest.approx((0.2 + 0.1) / (0.5 + 0.1))
    s.fixed = 0.4
    assert s.revise(True, (0.2, 0.1, 1e8), 5e-9) == 0.4  # a fixed share (TRANSIT_HOST_SHARE) stays


class Revising:
    """A split share that gives `first` at adoption and `revised` when the host steps ask
    again, recording the CPU's seconds a byte they report."""

    def __init__(self, first, revised):
        self.first, self.revised, self.rates = first, revised, []

    def __call__(self, opt, clipped, timing):
        return self.first

    def revise(self, clipped, timing, cpu_byte_s):
        self.rates.append(cpu_byte_s)
        return self.revised


def _split(th, ts, share, streamed, monkeypatch, whole=None):
    """A Split on the CPU, its steps timed as a GPU's; whole: the seconds the step streamed
    whole is said to take (window, stream), in place of the CPU's."""
    monkeypatch.setattr(th, "TIMED_DEVICES", ("cuda", "cpu"))
    host = th.HostStep(share=share)
    drv = ts.Split(host, streamed())
    host.revise = share.revise  # (Split takes a SplitShare's: here the stand-in's)
    if whole is not None:
        real = host._timing
        monkeypatch.setattr(host, "_timing", lambda opt, n: (real(opt, n) and None) or (*whole, n))
    return host, drv


def _clock(th, host, seconds, monkeypatch):
    """The host steps' marks read a clock that a step moves on by seconds[the parameters on
    the host then]: the split's timings made exact (the CPU's own would decide by noise)."""
    now = [0.0]

    def mark(dev):
        now[0] += seconds.get(host.stats["host_params"], 1.0)  # (none while the split learns)
        return now[0]

    monkeypatch.setattr(th, "_mark", mark)


# Linear(64, 1000), Linear(1000, 4): shares 0.5 and 0.01 of the 69,004 offloaded parameters'
# bytes pick the last three parameters and the last one (_host_share: to the nearest parameter)
@pytest.mark.parametrize("first, revised, before, after", [(0.5, 0.01, 3, 1), (0.01, 1.0, 1, 4)],
                         ids=["fewer", "more"])
def test_the_split_revises_its_share_from_the_host_steps_and_stays_exact(streamed, monkeypatch, capsys, first,
                                                                          revised, before, after):
    """After REVISE_STEPS host steps the share is asked again with the CPU's seconds a byte
    as they ran; the parameters that leave the host give their state back to the streamed
    step, those that join take theirs from it, and the run equals torch's fused step bit for
    bit (losses, parameters, state). The step streamed whole said slower: the host path stays."""
    import torch

    from tests.test_adapter_streamed import same, train

    th, ts = load("transit_host"), load("transit_split")
    share = Revising(first, revised)
    host, drv = _split(th, ts, share, streamed, monkeypatch, whole=(1e3, 1e3))
    _clock(th, host, {before: 2.0, after: 1.0}, monkeypatch)  # the revised share the faster
    adopted = []
    real_adopt = host._adopt
    monkeypatch.setattr(host, "_adopt", lambda opt, **kw: adopted.append(kw) or real_adopt(opt, **kw))
    make = lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1, fused=True)  # noqa: E731
    steps = ts.LEARN_STEPS + 1 + ts.REVISE_STEPS + 4
    ref = train(make, steps=steps, clip=0.05)
    got = train(make, drv, steps=steps, clip=0.05)
    same(got, ref)
    assert len(share.rates) == 1 and share.rates[0] > 0  # asked once, with a rate
    assert [kw.get("share") for kw in adopted] == [None, revised]
    assert (host.stats["host_params"], host.stats["stream_params"]) == (after, 4 - after)
    assert host.stats["share"] == revised and host.stats["revised_share"] == revised
    # kept to the end: the step streamed whole was "slower"
    assert host.stats["steps"] == steps - ts.LEARN_STEPS and "faster" not in capsys.readouterr().err
    # streamed: every parameter while learning, then the first plan's rest from its adoption to the
    # revision (1 + REVISE_STEPS steps), then the revised plan's rest (here a state given back is
    # homed already, the staging's CPU homes being in place: it streams at once)
    first_steps, later = 1 + ts.REVISE_STEPS, steps - ts.LEARN_STEPS - 1 - ts.REVISE_STEPS
    assert drv.stream.streamed == ts.LEARN_STEPS * 4 + first_steps * (4 - before) + later * (4 - after)


def test_the_split_gives_all_to_the_streamed_step_where_it_was_faster(streamed, monkeypatch, capsys):
    """Host steps slower than the step streamed whole (said to take no time): after
    REVISE_STEPS of them the host path gives its state back, says so once, and the streamed
    step runs every parameter from then on; the run equals torch's fused step bit for bit."""
    import torch

    from tests.test_adapter_streamed import same, train

    th, ts = load("transit_host"), load("transit_split")
    share = Revising(0.5, 0.5)  # the same parameters: no plan made again, the times compared at once
    host, drv = _split(th, ts, share, streamed, monkeypatch, whole=(0.0, 0.0))
    make = lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1, fused=True)  # noqa: E731
    steps = ts.LEARN_STEPS + 1 + ts.REVISE_STEPS + 3
    ref = train(make, steps=steps)
    got = train(make, drv, steps=steps)
    same(got, ref)
    err = capsys.readouterr().err
    assert err.count("the step streamed whole was faster") == 1
    assert host.gate is None  # no plan left: every torch function goes past no mode of ours
    host_steps = 1 + ts.REVISE_STEPS
    assert host.stats["steps"] == host_steps
    # 4 a step while learning and from the fallback on, 1 between
    assert drv.stream.streamed == 4 * (steps - host_steps) + host_steps * 1



def test_a_share_takes_the_last_parameters_to_the_nearest_parameter():
    """_pick, by hand on Linear(64, 1000) and Linear(1000, 4) in fp32 (forward order: 256,000,
    4,000, 16,000 and 16 bytes; 276,016 in all). At 0.07 (19,321.12 bytes) the last bias and
    weight (16,016) and the first bias (20,016: 695 past the share where 16,016 is 3,305
    short) are nearest: three, not the two that stay below it; the first weight (148,016
    halfway) is not. Below half the last bias (8 bytes): none."""
    th = load("transit_host")
    sizes = [256_000, 4_000, 16_000, 16]
    assert th._pick(sizes, 0.07) == 3
    assert th._pick(sizes, 0.5) == 3 and th._pick(sizes, 0.6) == 4
    assert th._pick(sizes, 7 / 276_016) == 0 and th._pick(sizes, 9 / 276_016) == 1


def test_every_level_the_search_offers_is_the_plan_of_that_many_parameters():
    """The search keys a timed plan by levels[len(recs) - 1], so a share it asks must give
    back as many parameters as the level's rank: three equal parameters' levels are
    0.333333, 0.666667 and 1.0 (rounded to 6 places, the first below a third), and each
    picks 1, 2 and 3 (to the nearest parameter, not the whole ones within the share)."""
    th = load("transit_host")
    sizes = [4_000, 4_000, 4_000]
    levels = th._levels(sizes)
    assert levels == [0.333333, 0.666667, 1.0]
    assert [th._pick(sizes, x) for x in levels] == [1, 2, 3]


def test_a_fixed_share_is_neither_revised_nor_searched(streamed, monkeypatch, capsys):
    """TRANSIT_HOST_SHARE measures the share given (a diagnostic): the split neither revises
    it nor searches, so it stays at 0.5 (the last three parameters) to the end even where
    the step streamed whole is said to take no time and each host step 2 s (the search's
    fallback would give all of it to the streamed step)."""
    import torch

    from tests.test_adapter_streamed import train

    monkeypatch.setenv("TRANSIT_HOST_SHARE", "0.5")
    th, ts = load("transit_host"), load("transit_split")
    monkeypatch.setattr(th, "TIMED_DEVICES", ("cuda", "cpu"))
    host = th.HostStep(share=ts.SplitShare())
    drv = ts.Split(host, streamed())
    real = host._timing
    monkeypatch.setattr(host, "_timing", lambda opt, n: (real(opt, n) and None) or (0.0, 0.0, n))
    _clock(th, host, {3: 2.0}, monkeypatch)
    make = lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1, fused=True)  # noqa: E731
    steps = ts.LEARN_STEPS + 1 + ts.REVISE_STEPS + 1  # one step past where a search would revise
    train(make, drv, steps=steps, micro=1, clip=0.05)
    assert "faster" not in capsys.readouterr().err
    assert (host.stats["host_params"], host.stats["stream_params"]) == (3, 1) and host.stats["share"] == 0.5
    assert host.stats["steps"] == steps - ts.LEARN_STEPS and host.stats["revised_share"] is None


# 16 parameters of one size (bench/host_step.py's model): the shares 1/16 apart
SIXTEEN = [k / 16 for k in range(1, 17)]


@pytest.mark.parametrize("tried, want", [
    ({0.0: 0.505, 0.375: 0.507}, 0.5),                 # up first: 0.475 rounds to no level, 0.5 is the next
    ({0.0: 0.505, 0.375: 0.507, 0.5: 0.462}, 0.625),   # faster: on up from there
    ({0.0: 0.505, 0.375: 0.507, 0.5: 0.462, 0.625: 0.488}, None),  # both neighbours timed: settled
    ({0.0: 0.505, 0.375: 0.49, 0.5: 0.50}, 0.25),      # up was slower: down, 0.1 or more below
    ({0.0: 0.5, 0.9375: 0.4}, 1.0),                    # nothing 0.1 above: the farthest level there is
    ({0.0: 0.5, 1.0: 0.4}, 0.875),
    ({0.0: 0.1, 0.5: 0.4, 0.625: 0.41, 0.375: 0.42}, None),  # streamed whole the fastest: no share left near the best
    ({0.0: 0.9, 0.125: 0.5, 0.25: 0.4, 0.375: 0.3, 0.5: 0.2, 0.625: 0.1}, None),  # SEARCH_TRIALS spent
], ids=["up", "on-up", "settled", "down", "top-edge", "from-top", "whole-best", "spent"])
def test_the_split_searches_the_shares_next_to_the_fastest(tried, want):
    """SplitShare.next_share, by hand over 16 equal parameters: the level SEARCH_STEP (0.1)
    or more above the fastest share, then below, each once; None when both were timed or
    after SEARCH_TRIALS (4) beyond the first two. A fixed share is not searched."""
    ts = load("transit_split")
    share = ts.SplitShare()
    share.fixed = None
    assert share.next_share(dict(tried), SIXTEEN) == want
    share.fixed = 0.5
    assert share.next_share({0.0: 0.5, 0.375: 0.4}, SIXTEEN) is None


def test_the_split_keeps_the_fastest_share_it_timed_and_stays_exact(streamed, monkeypatch, capsys):
    """The search end to end on the CPU, its step times set by the parameters on the host
    (1: 6 s, 2: 5 s, 3: 3 s, 4: 4 s; streamed whole 10 s). The shares this model can take:
    4 / 69,004 of the offloaded bytes (the last bias), 0.058, 0.0725, 1.0. From 2 parameters
    (the model's share, asked again, the same) it times 1.0 (up: 4 s), then 0.0725 (below
    1.0: 3 s), then the last bias alone (below 0.0725: 6 s), and keeps 3 parameters; every
    state moving sides on the way, the run equals torch's fused step bit for bit."""
    import types

    import torch

    from tests.test_adapter_streamed import same, train

    th, ts = load("transit_host"), load("transit_split")
    share = Revising(0.06, 0.06)
    share.fixed = None
    share.next_share = types.MethodType(ts.SplitShare.next_share, share)
    host, drv = _split(th, ts, share, streamed, monkeypatch, whole=(4.0, 6.0))
    _clock(th, host, {1: 6.0, 2: 5.0, 3: 3.0, 4: 4.0}, monkeypatch)
    adopted = []
    real_adopt = host._adopt
    monkeypatch.setattr(host, "_adopt", lambda opt, **kw: adopted.append(kw.get("share")) or real_adopt(opt, **kw))
    make = lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1, fused=True)  # noqa: E731
    per = 1 + ts.REVISE_STEPS  # a plan's steps before the next is made
    steps = ts.LEARN_STEPS + 4 * per + 3
    ref = train(make, steps=steps, clip=0.05)
    got = train(make, drv, steps=steps, clip=0.05)
    same(got, ref)
    assert adopted == [None, 1.0, 0.072518, 5.8e-05, 0.072518]
    assert host.stats["tried"] == [[0.0, 10.0], [5.8e-05, 6.0], [0.058026, 5.0], [0.072518, 3.0], [1.0, 4.0]]
    assert (host.stats["host_params"], host.stats["stream_params"]) == (3, 1)
    assert host.stats["share"] == 0.073  # 0.072518, as the stats round it
    assert host.stats["steps"] == steps - ts.LEARN_STEPS and "faster" not in capsys.readouterr().err


def test_a_dtensors_state_goes_back_as_a_dtensor(host, gloo):
    """A state given back to an FSDP2 optimizer (a share revised down, a refusal) is a DTensor
    of its parameter's placement, as torch's step made it: the application's step reads it
    beside DTensor parameters."""
    import torch
    from torch.distributed.tensor import DTensor

    from tests.test_adapter_step import fsdp_mlp

    m = fsdp_mlp()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    for _ in range(2):
        m(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    host._give_back(opt, host.plans[opt])  # as pre_step does at a refusal, which it then says (off)
    host._off(opt, "a refusal")
    for p in m.parameters():
        st = opt.state[p]
        assert isinstance(st["exp_avg"], DTensor) and st["exp_avg"].placements == p.placements
        assert st["exp_avg"].shape == p.shape and not isinstance(st["step"], DTensor)
    m(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()  # torch's own step, over DTensor parameters and the state given back
    assert int(opt.state[next(m.parameters())]["step"]) == 3


@pytest.mark.parametrize("text, share", [("0.4", 0.4), ("0", 0.0), ("1", 1.0), ("1.5", None), ("half", None)])
def test_a_fixed_share_replaces_the_splits_own(monkeypatch, capsys, text, share):
    """TRANSIT_HOST_SHARE, a fraction, is the share clipped or not (no calibration run);
    anything else is said once on stderr and the split's own share is used."""
    monkeypatch.setenv("TRANSIT_HOST_SHARE", text)
    s = load("transit_split").SplitShare()
    s.measured = (3e-9, 1e-9)
    err = capsys.readouterr().err
    if share is None:
        assert s(None, True) == pytest.approx(0.25) and s(None, False) == 1.0
        assert err.count("TRANSIT_HOST_SHARE") == 1 and f"{text!r}" in err
    else:
        assert s(None, True) == s(None, False) == share and err == ""


def test_the_split_shares_calibration_runs_no_step_hooks():
    """The share's CPU calibration steps an optimizer of the application's class: through
    its raw step, so no step hook sees it (the host step would adopt it and sitecustomize
    would count it as the job's first optimizer, its iterations the shim's)."""
    import torch
    from torch.optim import optimizer as o

    seen = []
    hooks = [o.register_optimizer_step_pre_hook(lambda opt, a, k: seen.append(opt)),
             o.register_optimizer_step_post_hook(lambda opt, a, k: seen.append(opt))]
    s = load("transit_split").SplitShare()
    s.CALIBRATE_ELEMS = 1 << 16
    try:
        share = s(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(4))]), True)
    finally:
        for h in hooks:
            h.remove()
    assert seen == [] and s.measured[0] > 0 and share == 1.0  # no GPU: no link to share with


def test_the_split_shares_calibration_steps_with_the_workers_threads(monkeypatch):
    """The CPU's rate is measured as the worker steps: with one intra-op thread less than the
    application's (the core its thread keeps), which is given back afterwards."""
    import torch

    th = load("transit_split")
    seen = []
    real = th.transit_step.raw_step

    def counting(opt):
        step = real(opt)
        return lambda o: (seen.append(torch.get_num_threads()), step(o))

    before = torch.get_num_threads()
    if before < 2:
        torch.set_num_threads(2)
    try:
        threads = torch.get_num_threads()
        monkeypatch.setattr(th.transit_step, "raw_step", counting)
        s = th.SplitShare()
        s.CALIBRATE_ELEMS = 1 << 12
        s(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(4))]), True)
        assert seen == [threads - 1, threads - 1] and torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)


def test_a_failed_calibration_gives_the_threads_back(monkeypatch):
    """A calibration step that raises (the job goes on: pre_step catches it) still gives the
    application its intra-op threads back."""
    import torch

    th = load("transit_split")
    real, calls = th.transit_step.raw_step, []

    def failing(opt):
        step = real(opt)

        def once_then_fail(o):
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("boom")
            return step(o)
        return once_then_fail

    before = torch.get_num_threads()
    torch.set_num_threads(max(2, before))
    try:
        threads = torch.get_num_threads()
        monkeypatch.setattr(th.transit_step, "raw_step", failing)
        s = th.SplitShare()
        s.CALIBRATE_ELEMS = 1 << 12
        with pytest.raises(RuntimeError, match="boom"):
            s(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(4))]), True)
        assert len(calls) == 2 and torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)


class _Event:
    def __init__(self, name):
        self.name = name


class _Stream:
    """A CUDA stream as the rings use it, recording what each stream is told to wait for."""

    def __init__(self, name, log):
        self.name, self.log, self.n = name, log, 0

    def record_event(self):
        self.n += 1
        return _Event(f"{self.name}{self.n}")

    def wait_event(self, ev):
        self.log.append((self.name, ev.name))


@pytest.fixture
def streams(monkeypatch):
    """Recorded streams in place of CUDA's (the copies themselves run on the CPU, in turn)."""
    import contextlib

    import torch

    log = []
    compute = _Stream("compute", log)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda dev=None: compute)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    return log, lambda name: _Stream(name, log)


def test_the_down_ring_reuses_a_piece_only_after_its_copy_down(streams):
    """A ring of 4 pieces of 512 B and a 4096 B gradient (8 pieces): piece k+4 is written on
    the compute stream only after the copy stream's copy of piece k (its event down k), and
    each copy down waits for its piece's write on the compute stream."""
    import torch

    log, stream = streams
    th = load("transit_host")
    ring = th._DownRing(torch.zeros(2048, dtype=torch.uint8))
    src, dst = torch.arange(1024, dtype=torch.float32), torch.empty(1024)
    done = ring.send(dst, src, stream("down"))
    assert torch.equal(dst, src) and done.name == "down8"
    assert [ev for who, ev in log if who == "compute"] == ["down1", "down2", "down3", "down4"]
    assert [ev for who, ev in log if who == "down"] == [f"compute{i}" for i in range(1, 9)]
    # each reuse waits before the write that reuses the piece: down k before compute's event k + 4
    order = [ev for _, ev in log]
    assert all(order.index(f"down{k}") < order.index(f"compute{k + 4}") for k in range(1, 5))


def test_the_up_ring_reuses_a_piece_only_after_its_device_copy(streams):
    """The same ring up: piece k+4 crosses (the copy stream) only after the high-priority
    stream's device copy out of piece k, and each device copy waits for its piece's crossing."""
    import torch

    log, stream = streams
    th = load("transit_host")
    ring = th._UpRing(torch.zeros(2048, dtype=torch.uint8))
    src, dst = torch.arange(1024, dtype=torch.float32), torch.empty(1024)
    done = ring.send(dst, src, stream("across"), stream("dev"))
    assert torch.equal(dst, src) and done.name == "dev8"
    assert [ev for who, ev in log if who == "across"] == ["dev1", "dev2", "dev3", "dev4"]
    assert [ev for who, ev in log if who == "dev"] == [f"across{i}" for i in range(1, 9)]
    order = [ev for _, ev in log]
    assert all(order.index(f"dev{k}") < order.index(f"across{k + 4}") for k in range(1, 5))
