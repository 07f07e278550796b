"""TRANSIT_OVERLAP_STEP=1 or staged (opt-in, docs/lifetime-policy.md): the optimizer step
overlapped with backward. This module decides when a parameter's gradient is final (its hook
in each backward, the end of backward, the microbatches of a step) and whether the step will
be the verified torch step; transit_update.py runs the early update. Also the step's mode and
the verified-step checks transit_streamed.py shares. Loaded by sitecustomize.py; hooks
torch.optim globally, no application change.

Under advise the AdamW state is served zero-copy from the host, so the step reads and writes
it over PCIe after backward has ended and nothing hides that traffic. Here a parameter is
updated as soon as its gradient is final in the last backward of a step, on a side stream,
while backward computes the rest; the application's optimizer.step() then updates what is
left (the parameters done early have their gradients hidden from it for the call).

Why the result is bit-identical: an early update is torch's own step function (unhooked) run
on a param group that holds only that parameter, and for Adam, AdamW and SGD every kernel
path (for-loop, foreach, fused) computes a parameter from its own gradient, its own state and
the group's hyper-parameters alone (evidence: docs/lifetime-policy.md). So the early update
equals the one the whole step would make, provided the gradient, the hyper-parameters and
the kernel path are those of the normal step. Those are what is checked: each optimizer is
watched for LEARN steps first (how many gradients each parameter gets a step, whether its
gradient is still bit-for-bit the same when the step runs, whether anything else could change
the step), and anything that could make the result differ (clipping, GradScaler, closures,
other step hooks, sparse gradients, changed param groups, shared parameters, ...)
turns the overlap off for that optimizer with one line on stderr; its steps then run as
without the adapter. Steps that break the learned pattern later are detected at the step and
reported; see the docs for what cannot be undone then.
"""

import sys
import weakref

import transit_rules
import transit_staging  # the staged mode's ring and homes
import transit_update  # how an early update runs
from transit_update import local_tensor

OVERLAP_ENV = transit_rules.ENV["OVERLAP_STEP"]
OFF = "0"  # the opt-out: no mode, the application's step reads the state where the shim put it
# "1": early updates on a side stream beside backward, reading the state where it is (over
# PCIe under advise); "staged": their state staged through the copy engines instead
# (transit_staging.py; the fastest measured, with a second host copy); stream, host: not
# overlaps with backward (transit_streamed.py, transit_host.py)
MODES = tuple(m for m in transit_rules.OVERLAP_MODES if m != OFF)
# Retired experiments (docs/retired-experiments.md): a job that still sets one is told once,
# and runs as if it were unset. "serial" ran the early updates on the compute stream (a
# diagnostic); TRANSIT_OVERLAP_SMS put their side stream on a CUDA green context of N SMs.
# TRANSIT_STAGE is the shim's to say (shim/config.c).
RETIRED_MODES = transit_rules.RETIRED_OVERLAP_MODES
RETIRED_ENV = tuple(v for k, v in transit_rules.RETIRED_ENV.items() if k != "STAGE")
# the mode when TRANSIT_OVERLAP_STEP is unset, by the shim's policy: under advise the streamed
# step, which moves only the state the budget cannot hold (bench/RESULTS.md, "The streamed step
# by default")
DEFAULT_MODES = transit_rules.DEFAULT_OVERLAP


def mode(policy):
    """The step's mode for this job: TRANSIT_OVERLAP_STEP, else the policy's default (also for
    a retired mode, which retired() has said); None when off (TRANSIT_OVERLAP_STEP=0) or not a
    mode (said once)."""
    import os

    raw = os.environ.get(OVERLAP_ENV, "")
    if not raw or raw in RETIRED_MODES:
        return DEFAULT_MODES.get(policy)
    if raw == OFF:
        return None
    if raw not in MODES:
        say(f"{OVERLAP_ENV}={raw!r} is not one of {', '.join((OFF, *MODES))}: the step runs as without the adapter")
        return None
    return raw
DIGEST_CHUNK = 1 << 20  # elements a checksum sums at once (its int64 temporary: 8 MiB)
LEARN = 2  # steps with the same backward pattern before the first overlapped one
# torch.optim classes whose update is elementwise per parameter (exact classes: a subclass
# may change step), and the qualified name of their undecorated step function.
KNOWN = {("torch.optim.adam", "Adam"): "Adam.step", ("torch.optim.adamw", "AdamW"): "Adam.step",
         ("torch.optim.sgd", "SGD"): "SGD.step"}
CHANGED_GRAD = ("the gradient of a parameter changed between its last backward and the step (gradient "
                "clipping, GradScaler.unscale_, a data-parallel reduction or another in-place change)")
CHANGED_PARAM = "a parameter was changed in place between backward and the step (a weight constraint?)"


def retired(environ) -> list:
    """What to say about the retired settings environ still holds: a line each."""
    lines = []
    mode = environ.get(OVERLAP_ENV)
    if mode in RETIRED_MODES:
        lines.append(f"{OVERLAP_ENV}={mode} is retired and ignored (docs/retired-experiments.md): the optimizer "
                     f"step runs as if it were unset; the modes are {', '.join((OFF, *MODES))}")
    for name in RETIRED_ENV:
        if environ.get(name):
            lines.append(f"{name}={environ[name][:100]} is retired and ignored (docs/retired-experiments.md): "
                         "no green context is made (the early updates of 1 and staged run on a plain side stream)")
    return lines


def say(msg):
    """One line on stderr, as every adapter message is written."""
    print(f"transit adapter: {msg}", file=sys.stderr, flush=True)


def _digest(g):
    """A checksum of a gradient's bits. Only while learning (a reduction, and a sync at the
    step): it sees in-place changes that bypass the version counter (.data, custom kernels)."""
    import torch

    t = local_tensor(g).detach()
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[t.element_size()]
    t = t.view(ints)
    if not t.is_contiguous() or t.numel() <= DIGEST_CHUNK:
        return t.sum(dtype=torch.int64)
    # In chunks: the sum casts its input to int64 first, and a whole gradient's copy (0.53 GB
    # for the 1.0 B trainer's embedding) stayed cached in the pool of the stream the hook
    # runs on (FSDP2's reduce-scatter stream), which the exact GPU budget then paid for with
    # hot data on the host (measured: bench/probes/memory_streams.py, bench/RESULTS.md).
    flat = t.view(-1)
    return torch.stack([flat[i:i + DIGEST_CHUNK].sum(dtype=torch.int64)
                        for i in range(0, flat.numel(), DIGEST_CHUNK)]).sum()


def _version_of(g):
    """The in-place version of a gradient's storage. Several gradients can be views of one
    buffer (FSDP2's reduce-scatter output, DDP's buckets) and share the counter, so a
    sibling's accumulation bumps it: it is read once backward has ended, never at a hook."""
    import torch

    with torch.no_grad():
        return local_tensor(g)._version


def _unchanged(rec, g, learning):
    """Whether the step sees the gradient the early update used (or, while learning, would
    have used): the same tensor, not changed in place since backward ended and, while
    learning, the same bits as at its final hook."""
    import torch

    if rec.seen is None or g is not rec.seen[0] or rec.ended is None or _version_of(g) != rec.ended[0]:
        return False
    return not learning or torch.equal(rec.seen[1], _digest(g))


def foreign_hooks(opt, mine):
    """The step hooks on opt (global and its own) that are not in `mine`: they could change
    the gradients a step sees, or read what it wrote."""
    from torch.optim import optimizer as o

    hooks = [*o._global_optimizer_pre_hooks.values(), *o._global_optimizer_post_hooks.values(),
             *opt._optimizer_step_pre_hooks.values(), *opt._optimizer_step_post_hooks.values()]
    return [h for h in hooks if not any(h == m for m in mine)]


def call_refusal(opt, args, kwargs, mine):
    """Why a step call of opt must run as the application made it, or None: a closure or
    GradScaler's arguments, GradScaler inside a fused step, step hooks not in `mine`."""
    if args[1:] or kwargs:  # args[0] is the optimizer itself
        return "optimizer.step() called with arguments (a closure, or GradScaler's)"
    if hasattr(opt, "grad_scale") or hasattr(opt, "found_inf"):
        return "GradScaler steps it (unscaling and the inf check run inside the step)"
    if foreign_hooks(opt, mine):
        return "other optimizer step hooks are registered (they may change gradients or read them)"
    return None


def is_container(opt):
    """Whether opt holds other optimizers (TorchTitan's OptimizersContainer: one per model
    part): its step only calls theirs, each hooked on its own."""
    from torch.optim import Optimizer

    return any(isinstance(v, (list, tuple)) and v and all(isinstance(x, Optimizer) for x in v)
               for v in vars(opt).values())


def step_refusal(opt, args, kwargs, mine):
    """Why this step of opt must run as the application made it (call_refusal, then each
    param group's group_refusal), or None: what the streamed and the host step share."""
    why = call_refusal(opt, args, kwargs, mine)
    if why:
        return why
    for group in opt.param_groups:
        why = group_refusal(group)
        if why:
            return why
    return None


def _hyper(group):
    """A param group's hyper-parameters (lr, betas, ...), comparable across calls."""
    return tuple(sorted((k, v) for k, v in group.items() if k != "params"))


def _layout(opt):
    return tuple(tuple(id(p) for p in g["params"]) for g in opt.param_groups)


def _regrouped(plan):
    """Whether the groups hooked at adoption changed (groups added later are fine: their
    parameters are not hooked, the step updates them)."""
    return _layout(plan.opt())[:len(plan.layout)] != plan.layout


def raw_step(opt):
    """torch's own step of an Adam/AdamW/SGD, without torch's step hooks around it
    (profile_hook_step wraps the class's step once and marks it `hooked`): an early update
    must not run the global hooks (the adapter's iteration boundary among them), and calling
    the class's function also bypasses an LR scheduler's wrapper on the instance, so it is
    not counted as a step. None when the class or its step is not the one verified."""
    cls = type(opt)
    qualname = KNOWN.get((cls.__module__, cls.__name__))
    step = cls.step
    raw = getattr(step, "__wrapped__", None) if getattr(step, "hooked", False) else None
    return raw if qualname and raw is not None and raw.__qualname__ == qualname else None


def _path(group):
    """The kernel path the whole step takes for this group: 'fused', 'foreach' or 'for-loop';
    None when torch's default choice (foreach=None) would differ between subsets of the
    group's parameters (it requires all of them to be plain tensors on a foreach device)."""
    from torch.optim.optimizer import _default_to_fused_or_foreach

    if group.get("fused"):
        return "fused"
    if group["foreach"] is not None:
        return "foreach" if group["foreach"] else "for-loop"
    each = {_default_to_fused_or_foreach([p], False, use_fused=False)[1] for p in group["params"]}
    if len(each) > 1:
        return None
    return "foreach" if each == {True} else "for-loop"


def group_refusal(group):
    """Why torch's step of this param group is not the one verified, or None."""
    import torch

    if group.get("differentiable"):
        return "differentiable=True"
    if group.get("capturable"):
        return "capturable=True (not verified)"
    if any(torch.is_tensor(v) or (isinstance(v, tuple) and any(map(torch.is_tensor, v)))
           for k, v in group.items() if k != "params"):
        return "tensor hyper-parameters (not verified)"
    if any(not torch.is_floating_point(p) for p in group["params"]):
        return "complex or integer parameters (not verified)"
    if _path(group) is None:
        return ("a param group mixes devices or tensor types, so torch's choice of kernels depends on "
                "which parameters step together")
    return None


def _compiled_autograd():
    """Compiled autograd (torch.compile's backward) traces gradient hooks into its graph:
    not verified. Asked only when torch._dynamo is loaded (its own switches live there)."""
    dynamo = sys.modules.get("torch._dynamo")
    ca = sys.modules.get("torch._dynamo.compiled_autograd")
    return bool(dynamo and getattr(dynamo.config, "compiled_autograd", False)
                or ca and getattr(ca, "compiled_autograd_enabled", False))


def _fast_route_alike(p, grad, state):
    """On a GPU, torch's foreach kernels take their fast path only when every tensor of the
    call is dense and laid out like its parameter; one exception sends the whole call down
    the per-tensor path. Early updates stay on the path of the whole step when every
    parameter qualifies (checked for each one). CPU foreach always loops per tensor."""
    if p.device.type == "cpu":
        return True
    tensors = [grad, *(v for v in state.values() if hasattr(v, "shape") and v.shape == p.shape)]
    return p.is_contiguous() and all(t.is_contiguous() and t.dtype == p.dtype and t.stride() == p.stride()
                                     for t in tensors)


class _Param:
    """One parameter of an adopted optimizer: its hook and what this step did with it."""

    __slots__ = ("plan", "param", "gi", "handle", "fires", "seen", "ended", "done")

    def __init__(self, plan, param, gi, handle):
        self.plan, self.param, self.gi, self.handle = plan, param, gi, handle
        self.reset()

    def reset(self):
        # seen: (gradient, checksum while learning) at its latest hook; ended: the versions of
        # the gradient and the parameter when that backward ended
        self.fires, self.seen, self.ended, self.done = 0, None, None, False


class _Plan:
    """One optimizer: learning its backward pattern, overlapping ('on'), or 'off' for good."""

    def __init__(self, opt, raw):
        # a weak reference: an application that replaces its optimizer must not keep the
        # old one's state alive through the adapter
        self.opt, self.raw, self.name = weakref.ref(opt), raw, type(opt).__name__
        self.phase = "learn"
        self.layout = _layout(opt)
        self.paths = [_path(g) for g in opt.param_groups]
        self.params = {}        # id(param) -> _Param
        self.learned = None     # id(param) -> gradients a step; the last one of a step is final
        self.stable = 0         # consecutive steps with the learned pattern
        self.hyper = {}         # group index -> hyper-parameters the gradients were used with
        self.devices = set()    # devices whose side stream holds early updates of this step
        self.hidden = []        # (param, grad) hidden from the step
        self.task = None        # the last backward (autograd graph task) its hooks ran in
        self.pending = {}       # (group index, device) -> [(_Param, param, state keys, gradient ready event)]
        self.pending_bytes = {}  # (group index, device) -> state bytes pending there


class Overlap(transit_update.EarlyUpdates):
    """The driver: torch.optim's global step pre/post hooks, and a post-accumulate-grad hook
    on every parameter of an adopted optimizer (on FSDP2's sharded parameters FSDP2 calls it
    after the reduce-scatter). Its early updates run as transit_update.EarlyUpdates runs them."""

    def __init__(self, ours=(), staged=False, device_memory=None, host_state=None):
        # device_memory: the shim's (alloc, free) of plain device memory for the staging ring;
        # host_state(ptr, nbytes): whether the shim made that state in pinned host memory
        super().__init__(transit_staging.Staging(device_memory, host_state) if staged else None)
        self.ours = list(ours)  # the adapter's other step hooks: not foreign
        self.plans = weakref.WeakKeyDictionary()  # optimizer -> _Plan
        self.recs = {}          # id(param) -> _Param of a hooked parameter
        self.owners = {}        # id(param) -> (weak param, _Plan) of every optimizer that stepped
        self.handles = []
        self.task = None        # the autograd graph task whose end is awaited
        self.fired = []         # parameters whose hook ran in that backward

    def install(self):
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.handles = [register_optimizer_step_pre_hook(self.pre_step),
                        register_optimizer_step_post_hook(self.post_step)]

    def uninstall(self):
        for h in self.handles:
            h.remove()
        for plan in {rec.plan for rec in self.recs.values()}:
            self._unhook(plan)

    # --- the step hooks -------------------------------------------------------------------

    def pre_step(self, opt, args, kwargs):
        plan = self.plans.get(opt)
        if plan is not None:
            plan.pending, plan.pending_bytes = {}, {}  # staged updates not made by the end of backward: the step makes them
        try:
            if plan is None:
                self._adopt(opt)
            else:
                self._sync(plan)
                if plan.phase != "off":
                    self._judge(plan, args, kwargs)
        except Exception as e:  # never the reason a job dies
            self._turn_off(self.plans.get(opt), f"an error in its step hook: {e!r}")
        if plan is not None:
            self._hide_done(plan)  # whatever happened above: a parameter is never updated twice

    def post_step(self, opt, args, kwargs):
        plan = self.plans.get(opt)
        if plan is None:
            return
        try:
            for p, g in plan.hidden:
                p.grad = g
            plan.hidden = []
            for rec in plan.params.values():
                rec.reset()
            plan.hyper = {}
            if plan.phase == "off":
                self._unhook(plan)  # here, not in a gradient hook: FSDP2 iterates the hook dict
            elif self.staging:
                born = self.staging.in_place
                moved = self.staging.home(opt)  # new states (the first step, a loaded state_dict) go home
                born = self.staging.in_place - born
                self.staging.stepped()  # the next in-copies read what this step wrote
                if moved:
                    where = f" ({born / 1e9:.2f} GB of it made there by the shim: not copied)" if born else ""
                    say(f"{plan.name}'s state ({moved / 1e9:.2f} GB) moved to pinned host memory{where}: its "
                         "early updates stage it through the copy engines")
        except Exception as e:
            self._turn_off(plan, f"an error in its step hook: {e!r}")

    def _adopt(self, opt):
        """At an optimizer's first step: hook its parameters, or say once why not."""
        plan = self.plans[opt] = _Plan(opt, raw_step(opt))
        why = self._claim(opt, plan) or self._refusal(opt, plan)
        if why:
            self._turn_off(plan, why)
            return
        for gi, group in enumerate(opt.param_groups):
            for p in group["params"]:
                if p.requires_grad:
                    plan.params[id(p)] = self.recs[id(p)] = _Param(
                        plan, p, gi, p.register_post_accumulate_grad_hook(self.on_grad))

    def _refusal(self, opt, plan):
        if plan.raw is None:
            return f"{type(opt).__name__} is not torch.optim's Adam, AdamW or SGD (the elementwise updates verified)"
        for group in opt.param_groups:
            why = group_refusal(group)
            if why:
                return why
        return None

    def _claim(self, opt, plan):
        """Record which optimizer steps each parameter, whether it is overlapped or not: a
        parameter that two optimizers step is updated in the order of their steps, which an
        early update would change."""
        shared = None
        for group in opt.param_groups:
            for p in group["params"]:
                ref, other = self.owners.get(id(p), (None, None))
                if other is not None and ref() is p and other.opt() is not None and other is not plan:
                    shared = other
                elif other is not None and other.opt() is None:
                    self._unhook(other)  # left by an optimizer that is gone
                self.owners[id(p)] = (weakref.ref(p), plan)
        if shared is not None:
            self._turn_off(shared, "parameters shared with another optimizer")
            return "parameters shared with another optimizer"
        return None

    def _judge(self, plan, args, kwargs):
        """At the step: does this step (learning) or did it (overlapping) compute what the
        normal step computes? Learning ends after LEARN steps with the same pattern."""
        why = self._why_not(plan, args, kwargs)
        if why:
            self._turn_off(plan, why)
        elif plan.phase == "learn":
            self._learn(plan)

    def _why_not(self, plan, args, kwargs):
        opt = plan.opt()
        why = call_refusal(opt, args, kwargs, [self.pre_step, self.post_step, *self.ours])
        if why:
            return why
        if _regrouped(plan):
            return "its param groups changed"
        if _compiled_autograd():
            return "compiled autograd traces the gradient hooks (not verified)"
        learning = plan.phase == "learn"
        return self._grads_why(plan, learning) or self._hyper_why(plan)

    def _grads_why(self, plan, learning):
        opt = plan.opt()
        for gi, group in enumerate(opt.param_groups):
            for p in group["params"]:
                rec = plan.params.get(id(p))
                if p.grad is not None and p.grad.is_sparse:
                    return "sparse gradients"
                if rec is None or not (rec.done or (learning and rec.fires)):
                    continue
                if not _unchanged(rec, p.grad, learning):
                    return CHANGED_GRAD
                if _version_of(p) != rec.ended[1]:  # the update it got early would come after this change
                    return CHANGED_PARAM
                if plan.paths[gi] == "foreach" and not _fast_route_alike(p, p.grad, opt.state.get(p, {})):
                    return "tensors laid out unlike their parameter on a GPU foreach path"
            if not learning and gi < len(plan.paths) and self._first_update_couples(plan, gi, group):
                return "a parameter got its first gradient after the learning steps (SGD momentum, batched path)"
        return None

    def _first_update_couples(self, plan, gi, group):
        """SGD with momentum on a foreach or fused path treats a group whose parameters lack a
        momentum buffer differently as a whole; a parameter that gets its first gradient
        while others were updated early would change that."""
        if plan.name != "SGD" or not group["momentum"] or plan.paths[gi] == "for-loop":
            return False
        return any(p.grad is not None and "momentum_buffer" not in plan.opt().state.get(p, {})
                   for p in group["params"])

    def _hyper_why(self, plan):
        for gi, seen in plan.hyper.items():
            if _hyper(plan.opt().param_groups[gi]) != seen:
                return "its hyper-parameters changed between backward and the step (a scheduler stepped in between)"
        return None

    def _learn(self, plan):
        counts = {pid: rec.fires for pid, rec in plan.params.items()}
        plan.stable = plan.stable + 1 if counts == plan.learned and any(counts.values()) else 0
        plan.learned = counts
        if plan.stable >= LEARN - 1:
            plan.phase = "on"
            micro = max(counts.values())
            say(f"overlapping {plan.name}'s step with backward ({', '.join(sorted(set(filter(None, plan.paths))))}"
                 f"; {sum(1 for c in counts.values() if c)} parameters, {micro} backward(s) a step)")

    def _turn_off(self, plan, why):
        """Off for good, one line. Hooks stay until the step (see post_step)."""
        if plan is None or plan.phase == "off":
            return
        done = any(rec.done for rec in plan.params.values())
        plan.phase = "off"
        say(f"step overlap off for {plan.name}: {why}" +
             ("; this step's early updates were already made, so it is not bit-identical" if done else
              "; its steps run normally"))

    def _unhook(self, plan):
        for pid, rec in list(plan.params.items()):
            rec.handle.remove()
            if self.recs.get(pid) is rec:
                del self.recs[pid]
        plan.params = {}

    # --- during backward --------------------------------------------------------------------

    def on_grad(self, p):
        import torch

        if torch.compiler.is_compiling():
            return  # being traced (compiled autograd): no side effects; the step hook falls back
        rec = self.recs.get(id(p))
        if rec is None or rec.plan.phase == "off" or rec.plan.opt() is None:
            return
        try:
            self._on_grad(rec, p)
        except Exception as e:  # never the reason a job dies: the step updates what is left
            self._turn_off(rec.plan, f"an error in its gradient hook: {e!r}")

    def _on_grad(self, rec, p):
        plan = rec.plan
        self._await_end(rec)
        if plan.task != self.task:  # its first hook in this backward, before any early update
            plan.task = self.task
            if plan.phase == "on" and _regrouped(plan):
                self._turn_off(plan, "its param groups changed")
                return
        if p.grad is not None and p.grad.is_sparse:
            self._turn_off(plan, "sparse gradients")
            return
        rec.fires += 1
        learning = plan.phase == "learn"
        rec.seen = (p.grad, _digest(p.grad) if learning and p.grad is not None else None)
        if learning:
            plan.hyper[rec.gi] = _hyper(plan.opt().param_groups[rec.gi])
            return
        final = plan.learned.get(id(p), 0)
        if rec.done:  # a gradient after the one learned as final: the update used a partial gradient
            self._turn_off(plan, "a parameter got more gradients in a step than in the learning steps")
        elif rec.fires == final:
            group = self._usable(plan, rec, p)
            if group is not None:
                self._update(plan, rec, p, group)

    def _await_end(self, rec):
        """Have the end of this backward recorded (autograd runs queued callbacks when the
        graph task is done: after every hook, FSDP2's final reduce-scatters included)."""
        import torch

        task = torch._C._current_graph_task_id()
        if task != self.task:
            self.task = task
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_ended)
        self.fired.append(rec)

    def _backward_ended(self):
        fired, self.fired, self.task = self.fired, [], None
        for plan in {rec.plan for rec in fired}:
            if plan.pending:
                self._flush_all(plan)  # before the versions below: an update bumps its parameter's
        for rec in fired:
            try:
                g = rec.param.grad
                # the versions of its gradient and (after any early update) of the parameter
                rec.ended = None if g is None else (_version_of(g), _version_of(rec.param))
            except Exception as e:  # raised here it would end the application's backward()
                self._turn_off(rec.plan, f"an error at the end of backward: {e!r}")

    def _usable(self, plan, rec, p):
        """The param group whose step p's final gradient is updated with early now
        (transit_update.py runs it), its hyper-parameters recorded for the check at the step;
        None when p has no gradient, or when its tensors would take another kernel path (its
        overlap turned off)."""
        opt = plan.opt()
        if p.grad is None:
            return None  # nothing to update with: the step skips it too
        # (its state exists: it had gradients in the learning steps, which stepped it)
        if plan.paths[rec.gi] == "foreach" and not _fast_route_alike(p, p.grad, opt.state.get(p, {})):
            self._turn_off(plan, "tensors laid out unlike their parameter on a GPU foreach path")
            return None
        group = opt.param_groups[rec.gi]
        plan.hyper.setdefault(rec.gi, _hyper(group))
        return group
