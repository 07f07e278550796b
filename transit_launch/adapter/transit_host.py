"""TRANSIT_OVERLAP_STEP=host (opt-in): the update of the state the GPU budget cannot hold
runs on the host, with torch's own optimizer, for a share of it (the split, transit_split.py:
the streamed step moves the rest).

The streamed step moves that state, 16 B a parameter of Adam (8 in, 8 out), after backward.
Here it never moves: it lives in host memory, each parameter's gradient goes down (4 B) as it
becomes final in the last microbatch's backward, on a copy stream beside backward, torch's own
optimizer class (fused, on the CPU) steps a host copy of the parameter, and the parameter goes
back up (4 B), chunk by chunk while the CPU steps the next chunk. The CPU steps on a worker
thread: `opt.step()` returns at once, and the work the CPU has left runs beside the next
forward; an op of the application's thread that reads or writes a parameter still in flight
(FSDP2's all-gather of its shard, a forward, an EMA, state_dict) waits for that parameter's
chunk only (_gate). What the budget holds on the GPU is left to the application's own step
(bit-identical there).

torch's semantics are kept: the same optimizer class and param groups (their hyper-parameters
read at every step, so LR schedules apply), the step counts, the state in `opt.state` (plain
tensors; see DTENSOR_STATE), and the gradients the step would see. A gradient copied at its
final hook is used only if nothing changed it since backward ended (its version), except by
gradient clipping: clip_grads_with_norm_ is wrapped, its coefficient recomputed as torch
computes it and applied to the host copy (the same float multiply); any other change, or
clipping twice, has the gradient copied again at the step. Which hook is final is learned
from the previous step (its number of hooks); the first step copies at the step.

What cannot run here steps as without the adapter, said once: optimizers other than Adam,
AdamW and SGD, a closure or GradScaler, foreign step hooks, param groups the streamed step
refuses too, sparse or non-contiguous tensors.
"""

import atexit
import itertools
import os
import statistics
import threading
import time
import weakref

import transit_rules  # the environment's names (generated from transit_launch/rules.py)
import transit_step  # the verified step (raw_step) and the refusals the step modes share
import transit_staging  # plain device memory out of the GPU budget (device_buffer)

# What reads a tensor's metadata, not its data: the gate lets it through (a parameter's
# attributes, p.grad among them, are read by torch's step while the worker runs)
METADATA = frozenset(("__get__", "__set__", "size", "dim", "numel", "stride", "is_contiguous", "element_size",
                      "data_ptr", "untyped_storage", "is_floating_point", "is_complex", "__len__"))
CHUNK_BYTES = 256 << 20  # parameter bytes stepped and sent up together (the CPU steps one while one copies)
# Under the shim the parameters and gradients are managed memory, and a copy between managed
# and pinned host memory is served by the SMs: the compute stream stalls for each gradient's
# copy down (bench/LOG.md, "The host step's copies through plain device memory"). So each
# copy passes through this many bytes of plain device memory each way: the copy engines move
# it over PCIe, the SMs only copy it on the device. Down, the device copy runs on the compute
# stream in backward's order (a copy stream's would wait for a gap between the GEMMs, one per
# piece), into a ring of RING_PIECES pieces, which the copy stream sends down (_DownRing); up,
# the pieces cross into a ring and a high-priority stream copies them on the device (_UpRing)
BOUNCE_BYTES = 64 << 20
RING_PIECES = 4
# The devices whose steps the split (transit_split.py) times: on a CPU (tests) the host step's work is the device's
# own, with nothing beside it to balance (all of it goes to the host, as without a link)
TIMED_DEVICES = ("cuda",)
# The copies up issued by a thread of their own while the worker steps the next chunk (HostStep._run);
# TRANSIT_HOST_SEND_BESIDE=0, a diagnostic, issues them on the worker between its steps
SEND_BESIDE = os.environ.get(transit_rules.ENV["HOST_SEND_BESIDE"], "1") != "0"
# Said once for an optimizer of FSDP2 (DTensor) parameters: their host state is plain tensors,
# which torch's distributed checkpoint cannot place
DTENSOR_STATE = ("its parameters are DTensors (FSDP2): their host state is not in opt.state, so "
                 "state_dict() does not hold it (checkpoints need TRANSIT_OVERLAP_STEP=stream)")


def state_tensors(opt):
    """How many parameter-shaped state tensors the optimizer keeps (Adam's two moments, SGD's
    momentum)."""
    return 2 if type(opt).__name__ in ("Adam", "AdamW") else 1


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _mark(dev):
    """A point in the work of device dev: a timed CUDA event on its current stream, or on a
    CPU (tests) the clock (its work is done when issued)."""
    import torch

    if dev.type != "cuda":
        return time.perf_counter()
    ev = torch.cuda.Event(enable_timing=True)
    ev.record(torch.cuda.current_stream(dev))
    return ev


def _elapsed(a, b):
    """Seconds from mark a to mark b (b waited for)."""
    if isinstance(a, float):
        return b - a
    b.synchronize()
    return a.elapsed_time(b) / 1e3


def _pick(sizes, share):
    """How many of the last parameters (sizes: their bytes, in forward order) the CPU steps
    at this share of all their bytes: to the nearest parameter."""
    target, taken, n = share * sum(sizes), 0, 0
    for size in reversed(sizes):
        if taken + size / 2 > target:
            break
        taken += size
        n += 1
    return n


def _levels(sizes):
    """The shares a plan can realize (the byte fraction of the last k parameters, k >= 1),
    rounded as the search keys them, ascending."""
    total, taken, out = sum(sizes), 0, []
    for size in reversed(sizes):
        taken += size
        out.append(round(taken / total, 6))
    return out


class _Pieces:
    """A ring of plain device memory (uint8 `mem`) that copies pass through in RING_PIECES pieces."""

    def __init__(self, mem):
        self.ring = transit_staging.Ring(mem.numel())
        self.mem = mem
        self.piece = max(transit_staging.ALIGN,
                         self.ring.size // RING_PIECES // transit_staging.ALIGN * transit_staging.ALIGN)

    def pieces(self, dst, src):
        """(dst's piece, src's piece, its slot in the ring, the event to wait for before the
        slot is written or None) for each piece, as bytes; the caller marks each slot's
        reuse with self.ring.done."""
        import torch

        d, s = dst.view(-1).view(torch.uint8), src.view(-1).view(torch.uint8)
        for off in range(0, d.numel(), self.piece):
            k = min(self.piece, d.numel() - off)
            base, wait = self.ring.take(k)
            yield d[off:off + k], s[off:off + k], self.mem[base:base + k], wait


class _DownRing(_Pieces):
    """Gradients sent down through a ring of plain device memory: each piece copied into the
    ring on the stream that made the gradient (in order: no copy stream waiting for SMs), then
    sent to pinned host memory by the copy stream. A piece reuses ring bytes only after their
    copy down (the compute stream waits for that on the GPU, only when the copy engines are a
    whole ring behind). On a CPU (tests) the same pieces, copied in turn."""

    def send(self, dst, src, down):
        """dst (pinned host) = src (on the device), in pieces; the last piece's copy-down event
        (None on a CPU)."""
        import torch

        cur = torch.cuda.current_stream(src.device) if down is not None else None
        done = None
        for d, s, slot, wait in self.pieces(dst, src):
            if wait is not None:
                cur.wait_event(wait)
            slot.copy_(s)
            if down is None:
                d.copy_(slot)
            else:
                down.wait_event(cur.record_event())
                with torch.cuda.stream(down):
                    d.copy_(slot, non_blocking=True)
                    done = down.record_event()
            self.ring.done(done)
        return done


class _UpRing(_Pieces):
    """Parameters sent up through a ring of plain device memory: each piece crosses on the copy
    stream into the ring, and a high-priority stream copies it on the device into the
    parameter: the scheduler runs that copy's blocks as the GEMMs' blocks retire instead of
    after a whole GEMM, and the next piece crosses meanwhile. A piece reuses ring bytes only
    after their device copy. On a CPU (tests) the same pieces, copied in turn."""

    def send(self, dst, src, across, dev):
        """dst (the parameter, on the device) = src (pinned host), in pieces: across (the copy
        stream) brings each piece, dev (high priority) copies it into dst after what dev was
        told to wait for; the last device copy's event (None on a CPU)."""
        import torch

        done = None
        for d, s, slot, wait in self.pieces(dst, src):
            if across is None:
                slot.copy_(s)
                d.copy_(slot)
            else:
                if wait is not None:
                    across.wait_event(wait)
                with torch.cuda.stream(across):
                    slot.copy_(s, non_blocking=True)
                dev.wait_event(across.record_event())
                with torch.cuda.stream(dev):
                    d.copy_(slot, non_blocking=True)
                    done = dev.record_event()
            self.ring.done(done)
        return done


class _Rec:
    """One parameter on the host path: its host copy, its host gradient, what this step did."""

    __slots__ = ("p", "local", "ph", "gh", "fires", "copied", "ended", "clip", "pver", "event")

    def __init__(self, p, ph, gh):
        self.p, self.local, self.ph, self.gh = p, _local(p).detach(), ph, gh
        self.fires, self.copied, self.ended, self.clip = 0, None, None, []
        self.pver = self.local._version  # the parameter's version when ph last equalled it
        self.event = None  # the copy down's completion (a GPU's)


class _Plan:
    """One adopted optimizer: its host-path parameters in chunks, each stepped by a CPU
    optimizer of the application's class over one param group's host copies."""

    def __init__(self, opt):
        self.opt = weakref.ref(opt)
        self.recs = {}      # id(param) -> _Rec
        self.chunks = []    # (group index, CPU optimizer, [_Rec])
        self.learned = {}   # id(param) -> hooks in the last step (the last is final)
        self.hidden = []    # (param, grad) hidden from the application's step
        self.handles = []
        self.job = None     # the step the worker runs (_Job), until _finish
        self.counts = (0, 0, 0)  # (host, streamed, resident) parameters, in the stats
        self.host_bytes = 0      # bytes of the parameters stepped here
        self.timing = None       # the split's (window_s, stream_s, offloaded bytes), from its whole steps
        self.times = []          # (mark, cpu_s) at each step's call, until the share is revised
        self.cpu_s = 0.0         # the CPU steps' seconds of this plan's jobs
        self.revised = False     # the share revised from this plan's steps (HostStep._revise)
        self.sizes = []          # the offloaded parameters' bytes, in forward order (their shares: levels)
        # {share: median step seconds} timed in the split's search, shared by the plans it makes
        # (HostStep._revise); 0.0: the step streamed whole
        self.tried = {}


class _Chunk:
    """One chunk of a step for the worker: what to wait for, the CPU step, the copies up."""

    __slots__ = ("cpu", "live", "items", "done", "up")

    def __init__(self, cpu, live, items):
        self.cpu, self.live = cpu, live
        self.items = items               # (rec, copy-down event or None, (coefficient, event) or None)
        self.done = threading.Event()    # set when the copies up are issued (or the job failed)
        self.up = None                   # the copies up's completion (a GPU's event)

    def landed(self):
        """The gradients' copies (and the clip's coefficient) are on the host."""
        return all((ev is None or ev.query()) and (c is None or c[1] is None or c[1].query())
                   for _, ev, c in self.items)


class _Job:
    """One optimizer step's host work, run by the worker thread in _run."""

    def __init__(self, device, chunks, threads):
        self.device, self.chunks = device, chunks
        self.threads = threads  # the worker's intra-op threads (_step says why)
        self.error = None
        self.future = None
        self.cpu_s = 0.0        # its CPU steps' seconds


class HostStep:
    """Global optimizer step pre/post hooks, a post-accumulate-grad hook on each host-path
    parameter, and the clipping wrapper."""

    def __init__(self, ours=(), room=None, on_host=None, share=None, device_memory=None):
        self.ours = list(ours)       # the adapter's other step hooks: not foreign
        self.room = room             # room(device) -> bytes of state the budget holds there; None: unbounded
        # on_host(): tells the shim the state it will not see is on the host (transit_api.state_on_host),
        # before the first step's boundary: else advise, finding no state hinted, probes every
        # managed byte's access (all of them sent to the host for its recording)
        self.on_host = on_host
        # share(opt, clipped) -> the fraction of the offloaded parameters' bytes the CPU steps
        # (SplitShare); None: all of them. clipped: a clip ran before the first step
        self.share = share
        # device_memory: the shim's plain device memory (transit_staging.device_buffer), the copies'
        # bounce buffers; None (no shim: the parameters are plain memory already): copies go direct
        self.device_memory = device_memory
        # home(cpu tensor, device, opt) -> the tensor a state given back is kept as (the streamed
        # step's pinned homes, transit_staging.Staging.home_of: Split sets it); None: moved to the device
        self.home = None
        self.bounce_bytes = BOUNCE_BYTES
        self.bounces = {}            # device -> (down, up) uint8 buffers, or (None, None): none to be had
        self.clip_seen = False
        self.learn = 0               # steps streamed whole before adopting, timed (Split sets it)
        # revise(clipped, timing, cpu_byte_s) -> the share from the CPU's seconds a byte as the
        # host steps ran (Split sets it); after revise_steps such steps, once (_revise)
        self.revise = None
        self.revise_steps = 0
        # search(tried, levels) -> the share to time next, or None: settled (Split sets it; _revise)
        self.search = None
        self.marks = weakref.WeakKeyDictionary()  # optimizer -> [[device, pre mark, post mark]] of those steps
        self.plans = weakref.WeakKeyDictionary()
        self.said = weakref.WeakKeyDictionary()  # optimizer -> why it steps as without the adapter
        self.streams = {}            # device -> (down, up) copy streams
        self.task_open = False       # a backward is running whose end is awaited
        self.stats = {"steps": 0, "host_params": 0, "resident_params": 0, "stream_params": 0, "share": 1.0,
                      "recopied": 0, "clipped": 0,
                      "adopt_s": 0.0, "wait_s": 0.0, "grads_s": 0.0, "cpu_s": 0.0, "up_s": 0.0, "held_s": 0.0,
                      "window_s": 0.0, "stream_s": 0.0, "step_s": 0.0, "revised_share": None,
                      "run_cpu_ns_per_byte": None, "tried": []}
        self.handles = []
        self.worker = None           # one thread: the CPU steps of a job, in order
        self.sender = None           # one thread: the copies up of the chunks the worker stepped (_send_up)
        self.pending = {}            # storage address of a parameter in flight -> its _Chunk (_gate)
        self.gate = None
        self._unclip = None
        self.hook_failed = False
        self.lock = threading.Lock()
        atexit.register(self.report)

    def _add_grads_s(self, dt):
        """grads_s is the one counter both threads add to (the clip's scaling on the worker, a
        gradient copied again on the application's thread)."""
        with self.lock:
            self.stats["grads_s"] += dt

    def counters(self):
        """What the stats report's "adapter" object holds of the host step, the steps in flight
        done first (their CPU seconds counted)."""
        for plan in list(self.plans.values()):
            self._finish(plan)
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in self.stats.items()}

    def report(self):
        s = self.stats
        if s["steps"]:
            transit_step.say(
                f"host step: {s['steps']} steps, {s['host_params']} parameters on the host, {s['stream_params']} "
                f"streamed (share on the host {s['share']:.2f}"
                + (f", from a {s['window_s']:.3f} s forward and backward and a {s['stream_s']:.3f} s step streamed whole"
                   if s["window_s"] else "")
                + (f"; modelled again as {s['revised_share']:.2f} from {s['run_cpu_ns_per_byte']:.3f} ns a byte as the CPU "
                   f"stepped" if s["revised_share"] is not None else "")
                + ("; timed: " + ", ".join(f"{t:.3f} s at {k:.3g}" for k, t in s["tried"]) if s["tried"] else "")
                + f"), {s['resident_params']} left to the GPU step; "
                f"gradients copied again at the step {s['recopied']} times, scaled by a clip {s['clipped']} times; "
                f"seconds: adopt {s['adopt_s']:.2f}, waiting for the gradients' copies "
                f"(and the clip) {s['wait_s']:.2f}, gradients {s['grads_s']:.2f}, CPU steps {s['cpu_s']:.2f}, "
                f"parameters sent up {s['up_s']:.2f}, the application held for the CPU {s['held_s']:.2f}")

    # --- install ------------------------------------------------------------------------------

    def install(self):
        from torch.optim import optimizer as o

        self.handles = [o.register_optimizer_step_pre_hook(self.pre_step),
                        o.register_optimizer_step_post_hook(self.post_step)]
        self._wrap_clipping()

    def uninstall(self):
        atexit.unregister(self.report)
        for plan in list(self.plans.values()):
            self._finish(plan)
            for h in plan.handles:
                h.remove()
        for h in self.handles:
            h.remove()
        if self._unclip:
            self._unclip()
        if self.gate is not None:
            self.gate.__exit__(None, None, None)
            self.gate = None
        for pool in (self.worker, self.sender):
            if pool:
                pool.shutdown()

    def _wrap_clipping(self):
        """torch.nn.utils.clip_grads_with_norm_ (TorchTitan calls it) and the function
        clip_grad_norm_ calls, wrapped: after torch scales the gradients, on_clip records the
        coefficient for the host copies."""
        import torch.nn.utils as u
        from torch.nn.utils import clip_grad as cg

        orig = cg._clip_grads_with_norm_
        host = self

        def clip_grads_with_norm_(parameters, max_norm, total_norm, foreach=None):
            import torch

            params = [parameters] if torch.is_tensor(parameters) else list(parameters)
            out = orig(params, max_norm, total_norm, foreach)
            host.clip_seen = True
            try:
                host.on_clip(params, max_norm, total_norm)
            except Exception as e:  # never the reason a job dies: the step copies again
                transit_step.say(f"host step: clipping not followed ({e!r}); gradients are copied again at the "
                                 "step")
                host.clip_broken = True
            return out

        clip_grads_with_norm_.__wrapped__ = orig
        saved = {(cg, "_clip_grads_with_norm_"): orig}
        for mod in (u, cg):
            if hasattr(mod, "clip_grads_with_norm_"):
                saved[(mod, "clip_grads_with_norm_")] = mod.clip_grads_with_norm_
        for mod, name in saved:
            setattr(mod, name, clip_grads_with_norm_)
        self.clip_broken = False

        def unclip():
            for (mod, name), f in saved.items():
                setattr(mod, name, f)
        self._unclip = unclip

    def _push_gate(self):
        """A torch function mode on this (the application's) thread: while a step's chunks are
        in flight, an op that reads or writes one of their parameters (FSDP2's all-gather of
        the sharded parameter, a forward, state_dict's detach, an EMA) first waits for that
        chunk's copies up. The worker's own ops run on its thread, outside the mode."""
        from torch.overrides import TorchFunctionMode

        host = self

        class Gate(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if host.pending and getattr(func, "__name__", None) not in METADATA:
                    host._gate(args, kwargs)
                return func(*args, **kwargs)

        self.gate = Gate()
        self.gate.__enter__()

    def _gate(self, args, kwargs):
        import torch

        for a in (*args, *kwargs.values()):
            for t in (a if isinstance(a, (list, tuple)) else (a,)):
                if not isinstance(t, torch.Tensor):
                    continue
                t = getattr(t, "_local_tensor", t)  # a DTensor: its shard
                try:
                    ptr = t.untyped_storage().data_ptr()
                except Exception:  # no storage (meta, fake): nothing the worker writes
                    continue
                for chunk in self.pending.pop(ptr, ()):
                    self._await(chunk)
                    if chunk.up is not None:
                        torch.cuda.current_stream(chunk.up.device).wait_event(chunk.up)

    def _await(self, chunk):
        if not chunk.done.is_set():
            t0 = time.perf_counter()
            chunk.done.wait()
            self.stats["held_s"] += time.perf_counter() - t0

    def _finish(self, plan):
        """The in-flight step of plan done, its copies up ordered before the application's
        next work; an error of the worker said and the state given back."""
        import torch

        job, plan.job = plan.job, None
        if job is None:
            return
        for c in job.chunks:
            for r in c.live:
                self.pending.pop(r.local.untyped_storage().data_ptr(), None)
        t0 = time.perf_counter()
        job.future.result()
        self.stats["held_s"] += time.perf_counter() - t0
        plan.cpu_s += job.cpu_s
        for c in job.chunks:
            if c.up is not None:
                torch.cuda.current_stream(c.up.device).wait_event(c.up)
        if job.error is not None:
            opt = plan.opt()
            if opt is not None:
                self._give_back(opt, plan)
                self._off(opt, f"an error in the host step's worker: {job.error!r} (this step's update of "
                               f"its host parameters may be partial)")

    # --- the hooks ----------------------------------------------------------------------------

    def on_grad(self, p):
        """A gradient is final when its hook has fired as often as in the last step: it goes
        down on the copy stream, after the work that made it (the hook's current stream)."""
        import torch

        if torch.compiler.is_compiling():
            return
        for plan in self.plans.values():
            rec = plan.recs.get(id(p))
            if rec is None:
                continue
            try:
                rec.fires += 1
                final = plan.learned.get(id(p))
                if final is None or rec.fires == final:  # not learned yet: every hook copies, the last one counts
                    self._down(rec)
                self._await_end()
            except Exception as e:
                if not self.hook_failed:
                    transit_step.say(f"host step: a gradient hook failed ({e!r}); such gradients are copied at "
                                     "the step")
                self.hook_failed = True

    def _down(self, rec):
        import torch

        g = _local(rec.p.grad)
        dev = rec.local.device
        ring = self.bounces.get(dev, (None,))[0]
        down = self._streams(dev)[0] if dev.type == "cuda" else None
        if ring is not None and g.is_contiguous() and rec.gh.is_contiguous():
            rec.event = ring.send(rec.gh, g, down)
        elif down is not None:
            down.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(down):
                rec.gh.copy_(g, non_blocking=True)
                rec.event = down.record_event()
            g.record_stream(down)
        else:
            rec.gh.copy_(g)
        rec.copied, rec.clip = rec.p.grad, []

    def _await_end(self):
        """Versions are read when the backward has ended (FSDP2's gradients are views of one
        buffer and share its version counter)."""
        import torch

        if not self.task_open:
            self.task_open = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_ended)

    def _backward_ended(self):
        self.task_open = False
        for plan in self.plans.values():
            for rec in plan.recs.values():
                if rec.copied is not None and rec.copied is rec.p.grad:
                    rec.ended = _local(rec.p.grad)._version

    def on_clip(self, params, max_norm, total_norm):
        import torch

        ours = [(plan, plan.recs[id(p)]) for p in params for plan in self.plans.values()
                if id(p) in plan.recs and p.grad is not None]
        if not ours:
            return
        tn = total_norm.full_tensor() if hasattr(total_norm, "full_tensor") else total_norm
        coef = torch.clamp(float(max_norm) / (tn + 1e-6), max=1.0)  # as torch computes it
        for _, rec in ours:
            rec.clip.append((coef, _local(rec.p.grad)._version))

    def pre_step(self, opt, args, kwargs):
        if opt in self.said or transit_step.is_container(opt):  # a container: its optimizers come one by one
            return
        try:
            plan = self.plans.get(opt)
            why = self._refusal(opt, args, kwargs)
            if why:
                if plan is not None:
                    self._give_back(opt, plan)
                self._off(opt, why)
                return
            if plan is None:
                if self._learning(opt):
                    return
                t0 = time.perf_counter()
                plan = self._adopt(opt)
                self.stats["adopt_s"] += time.perf_counter() - t0
                if plan is None:
                    return
            elif self.revise is not None and plan.timing is not None and plan.revised is not None:
                plan = self._revise(opt, plan)
                if plan is None:
                    return
            self._step(opt, plan)
        except Exception as e:  # never the reason a job dies
            plan = self.plans.get(opt)
            if plan is not None:
                self._give_back(opt, plan)
            self._off(opt, f"an error in the host step: {e!r}")

    def post_step(self, opt, args, kwargs):
        plan = self.plans.get(opt)
        if plan is None:
            marks = self.marks.get(opt)
            if marks and marks[-1][2] is None:  # a step the split streamed whole: its end
                marks[-1][2] = _mark(marks[-1][0])
            return
        for p, g in plan.hidden:
            p.grad = g
        plan.hidden = []
        for rec in plan.recs.values():
            if rec.fires:  # a step whose backward ran without the hooks (the first) teaches nothing
                plan.learned[id(rec.p)] = rec.fires
            rec.fires, rec.copied, rec.ended, rec.clip, rec.event = 0, None, None, [], None

    # --- adopting and stepping ------------------------------------------------------------------

    def _off(self, opt, why):
        if opt not in self.said:
            self.said[opt] = why
            transit_step.say(f"host step off for {type(opt).__name__}: {why}; its step runs as without the "
                             "adapter")

    def _refusal(self, opt, args, kwargs):
        if transit_step.raw_step(opt) is None:
            return f"not torch.optim's Adam, AdamW or SGD ({type(opt).__name__})"
        why = transit_step.step_refusal(opt, args, kwargs, [self.pre_step, self.post_step, *self.ours])
        if why:
            return why
        for group in opt.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is not None and (g.is_sparse or not _local(g).is_contiguous() or not _local(p).is_contiguous()):
                    return "a sparse or non-contiguous parameter or gradient"
        return None

    def _streams(self, device):
        import torch

        if device not in self.streams:  # down, up (the copy engines'), and _UpRing's device copies
            self.streams[device] = (torch.cuda.Stream(device), torch.cuda.Stream(device),
                                    torch.cuda.Stream(device, priority=-1))
        return self.streams[device]

    def _learning(self, opt):
        """True while the split streams this step whole (the first self.learn steps), its
        start marked; post_step marks its end."""
        marks = self.marks.setdefault(opt, [])
        if len(marks) >= self.learn:
            return False
        dev = next((p.device for g in opt.param_groups for p in g["params"]), None)
        if dev is None or dev.type not in TIMED_DEVICES:
            return False
        marks.append([dev, _mark(dev), None])
        return True

    def _timing(self, opt, nbytes):
        """(window_s, stream_s, nbytes) of the last step streamed whole, or None: the window
        from its end to this step's call, the step itself (of nbytes offloaded bytes)."""
        marks = self.marks.pop(opt, None)
        if not marks or marks[-1][2] is None:
            return None
        dev, pre, post = marks[-1]
        timing = _elapsed(post, _mark(dev)), _elapsed(pre, post), nbytes
        self.stats["window_s"], self.stats["stream_s"] = (round(t, 4) for t in timing[:2])
        return timing

    def _adopt(self, opt, old=None, share=None):
        """At the first step (in the split, the first after its timed steps): the parameters
        whose state the budget cannot hold (by group order, the first ones fit) are offloaded;
        of those, the last in forward order, up to the share of their bytes that self.share
        gives (all without one), get host copies, chunks and hooks. The rest are left to the application's step: in the split, the
        streamed step installed after this one (the next forward reads the first layers
        first, so the CPU's chunks, which it waits for, are the last layers').
        Again at a revised share (_revise): old's parameters that stay keep their host copies
        and state, those that leave get their state back (_return_state), and the plan is old
        itself when the share picks the same parameters."""
        import torch

        plan = _Plan(opt)
        per_param = state_tensors(opt)
        left = {}
        offloaded = []  # (group index, parameter, its local tensor)
        cls = type(opt)
        resident = 0
        for gi, group in enumerate(opt.param_groups):
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                lp = _local(p).detach()
                dev = lp.device
                if dev not in left:  # no budget to ask (no shim, the CPU in tests): all of it on the host
                    left[dev] = self.room(dev) if self.room else 0
                need = lp.numel() * lp.element_size() * per_param
                if left[dev] is None or need <= left[dev]:
                    left[dev] = None if left[dev] is None else left[dev] - need
                    resident += 1
                    continue
                offloaded.append((gi, p, lp))
        plan.sizes = [lp.numel() * lp.element_size() for _, _, lp in offloaded]
        if old is None:
            plan.timing = self._timing(opt, sum(plan.sizes))
        else:
            plan.timing, plan.learned, plan.tried = old.timing, old.learned, old.tried
        host = self._host_share(opt, offloaded, plan.sizes, plan.timing, share)
        if old is not None:
            if host == set(old.recs):
                return old
            self._finish(old)
            self._copies_done()
            kept = {}  # id(param) -> (its _Rec, its host state)
            for gi, cpu, recs in old.chunks:
                for r in recs:
                    st = cpu.state.get(r.ph)
                    if id(r.p) in host:
                        kept[id(r.p)] = (r, st)
                    elif st:
                        self._return_state(opt, gi, r, st)
            for h in old.handles:
                h.remove()
            self._count(old, -1)
        dtensor = False
        for gi, group in itertools.groupby((o for o in offloaded if id(o[1]) in host), key=lambda o: o[0]):
            chunk, size = [], 0
            for _, p, lp in group:
                rec, st = kept.get(id(p), (None, None)) if old is not None else (None, None)
                if rec is None:
                    # pinned of its exact size on huge pages where the parameter is on a GPU
                    host_copy = transit_staging.pinned if lp.device.type == "cuda" else torch.empty
                    ph = host_copy(lp.shape, dtype=lp.dtype)
                    ph.copy_(lp)
                    gh = host_copy(lp.shape, dtype=lp.dtype)
                    rec = _Rec(p, ph, gh)
                self._bounce(lp.device)
                dtensor |= hasattr(p, "to_local")
                plan.recs[id(p)] = rec
                plan.handles.append(p.register_post_accumulate_grad_hook(self.on_grad))
                chunk.append((rec, st))
                size += lp.numel() * lp.element_size()
                if size >= CHUNK_BYTES:
                    plan.chunks.append(self._chunk(cls, opt, gi, chunk))
                    chunk, size = [], 0
            if chunk:
                plan.chunks.append(self._chunk(cls, opt, gi, chunk))
        plan.counts = (len(plan.recs), len(offloaded) - len(plan.recs), resident)
        plan.host_bytes = sum(r.local.numel() * r.local.element_size() for r in plan.recs.values())
        self._count(plan, 1)
        if old is not None:
            self.plans.pop(opt, None)
        if not plan.recs:
            self._off(opt, "the streamed step has all of its state" if offloaded else
                      "its state fits the GPU budget: nothing to step on the host")
            return None
        self.plans[opt] = plan
        if self.gate is None:  # on the thread that steps; not at install, which runs inside `import torch`
            self._push_gate()
        # what reads the state or the parameters outside a forward waits for the step in flight
        plan.handles.append(opt.register_state_dict_pre_hook(lambda o: self._finish(plan)))
        plan.handles.append(opt.register_load_state_dict_pre_hook(lambda o, sd: self._finish(plan)))
        if self.on_host and old is None:
            self.on_host()
        if dtensor and old is None:
            transit_step.say(f"host step for {cls.__name__}: {DTENSOR_STATE}")
        return plan

    def _count(self, plan, sign):
        for key, n in zip(("host_params", "stream_params", "resident_params"), plan.counts):
            self.stats[key] += sign * n

    def _revise(self, opt, plan):
        """The split's share, found from the host steps themselves. Each plan's steps are timed
        (from each one's call to the next's, revise_steps of them; the first, the one that made
        the plan, left out). The first plan's give the CPU's seconds a byte as they ran, and the
        share self.revise makes of them is made the plan; then the shares next to the fastest so
        far are timed in turn (self.search) until neither is faster, and the fastest of all is
        kept. The step streamed whole is the share 0.0 among them: fastest, the host path gives
        its state back and the streamed step takes all of it. The plan to step with, or None (off)."""
        self._finish(plan)
        if self.plans.get(opt) is not plan:  # the worker failed: given back
            return None
        dev = next(iter(plan.recs.values())).local.device
        plan.times.append((_mark(dev), plan.cpu_s))
        if len(plan.times) <= self.revise_steps:
            return plan
        times, plan.times = plan.times, []
        step_s = statistics.median(_elapsed(a, b) for (a, _), (b, _) in zip(times, times[1:]))
        self.stats["step_s"] = round(step_s, 4)
        window, stream, _ = plan.timing
        tried, levels = plan.tried, _levels(plan.sizes)
        tried.setdefault(0.0, window + stream)
        tried[levels[len(plan.recs) - 1]] = step_s  # its host parameters are the last len(recs) offloaded
        self.stats["tried"] = [[k, round(v, 4)] for k, v in sorted(tried.items())]
        share = None
        if not plan.revised:
            cpu_byte_s = (times[-1][1] - times[0][1]) / (len(times) - 1) / plan.host_bytes
            self.stats["run_cpu_ns_per_byte"] = round(cpu_byte_s * 1e9, 4)
            share = min(1.0, max(0.0, float(self.revise(self.clip_seen, plan.timing, cpu_byte_s))))
            self.stats["revised_share"] = round(share, 3)
            n = _pick(plan.sizes, share)
            if n == 0 or levels[n - 1] in tried:  # no parameter, or these timed already: the search goes on
                share = None
        plan.revised = True
        if share is None and self.search is not None:
            share = self.search(tried, levels)
        if share is None:  # settled: the fastest of the shares timed
            plan.revised = None
            best = min(tried, key=tried.get)
            if best == 0.0:
                self._give_back(opt, plan)
                self._off(opt, f"the step streamed whole was faster ({tried[0.0]:.3f} s against "
                               + ", ".join(f"{v:.3f} s at {k:.2f}" for k, v in sorted(tried.items()) if k)
                               + " of the offloaded bytes on the host): it takes all of it")
                return None
            share = best
        new = self._adopt(opt, old=plan, share=share)
        if new is not None and new is not plan:
            new.revised = plan.revised
        return new

    def _bounce(self, dev):
        """The device's bounce buffers (down, up), made once (said once when none can be had:
        the copies then go direct, stalling the compute stream under the shim)."""
        if dev in self.bounces:
            return
        self.bounces[dev] = (None, None)
        if self.device_memory is None:
            return
        mem, why = transit_staging.device_buffer(self.device_memory, dev, 2 * self.bounce_bytes, self,
                                                 "bounce buffer of the host step")
        if mem is None:
            transit_step.say(f"host step: {why}: its copies on {dev} go direct")
            return
        self.bounces[dev] = (_DownRing(mem[:self.bounce_bytes]), _UpRing(mem[self.bounce_bytes:]))

    def _host_share(self, opt, offloaded, sizes, timing, share=None):
        """The ids of the offloaded parameters (sizes: their bytes) the CPU steps: the last ones
        in forward order while their bytes stay within share x all offloaded bytes (to the
        nearest parameter, _pick); the share self.share gives where none is given."""
        if not offloaded:
            return set()
        if share is None:
            share = 1.0 if self.share is None else min(1.0, max(0.0, float(self.share(opt, self.clip_seen, timing))))
        self.stats["share"] = round(share, 3)
        n = _pick(sizes, share)
        return {id(p) for _, p, _ in offloaded[len(offloaded) - n:]}

    def _chunk(self, cls, opt, gi, items):
        """A CPU optimizer of the application's class over these host copies ([(rec, its host
        state or None)]): a host state carried over (a revised share) is taken as it is, else
        the state the application's optimizer has (a loaded state_dict, the split's streamed
        steps) is moved into it."""
        import torch

        hyper = {k: v for k, v in opt.param_groups[gi].items() if k not in ("params", "foreach", "fused")}
        recs = [r for r, _ in items]
        cpu = cls([r.ph for r in recs], **{k: v for k, v in hyper.items() if k in cls.__init__.__code__.co_varnames},
                  fused=True)
        for r, st in items:
            old = opt.state.get(r.p)
            if st:
                cpu.state[r.ph] = st
            elif old:
                cpu.state[r.ph] = {k: _local(v).detach().to("cpu", copy=True) if torch.is_tensor(v) else v
                                   for k, v in old.items()}
            if not hasattr(r.p, "to_local"):
                opt.state[r.p] = cpu.state[r.ph]  # one dict: state_dict() sees the host state
            elif old:  # the streamed steps' state, taken in: not left behind stale (DTENSOR_STATE)
                del opt.state[r.p]
        return gi, cpu, recs

    def _step(self, opt, plan):
        """The step's host work handed to the worker (_run), chunk by chunk; what must happen
        on this thread (the hyper-parameters read, a gradient copied again, the clip's
        coefficient sent down) happens here first. The parameters stepped on the host are
        hidden from the application's own step and enter the gate (_gate) until sent up."""
        import torch

        self._finish(plan)
        if self.plans.get(opt) is not plan:  # the last step's worker failed: given back
            return
        self._resync(opt, plan)
        chunks, synced, coefs = [], set(), {}
        for gi, cpu, recs in plan.chunks:
            for k, v in opt.param_groups[gi].items():
                if k not in ("params", "foreach", "fused"):
                    cpu.param_groups[0][k] = v
            live = [r for r in recs if r.p.grad is not None]
            for r in recs:
                r.ph.grad = r.gh if r.p.grad is not None else None
            if live:
                chunks.append(_Chunk(cpu, live, [self._gradient(plan, r, synced, coefs) for r in live]))
        plan.hidden = [(r.p, r.p.grad) for r in plan.recs.values() if r.p.grad is not None]
        for p, _ in plan.hidden:
            p.grad = None  # torch's step skips a parameter without a gradient
        self.stats["steps"] += 1
        if not chunks:
            return
        # the worker's intra-op threads (a per-thread setting): the application's less one, the core
        # its own thread keeps (it launches the next forward, or spins in a CUDA sync): a team
        # thread sharing that core would hold back the whole team at every parallel region's end
        job = plan.job = _Job(chunks[0].live[0].local.device, chunks, max(1, torch.get_num_threads() - 1))
        for c in chunks:
            for r in c.live:
                self.pending.setdefault(r.local.untyped_storage().data_ptr(), []).append(c)
        if self.worker is None:
            # imported here: every process of an adapter job imports this module at start-up
            from concurrent.futures import ThreadPoolExecutor

            self.worker = ThreadPoolExecutor(1, thread_name_prefix="transit-host-step")
        dtensor = hasattr(chunks[0].live[0].p, "to_local")
        job.future = self.worker.submit(self._run, None if dtensor else opt, job)

    def _run(self, opt, job):
        """The worker: each chunk once its gradients are on the host, the first in forward's
        order among those that are (backward sends the last layers first; the next forward
        reads the first layers first); its parameters are sent up by the sender thread
        (_send_up) while the worker steps the next chunk (issuing a chunk's copies is Python
        and CUDA calls, which would hold back the CPU steps behind them)."""
        import torch

        clock = time.perf_counter
        sends = []
        try:
            if torch.get_num_threads() != job.threads:
                torch.set_num_threads(job.threads)
            left = list(job.chunks)
            while left:
                c = next((c for c in left if c.landed()), left[-1])
                left.remove(c)
                t0 = clock()
                for r, ev, coef in c.items:
                    if ev is not None:
                        ev.synchronize()
                    if coef is not None:
                        if coef[1] is not None:
                            coef[1].synchronize()
                        t1 = clock()
                        r.gh.mul_(coef[0])
                        self._add_grads_s(clock() - t1)
                        t0 += clock() - t1
                t1 = clock()
                self.stats["wait_s"] += t1 - t0
                transit_step.raw_step(c.cpu)(c.cpu)
                job.cpu_s += clock() - t1
                self.stats["cpu_s"] += clock() - t1
                if opt is not None:
                    for r in c.live:
                        opt.state[r.p] = c.cpu.state[r.ph]
                sent = None
                if SEND_BESIDE:
                    try:
                        sent = self._sender().submit(self._send_up, job, c)
                    except RuntimeError:  # the interpreter exits (its sender thread told to end): sent here,
                        for f in sends:    # after the sends before it, whose ring it shares
                            f.result()
                if sent is not None:
                    sends.append(sent)
                else:
                    self._send_up(job, c)
        except Exception as e:  # said and given back by _finish, on the application's thread
            job.error = e
        finally:
            for f in sends:  # the ring is the sender's until its last copy is issued
                e = f.exception()
                if e is not None and job.error is None:
                    job.error = e
            for c in job.chunks:
                c.done.set()

    def _sender(self):
        if self.sender is None:
            from concurrent.futures import ThreadPoolExecutor

            self.sender = ThreadPoolExecutor(1, thread_name_prefix="transit-host-up")
        return self.sender

    def _send_up(self, job, c):
        """Chunk c's parameters sent up (through the up ring where there is one), after the
        kernels that read them in backward; c.up and c.done set for the gate."""
        import torch

        t0 = time.perf_counter()
        ring = self.bounces.get(job.device, (None, None))[1]
        gpu = job.device.type == "cuda"
        up = dev = None
        if gpu:
            torch.cuda.set_device(job.device)
            _, up, dev = self._streams(job.device)
            if ring is None:
                dev = up  # no ring: copied direct, on the copy stream
        for r in c.live:
            if gpu and r.event is not None:  # written after the kernels that read it in backward
                dev.wait_event(r.event)
            if ring is not None and r.local.is_contiguous():
                ring.send(r.local, r.ph, up, dev)
            elif gpu:
                with torch.cuda.stream(dev):
                    r.local.copy_(r.ph, non_blocking=True)
            else:
                r.local.copy_(r.ph)
            r.pver = r.local._version
        if gpu:
            c.up = dev.record_event()
        self.stats["up_s"] += time.perf_counter() - t0
        c.done.set()

    def _gradient(self, plan, rec, synced, coefs):
        """What the worker needs to make rec's host gradient equal to what the step would
        read: (rec, the copy down's event, the clip's (coefficient, event)) for the copy made
        at its final hook, unchanged since backward ended or changed only by one clipping;
        else it is copied again here, now (after the GPU's work so far)."""
        import torch

        g = rec.p.grad
        version = _local(g)._version
        fresh = (rec.copied is g and rec.ended is not None
                 and rec.fires == plan.learned.get(id(rec.p), rec.fires))  # no gradient after the copy
        clipped = fresh and len(rec.clip) == 1 and rec.clip[0][1] == version and not self.clip_broken
        if fresh and (clipped or not rec.clip and version == rec.ended):
            if not clipped:
                return rec, rec.event, None
            coef = rec.clip[0][0]
            if id(coef) not in coefs:  # sent down once, after the clip's kernels
                host = torch.empty((), dtype=coef.dtype, pin_memory=coef.is_cuda)
                host.copy_(coef, non_blocking=True)
                ev = torch.cuda.current_stream(coef.device).record_event() if coef.is_cuda else None
                coefs[id(coef)] = (host, ev)
            self.stats["clipped"] += 1
            return rec, rec.event, coefs[id(coef)]
        t0 = time.perf_counter()
        dev = rec.local.device
        if dev.type == "cuda" and dev not in synced:
            torch.cuda.current_stream(dev).synchronize()
            synced.add(dev)
        self.stats["recopied"] += 1
        rec.gh.copy_(_local(g))
        self._add_grads_s(time.perf_counter() - t0)
        return rec, None, None

    def _resync(self, opt, plan):
        """What changed outside the host path since the last step is taken in: a parameter
        written on the GPU (a loaded checkpoint, a weight constraint) is copied down, a state
        the application's optimizer was given (load_state_dict) is moved to the host."""
        import torch

        for _, cpu, recs in plan.chunks:
            for r in recs:
                if r.local._version != r.pver:
                    r.ph.copy_(r.local)
                    r.pver = r.local._version
                st = opt.state.get(r.p)
                if st and not hasattr(r.p, "to_local") and st is not cpu.state.get(r.ph):
                    cpu.state[r.ph] = {k: v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v
                                       for k, v in st.items()}
                    opt.state[r.p] = cpu.state[r.ph]

    def _give_back(self, opt, plan):
        """The host path stops for this optimizer: its state and parameters go back to the
        application's own step."""
        self._finish(plan)
        self._copies_done()
        for gi, cpu, recs in plan.chunks:
            for r in recs:
                st = cpu.state.get(r.ph)
                if st:
                    self._return_state(opt, gi, r, st)
        for h in plan.handles:
            h.remove()
        self.plans.pop(opt, None)
        self._drop_gate()
        self._drop_bounces()

    def _drop_bounces(self):
        """No plan left: the bounce buffers go back to the GPU budget. Held, they keep as much of
        what the budget held (at advise's ranking, the coldest: state stepped in place) on the
        host, read zero-copy, for the rest of the job. A plan made later makes them again."""
        import torch

        if self.plans:
            return
        held = [(dev, down) for dev, (down, _up) in self.bounces.items() if down is not None]
        self.bounces.clear()
        if not held:
            return
        for dev, _ in held:  # the compute streams' copies into the down rings, then the copy streams'
            if dev.type == "cuda":
                torch.cuda.current_stream(dev).synchronize()
        self._copies_done()
        for _, down in held:
            transit_staging.give_back(down.mem)  # down's is the buffer's start (_bounce)

    def _drop_gate(self):
        """No plan left (every optimizer given back): the gate leaves the mode stack, where it
        is on top (a Python call for every torch function is not free); else it stays,
        letting everything through."""
        from torch.overrides import _get_current_function_mode_stack

        if self.plans or self.gate is None:
            return
        stack = _get_current_function_mode_stack()
        if stack and stack[-1] is self.gate:
            self.gate.__exit__(None, None, None)
            self.gate = None

    def _copies_done(self):
        """The host copies' last reads and writes on the copy streams (the copies up) done."""
        for streams in self.streams.values():
            for stream in streams:
                stream.synchronize()

    def _return_state(self, opt, gi, rec, st):
        """rec's host state back in opt.state, where torch's step keeps it: on the parameter's
        device (in the split, in a pinned home the streamed step streams: self.home; a
        DTensor's as a DTensor of the parameter's placement), the step count on it only for
        fused or capturable steps (as torch's load_state_dict puts it)."""
        import torch

        group = opt.param_groups[gi]
        step_on_device = bool(group.get("fused") or group.get("capturable"))
        p, out = rec.p, {}
        for k, v in st.items():
            if not torch.is_tensor(v) or (k == "step" and not step_on_device):
                out[k] = v
                continue
            homed = self.home is not None and k != "step" and v.shape == rec.local.shape
            t = self.home(v, rec.local.device, opt) if homed else v.to(rec.local.device)
            if hasattr(p, "to_local") and k != "step" and t.shape == rec.local.shape:
                from torch.distributed.tensor import DTensor

                t = DTensor.from_local(t, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                       stride=p.stride())
            out[k] = t
        opt.state[p] = out
