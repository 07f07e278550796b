"""The optimizer state gets memory of its own: each optimizer's first step (where torch.optim
creates its state lazily) allocates from a private pool of PyTorch's caching allocator.

Why: otherwise the new state is carved from the blocks that the step's activations just
freed, so the next step's activations find the cache short and grow it by new segments.
Under a GPU budget those segments do not fit (the budget was sized for the working set
without the state), and the shim can only serve them zero-copy from the host until the
next boundary re-ranks: the second step ran many times slower than a steady one. In a pool
of its own the state comes in segments the shim sees as they are made, placed on the GPU
while the budget has room and on the host otherwise, where advise wants cold data; the
activations keep their blocks.

Precisely what is routed: the optimizer's own `_init_group` (torch's Adam, AdamW and SGD
create their state there, and allocate nothing else there) during the optimizer's first
step, through torch.cuda.use_mem_pool, which routes the calling thread only. The step's
temporaries stay in the default pool, so the private one holds state and nothing idle.
An optimizer without `_init_group` is left as it is. TRANSIT_STATE_POOL=0 turns it off.

The same calls are marked for the shim as optimizer state (transit_state_alloc): under
advise, a segment that does not fit what the budget has left is then made in pinned host
memory, read zero-copy at once, instead of managed memory populated by the GPU's faults
and pushed out at the next boundary.

Writing that pinned memory's pages and registering it is most of its cost, on the first
step's critical path. StateExpect tells the shim beforehand which segments the first step's
state will be allocated in (transit_state_segments: PyTorch's allocator, predicted by
allocator_segments): the shim makes them ready in the background during the first forward and
backward (shim/prefill.c), and the state takes them ready.
"""

import os
import sys
import weakref

import transit_rules

POOL_ENV = transit_rules.ENV["STATE_POOL"]


def enabled():
    return os.environ.get(POOL_ENV, "1") != "0"


def _cuda_device(opt):
    for group in opt.param_groups:
        for p in group["params"]:
            if getattr(p, "is_cuda", False):
                return p.device
    return None


class StatePool:
    """Global optimizer step pre/post hooks: at an optimizer's first step its `_init_group`
    runs inside its device's private pool."""

    def __init__(self, torch_cuda=None, mark=None):
        self.cuda = torch_cuda  # torch.cuda, or a stand-in (tests)
        self.mark = mark        # mark(on): the shim's transit_state_alloc, or None
        self.seen = weakref.WeakSet()  # optimizers whose first step ended
        self.pools = {}   # device -> MemPool: kept alive while the state lives in it
        self.routing = weakref.WeakSet()  # optimizers whose _init_group is wrapped now
        self.routed = 0   # first steps routed to a pool (tests, logs)
        self.failed = False

    def _torch_cuda(self):
        if self.cuda is None:
            import torch
            self.cuda = torch.cuda
        return self.cuda

    def pre_step(self, opt, args, kwargs):
        if self.failed:
            return
        try:
            if opt in self.routing:  # its first step raised before the post hook
                self._restore(opt)
            if opt in self.seen:
                return
            device = _cuda_device(opt)
            cuda = self._torch_cuda()
            init = getattr(opt, "_init_group", None)
            if device is None or init is None or "_init_group" in vars(opt) or not hasattr(cuda, "use_mem_pool"):
                return
            pool = self.pools.get(device)
            if pool is None:
                pool = self.pools[device] = cuda.MemPool()

            mark = self.mark

            def init_group(*args, **kwargs):
                with cuda.use_mem_pool(pool, device=device):
                    if mark is None:
                        return init(*args, **kwargs)
                    mark(True)
                    try:
                        return init(*args, **kwargs)
                    finally:
                        mark(False)
            opt._init_group = init_group  # an instance attribute: the class's method is untouched
            self.routing.add(opt)
            self.routed += 1
        except Exception as e:  # never the reason a job dies
            self.failed = True
            print(f"transit adapter: the optimizer state's own pool is off after an error: {e!r}", file=sys.stderr)

    def post_step(self, opt, args, kwargs):
        self.seen.add(opt)  # a first step that raised is tried again at the next one
        if opt in self.routing:
            self._restore(opt)

    def _restore(self, opt):
        self.routing.discard(opt)
        vars(opt).pop("_init_group", None)

    def install(self, optimizer_module):
        optimizer_module.register_optimizer_step_pre_hook(self.pre_step)
        optimizer_module.register_optimizer_step_post_hook(self.post_step)


# PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, native backend) under
# the shim's PYTORCH_ALLOC_CONF (rules.ALLOC_CONF: no expandable segments; nor power-of-two
# rounding nor max_split_size, which nothing sets): requests are rounded to MIN_BLOCK; those of
# at most SMALL_SIZE come from SMALL_BUFFER segments, those below MIN_LARGE_ALLOC from
# LARGE_BUFFER segments, larger ones from a segment of their own rounded to ROUND_LARGE.
MIN_BLOCK, SMALL_SIZE, SMALL_BUFFER = 512, 1 << 20, 2 << 20
MIN_LARGE_ALLOC, LARGE_BUFFER, ROUND_LARGE = 10 << 20, 20 << 20, 2 << 20


def allocator_segments(requests):
    """The segments (cudaMalloc sizes, in order) the caching allocator makes for these requests
    in a fresh private pool where nothing is freed (the first step's state pool): each request
    takes the smallest free block that fits (a segment's remainder after a split), else a new
    segment; a block is split where the remainder is at least MIN_BLOCK (small) or more than
    SMALL_SIZE (large)."""
    free = {True: [], False: []}  # the small and the large pool's free blocks
    segments = []
    for n in requests:
        if n <= 0:
            continue  # torch allocates nothing for an empty tensor
        size = max(MIN_BLOCK, -(-n // MIN_BLOCK) * MIN_BLOCK)
        small = size <= SMALL_SIZE
        fits = [b for b in free[small] if b >= size]
        if fits:
            block = min(fits)
            free[small].remove(block)
        else:
            block = SMALL_BUFFER if small else LARGE_BUFFER if size < MIN_LARGE_ALLOC else -(-size // ROUND_LARGE) * ROUND_LARGE
            segments.append(block)
        rest = block - size
        if (rest >= MIN_BLOCK) if small else (rest > SMALL_SIZE):
            free[small].append(rest)
    return segments


def state_requests(opt, counted=lambda t: t.is_cuda):
    """The device allocations, in order, that an Adam's or AdamW's _init_group makes at its
    first step for the parameters `counted` takes (the GPU's; the state of a CPU parameter is not
    the shim's): per parameter that takes a gradient, its step count where it lives on the device
    (fused or capturable), then exp_avg and exp_avg_sq (and max_exp_avg_sq with amsgrad), each
    the size of its local shard (a DTensor's to_local(), FSDP2). [] for any other optimizer: SGD
    makes its momentum outside _init_group, from the gradient, and others are not known."""
    import torch

    if type(opt) not in (torch.optim.Adam, torch.optim.AdamW):
        return []
    out = []
    for group in opt.param_groups:
        copies = 3 if group.get("amsgrad") else 2
        on_device = group.get("fused") or group.get("capturable")
        for p in group["params"]:
            local = p.to_local() if hasattr(p, "to_local") else p
            if p.requires_grad and counted(local):
                n = local.numel() * local.element_size()
                out += ([4] if on_device else []) + [n] * copies  # (a 0-d float32, or float64: one block)
    return out


class StateExpect:
    """Tells the shim once which segments the first step's state will be allocated in
    (send(sizes): the shim makes host memory for them ready, written and registered, during the
    first forward and backward), and send([]) when that step is over.

    All the optimizers made before the first step count (TorchTitan makes one per model part,
    inside a container that is itself an Optimizer, and has no state of its own), in the order
    made, which is the order a container steps them: they share the state pool, so their
    requests are one stream for allocator_segments. They are collected from the first one's
    construction (watch wraps Optimizer.__init__) to the first module forward call (a one-shot
    global forward pre-hook), where the list is sent. By then every optimizer of the step
    exists, and the forward and backward that follow are the time the shim has to make the
    memory. The first step is over when every optimizer counted has stepped once (a container
    steps them in turn, so the adapter's first boundary, after the first of them, is too early),
    or when one of them steps a second time (one that never steps does not hold the memory for long)."""

    def __init__(self, send, counted=lambda t: t.is_cuda):
        self.send = send        # the shim's transit_state_segments, or a stand-in (tests)
        self.counted = counted  # which parameters' state the shim makes (tests: the CPU's too)
        self.made = []          # weak references to the optimizers made before the first forward
        self.waiting = weakref.WeakSet()  # counted optimizers whose first step has not ended
        self.stepped = weakref.WeakSet()
        self.handle = None
        self.restore = None
        self.sent = self.ended = False

    def watch(self, cls, first):
        """The first optimizer (first, of class cls's tree) was made: collect it and those made
        after it until the first forward."""
        if self.handle is not None or self.sent:
            return
        from torch.nn.modules import module

        self.made.append(weakref.ref(first))
        init, hooks = cls.__init__, self

        def collecting_init(opt, *args, **kwargs):
            out = init(opt, *args, **kwargs)
            if not hooks.sent:
                hooks.made.append(weakref.ref(opt))
            return out
        cls.__init__ = collecting_init

        def restore():  # unless something wrapped it after us: then ours stays, a pass-through
            if cls.__init__ is collecting_init:
                cls.__init__ = init
        self.restore = restore
        self.handle = module.register_module_forward_pre_hook(self._first_forward)

    def _first_forward(self, m, args):
        self.sent = True
        try:
            self.handle.remove()
            self.restore()
            requests = []
            for ref in self.made:
                opt = ref()
                mine = state_requests(opt, self.counted) if opt is not None else []
                if mine:
                    self.waiting.add(opt)
                    requests += mine
            self.made = []
            segments = allocator_segments(requests)
            if segments:
                self.send(segments)
            else:
                self.ended = True
        except Exception as e:  # never the reason a job dies
            self.ended = True
            print(f"transit adapter: the optimizer state's segments not told to the shim: {e!r}", file=sys.stderr)

    def post_step(self, opt):
        """An optimizer step ended (the adapter's post hook)."""
        if not self.sent or self.ended:
            return
        try:
            again = opt in self.stepped
            self.stepped.add(opt)
            self.waiting.discard(opt)
            if again or not self.waiting:
                self.ended = True
                self.send([])
        except Exception as e:
            self.ended = True
            print(f"transit adapter: the optimizer state's prepared memory not given back: {e!r}", file=sys.stderr)
