"""transit-launch's framework hint adapter, loaded by Python at start-up because the
launcher puts this directory on PYTHONPATH. The application is never changed.

When torch.optim is imported it registers torch's global optimizer-step post hook; after
each step it reports the optimizer states (and fp32 parameters, the master weights under
FSDP2 mixed precision; those also when the first optimizer is made) to libtransit.so as
cold ranges and marks the iteration boundary. Each optimizer's first step makes its state
in a memory pool of its own (transit_state_pool.py).
Under advise the optimizer step is streamed through the copy engines (transit_streamed.py;
TRANSIT_OVERLAP_STEP=0 turns it off, =host runs a share of it on the host instead,
transit_host.py; transit_step.py says the mode). A failure here is said in one line and
turns off what failed (_Guard); the job runs on. A site's own sitecustomize further down
sys.path still runs."""

import atexit
import functools
import importlib.machinery
import importlib.util
import os
import sys

import transit_rules

_HERE = os.path.dirname(os.path.abspath(__file__))
ADAPTER_ENV = transit_rules.ENV["ADAPTER"]  # 0 installs nothing
# TRANSIT_OVERLAP_STEP modes whose step copies the state from pinned host homes
PINNED_STATE_MODES = transit_rules.RING_OVERLAP_MODES
_ON = os.environ.get(ADAPTER_ENV, "1") != "0"


class _Guard:
    """The adapter's one error path: an exception inside `with _Guard(what) as g` is said in
    one line ("transit adapter: what: error") and goes no further, so the adapter is never
    the reason a job dies; g.failed tells the caller to drop what did not come up. As a
    decorator, the function returns None after such an exception."""

    def __init__(self, what):
        self.what, self.failed = what, False

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if not isinstance(error, Exception):  # none, or KeyboardInterrupt/SystemExit: not ours to stop
            return False
        self.failed = True
        print(f"transit adapter: {self.what}: {error!r}", file=sys.stderr, flush=True)
        return True

    def __call__(self, fn):
        @functools.wraps(fn)
        def guarded(*args, **kwargs):
            with _Guard(self.what):
                return fn(*args, **kwargs)
            return None
        return guarded


# The adapter's modules are imported flat, here, while Python's site imports this module: the
# job's script directory is not on sys.path yet (Python adds it after site), so a module
# planted there under one of these names is not the one loaded, and every later import of
# the name finds the adapter's in sys.modules. No adapter module imports another later.
with _Guard("not installed") as _imported:
    if _ON:
        import transit_api
        import transit_host
        import transit_sparse
        import transit_split
        import transit_staging
        import transit_state_pool
        import transit_step
        import transit_streamed
_ON = _ON and not _imported.failed


def _state_room(api):
    """room(device): the bytes of optimizer state the GPU budget holds beside what the job
    has reserved at its first step (the shim's budget, from its stats), or None without one."""
    import json
    import tempfile

    def room(device):
        import torch

        if device.type != "cuda":
            return None
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "stats.json")
            if api.write_stats(path) != 0:
                return None
            with open(path) as f:
                budget = json.load(f).get("budget_bytes") or 0
        return max(0, budget - torch.cuda.memory_reserved(device)) if budget else None
    return room


def _chain_next_sitecustomize():
    rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec and spec.loader and spec.origin != __file__:
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)


class _Hooks:
    def __init__(self, api):
        self.api = api
        self.reported = {}
        self.first = None
        self.failed = False
        self.sparse = _sparse_reads(api)  # which master weights the forward reads in part
        self.sparse_ids = set()
        mode = self.mode = _step_mode(api)  # asked once: a bad value is said once
        self.pool = _state_pool(api, mode)
        self.expect = _state_expect(api, self.pool)
        self.overlap = _overlap(api, self, mode)

    @_Guard("counters not sent to the shim's report")
    def send_stats(self):
        """At the job's exit, before the shim writes its report: the step's counters go into
        it as its "adapter" object (transit-launch report shows them)."""
        counters = getattr(self.overlap, "counters", None)
        self.api.adapter_stats({"mode": self.mode or "0", **(counters() if counters else {})})

    def ours(self):
        """The adapter's own step hooks (not foreign to the step driver's checks)."""
        return [self.post_step, *([self.pool.pre_step, self.pool.post_step] if self.pool else [])]

    def register(self, optimizer_module):
        """torch.optim.optimizer is loaded: the global step hooks go in."""
        if self.pool:
            with _Guard("the optimizer state's own pool not installed") as g:
                self.pool.install(optimizer_module)
            self.pool = None if g.failed else self.pool
        optimizer_module.register_optimizer_step_post_hook(self.post_step)
        self._attach_at_first_optimizer(optimizer_module.Optimizer)
        if self.overlap:
            with _Guard("step overlap not installed") as g:
                self.overlap.install()
            self.overlap = None if g.failed else self.overlap

    def _attach_at_first_optimizer(self, cls):
        """When the first optimizer is made, the shim learns that this job's iterations come
        from here (transit_adapter_attach) and stops guessing them from kernel sequences:
        with gradient accumulation it guessed one before the first step and began a warm-up
        recording that kept CUPTI from torch.profiler for good. Not at import: `import torch`
        imports torch.optim, also in jobs that never step, whose iterations only the shim's
        guess can find. Optimizer.__init__ is wrapped until its first call, then restored
        (unless something wrapped it after us: then ours stays, a pass-through)."""
        init = cls.__init__
        api = self.api
        hooks = self
        attached = []

        @functools.wraps(init)
        def first_init(opt, *args, **kwargs):
            first = not attached
            if first:
                attached.append(True)
                if cls.__init__ is first_init:
                    cls.__init__ = init
                with _Guard("could not attach to the shim"):
                    api.adapter_attach()
            out = init(opt, *args, **kwargs)
            if first:
                # the master weights are known before the first forward: the first step's
                # new segments can take their room (advise's ranking) instead of the host's
                with _Guard("could not report the master weights"):
                    hooks._hint_masters(opt)
                    if hooks.sparse:
                        hooks.sparse.start()  # until the first step: which of them are read in part
                if hooks.expect:
                    with _Guard("the optimizer state's size not watched") as g:
                        hooks.expect.watch(cls, opt)  # the state's size, sent at the first forward
                    hooks.expect = None if g.failed else hooks.expect
            return out
        cls.__init__ = first_init

    def _hint_masters(self, opt):
        """fp32 parameters on the GPU: the master weights under mixed precision."""
        import torch

        for group in opt.param_groups:
            for p in group["params"]:
                # an attribute read, not to_local(): an op the host step's gate would hold until the
                # parameter in flight is sent up (after every step, it held the job for the CPU step)
                local = transit_staging.storage_tensor(p)
                if local.is_cuda and local.dtype == torch.float32:
                    self._hint(local, self._master_kind(p))

    def _master_kind(self, p):
        """SPARSE for a table the forward reads only in part (transit_sparse.py), else MASTER."""
        return self.api.SPARSE if id(p) in self.sparse_ids else self.api.MASTER

    def post_step(self, opt, args, kwargs):
        if self.expect:
            self.expect.post_step(opt)  # its own errors are caught and said there
        if self.failed:
            return
        with _Guard("disabled after an error") as g:  # the hints stop; the job runs on
            self._report_step(opt)
        self.failed = g.failed

    def _report_step(self, opt):
        """The optimizer's states (and master weights) as hints; the iteration boundary."""
        import torch

        if self.first is None:
            self.first = opt
        if self.sparse and not self.sparse.done:
            self.sparse_ids = self.sparse.finish()
        for group in opt.param_groups:
            for p in group["params"]:
                for v in opt.state.get(p, {}).values():
                    if torch.is_tensor(v):
                        v = transit_staging.storage_tensor(v)
                        if v.is_cuda and v.numel() > 1:
                            self._hint(v, self.api.OPTIMIZER)
        self._hint_masters(opt)
        # One boundary per training step, also when several optimizers step in turn.
        if opt is self.first:
            self.api.iteration()

    def _hint(self, t, kind):
        ptr, size = t.data_ptr(), t.numel() * t.element_size()
        if self.reported.get(ptr) != (size, kind):
            self.reported[ptr] = (size, kind)
            self.api.hint(ptr, size, kind)


@_Guard("no sparse reads")
def _sparse_reads(api):
    """transit_sparse.SparseReads where the shim takes the SPARSE hint (API version 6); else None."""
    since = getattr(api, "since", None)
    return transit_sparse.SparseReads() if since is not None and since(6) else None


@_Guard("step overlap not available")
def _step_mode(api):
    """The optimizer step's mode (transit_step.mode: TRANSIT_OVERLAP_STEP, else the policy's
    default), retired settings said once; None when off or not to be had."""
    for line in transit_step.retired(os.environ):
        transit_step.say(line)
    return transit_step.mode(api.policy())


@_Guard("the optimizer state's own pool not available")
def _state_pool(api, mode):
    """The optimizer state's private pool (transit_state_pool.py, on unless
    TRANSIT_STATE_POOL=0), its allocations marked for the shim as state; else None."""
    # the state is marked for the shim (born in pinned host memory when over the budget) where
    # the step stages it through pinned homes anyway: pinning costs more than the GPU's first
    # touch of managed memory, so plain advise keeps managed state (bench/RESULTS.md)
    mark = api.state_alloc if mode in PINNED_STATE_MODES else None
    return transit_state_pool.StatePool(mark=mark) if transit_state_pool.enabled() else None


@_Guard("the optimizer state's segments not told to the shim")
def _state_expect(api, pool):
    """transit_state_pool.StateExpect where the state is marked for the shim (pool.mark, the
    PINNED_STATE_MODES): the shim makes the pinned state's memory ready before the first step; else None."""
    send = getattr(api, "state_segments", None)
    if pool is None or pool.mark is None or send is None:
        return None
    return transit_state_pool.StateExpect(send)


def _streamed(api, hooks):
    staging = transit_staging.Staging((api.device_alloc, api.device_free), api.host_state)
    return transit_streamed.StreamedStep(staging, ours=hooks.ours())


@_Guard("step overlap not available")
def _overlap(api, hooks, mode):
    """The step's driver for `mode` (_step_mode): the streamed step (transit_streamed.py) under
    "stream", the split (transit_split.py) under "host"; else None."""
    if mode == "stream":  # the step streamed through the copy engines (transit_streamed.py)
        return _streamed(api, hooks)
    if mode == "host":  # the update of a share of the state the budget cannot hold on the host, the rest
        # streamed (transit_split.py's Split)
        host = transit_host.HostStep(ours=hooks.ours(), room=_state_room(api), on_host=api.state_on_host,
                                     share=transit_split.SplitShare(),
                                     device_memory=(api.device_alloc, api.device_free))
        return transit_split.Split(host, _streamed(api, hooks))
    return None


class _OptimFinder:
    """Registers the hooks right after torch.optim.optimizer is executed."""

    def __init__(self, hooks):
        self.hooks = hooks

    def find_spec(self, name, path, target=None):
        if name != "torch.optim.optimizer":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        real_exec = spec.loader.exec_module
        hooks = self.hooks

        def exec_module(module):
            real_exec(module)
            with _Guard("cannot hook torch.optim"):
                hooks.register(module)

        spec.loader.exec_module = exec_module
        sys.meta_path.remove(self)
        return spec


def _install():
    if not _ON:
        return
    if not transit_api.active():
        return
    hooks = _Hooks(transit_api)
    atexit.register(hooks.send_stats)  # the shim writes its report after Python's exit handlers
    if "torch.optim.optimizer" in sys.modules:
        hooks.register(sys.modules["torch.optim.optimizer"])
    else:
        sys.meta_path.insert(0, _OptimFinder(hooks))


with _Guard("not installed"):
    _install()
with _Guard("the next sitecustomize failed"):
    _chain_next_sitecustomize()
