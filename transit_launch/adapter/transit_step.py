"""The verified step and the refusals the step modes share (transit_streamed.py,
transit_host.py): the step's mode (TRANSIT_OVERLAP_STEP, else the policy's default), the
retired settings a job may still hold, torch's own step of an Adam, AdamW or SGD without its
hooks (raw_step), and why a step call or a param group must run as the application made it.
Loaded by sitecustomize.py.

Why a step run by the adapter is bit-identical: it is torch's own step function (unhooked)
run on param groups that hold a subset of the parameters (or slices of them), and for Adam,
AdamW and SGD every kernel path (for-loop, foreach, fused) computes a parameter from its own
gradient, its own state and the group's hyper-parameters alone (evidence:
docs/lifetime-policy.md). What could make the result differ (a closure, GradScaler, other
step hooks, tensor or differentiable hyper-parameters, a group whose kernel choice depends on
which parameters step together, ...) is refused here, and the step then runs as without the
adapter.
"""

import sys

import transit_rules

OVERLAP_ENV = transit_rules.ENV["OVERLAP_STEP"]
OFF = "0"  # the opt-out: no mode, the application's step reads the state where the shim put it
# stream: the step streamed through the copy engines (transit_streamed.py); host: a share of it
# run on the host (transit_host.py)
MODES = tuple(m for m in transit_rules.OVERLAP_MODES if m != OFF)
# Retired experiments (docs/retired-experiments.md): a job that still sets one is told once,
# and runs as if it were unset. "1" and "staged" overlapped the step with backward (early
# updates as gradients became final; staged: their state through a ring of device memory);
# "serial" ran those early updates on the compute stream (a diagnostic); TRANSIT_OVERLAP_SMS
# put their side stream on a CUDA green context of N SMs; TRANSIT_OVERLAP_EARLY=1 copied the
# streamed step's state in during backward. TRANSIT_STAGE is the shim's to say (shim/config.c).
RETIRED_MODES = transit_rules.RETIRED_OVERLAP_MODES
# each retired name the adapter says, and what runs instead
RETIRED_ENV = {transit_rules.RETIRED_ENV["OVERLAP_SMS"]: "no green context is made (the early updates it placed are "
               "retired too)",
               transit_rules.RETIRED_ENV["OVERLAP_EARLY"]: "the streamed step copies the state after backward"}
# the mode when TRANSIT_OVERLAP_STEP is unset, by the shim's policy: under advise the streamed
# step, which moves only the state the budget cannot hold (bench/LOG.md, "The streamed step
# by default")
DEFAULT_MODES = transit_rules.DEFAULT_OVERLAP
# torch.optim classes whose update is elementwise per parameter (exact classes: a subclass
# may change step), and the qualified name of their undecorated step function.
KNOWN = {("torch.optim.adam", "Adam"): "Adam.step", ("torch.optim.adamw", "AdamW"): "Adam.step",
         ("torch.optim.sgd", "SGD"): "SGD.step"}


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


def retired(environ) -> list:
    """What to say about the retired settings environ still holds: a line each."""
    lines = []
    value = environ.get(OVERLAP_ENV)
    if value in RETIRED_MODES:
        defaults = ", ".join(f"{m} under {p}" for p, m in DEFAULT_MODES.items())
        lines.append(f"{OVERLAP_ENV}={value} is retired and ignored (docs/retired-experiments.md): the optimizer "
                     f"step runs as if it were unset ({defaults}, else the application's own step); the modes are "
                     f"{', '.join((OFF, *MODES))}")
    for name, instead in RETIRED_ENV.items():
        if environ.get(name):
            lines.append(f"{name}={environ[name][:100]} is retired and ignored (docs/retired-experiments.md): "
                         f"{instead}")
    return lines


def say(msg):
    """One line on stderr, as every adapter message is written."""
    print(f"transit adapter: {msg}", file=sys.stderr, flush=True)


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


def raw_step(opt):
    """torch's own step of an Adam/AdamW/SGD, without torch's step hooks around it
    (profile_hook_step wraps the class's step once and marks it `hooked`): a step the adapter
    runs must not run the global hooks (the adapter's iteration boundary among them), and
    calling the class's function also bypasses an LR scheduler's wrapper on the instance, so
    it is not counted as a step. None when the class or its step is not the one verified."""
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
