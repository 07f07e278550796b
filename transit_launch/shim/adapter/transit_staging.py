"""The overlapped step's state staging (TRANSIT_OVERLAP_STEP=staged; an experiment, measured
slower than the plain overlap: bench/RESULTS.md), loaded by transit_overlap.py.

An early update that reads its AdamW state zero-copy holds SMs while it waits on PCIe: beside
backward's kernels on an H200 it slowed them 1.55x and hid 0.024 s of its 0.206 s
(bench/state_paths.py). Copies between the GPU and *pinned* host memory run on the copy
engines instead: 49.9 GB/s each way, 1.03x, 0.162 s of 0.172 s hidden. Managed memory, where
the shim puts cold data, does not get that path (26 GB/s through torch's copy and through
cudaMemcpyBatchAsync asking for the copy engines, and 1.89x). So here:

- home: after an adopted optimizer's step, each of its parameter-shaped state tensors (exp_avg,
  exp_avg_sq, momentum_buffer, ...) on a GPU moves to pinned host memory, in place: the tensor
  object (a DTensor's local tensor under FSDP2) keeps its device, shape and values, and its
  storage becomes pinned host memory that kernels reach over PCIe, as advise's managed memory
  was. So the application's own step, state_dict() and checkpoints work unchanged. The old
  storage is kept, never returned to PyTorch's cache: the shim placed it on the host as cold
  data, and a hot tensor carved from it would be served zero-copy.
- stage: an early update copies its state into GPU buffers on one stream (host to device),
  runs torch's own step on them on a second, and copies them home on a third (device to
  host). The buffers come from the compute stream's cache, which backward is freeing, so they
  add no reserved memory when it has room; at most STAGE_LIMIT bytes (TRANSIT_OVERLAP_INFLIGHT)
  are in flight.

Bit-identical: the update is torch's step function on the same values (exact copies), only
at other addresses; every verified kernel computes each element from its own inputs alone.
"""

import atexit
import collections
import os
import sys
import time
import weakref

INFLIGHT_ENV = "TRANSIT_OVERLAP_INFLIGHT"  # transit_launch/rules.py ENV["OVERLAP_INFLIGHT"]; a test keeps them equal
STAGE_LIMIT = 1 << 30     # default bytes of state staged at once (the CPU waits for the oldest beyond it)


def _storage_tensor(t):
    """The tensor that owns a state's storage: a DTensor's local tensor (to_local() is a
    view: moving its storage would not move the DTensor's), else t."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def _nbytes(t):
    return t.numel() * t.element_size()


def _wrap_like(state, buf):
    """buf as the optimizer expects its state: a DTensor like `state` when it is one."""
    if not hasattr(state, "_local_tensor"):
        return buf
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(buf, device_mesh=state.device_mesh, placements=state.placements, run_check=False,
                              shape=state.shape, stride=state.stride())


class _CudaView:
    """Pinned host memory presented to torch as CUDA memory (__cuda_array_interface__);
    the tensor made from it keeps this object, and so the pinned tensor, alive."""

    def __init__(self, host):
        self.host = host
        self.__cuda_array_interface__ = {"shape": (host.numel(),), "typestr": "|u1",
                                         "data": (host.data_ptr(), False), "version": 3}


def _limit():
    """TRANSIT_OVERLAP_INFLIGHT in bytes; a value that is not a positive integer is said in one
    line and the default used (the job goes on)."""
    raw = os.environ.get(INFLIGHT_ENV, "")
    if not raw:
        return STAGE_LIMIT
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        print(f"transit adapter: {INFLIGHT_ENV}={raw!r} is not a positive number of bytes; using {STAGE_LIMIT}",
              file=sys.stderr, flush=True)
        return STAGE_LIMIT
    return value


class Staging:
    def __init__(self):
        self.limit = _limit()
        self.largest = self.limit // 2  # a parameter with more state bytes is updated in place (zero-copy)
        self.batch = self.limit // 4    # state bytes of one staged step (several parameters)
        self.wrappers = {}              # id(DTensor state) -> (state, its wrapper for staged buffers)
        self.cpu_s = self.wait_s = 0.0  # the CPU's time in staged updates, and in the throttle's waits
        atexit.register(self.report)
        self.homes = {}      # data_ptr of a homed state -> its pinned host (CPU) view
        self.owner = {}      # data_ptr of a homed state -> id() of its optimizer
        # the storages the states left, for the life of the job (see the module docstring; a
        # load_state_dict that replaces the states adds one more copy of them on the host)
        self.kept = []       # (id() of the optimizer, storage)
        self.finalizers = {}  # id() of an optimizer with homes -> its weakref.finalize
        self.streams = {}    # device -> (in, update, out) streams
        self.inflight = collections.deque()  # (event after the out-copies, bytes)
        self.staged = 0      # early updates staged (tests, logs)

    # --- home ---------------------------------------------------------------------------

    def staged_keys(self, state, p):
        """The parameter-shaped floating-point state tensors (never the step count, also for a
        0-dim parameter)."""
        import torch

        return [k for k, v in state.items() if k != "step" and torch.is_tensor(v) and v.shape == p.shape
                and v.dtype.is_floating_point]

    def home(self, opt):
        """After a step: the GPU states of `opt` not yet in pinned host memory go there;
        the bytes moved."""
        import torch

        moved, live = 0, set()
        if id(opt) not in self.finalizers:  # a discarded optimizer's homes go with it
            self.finalizers[id(opt)] = weakref.finalize(opt, self._forget, id(opt))
        with torch.no_grad():
            for group in opt.param_groups:
                for p in group["params"]:
                    state = opt.state.get(p, {})
                    for k in self.staged_keys(state, p):
                        t = _storage_tensor(state[k])
                        if self._homeable(t) and t.data_ptr() not in self.homes:
                            self._home(t, opt)
                            moved += _nbytes(t)
                        live.add(t.data_ptr())
        if moved:  # states replaced (load_state_dict): their pinned homes and wrappers go
            self._drop({q for q, o in self.owner.items() if o == id(opt) and q not in live})
        return moved

    def _drop(self, stale):
        for q in stale:
            del self.homes[q], self.owner[q]
        self.wrappers = {k: w for k, w in self.wrappers.items() if _storage_tensor(w[0]).data_ptr() not in stale}

    def _forget(self, oid):
        """An optimizer was freed: its homes, wrappers and the storages its states left go too
        (its managed state would have gone back to PyTorch's cache as well)."""
        self._drop({q for q, o in self.owner.items() if o == oid})
        self.kept = [(o, st) for o, st in self.kept if o != oid]
        self.finalizers.pop(oid, None)

    @staticmethod
    def _homeable(t):
        return t.is_cuda and t.is_contiguous()

    def _home(self, t, opt):
        import torch

        host = torch.empty(_nbytes(t), dtype=torch.uint8, pin_memory=True)
        view = torch.as_tensor(_CudaView(host)).view(t.dtype).view(t.shape)
        if view.device != t.device or view.data_ptr() != host.data_ptr():
            raise RuntimeError(f"pinned memory seen as {view.device}, the state is on {t.device}")
        cpu = host.view(t.dtype).view(t.shape)
        cpu.copy_(t)  # a device-to-host copy: waits for the step that wrote t
        self.kept.append((id(opt), t.untyped_storage()))
        t.set_(view)
        self.homes[t.data_ptr()] = cpu
        self.owner[t.data_ptr()] = id(opt)

    # --- stage ----------------------------------------------------------------------------

    def stageable(self, opt, p):
        """The state keys an early update of p can stage, or None (update it in place)."""
        state = opt.state.get(p, {})
        keys = self.staged_keys(state, p)
        if not keys:
            return None
        ts = [_storage_tensor(state[k]) for k in keys]
        dev = _storage_tensor(p).device
        if any(t.device != dev for t in ts):
            return None
        if dev.type == "cuda" and (any(t.data_ptr() not in self.homes for t in ts) or
                                   sum(map(_nbytes, ts)) > self.largest):
            return None
        return keys

    def nbytes(self, opt, p, keys):
        """The state bytes a staged update of p moves each way."""
        return sum(_nbytes(_storage_tensor(opt.state[p][k])) for k in keys)

    def update(self, opt, items, step, ready=()):
        """Stage the state of the parameters in items [(param, keys)], run step(swaps) (swaps:
        for each parameter the state entries to use) after the events `ready` (their
        gradients), copy the state home."""
        t0 = time.perf_counter()
        try:
            self._update(opt, items, step, ready)
        finally:
            self.cpu_s += time.perf_counter() - t0

    def _update(self, opt, items, step, ready):
        import torch

        homes = [(p, k, opt.state[p][k], _storage_tensor(opt.state[p][k])) for p, keys in items for k in keys]
        first = homes[0][3]
        if not first.is_cuda:  # CPU (tests): the same swap through plain copies
            bufs = [t.clone() for _, _, _, t in homes]
            try:
                step(self._swaps(homes, bufs))
            finally:
                self._unwrap(homes)
            for (_, _, _, t), b in zip(homes, bufs):
                t.copy_(b)
            self.staged += len(items)
            return
        dev = first.device
        s_in, s_upd, s_out = self._streams(dev)
        size = sum(_nbytes(t) for _, _, _, t in homes)
        self._throttle(size)
        compute = torch.cuda.default_stream(dev)
        with torch.cuda.stream(compute):  # from the compute stream's cache (see the docstring)
            bufs = [torch.empty_like(t) for _, _, _, t in homes]
        for b in bufs:  # first: whatever fails below, the cache reuses them only after these streams
            for s in (s_in, s_upd, s_out):
                b.record_stream(s)
        s_in.wait_stream(compute)  # the buffers' memory is free once the compute stream's earlier kernels are done
        with torch.cuda.stream(s_in):
            for (_, _, _, t), b in zip(homes, bufs):
                b.copy_(self.homes[t.data_ptr()], non_blocking=True)
        s_upd.wait_stream(s_in)
        for ev in ready:  # each gradient, on the stream that made it
            s_upd.wait_event(ev)
        try:
            with torch.cuda.stream(s_upd):
                step(self._swaps(homes, bufs))
        finally:
            self._unwrap(homes)
        s_out.wait_stream(s_upd)
        with torch.cuda.stream(s_out):
            for (_, _, _, t), b in zip(homes, bufs):
                self.homes[t.data_ptr()].copy_(b, non_blocking=True)
        done = torch.cuda.Event()
        done.record(s_out)
        self.inflight.append((done, size))
        self.staged += len(items)

    def _swaps(self, homes, bufs):
        """{param: {key: the staged buffer as the optimizer expects its state}}. A DTensor state
        gets a DTensor wrapper made once per state tensor, whose local tensor is pointed at the
        buffer: DTensor.from_local for every update cost the CPU more than the update."""
        swaps = {}
        for (p, k, state, _), buf in zip(homes, bufs):
            if hasattr(state, "_local_tensor"):
                w = self.wrappers.get(id(state))
                if w is None or w[0] is not state:
                    w = self.wrappers[id(state)] = (state, _wrap_like(state, buf))
                w[1]._local_tensor = buf
                buf = w[1]
            swaps.setdefault(p, {})[k] = buf
        return swaps

    def _unwrap(self, homes):
        """The wrappers let go of the buffers (which then return to the cache)."""
        for _, _, state, t in homes:
            w = self.wrappers.get(id(state))
            if w is not None:
                w[1]._local_tensor = t

    def _streams(self, dev):
        import torch

        if dev not in self.streams:
            self.streams[dev] = tuple(torch.cuda.Stream(device=dev) for _ in range(3))
        return self.streams[dev]

    def _throttle(self, size):
        """At most `limit` bytes in flight: the buffers go back to the compute stream's cache
        only when their copies are done, and the CPU may be far ahead of the GPU."""
        while self.inflight and (self.inflight[0][0].query() or
                                 sum(b for _, b in self.inflight) + size > self.limit):
            t0 = time.perf_counter()
            self.inflight.popleft()[0].synchronize()
            self.wait_s += time.perf_counter() - t0

    def report(self):
        if self.staged and self.streams:  # staged on a GPU (the CPU path is for tests)
            print(f"transit adapter: {self.staged} staged early updates; the CPU spent {self.cpu_s:.3f} s in them, "
                  f"{self.wait_s:.3f} s of it waiting for copies (at most {self.limit / 2**20:.0f} MiB in flight)",
                  file=sys.stderr, flush=True)

    def wait(self, dev):
        """The step's stream waits for every staged update and copy home (pre_step)."""
        import torch

        cur = torch.cuda.current_stream(dev)
        for s in self.streams.get(dev, ()):
            cur.wait_stream(s)
