"""The streamed step's state homes and staging ring (transit_streamed.py), and plain device
memory out of the GPU budget (device_buffer, also the host step's bounce buffers,
transit_host.py).

A step that reads its AdamW state zero-copy holds SMs while it waits on PCIe; copies between
the GPU and *pinned* host memory run on the copy engines instead. Managed memory, where the
shim puts cold data, does not get that path (bench/LOG.md, "The state's paths across
PCIe, beside compute"). So here:

- home: after an optimizer's step, each of its parameter-shaped state tensors (exp_avg,
  exp_avg_sq, momentum_buffer, ...) on a GPU has a home in pinned host memory: under the shim
  the state it made in pinned host memory (shim/hoststate.c) is its own home, nothing is
  copied or kept, and the state the budget holds on the GPU stays there. Without the shim the
  state moves there in place: the tensor object (a DTensor's local tensor under FSDP2) keeps
  its device, shape and values, and its storage becomes pinned host memory that kernels reach
  over PCIe; the old storage is kept, never returned to PyTorch's cache. So the application's
  own step, state_dict() and checkpoints work unchanged.
- ring: the streamed step copies slices of the state into buffers carved in turn from one
  ring of plain device memory per GPU (transit_device_alloc: its bytes come out of the GPU
  budget). Not PyTorch's cache: under the shim that is managed memory, and copies into managed
  memory, even memory placed on the GPU, are served by the SMs and slow the kernels beside
  them, where plain device memory gets the copy engines (the same RESULTS section). A buffer
  is reused only after its copy home: the in-copy stream waits for that on the GPU.
  TRANSIT_OVERLAP_INFLIGHT sets the ring's bytes (STAGE_LIMIT).

Bit-identical: the update is torch's step function on the same values (exact copies), only
at other addresses; every verified kernel computes each element from its own inputs alone.
"""

import collections
import contextlib
import os
import sys
import threading
import weakref

import transit_rules

INFLIGHT_ENV = transit_rules.ENV["OVERLAP_INFLIGHT"]
# default bytes of the staging ring on each GPU. It comes out of the GPU budget, which every
# microbatch pays for with hot data served from the host: the size measured best for the staged
# step, retired (bench/LOG.md, "The staged step through a device ring"); the plan counts the
# same bytes
STAGE_LIMIT = transit_rules.STAGE_RING_BYTES
ALIGN = 512               # bytes: every buffer carved from the ring starts aligned for any dtype's kernels


def storage_tensor(t):
    """The tensor that owns a state's storage: a DTensor's local tensor (to_local() is a
    view: moving its storage would not move the DTensor's), else t."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def nbytes(t):
    return t.numel() * t.element_size()


def on_stream(stream):
    """torch.cuda.stream(stream), or nothing on the CPU (tests) where stream is None."""
    if stream is None:
        return contextlib.nullcontext()
    import torch

    return torch.cuda.stream(stream)


class _CudaView:
    """Pinned host memory presented to torch as CUDA memory (__cuda_array_interface__);
    the tensor made from it keeps this object, and so the pinned tensor, alive."""

    def __init__(self, host):
        self.host = host
        self.__cuda_array_interface__ = {"shape": (host.numel(),), "typestr": "|u1",
                                         "data": (host.data_ptr(), False), "version": 3}


class _DeviceView:
    """Plain device memory (the shim's transit_device_alloc) presented to torch."""

    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}


def device_buffer(device_memory, dev, nbytes, owner, what):
    """(a uint8 tensor of nbytes of plain device memory on dev, None) or (None, why not).
    device_memory: (alloc(nbytes) -> pointer or 0, free(pointer)), the shim's plain memory out
    of the GPU budget (transit_device_alloc), given back when `owner` is collected; None, or a
    CPU (tests): torch's allocator (without the shim its memory is plain too)."""
    import torch

    if device_memory is None or dev.type != "cuda":
        return torch.empty(nbytes, dtype=torch.uint8, device=dev), None
    with torch.cuda.device(dev):  # the shim allocates on the calling thread's device
        ptr = device_memory[0](nbytes)
    if not ptr:
        return None, (f"no room in the GPU budget for a {nbytes / 2**20:.0f} MiB {what}, "
                      "or a libtransit.so without device buffers (API version 2)")
    mem = torch.as_tensor(_DeviceView(ptr, nbytes), device=dev)
    if mem.data_ptr() != ptr:  # torch copied it (memory of another device): never stage through a copy
        device_memory[1](ptr)
        return None, f"the {what}'s memory is not on {dev}"
    held(owner, device_memory[1], ptr)
    return mem, None


_GIVE_BACK = {}  # address -> the finalizer that gives a device buffer of device_buffer's back


def held(owner, free, ptr):
    """free(ptr) when owner is collected, or before by give_back, once; at exit the process's
    end does it (copies may be in flight)."""
    def once():
        _GIVE_BACK.pop(ptr, None)
        free(ptr)
    _GIVE_BACK[ptr] = weakref.finalize(owner, once)
    _GIVE_BACK[ptr].atexit = False


def give_back(mem):
    """A buffer of device_buffer's back to the shim now rather than with its owner: its room in
    the GPU budget goes to what it displaced. The caller has waited for every copy through it.
    One of torch's (a CPU, no shim) is left to torch."""
    fin = _GIVE_BACK.get(mem.data_ptr())
    if fin is not None:
        fin()


def _tensor_at(addr, nbytes, dtype, shape, owner=None):
    """A CPU tensor over nbytes of memory at addr; owner, when given, lives as long as the
    tensor or any view of it (it rides on the buffer torch.frombuffer keeps)."""
    import ctypes

    import torch

    buf = (ctypes.c_uint8 * nbytes).from_address(addr)
    if owner is not None:
        buf.owner = owner
    return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).view(shape)


def _pinned_cpu_view(t):
    """A CPU tensor over the pinned host memory a CUDA tensor `t` lives in (same address,
    UVA): what the copy engines copy from and to. It does not own the memory; t's storage does."""
    return _tensor_at(t.data_ptr(), nbytes(t), t.dtype, t.shape)


HUGE = transit_rules.HUGE_PAGE_BYTES
_PROT_RW, _MAP_PRIVATE_ANON, _MADV_HUGEPAGE = 0x3, 0x22, 14  # Linux's, x86-64 and arm64 alike
_REGISTER_PORTABLE_MAPPED = 0x3  # cudaHostRegisterPortable | cudaHostRegisterMapped, as the shim registers


class _Pinned:
    """Host memory mapped for the adapter and registered with CUDA (pinned, and mapped so that
    kernels can reach it at the same address); unregistered, then unmapped, when the last
    tensor over it dies (pinned: _tensor_at's owner)."""

    def __init__(self, nbytes, register, unregister):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                                   ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        huge = nbytes >= HUGE
        align = HUGE if huge else 4096
        self.len = -(-nbytes // align) * align  # as shim/transit.h's tr_host_round
        over = self.len + (HUGE if huge else 0)  # room to move the start to a huge page's boundary
        base = libc.mmap(None, over, _PROT_RW, _MAP_PRIVATE_ANON, -1, 0)
        if base in (None, ctypes.c_void_p(-1).value):
            raise MemoryError(f"mmap of {over} bytes: errno {ctypes.get_errno()}")
        self.addr = -(-base // align) * align
        if self.addr > base:
            libc.munmap(base, self.addr - base)
        if base + over > self.addr + self.len:
            libc.munmap(self.addr + self.len, base + over - self.addr - self.len)
        if huge:
            libc.madvise(self.addr, self.len, _MADV_HUGEPAGE)  # advice: without THP the pages stay small
        self.libc, self.unregister = libc, unregister
        err = int(register(self.addr, self.len, _REGISTER_PORTABLE_MAPPED))  # torch's cudaError: a pybind enum, always truthy
        if err:
            libc.munmap(self.addr, self.len)
            nbytes, self.len = self.len, 0
            raise OSError(f"cudaHostRegister of {nbytes} bytes: error {err}")

    def __del__(self):
        if self.len:
            self.unregister(self.addr)  # before the pages go: the driver holds them while registered
            self.libc.munmap(self.addr, self.len)


def pinned(shape, dtype):
    """An empty CPU tensor in pinned host memory of its exact size, on huge pages from one huge
    page up: the memory the shim gives the state it keeps on the host (shim/hoststate.c).
    torch's pin_memory=True rounds each block up to a power of two (up to twice the bytes, kept
    in its cache) on small pages, which the copy engines read slower. Falls back to torch's
    where the mapping or the registration is refused."""
    import math

    import torch

    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)  # nothing to pin
    try:
        cudart = torch.cuda.cudart()
        owner = _Pinned(nbytes, cudart.cudaHostRegister, cudart.cudaHostUnregister)
    except Exception:  # no CUDA runtime, a refusal: torch's own pinned memory
        return torch.empty(shape, dtype=dtype, pin_memory=True)
    return _tensor_at(owner.addr, nbytes, dtype, shape, owner)


class Ring:
    """Buffers carved in turn from `size` bytes, reused in first-in first-out order: a new
    buffer reuses the bytes of buffers handed out about one ring earlier, and must wait for
    the event that marked them done. Every done event is recorded on one stream, so waiting
    for the newest of them covers the older ones. Pure bookkeeping (tests drive it with any
    event objects)."""

    def __init__(self, size):
        self.size = size - size % ALIGN
        self.head = 0                       # virtual offset: grows forever, position = head % size
        self.live = collections.deque()     # (virtual start, done event) of buffers handed out

    def take(self, nbytes):
        """(offset, event to wait for or None) of a buffer of nbytes (at most the ring's size)."""
        n = -(-nbytes // ALIGN) * ALIGN
        if n > self.size:
            raise ValueError(f"{nbytes} bytes staged at once, the ring has {self.size}")
        start = self.head
        if start % self.size + n > self.size:  # no wrapping inside a buffer: skip to the ring's start
            start += self.size - start % self.size
        wait = None
        while self.live and self.live[0][0] < start + n - self.size:  # its bytes are reused now
            wait = self.live.popleft()[1]
        self.head = start + n
        self._pending = start
        return start % self.size, wait

    def done(self, event):
        """The buffer last taken is free again once `event` has happened."""
        self.live.append((self._pending, event))


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
    def __init__(self, device_memory=None, host_state=None):
        """device_memory: (alloc(nbytes) -> pointer or 0, free(pointer)), the shim's plain device
        memory out of the GPU budget; None: torch's allocator (no shim: plain memory too).
        host_state(ptr, nbytes): whether the shim made that state in pinned host memory."""
        self.limit = _limit()
        self.host_state = host_state
        self.batch = self.limit // 4    # state bytes of one streamed batch of slices
        self.device_memory = device_memory
        self.rings = {}                 # device -> (Ring, its memory as a uint8 tensor), or None: none to be had
        self.after_step = {}            # device -> event after the last optimizer step, not yet waited for
        self.lock = threading.Lock()    # a ring's take and done in order
        self.homes = {}      # data_ptr of a homed state -> its pinned host (CPU) view
        self.owner = {}      # data_ptr of a homed state -> id() of its optimizer
        # the storages the states left, for the life of the job (see the module docstring; a
        # load_state_dict that replaces the states adds one more copy of them on the host)
        self.kept = []       # (id() of the optimizer, storage)
        self.finalizers = {}  # id() of an optimizer with homes -> its weakref.finalize
        self.streams = {}    # device -> (in, update, out) streams
        self.in_place = 0    # bytes homed where they were born (the shim's pinned host memory)
        self.resident = {}   # data_ptr -> (bytes, id() of its optimizer) of a state the shim kept on the GPU: not homed

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

        moved, live, devices = 0, set(), set()
        if id(opt) not in self.finalizers:  # a discarded optimizer's homes go with it
            self.finalizers[id(opt)] = weakref.finalize(opt, self._forget, id(opt))
        with torch.no_grad():
            for group in opt.param_groups:
                for p in group["params"]:
                    state = opt.state.get(p, {})
                    for k in self.staged_keys(state, p):
                        t = storage_tensor(state[k])
                        if (self._homeable(t) and t.data_ptr() not in self.homes and t.data_ptr() not in self.resident
                                and self._home(t, opt)):
                            moved += nbytes(t)
                            if t.is_cuda:
                                devices.add(t.device)
                        live.add(t.data_ptr())
        if moved:  # states replaced (load_state_dict): their pinned homes go
            self._drop({q for q, o in self.owner.items() if o == id(opt) and q not in live})
        for dev in devices:
            self.ring(dev)  # at a step boundary, not inside the next backward
        return moved

    def home_of(self, src, device, opt):
        """A state the host path gives back (src, on the CPU) in a pinned home of its own, seen
        from `device` as the shim's pinned state is: the tensor opt.state keeps, which the
        streamed step streams from its next step. On a device without homes (the CPU), src
        moved there."""
        import torch

        if device.type != "cuda":
            return src.to(device)
        if id(opt) not in self.finalizers:
            self.finalizers[id(opt)] = weakref.finalize(opt, self._forget, id(opt))
        host = pinned((nbytes(src),), torch.uint8)
        cpu = host.view(src.dtype).view(src.shape)
        cpu.copy_(src)
        with torch.cuda.device(device):
            view = torch.as_tensor(_CudaView(host)).view(src.dtype).view(src.shape)
        if view.device != device or view.data_ptr() != host.data_ptr():
            raise RuntimeError(f"pinned memory seen as {view.device}, the state is on {device}")
        self.homes[view.data_ptr()] = cpu
        self.owner[view.data_ptr()] = id(opt)
        return view

    def stepped(self):
        """After an optimizer step (post-step hook, on the step's stream): the next
        in-copies on each device wait for it."""
        import torch

        for dev, ring in self.rings.items():
            if ring is not None and dev.type == "cuda":  # (a CPU ring: the streamed step's tests)
                ev = torch.cuda.Event()
                ev.record(torch.cuda.current_stream(dev))
                self.after_step[dev] = ev

    def _drop(self, stale):
        for q in stale:
            del self.homes[q], self.owner[q]

    def _forget(self, oid):
        """An optimizer was freed: its homes and the storages its states left go too
        (its managed state would have gone back to PyTorch's cache as well)."""
        self._drop({q for q, o in self.owner.items() if o == oid})
        self.resident = {q: v for q, v in self.resident.items() if v[1] != oid}
        self.kept = [(o, st) for o, st in self.kept if o != oid]
        self.finalizers.pop(oid, None)

    @staticmethod
    def _homeable(t):
        return t.is_cuda and t.is_contiguous()

    def _home(self, t, opt):
        """Whether t has a pinned home now. Under the shim (host_state given) only the state it
        made in pinned host memory has one: the rest is what the budget holds on the GPU, and
        stays there (stepped where it is, nothing copied). Without it, t is copied home."""
        import torch

        if self.host_state is not None:
            if not self.host_state(t.data_ptr(), nbytes(t)):
                self.resident[t.data_ptr()] = (nbytes(t), id(opt))
                return False
            # born in pinned host memory (the shim's, under advise): already its home; no copy
            self.homes[t.data_ptr()] = _pinned_cpu_view(t)
            self.owner[t.data_ptr()] = id(opt)
            self.in_place += nbytes(t)
            return True
        host = pinned((nbytes(t),), torch.uint8)
        view = torch.as_tensor(_CudaView(host)).view(t.dtype).view(t.shape)
        if view.device != t.device or view.data_ptr() != host.data_ptr():
            raise RuntimeError(f"pinned memory seen as {view.device}, the state is on {t.device}")
        cpu = host.view(t.dtype).view(t.shape)
        cpu.copy_(t)  # a device-to-host copy: waits for the step that wrote t
        self.kept.append((id(opt), t.untyped_storage()))
        t.set_(view)
        self.homes[t.data_ptr()] = cpu
        self.owner[t.data_ptr()] = id(opt)
        return True

    # --- the ring -------------------------------------------------------------------------

    def ring(self, dev):
        """The device's staging ring, made after its optimizer's first step; None (said once)
        when it cannot be had (no room in the GPU budget, a ring too small to hold a buffer):
        the step then reads the state in place."""
        if dev not in self.rings:
            self.rings[dev] = None
            why = self._make_ring(dev)
            if why:
                print(f"transit adapter: {why}: the optimizer step on {dev} reads the state in place",
                      file=sys.stderr, flush=True)
        return self.rings[dev]

    def _make_ring(self, dev):
        if self.limit < ALIGN:
            return f"{INFLIGHT_ENV}={self.limit} is less than one {ALIGN}-byte staging buffer"
        mem, why = device_buffer(self.device_memory, dev, self.limit, self, f"staging ring ({INFLIGHT_ENV})")
        if mem is None:
            return why
        self.rings[dev] = (Ring(self.limit), mem)
        return None

    def copy_streams(self, dev):
        """The device's (in, update, out) copy and step streams, made at first use."""
        import torch

        if dev not in self.streams:
            self.streams[dev] = tuple(torch.cuda.Stream(device=dev) for _ in range(3))
        return self.streams[dev]

    def wait(self, dev):
        """The step's stream waits for every streamed update and copy home."""
        import torch

        cur = torch.cuda.current_stream(dev)
        for s in self.streams.get(dev, ()):
            cur.wait_stream(s)
