"""TRANSIT_OVERLAP_STEP=host's split: the host step (transit_host.py) and the streamed step
(transit_streamed.py) on one job, and the share of the offloaded state each takes."""

import math
import os
import time

import transit_host  # the host step, and what a parameter's state weighs (state_tensors)
import transit_rules  # the environment's names (generated from transit_launch/rules.py)
import transit_step  # the verified step (raw_step), say

# The split streams a job's first steps whole and times the last of them (the first makes the
# state): the GPU's forward and backward, the streamed step; the host step adopts its share after
LEARN_STEPS = 2
# Host steps timed at that share before it is revised from the CPU's seconds as they ran (the
# first left out): the calibration runs apart from the job, its rate off by up to a quarter
REVISE_STEPS = 3
# The split's search (SplitShare.next_share): the shares tried next to the fastest so far are
# this far from it (at least one parameter), at most SEARCH_TRIALS of them after the revised one.
# The model's share is a start: the CPU's work slows the link's copies as the two share the host's
# memory, which no rate measured apart shows (bench/LOG.md)
SEARCH_STEP = 0.1
SEARCH_TRIALS = 4


class SplitShare:
    """share(opt, clipped, timing) for the split (HostStep's share): the fraction of the
    offloaded parameters' bytes whose update the CPU runs, the streamed step moving the rest's
    state. timing: (window_s, stream_s, nbytes) from the steps the split streamed whole before
    adopting (HostStep.learn): the GPU's seconds from one step's end to the next step's call
    (forward and backward), the streamed step's seconds for all nbytes offloaded parameter
    bytes. The CPU's seconds for them: cpu_s a parameter byte, measured once as the job runs it
    (torch's fused CPU step of the optimizer's class on CALIBRATE_ELEMS parameters, with the
    worker's threads and copies both ways in flight beside it). Balanced where the GPU's step
    (the window plus the streamed share) and the CPU's cycle end together:
    - unclipped, the CPU steps each chunk as its gradients land and until the next forward
      reads it: share x cpu = window + (1 - share) x stream;
    - clipped, no update starts before backward ends, and the CPU's chunks (the last layers)
      are read after the forward's first part (FORWARD_SHARE of the window, the part on the
      streamed layers): share x (cpu + fwd) = fwd + (1 - share) x stream.
    Without timing (no step streamed whole, a CPU): all of it unclipped; clipped, the link's
    rate (a pinned copy timed) in place of the streamed step's: share x cpu = (1 - share) x link."""

    # The forward's share of a step's forward and backward (a backward is about twice its forward)
    FORWARD_SHARE = 1 / 3
    CALIBRATE_ELEMS = 16 << 20
    BESIDE = 8  # copies each way in flight while the CPU steps (more than its step lasts)

    def __init__(self):
        self.measured = None  # (cpu_s, link_s) a parameter byte
        self.fixed = None     # TRANSIT_HOST_SHARE, a diagnostic: this share, clipped or not
        text = os.environ.get(transit_rules.ENV["HOST_SHARE"])
        if text is not None:
            try:
                value = float(text)
            except ValueError:
                value = math.nan
            if 0.0 <= value <= 1.0:
                self.fixed = value
            else:
                transit_step.say(f"{transit_rules.ENV['HOST_SHARE']}={text!r} is not a fraction from 0 to 1: "
                                 "the split's own share is used")

    def __call__(self, opt, clipped, timing=None):
        if self.fixed is not None:
            return self.fixed
        if timing is not None:
            return self._balance(clipped, timing, (self.measured or self._measure(opt))[0])
        if not clipped:
            return 1.0
        cpu_s, link_s = self.measured or self._measure(opt)
        return link_s / (cpu_s + link_s) if link_s else 1.0  # no GPU: no link to share the work with

    def revise(self, clipped, timing, cpu_byte_s):
        """The share again, from the CPU's seconds a parameter byte as the host steps ran
        (HostStep._revise); a fixed share stays."""
        return self.fixed if self.fixed is not None else self._balance(clipped, timing, cpu_byte_s)

    def next_share(self, tried, levels):
        """The share to time next, or None: settled. tried: {share: median step seconds} timed
        so far, 0.0 the step streamed whole; levels: the shares a plan can take, ascending. The
        neighbours of the fastest share above 0 (the nearest level SEARCH_STEP away or more, else
        the farthest there is on that side) are timed until both were, at most SEARCH_TRIALS
        beyond the first two; a fixed share is not searched."""
        if self.fixed is not None or len(tried) >= SEARCH_TRIALS + 2:
            return None
        center = min((s for s in tried if s > 0), key=tried.get, default=None)
        if center is None:
            return None
        above = [x for x in levels if x > center]
        below = [x for x in reversed(levels) if x < center]
        up = next((x for x in above if x >= center + SEARCH_STEP - 1e-9), above[-1] if above else None)
        down = next((x for x in below if x <= center - SEARCH_STEP + 1e-9), below[-1] if below else None)
        return next((x for x in (up, down) if x is not None and x not in tried), None)

    def _balance(self, clipped, timing, cpu_byte_s):
        window, stream, nbytes = timing
        cpu = cpu_byte_s * nbytes
        fwd = self.FORWARD_SHARE * window if clipped else 0.0
        rest = stream + (fwd if clipped else window)
        return min(1.0, max(0.0, rest / (cpu + fwd + stream))) if cpu + fwd + stream > 0 else 1.0

    def _measure(self, opt):
        import torch

        dev = next((p.device for g in opt.param_groups for p in g["params"] if p.device.type == "cuda"), None)
        n, clock = self.CALIBRATE_ELEMS, time.perf_counter
        link_s, beside = 0.0, None
        if dev is not None:
            src = torch.empty(n, pin_memory=True)
            back = torch.empty(n, pin_memory=True)
            dst = torch.empty(n, device=dev)
            stream = torch.cuda.current_stream(dev)
            dst.copy_(src, non_blocking=True)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(stream)
            dst.copy_(src, non_blocking=True)
            b.record(stream)
            b.synchronize()
            link_s = transit_host.state_tensors(opt) * a.elapsed_time(b) / 1e3 / (4 * n)
            beside = (torch.cuda.Stream(dev), torch.cuda.Stream(dev))
        x = torch.zeros(n)
        x.grad = torch.ones(n)
        cpu = type(opt)([x], fused=True)
        step = transit_step.raw_step(cpu)  # without the step hooks: ours would adopt it, sitecustomize's count it
        threads = torch.get_num_threads()
        torch.set_num_threads(max(1, threads - 1))  # the worker's (HostStep._step says why)
        try:
            step(cpu)  # the state made
            if beside is not None:
                for _ in range(self.BESIDE):
                    with torch.cuda.stream(beside[0]):
                        dst.copy_(src, non_blocking=True)
                    with torch.cuda.stream(beside[1]):
                        back.copy_(dst, non_blocking=True)
            t0 = clock()
            step(cpu)
            cpu_s = (clock() - t0) / (4 * n)
        finally:
            torch.set_num_threads(threads)
            if beside is not None:
                for st in beside:
                    st.synchronize()
        self.measured = (cpu_s, link_s)
        return self.measured


class Split:
    """The host step and the streamed step on one job (TRANSIT_OVERLAP_STEP=host): the host
    step's pre-step hook runs first and hides the gradients of the parameters the CPU steps,
    so the streamed step, after it, streams the rest (the offloaded parameters the share left
    it) and the application's step updates in place what the budget holds. Each counts the
    other's hooks as its own."""

    def __init__(self, host, stream):
        self.host, self.stream = host, stream
        host.learn = LEARN_STEPS  # the streamed step runs these whole first: their times set the share
        host.home = stream.staging.home_of  # a state given back is streamed from a pinned home
        if getattr(host.share, "fixed", None) is None:  # a fixed share (a diagnostic) is measured as given
            host.revise, host.revise_steps = getattr(host.share, "revise", None), REVISE_STEPS
            host.search = getattr(host.share, "next_share", None)
        host.ours += [stream.pre_step, stream.post_step]
        stream.ours += [host.pre_step, host.post_step]

    def install(self):
        self.host.install()
        self.stream.install()

    def uninstall(self):
        self.stream.uninstall()
        self.host.uninstall()

    def counters(self):
        out = self.host.counters()
        measured = getattr(self.host.share, "measured", None)
        if measured:
            out["cpu_ns_per_byte"], out["link_ns_per_byte"] = (round(x * 1e9, 4) for x in measured)
        return {**out, "stream": self.stream.counters()}
