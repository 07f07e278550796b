"""TRANSIT_OVERLAP_STEP=stream (the default under advise): the optimizer step streamed
through the copy engines.

Under advise the step reads and writes the state zero-copy from the host: the SMs wait on
PCIe. Here the step of an Adam, AdamW or SGD runs when the application calls it (after
clipping, GradScaler, anything: it needs no early gradient) in slices of at most a quarter of
the staging ring: each slice's state is copied to the ring on one stream, torch's own step
runs on the slice on a second, and the result is copied home on a third, so copies in, updates
and copies out of successive slices overlap, on the copy engines. Optimizers inside a
container (TorchTitan's OptimizersContainer) are stepped, and so streamed, one by one.

The state the GPU budget cannot hold lives in pinned host memory (transit_staging.py's homes;
under the shim the state pool has it made there, so nothing is copied to get it home); the
state the budget holds stays on the GPU and its parameters are left to the application's step. A parameter of any size is cut
into flat slices: the updates of Adam, AdamW and SGD are elementwise (docs/lifetime-policy.md),
so a slice updated alone gets the values the whole step would give it. Each slice steps with
its own copy of the parameter's step count, which is then written back once.

The first step of an Adam or AdamW streams too. Its state does not exist before it: the
adapter has the optimizer's own `_init_group` make it, with torch.zeros_like made empty_like
(_Unfilled), so the new state's pinned pages are not written with zeros over PCIe; each slice
then starts from zeros written in the ring, on the GPU, and its copy home writes every byte.
Whatever no slice wrote (a refusal, an error part-way) gets its zeros in place, as torch's
init would have written them. SGD's first step is not streamed (its momentum buffer starts as
the gradient itself, not zeros).

What is not streamed steps as without the adapter, said once per optimizer: other optimizer
classes, a closure, step hooks that are not the adapter's, param groups torch's step would
treat differently per subset (see transit_step.group_refusal), non-contiguous or sparse
tensors, a state homed in part.
"""

import atexit
import weakref

import transit_step  # the verified step (raw_step) and the refusals the step modes share
import transit_staging

ALIGN_ELEMS = 4096  # a slice starts at a multiple of this many elements (see _slices)
# optimizers whose first step's state is all zeros (exp_avg, exp_avg_sq, max_exp_avg_sq): that
# step can stream from zeros written on the GPU (transit_step.KNOWN holds the exact classes)
ZERO_STATE = ("Adam", "AdamW")
# the arguments of Adam's _init_group besides `group` (torch 2.11 passes amsgrad, 2.13 does
# not): the lists it fills, and amsgrad, taken from the group
INIT_LISTS = ("params_with_grad", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs", "state_steps")


class StreamedStep:
    """Global optimizer step pre/post hooks. pre_step streams the step and hides the gradients
    of what it updated from the application's step (torch's steps skip a parameter without a
    gradient); post_step gives them back and homes new state."""

    def __init__(self, staging, ours=()):
        self.staging = staging          # transit_staging.Staging: homes, rings, streams
        self.ours = list(ours)          # the adapter's other step hooks: not foreign
        self.said = weakref.WeakKeyDictionary()    # optimizer -> why it steps unstreamed (said once)
        self.hidden = weakref.WeakKeyDictionary()  # optimizer -> [(param, grad)] hidden from its step
        self.streamed = 0               # parameters streamed, all steps (tests, logs)
        self.slices = 0                 # slices streamed, all steps
        self.resident = 0               # parameters stepped in place (their state on the GPU), all steps
        self.handles = []
        self.entered = []               # parameters whose slices entered torch's step in this call
        self.align = transit_staging.ALIGN  # bytes: each buffer's start in the ring
        self.local = transit_staging.storage_tensor  # a DTensor's local tensor (its storage), else the tensor
        self.steps = 0                  # optimizer steps streamed
        self.fresh = {}                 # data_ptr of a pinned state made unfilled -> [it, (start, end) written]
        self.unfilled = 0               # bytes of first-step state made without zeros over PCIe
        atexit.register(self.report)

    def counters(self):
        """What the stats report's "adapter" object holds of the streamed step."""
        return {"steps": self.steps, "streamed_params": self.streamed, "slices": self.slices,
                "resident_params": self.resident, "ring_bytes": self.staging.limit, "unfilled_bytes": self.unfilled}

    def report(self):
        if self.steps and self.staging.streams:  # streamed on a GPU (the CPU path is for tests)
            transit_step.say(
                f"{self.steps} optimizer steps streamed through the copy engines ({self.streamed} parameters, "
                f"{self.slices} slices; a {self.staging.limit / 2**20:.0f} MiB ring on each GPU; {self.resident} "
                "parameters stepped in place, their state held on the GPU by the budget; "
                f"{self.unfilled / 1e9:.2f} GB of first-step state started from zeros in the ring)")

    def install(self):
        from torch.optim import optimizer as o

        self.handles = [o.register_optimizer_step_pre_hook(self.pre_step),
                        o.register_optimizer_step_post_hook(self.post_step)]

    def uninstall(self):
        for h in self.handles:
            h.remove()

    # --- the hooks ---------------------------------------------------------------------------

    def pre_step(self, opt, args, kwargs):
        raw = transit_step.raw_step(opt)
        if raw is None:
            if not transit_step.is_container(opt):  # a container's step only calls its optimizers' (each hooked)
                self._once(opt, f"not torch.optim's Adam, AdamW or SGD ({type(opt).__name__})")
            return
        try:
            why = self._why_not(opt, args, kwargs)
            if why:
                self._once(opt, why)
                return
            self.entered = []
            self._hide(opt, self._stream(opt, raw))
        except Exception as e:  # never the reason a job dies
            # A parameter whose slice entered torch's step may have been written (in part): the
            # application's step must not update it again. What never entered, the step does.
            hit = list({id(p): p for p in self.entered}.values())
            self._once(opt, f"an error while streaming: {e!r}" + (
                f"; {len(hit)} parameter(s) updated in part or whole are not stepped again: this step is not "
                "bit-identical" if hit else ""))
            self._hide(opt, hit)

    def _hide(self, opt, params):
        """The application's step skips these (torch's steps skip a parameter without a
        gradient); post_step gives the gradients back."""
        self.hidden[opt] = [(p, p.grad) for p in params]
        for p in params:
            p.grad = None

    def post_step(self, opt, args, kwargs):
        for p, g in self.hidden.pop(opt, []):
            p.grad = g
        if transit_step.raw_step(opt) is None:
            return
        try:
            self.staging.home(opt)  # new state (the first step, a loaded state_dict) goes home
            self.staging.stepped()  # the next in-copies read what this step wrote
        except Exception as e:
            self._once(opt, f"an error while homing its state: {e!r}")

    # --- what is streamed --------------------------------------------------------------------

    def _once(self, opt, why):
        if opt not in self.said:
            self.said[opt] = why
            transit_step.say(f"step streaming off for {type(opt).__name__}: {why}; its step runs as without the "
                             "adapter")

    def _why_not(self, opt, args, kwargs):
        if opt in self.said:
            return self.said[opt]
        return transit_step.step_refusal(opt, args, kwargs, [self.pre_step, self.post_step, *self.ours])

    def _items(self, opt, group):
        """([(param, state keys)] of the group's parameters with a gradient and a pinned home,
        None) when all of those can stream this step, else (None, why); why is None where a
        parameter has no state yet (an optimizer _make_state does not make, such as SGD's
        first step: the state is made by the application's step, then homed). A state the
        budget holds on the GPU has no home: its parameter is left to the application's step."""
        items = []
        for p in group["params"]:
            g = p.grad
            if g is None:
                continue
            state = opt.state.get(p, {})
            if not state:
                return None, None
            keys = self.staging.staged_keys(state, p)
            if not keys:
                return None, "a parameter without parameter-shaped floating-point state"
            lp, lg = self.local(p), self.local(g)
            if not (lp.is_contiguous() and not lg.is_sparse and lg.is_contiguous() and lg.dtype == lp.dtype):
                return None, "a non-contiguous or sparse parameter or gradient"
            homed = [self.local(state[k]).data_ptr() in self.staging.homes for k in keys]
            if not any(homed):
                self.resident += 1  # held by the budget on the GPU (or not on a GPU): stepped in place
                continue
            items.append((p, keys))  # (a key the budget held is read where it is: _stream_batch)
        return items, None

    def _stream(self, opt, raw):
        """Stream every group's step; the parameters updated ([] when this step cannot be:
        then the application's step makes all of it)."""
        self._make_state(opt)
        try:
            return self._stream_made(opt, raw)
        finally:
            self._fill_left()

    def _make_state(self, opt):
        """The state an Adam's or AdamW's step is about to make (its parameters with a gradient
        and no state yet), made now by the optimizer's own _init_group (the state pool's
        wrapper, when routed) but unfilled. Its pinned tensors go to self.fresh, to be started
        from zeros in the ring; what the budget keeps on the GPU is zeroed there at once."""
        import inspect

        if type(opt).__name__ not in ZERO_STATE or transit_step.raw_step(opt) is None:
            return
        new = [p for g in opt.param_groups for p in g["params"] if p.grad is not None and not opt.state.get(p)]
        if not new:
            return
        names = list(inspect.signature(type(opt)._init_group).parameters)[1:]
        if names[:1] != ["group"] or not set(names[1:]) <= {"amsgrad", *INIT_LISTS}:
            self._once(opt, f"{type(opt).__name__}._init_group{tuple(names)} is not the signature verified")
            return
        mode = _unfilled()
        try:
            with mode:
                for group in opt.param_groups:
                    opt._init_group(group, **{n: group["amsgrad"] if n == "amsgrad" else [] for n in names[1:]})
        except BaseException:
            for p in new:  # made in part: the application's step makes it again, whole
                opt.state.pop(p, None)
            raise
        self.staging.home(opt)  # which of it the shim pinned (homes) and which the budget kept
        for t in map(self.local, mode.made):
            if t.data_ptr() in self.staging.homes:
                self.fresh[t.data_ptr()] = [t, []]
                self.unfilled += t.numel() * t.element_size()
            else:
                t.zero_()  # on the GPU (or the CPU): no PCIe

    def _fill_left(self):
        """Zeros in place wherever no slice wrote a state made unfilled (a refusal, no ring,
        an error part-way): what torch's init would have written."""
        fresh, self.fresh = self.fresh, {}
        for t, spans in fresh.values():
            flat, at = t.detach().view(-1), 0
            for a, b in sorted(spans) + [(flat.numel(), flat.numel())]:
                if a > at:
                    flat[at:a].zero_()
                at = max(at, b)

    def _stream_made(self, opt, raw):
        plans = []
        for group in opt.param_groups:
            items, why = self._items(opt, group)
            if items is None:
                if why:
                    self._once(opt, why)
                return []
            plans.append((group, items))
        if any(self.staging.ring(self.local(items[0][0]).device) is None for _, items in plans if items):
            return []  # no ring (said by staging): the step reads the state in place
        done = []
        for group, items in plans:
            if items:
                self._stream_group(opt, raw, group, items)
                done += [p for p, _ in items]
        for dev in {self.local(p).device for p in done}:
            if dev.type == "cuda":
                self.staging.wait(dev)  # the application's stream waits for the last copies home
        self.streamed += len(done)
        self.steps += bool(done)
        return done

    def _slices(self, opt, items, cap):
        """Batches of flat slices (param, keys, start, end), each batch at most `cap` bytes of
        homed state; a slice starts at a multiple of ALIGN_ELEMS (kernels split a slice into the
        same vector body and tail as the whole tensor)."""
        batch, size = [], 0
        for p, keys in items:
            homed = [t for t in (self.local(opt.state[p][k]) for k in keys) if t.data_ptr() in self.staging.homes]
            per = sum(t.element_size() for t in homed)  # homed state bytes per element
            n = self.local(p).numel()
            step = max(ALIGN_ELEMS, cap // per // ALIGN_ELEMS * ALIGN_ELEMS)
            for a in range(0, n, step):
                b = min(n, a + step)
                if batch and size + (b - a) * per > cap:
                    yield batch
                    batch, size = [], 0
                batch.append((p, keys, a, b))
                size += (b - a) * per
        if batch:
            yield batch

    def _stream_group(self, opt, raw, group, items):
        import torch

        st = self.staging
        dev = self.local(items[0][0]).device
        streams = st.copy_streams(dev) if dev.type == "cuda" else None
        ring, mem = st.ring(dev)
        if streams:
            s_in, s_upd, _ = streams
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(dev))  # the gradients as the step sees them (clipped)
            s_in.wait_event(ready)  # ... and the previous step's copies home, which the stream waited for
            s_upd.wait_event(ready)
            st.after_step.pop(dev, None)  # covered by `ready`
        counts = {}  # param -> its step count after the step (every slice's is the same)
        try:
            with st.lock:
                for batch in self._slices(opt, items, min(st.batch, ring.size)):
                    self._stream_batch(opt, raw, group, batch, ring, mem, streams, counts)
        finally:  # also after an error: what entered the step has counted it
            self._write_counts(opt, counts, streams[1] if streams else None)

    def _write_counts(self, opt, counts, stream):
        """The step count, once per parameter, after its slices."""
        import torch

        with transit_staging.on_stream(stream):
            for p, c in counts.items():
                own = opt.state[p]
                if torch.is_tensor(own["step"]):
                    own["step"].copy_(c)
                else:
                    own["step"] = c

    def _step_views(self, opt, raw, group, s_upd, counts, entries):
        """torch's step (raw) on s_upd over flat views of parameters, entries [(param, start,
        end, {key: state tensor})], each view with its own copy of its parameter's step count
        (left in counts, written back once by _write_counts)."""
        import torch

        views, groups = [], opt.param_groups
        try:
            with transit_staging.on_stream(s_upd):
                for p, a, b, state in entries:
                    v = self.local(p).detach().view(-1)[a:b]
                    v.grad = self.local(p.grad).detach().view(-1)[a:b]
                    own = opt.state[p]
                    if "step" in own:  # its own count: the parameter's is advanced once, after
                        state["step"] = own["step"].clone() if torch.is_tensor(own["step"]) else own["step"]
                    opt.state[v] = state
                    views.append((p, v))
                opt.param_groups = [dict(group, params=[v for _, v in views])]
                self.entered += [p for p, _ in views]
                raw(opt)
        finally:
            opt.param_groups = groups
            for p, v in views:
                state = opt.state.pop(v)
                if "step" in state:
                    counts[p] = state["step"]

    def _stream_batch(self, opt, raw, group, batch, ring, mem, streams, counts):
        import torch

        s_in, s_upd, s_out = streams or (None, None, None)
        layout, size = [], 0  # (param, key, start, end, state tensor, offset in the batch's buffer)
        bufs = {}
        homes = self.staging.homes
        for p, keys, a, b in batch:
            for k in keys:
                t = self.local(opt.state[p][k])
                if t.data_ptr() not in homes:  # a state the budget held on the GPU: its slice, in place
                    bufs[(id(p), k, a)] = t.detach().view(-1)[a:b]
                    continue
                layout.append((p, k, a, b, t, size))
                size += -(-(b - a) * t.element_size() // self.align) * self.align
        base, wait = ring.take(size)  # (size > 0: every item has a homed key, _items)
        if wait is not None:  # its bytes are reused: after their copy home (on the GPU)
            s_in.wait_event(wait)
        with transit_staging.on_stream(s_in):
            for p, k, a, b, t, off in layout:
                buf = mem[base + off:base + off + (b - a) * t.element_size()].view(t.dtype)
                if t.data_ptr() in self.fresh:  # made unfilled (_make_state): its first values are zeros
                    buf.zero_()
                else:
                    buf.copy_(homes[t.data_ptr()].view(-1)[a:b], non_blocking=True)
                bufs[(id(p), k, a)] = buf
        if streams:
            s_upd.wait_stream(s_in)
        try:
            self._step_views(opt, raw, group, s_upd, counts,
                             [(p, a, b, {k: bufs[(id(p), k, a)] for k in keys}) for p, keys, a, b in batch])
        finally:
            if streams:
                s_out.wait_stream(s_upd)
            with transit_staging.on_stream(s_out):
                for p, k, a, b, t, _off in layout:
                    homes[t.data_ptr()].view(-1)[a:b].copy_(bufs[(id(p), k, a)], non_blocking=True)
                    if t.data_ptr() in self.fresh:
                        self.fresh[t.data_ptr()][1].append((a, b))
            if streams:
                done = torch.cuda.Event()
                done.record(s_out)
                ring.done(done)  # whatever happened: the bytes are free after what was enqueued
            else:
                ring.done(None)
        self.slices += len(batch)


def _empty_like(*args, **kwargs):
    """torch.empty_like (tests poison it with NaN, so that a missed zero shows)."""
    import torch

    return torch.empty_like(*args, **kwargs)


def _unfilled():
    """A torch function mode under which torch.zeros_like makes an empty tensor (the state
    Adam's _init_group makes, then written whole by the streamed step); `made` lists them."""
    import torch
    from torch.overrides import TorchFunctionMode

    class Unfilled(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.made = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.zeros_like:
                t = _empty_like(*args, **kwargs)
                self.made.append(t)
                return t
            return func(*args, **kwargs)
    return Unfilled()

