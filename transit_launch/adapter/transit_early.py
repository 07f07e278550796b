"""TRANSIT_OVERLAP_EARLY=1 (opt-in until measured): the streamed step's state copied in during
backward and copied home under the next forward.

The streamed step (transit_streamed.py) moves each offloaded parameter's state after backward,
8 B in and 8 B out a parameter of Adam, on the link while the GPU waits. Backward frees the
activations as it goes and the next forward takes the room back only as it runs, so for the
parameters the streamed step streamed at the last step:
- in: when a parameter's gradient is final in the last backward (its hook has fired as often as
  at the last step), its state is copied from its pinned home into PyTorch's memory (the room
  backward freed), through the staging ring: the copy engines move it over PCIe into plain
  device memory and a device copy moves it on (a copy between managed and pinned memory would
  be served by the SMs: transit_staging.py). Only where the room left holds it beside what the
  rest of the backward took at the last step (Timeline), and where free blocks of the
  application's stream's pool hold its buffers: the hooks can run on another stream (FSDP2's
  reduce-scatter), whose pool has no freed activations, and a block PyTorch cannot find is a
  new segment, which the shim places on the host when the budget is full.
- the step: the application's step updates that state where it is (the streamed step's
  batches do the rest).
- out: the state goes home the same way back; each buffer goes back to PyTorch's cache once its
  bytes have left for the ring, and the next forward waits for a buffer only where the room
  the forward took at the last step needs it (a global forward pre-hook). Everything held is
  given back at the latest at the next backward's first gradient hook, when the state is read
  (state_dict) and at the next step.
Bit-identical: torch's step on the same values at other addresses, as the streamed step.
"""

import collections
import threading
import weakref

import transit_rules  # the environment's names (generated from transit_launch/rules.py)
import transit_staging  # storage_tensor: a DTensor's local tensor

ENV = transit_rules.ENV["OVERLAP_EARLY"]
# Bytes kept free beside the room's rule: an op's temporaries between two points of the
# timeline (a module's forward, a gradient's hook) are not in it
SLACK_BYTES = 1 << 30


def enabled(environ, say):
    """Whether TRANSIT_OVERLAP_EARLY asks for the early copies ("1"); a value other than unset,
    "0" or "1" is said in one line and taken as off (the job goes on)."""
    raw = environ.get(ENV, "")
    if raw not in ("", "0", "1"):
        say(f"{ENV}={raw!r} is not 0 or 1; the early state copies stay off")
    return raw == "1"


def _cuda_memory(dev):
    """(bytes allocated, bytes reserved) by PyTorch's caching allocator on dev."""
    import torch

    return torch.cuda.memory_allocated(dev), torch.cuda.memory_reserved(dev)


def _free_blocks(dev, stream):
    """The sizes of the free blocks in the pool of `stream` on dev (PyTorch's own segments, not a
    CUDA graph's): what an allocation on that stream can be carved from without a new segment."""
    import torch

    sid = stream.cuda_stream
    return [b["size"] for seg in torch.cuda.memory_snapshot()
            if seg["device"] == dev.index and seg["stream"] == sid and seg["segment_type"] == "large"
            and tuple(seg.get("segment_pool_id", (0, 0))) == (0, 0)
            for b in seg["blocks"] if b["state"] == "inactive"]


def _empty_cache():
    import torch

    torch.cuda.empty_cache()


def carve(free, sizes):
    """The free blocks left after `sizes` are taken from `free` as PyTorch's allocator takes them
    (the smallest block that holds each, split), largest first; None where one does not fit."""
    import bisect

    free = sorted(free)
    for n in sorted(sizes, reverse=True):
        n = -(-n // 512) * 512  # the allocator's rounding
        i = bisect.bisect_left(free, n)
        if i == len(free):
            return None
        rest = free.pop(i) - n
        if rest:
            bisect.insort(free, rest)
    return free


def _event(stream):
    """An event recorded on stream (None on the CPU: tests)."""
    return stream.record_event() if stream is not None else None


class Timeline:
    """The bytes PyTorch had allocated at numbered points of a phase (a backward's final
    gradients, a forward's modules), less what this module held then: the last step's, read
    while this step's is recorded."""

    def __init__(self):
        self.last, self.now = None, []

    def mark(self, base):
        """Records this step's next point; its index."""
        self.now.append(base)
        return len(self.now) - 1

    def turn(self):
        """A step boundary: what was recorded becomes the last step's."""
        if self.now:
            self.last = self.now
        self.now = []

    def most_from(self, i):
        """The most allocated at point i or after it at the last step (None: not known)."""
        if self.last is None or i >= len(self.last):
            return None
        return max(self.last[i:])

    def at(self, i):
        if self.last is None or i >= len(self.last):
            return None
        return self.last[i]


class _Fetched:
    """One parameter's state copied in: key -> (home's data_ptr, buffer); ready: the event after
    its last copy; stream: the stream its buffers were allocated on (released there)."""

    def __init__(self, p, bufs, ready, stream, nbytes):
        self.p = weakref.ref(p)
        self.bufs, self.ready, self.stream, self.nbytes = bufs, ready, stream, nbytes


class EarlyState:
    """Hooks on the streamed parameters, the buffers copied in during backward (fetched), and
    the buffers held past the step until their bytes are home (held)."""

    def __init__(self, staging, memory=None, slack=SLACK_BYTES, blocks=None, trim=None):
        self.staging = staging
        self.memory = memory or _cuda_memory  # dev -> (allocated, reserved); tests stand in
        self.blocks = blocks or _free_blocks  # (dev, stream) -> free block sizes in its pool
        self.trim = trim or _empty_cache      # gives PyTorch's unused segments back (after a growth)
        self.slack = slack
        self.app_stream = {}               # device -> the application's stream at the step (its pool is used)
        self.free = None                   # (device, allocated then) where the last look found no blocks
        self.lock = threading.Lock()       # hooks run on autograd's threads, the step on the application's
        self.hooked = {}                   # id(param) -> its hook's handle (tensors do not hash by identity)
        self.fires = {}                    # id(param) -> hooks fired this step
        self.learned = {}                  # id(param) -> hooks fired at the last step (the final one)
        self.fetched = {}                  # id(param) -> _Fetched
        self.held = collections.deque()    # (device, event, stream, [buffers], bytes) after the step
        self.held_bytes = 0
        self.out_done = {}                 # device -> event after the last copy home (the next in-copies wait)
        self.limit = {}                    # device -> PyTorch's reserved bytes at the last step's end
        self.back, self.fwd = Timeline(), Timeline()
        self.on = True                     # False after an error or a segment added while holding (said once)
        self.recording = False             # the forward's points are marked from a step to the first final gradient
        self._optimizers = weakref.WeakSet()  # the optimizers whose parameters are watched
        self.stats = {"fetched_params": 0, "stepped_params": 0, "fetched_bytes": 0, "no_room": 0, "held_bytes": 0, "waited_releases": 0,
                      "unused": 0, "no_block": 0}
        self.handle = None                 # the global forward pre-hook
        self.state_hooks = []              # the optimizers' state_dict pre-hooks
        self._device = None
        self.say = None                    # say(text): the adapter's one line (transit_step.say)

    # --- install -------------------------------------------------------------------------------

    def install(self, say):
        import torch.nn.modules.module as m

        self.say = say
        self.handle = m.register_module_forward_pre_hook(self.pre_forward)

    def uninstall(self):
        self.release_all()
        if self.handle is not None:
            self.handle.remove()
        for h in [*self.hooked.values(), *self.state_hooks]:
            h.remove()
        self.hooked.clear()
        self.state_hooks = []

    def watch(self, opt, params):
        """After a step that streamed params: their gradients' hooks (once each), and a
        state_dict hook that gives back what is held before the state is read."""
        for p in params:
            if id(p) not in self.hooked:
                self.hooked[id(p)] = p.register_post_accumulate_grad_hook(self.on_grad)
        if opt not in self._optimizers:
            self._optimizers.add(opt)
            self.state_hooks.append(opt.register_state_dict_pre_hook(lambda o: self.release_all()))

    # --- backward: in --------------------------------------------------------------------------

    def on_grad(self, p):
        import torch

        if torch.compiler.is_compiling():
            return
        try:
            with self.lock:
                if self.held:
                    self._release(lambda: True)  # a backward: the last step's state is home by now
                n = self.fires.get(id(p), 0) + 1
                self.fires[id(p)] = n
                if n != self.learned.get(id(p)) or not self.on:
                    return  # not the last backward's (or not learned yet: the first step after watch)
                self.recording = False
                self._fetch(p)
        except Exception as e:  # never the reason a job dies: this parameter streams at the step
            with self.lock:
                self._turn_off(f"an error while copying state in during backward: {e!r}")

    def _fetch(self, p):
        st = self.staging
        dev = transit_staging.storage_tensor(p).device
        old = self.fetched.pop(id(p), None)
        if old is not None:  # fetched by an earlier backward whose step never came: given back
            self._drop_fetched(old)
        opt_state = self._state_of(p)
        if opt_state is None:
            return
        keys = [k for k in st.staged_keys(opt_state, p) if transit_staging.storage_tensor(opt_state[k]).data_ptr() in st.homes]
        if not keys:
            return
        sizes = [transit_staging.nbytes(transit_staging.storage_tensor(opt_state[k])) for k in keys]
        nbytes = sum(sizes)
        alloc, reserved = self.memory(dev)
        base = alloc - sum(f.nbytes for f in self.fetched.values()) - self.held_bytes
        rest = self.back.most_from(self.back.mark(base))  # the most the rest of the backward took last step
        if rest is None:
            return
        if reserved > self.limit.get(dev, reserved):
            return self._turn_off(f"PyTorch reserved {reserved - self.limit[dev]} more bytes on {dev} than at the last step "
                                  "while state was copied in", grew=True)
        if alloc + nbytes + max(0, rest - base) + self.slack > reserved:
            self.stats["no_room"] += 1
            return
        ring = st.ring(dev)
        if ring is None:
            return
        if not self._carve(dev, alloc, sizes):
            self.stats["no_block"] += 1
            return
        f = self._copy_in(p, opt_state, keys, ring, nbytes)
        grown = self.memory(dev)[1] - reserved
        if grown > 0:  # a new segment after all: given back at once, and off
            self._drop_fetched(f)
            return self._turn_off(f"a buffer took a new segment of {grown} bytes on {dev}", grew=True)
        self.fetched[id(p)] = f
        self.stats["fetched_params"] += 1
        self.stats["fetched_bytes"] += nbytes

    def _carve(self, dev, alloc, sizes):
        """Whether free blocks of the application's stream's pool hold `sizes`, looked at now (the
        backward allocates from them too). Where the last look found none and less than `sizes`
        has been freed since, they are not looked at again."""
        stream = self.app_stream.get(dev)
        if stream is None:
            return dev.type != "cuda"  # tests on the CPU: no pools
        if self.free is not None and self.free[0] == dev and alloc + sum(sizes) > self.free[1]:
            return False
        fits = carve(self.blocks(dev, stream), sizes) is not None
        self.free = None if fits else (dev, alloc)
        return fits

    def _state_of(self, p):
        for opt in list(self._optimizers):
            state = opt.state.get(p)
            if state:
                return state
        return None

    def _copy_in(self, p, state, keys, ring, nbytes):
        import torch

        st = self.staging
        ringbuf, mem = ring
        dev = transit_staging.storage_tensor(p).device
        streams = st.copy_streams(dev) if dev.type == "cuda" else None
        s_in, _, s_out = streams or (None, None, None)
        cur = self.app_stream.get(dev, torch.cuda.current_stream(dev)) if streams else None
        bufs = {}
        with transit_staging.on_stream(cur):  # from its pool, where the freed activations are
            for k in keys:
                t = transit_staging.storage_tensor(state[k])
                bufs[k] = (t.data_ptr(), torch.empty(t.numel(), dtype=t.dtype, device=dev))
        if streams:
            s_in.wait_event(_event(cur))  # the freed blocks' last readers, on the application's stream
            if dev in self.out_done:
                s_in.wait_event(self.out_done[dev])  # the homes as the last step wrote them
        for k in keys:
            home = st.homes[bufs[k][0]].view(-1)
            self._through_ring(ringbuf, mem, home, bufs[k][1], s_in, s_out, inward=True)
        return _Fetched(p, bufs, _event(s_in), cur, nbytes)

    def _through_ring(self, ringbuf, mem, home, buf, s_copy, s_out, inward):
        """Copies buf's bytes from (inward) or to its home through the ring, piece by piece: the
        copy engines between the home and the ring, a device copy between the ring and buf. Every
        piece's done event is recorded on s_out, the stream the ring's events are ordered on."""
        st = self.staging
        piece = max(1, min(st.batch, ringbuf.size) // buf.element_size())
        with st.lock:
            for a in range(0, buf.numel(), piece):
                b = min(buf.numel(), a + piece)
                n = (b - a) * buf.element_size()
                off, wait = ringbuf.take(n)
                with transit_staging.on_stream(s_copy):
                    if wait is not None:
                        s_copy.wait_event(wait)
                    staged = mem[off:off + n].view(buf.dtype)
                    if inward:
                        staged.copy_(home[a:b], non_blocking=True)
                        buf[a:b].copy_(staged)
                    else:
                        staged.copy_(buf[a:b])
                        home[a:b].copy_(staged, non_blocking=True)
                if s_copy is not None and s_copy is not s_out:
                    s_out.wait_event(_event(s_copy))
                ringbuf.done(_event(s_out))

    # --- the step ------------------------------------------------------------------------------

    def take(self, p, state, keys):
        """The buffers fetched for p (key -> flat buffer) and the event they are ready after, if
        they are the state's homes as they are now; else None (given back)."""
        f = self.fetched.pop(id(p), None)
        if f is None:
            return None
        st = self.staging
        homed = {k: transit_staging.storage_tensor(state[k]).data_ptr() for k in keys if transit_staging.storage_tensor(state[k]).data_ptr() in st.homes}
        if f.p() is not p or {k: ptr for k, (ptr, _) in f.bufs.items()} != homed:
            self._drop_fetched(f)  # a state replaced since (load_state_dict): streamed from its home
            return None
        self.stats["stepped_params"] += 1
        return f

    def copy_out(self, f, dev, s_upd):
        """After the update: f's buffers home through the ring; each held until its bytes left."""
        st = self.staging
        ring = st.ring(dev)
        streams = st.copy_streams(dev) if dev.type == "cuda" else None
        s_out = streams[2] if streams else None
        if streams:
            s_out.wait_stream(s_upd)
        for ptr, buf in f.bufs.values():
            self._through_ring(ring[0], ring[1], st.homes[ptr].view(-1), buf, s_out, s_out, inward=False)
            self.held.append((dev, _event(s_out), f.stream, [buf], transit_staging.nbytes(buf)))
            self.held_bytes += transit_staging.nbytes(buf)
        if streams:
            self.out_done[dev] = _event(s_out)

    def stepped(self, devices):
        """After a step: the gradients' hook counts are learned, the timelines turn, and the
        reserved memory is the limit the next forward's holding keeps under."""
        with self.lock:
            for k, n in self.fires.items():
                self.learned[k] = n
            self.fires = {}
            for f in list(self.fetched.values()):  # fetched and never stepped (no gradient at the step)
                self.stats["unused"] += 1
                self._drop_fetched(f)
            self.fetched = {}
            self.back.turn()
            self.fwd.turn()
            self.free = None
            for dev in devices:
                self.limit[dev] = self.memory(dev)[1]
                if dev.type == "cuda":
                    import torch

                    self.app_stream[dev] = torch.cuda.current_stream(dev)
                self._device = dev  # the forward's points are read on it (one device a process)
            self.stats["held_bytes"] = max(self.stats["held_bytes"], self.held_bytes)
            self.recording = self.on
            if not self.on or self.fwd.last is None:
                self._release(lambda: True)  # nothing known of the next forward yet: hold nothing

    # --- forward: out ----------------------------------------------------------------------------

    def pre_forward(self, module, args):
        """Each module's forward: while buffers are held, the forward's next point must fit
        beside them under the reserved bytes, else the oldest are given back (the stream waits
        for their copies to leave)."""
        if not (self.held or self.recording):
            return
        try:
            with self.lock:
                dev = self.held[0][0] if self.held else self._device
                if dev is None:
                    return
                alloc, reserved = self.memory(dev)
                limit = self.limit.get(dev, reserved)
                if self.held and reserved > limit:  # a segment was added while holding: never again
                    self._turn_off(f"PyTorch reserved {reserved - limit} more bytes on {dev} than at the last step while "
                                   "the state went home under the forward", grew=True)
                    return
                nxt = self.fwd.at(self.fwd.mark(alloc - self.held_bytes) + 1)
                need = max(alloc - self.held_bytes, nxt if nxt is not None else limit)
                self._release(lambda: self.held_bytes + need + self.slack > limit, wait=True)
        except Exception as e:
            with self.lock:
                self._turn_off(f"an error while giving back the state's buffers: {e!r}")

    # --- giving back -------------------------------------------------------------------------------

    def release_all(self):
        with self.lock:
            self._release(lambda: True)

    def _release(self, more, wait=False):
        while self.held and more():
            dev, ev, stream, bufs, n = self.held.popleft()
            if ev is not None:
                stream.wait_event(ev)  # after this, the blocks are reused in the stream's order
            bufs.clear()
            self.held_bytes -= n
            self.stats["waited_releases"] += bool(wait)

    def _drop_fetched(self, f):
        if f.ready is not None:
            f.stream.wait_event(f.ready)
        f.bufs.clear()

    def _turn_off(self, why, grew=False):
        """Off for the rest of the job, said once; what is held goes back now (the caller holds
        the lock). After a growth PyTorch's unused segments go back too: the new one may be on the
        host (the shim's budget was full), and the job would run beside it from then on."""
        first = self.on
        if first and self.say:
            self.say(f"early state copies off: {why}; the streamed step copies the state after backward")
        self.on = self.recording = False
        self._release(lambda: True)
        if grew and first:
            self.trim()

    def counters(self):
        return dict(self.stats)


