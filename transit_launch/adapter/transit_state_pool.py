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
"""

import os
import sys
import weakref

POOL_ENV = "TRANSIT_STATE_POOL"  # transit_launch/rules.py ENV["STATE_POOL"]; a test keeps them equal


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
