"""How an early update of the overlapped step runs (TRANSIT_OVERLAP_STEP=1 or staged), once
transit_overlap.py has found a parameter's gradient final: torch's own step function
(plan.raw, transit_overlap.raw_step) on a param group that holds only that parameter (or a
batch of them), on a side stream beside backward on a GPU, or with its state staged through
transit_staging.py's ring; then the application's step waits for it and skips what was done
early.
"""

import threading


def local_tensor(t):
    """An FSDP2 DTensor's local shard (a view: it shares the version counter), else t."""
    return t.to_local() if hasattr(t, "to_local") else t


class EarlyUpdates:
    """The early updates of transit_overlap.Overlap (a base of it): what they run on and how.
    A plan (transit_overlap._Plan) holds one optimizer's updates in flight; the driver's
    _turn_off(plan, why) turns its overlap off after an error."""

    def __init__(self, staging):
        self.staging = staging  # transit_staging.Staging under "staged", else None
        self.lock = threading.RLock()  # hooks may run on several autograd device threads
        self.streams = {}       # device -> side stream for early updates
        self.early = 0          # parameters updated during backward, all steps (tests, logs)

    def _update(self, plan, rec, p, group):
        """The optimizer's own step on a group holding only p (and `group`'s hyper-parameters),
        on a side stream on a GPU."""
        import torch

        opt = plan.opt()
        local = local_tensor(p)
        if local.is_cuda and torch.cuda.is_current_stream_capturing():
            return  # inside a CUDA graph capture: leave it to the step
        keys = self.staging.stageable(opt, p) if self.staging else None
        if keys is not None:
            self._defer(plan, rec, p, keys)
            return
        if local.is_cuda:
            side = self.streams.get(local.device)
            if side is None:
                side = self.streams[local.device] = torch.cuda.Stream(device=local.device)
            # The side stream starts after the gradient is ready (this is the stream that made
            # it: the compute stream, or FSDP2's reduce-scatter stream) and runs while backward
            # goes on; the step's current stream waits for it (pre_step), before anything reads
            # the parameter or frees the gradient.
            side.wait_stream(torch.cuda.current_stream(local.device))
            plan.devices.add(local.device)
            with torch.cuda.stream(side):
                self._step_only(plan, group, p, entering=lambda: self._entering(rec))
        else:
            self._step_only(plan, group, p, entering=lambda: self._entering(rec))

    def _entering(self, rec):
        rec.done = True
        self.early += 1

    def _defer(self, plan, rec, p, keys):
        """A staged update waits for others of its group on its device: one staged step for
        several parameters costs the CPU about what one costs (torch's dispatch, the copies'
        calls). `ready` marks the gradient on the stream that made it (this hook's), which the
        staged step waits for whichever hook flushes the batch."""
        import torch

        local = local_tensor(p)
        ready = None
        if local.is_cuda:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(local.device))
        key = (rec.gi, str(local.device))
        with self.lock:  # autograd's device threads may defer and flush at once
            plan.pending.setdefault(key, []).append((rec, p, keys, ready))
            plan.pending_bytes[key] = plan.pending_bytes.get(key, 0) + self.staging.nbytes(plan.opt(), p, keys)
            full = plan.pending_bytes[key] >= self.staging.batch
        if full:
            self._flush(plan, key)

    def _flush(self, plan, key):
        """The pending staged updates of a param group on one device, as one step on their
        staged state."""
        with self.lock:
            batch = plan.pending.pop(key, [])
            plan.pending_bytes.pop(key, None)
        if not batch or plan.phase == "off" or plan.opt() is None:
            return  # not done: the step updates them
        opt = plan.opt()
        group = opt.param_groups[key[0]]
        ps = [p for _, p, _, _ in batch]
        local = local_tensor(ps[0])
        if local.is_cuda:  # before anything is enqueued: the step's stream must wait, whatever follows
            plan.devices.add(local.device)

        def entering():
            for rec, _, _, _ in batch:
                self._entering(rec)

        def step(swaps):
            self._step_only(plan, group, ps, swaps, entering)
        self.staging.update(opt, [(p, keys) for _, p, keys, _ in batch], step,
                            [r for _, _, _, r in batch if r is not None])

    def _flush_all(self, plan):
        try:
            for key in list(plan.pending):
                self._flush(plan, key)
        except Exception as e:  # raised here it would end the application's backward()
            plan.pending, plan.pending_bytes = {}, {}
            self._turn_off(plan, f"an error in a staged update: {e!r}")

    def _step_only(self, plan, group, ps, swaps=None, entering=None):
        """torch's step on the parameters ps (one, or a batch) alone; swaps: for each of
        them, state entries it uses instead of its own (staged copies), put back after.
        entering() runs just before torch's step: from there the parameters count as done,
        since a step that fails part-way (out of memory in its temporaries) may have written
        some tensors, which the application's step must not write again; the error then turns
        the overlap off as not bit-identical. An error before it leaves them to the step."""
        opt = plan.opt()
        ps = ps if isinstance(ps, list) else [ps]
        with self.lock:
            groups = opt.param_groups
            opt.param_groups = [dict(group, params=ps)]  # same hyper-parameters and path, these parameters
            saved = [(opt.state[p], {k: opt.state[p][k] for k in sw}) for p, sw in (swaps or {}).items()]
            for p, sw in (swaps or {}).items():  # (opt.state is a defaultdict: entries only for swaps)
                opt.state[p].update(sw)
            try:
                if entering:
                    entering()
                plan.raw(opt)
            finally:
                opt.param_groups = groups
                for state, old in saved:
                    state.update(old)

    def _sync(self, plan):
        if plan.devices:
            import torch

            for dev in plan.devices:
                if dev in self.streams:
                    torch.cuda.current_stream(dev).wait_stream(self.streams[dev])
                if self.staging:
                    self.staging.wait(dev)
            plan.devices = set()

    def _hide_done(self, plan):
        """The step must skip what was done early: torch's steps skip a parameter without a
        gradient. post_step gives the gradients back."""
        try:
            for rec in plan.params.values():
                p = rec.param
                if rec.done and p.grad is not None:
                    plan.hidden.append((p, p.grad))
                    p.grad = None
        except Exception as e:  # an exception here would end the application's step
            self._turn_off(plan, f"an error in its step hook: {e!r}")
