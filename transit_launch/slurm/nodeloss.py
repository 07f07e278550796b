"""Surviving a lost node by scaling in (--on-node-loss scale-in): what Slurm's output says
(which nodes the job still has and which are down), what to do about it (the planner's
best layout on the survivors, or Slurm's requeue when none fits), and the record of each
transition. Only parsing and deciding: slurm/scalein.py runs the commands and writes the
files; the sbatch template calls it between attempts.

Each attempt is one srun step. A step that fails while one of its nodes is down (DOWN,
FAIL or NOT_RESPONDING in `scontrol show node`, or gone from the job's NodeList, which
Slurm shrinks under --no-kill) is a node loss; a step that fails with every node up is
the trainer's own failure and ends the job as it would without the option."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from transit_launch.errors import UsageError

MODES = ("off", "scale-in")
RECORDS = "transitions.jsonl"   # one JSON line per transition, in the job's directory
# node state flags (scontrol's State=A+B) under which the node cannot run the next step
LOST_STATES = frozenset({"DOWN", "FAIL", "FAILING", "NOT_RESPONDING", "POWERED_DOWN", "POWERING_DOWN"})
# a step line of the trainer: examples/train_llama.py's JSON ({"step": N, ...}) or
# TorchTitan's log ("step:  N  loss: ...")
_STEP = re.compile(r'^\{"step": (\d+)[,}]|\bstep:\s*(\d+)\s+loss')


def job_dir_name(job_id: str) -> str:
    """The job's own directory for the records, under its working directory (status reads it)."""
    return f"transit-{job_id}"


def fields(line: str) -> dict[str, str]:
    """One record of scontrol's -o output (Key=Value separated by spaces) as a dict. Values
    with spaces (Reason=...) keep only their first word, which none of ours needs."""
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)


def node_states(scontrol_nodes: str) -> dict[str, set[str]]:
    """`scontrol show node -o` -> {node: its state flags}: 'State=DOWN+NOT_RESPONDING' ->
    {'DOWN', 'NOT_RESPONDING'}; a trailing '*' (sinfo's not-responding mark) counts too."""
    out = {}
    for line in scontrol_nodes.splitlines():
        f = fields(line)
        if "NodeName" not in f:
            continue
        state = f.get("State", "")
        flags = {s for s in state.rstrip("*").upper().split("+") if s}
        if state.endswith("*"):
            flags.add("NOT_RESPONDING")
        out[f["NodeName"]] = flags
    return out


def lost(before: list[str], job_nodes: list[str], states: dict[str, set[str]]) -> tuple[list[str], list[str]]:
    """(lost, survivors) of the nodes the last attempt ran on, in its order: a node is lost
    when the job no longer holds it or its state says it cannot run a step. A node whose
    state scontrol did not report counts as lost (it cannot be shown to be up)."""
    held = set(job_nodes)
    gone, left = [], []
    for n in before:
        (left if n in held and n in states and not states[n] & LOST_STATES else gone).append(n)
    return gone, left


def step_of(line: str) -> int | None:
    """The step number a trainer's output line reports, or None."""
    m = _STEP.search(line)
    return int(m.group(1) or m.group(2)) if m else None


def checkpoint_steps(names: list[str], complete) -> list[int]:
    """Steps of the finished checkpoints among a directory's entries (TorchTitan's and the
    example trainer's step-N); complete(name) says whether DCP finished it (its .metadata,
    written last)."""
    return sorted(int(n[5:]) for n in names if n.startswith("step-") and n[5:].isdigit() and complete(n))


@dataclass(frozen=True)
class Layout:
    """What one attempt runs: its nodes and the plan's layout on them."""
    nodes: list[str]
    dp: int
    microbatches: int
    policy: str
    efficiency: float
    gpu_gb: float            # the plan's per-GPU need
    offload_gb: float        # of it, what lives in host DRAM
    host_gb_per_node: float

    def summary(self) -> dict:
        return {"nodes": len(self.nodes), "nodelist": self.nodes, "dp": self.dp, "microbatches": self.microbatches,
                "policy": self.policy, "predicted_efficiency": self.efficiency, "gpu_gb": self.gpu_gb,
                "offload_gb": self.offload_gb, "host_gb_per_node": self.host_gb_per_node}

    @staticmethod
    def of(d: dict) -> "Layout":
        return Layout(d["nodelist"], d["dp"], d["microbatches"], d["policy"], d["predicted_efficiency"],
                      d["gpu_gb"], d["offload_gb"], d["host_gb_per_node"])


def layout(p, nodes: list[str], policy: str | None) -> Layout | None:
    """The plan's layout on these nodes (all of them), or None when it cannot run there:
    no valid layout, or one that offloading does not serve (hot data off the GPU, or more
    than host DRAM holds)."""
    from transit_launch.planning import choice
    c = p.at(len(nodes))
    if c is None or (p.needs_offload(c.nodes) and not choice.servable(c)):
        return None
    return layout_of(p, c, nodes, policy)


def layout_of(p, c, nodes: list[str], policy: str | None) -> Layout:
    """What candidate c of plan p runs on these nodes."""
    from transit_launch.planning import choice
    return Layout(list(nodes), c.layout.dp, c.microsteps, choice.policy_for(p, c.nodes, policy), c.efficiency,
                  round(c.est.total / 1e9, 2), round(c.offload / 1e9, 2), round(c.host_per_node / 1e9, 1))


def best_layout(p, survivors: list[str], policy: str | None) -> tuple[Layout | None, str]:
    """(layout, why not more nodes): the most survivors a layout serves (more nodes never
    run slower: each GPU holds less), using the first ones in order; None when no count
    from all of them down to one works."""
    skipped = []
    for n in range(len(survivors), 0, -1):
        lay = layout(p, survivors[:n], policy)
        if lay:
            return lay, "; ".join(skipped)
        why = p.why_not(n) or "offloading does not serve it (hot data off the GPU or host DRAM too small)"
        skipped.append(f"{n} node(s): {why}")
    return None, "; ".join(skipped)


@dataclass
class Transition:
    """One node loss and what was done: scaled in, requeued, or (the step failed with every
    node up) nothing. Written as one JSON line; the downtime is filled in at the first
    step on the survivors."""
    action: str                      # scale-in | requeue
    restart: int                     # Slurm's SLURM_RESTART_COUNT (a requeued job starts over at attempt 0)
    attempt: int                     # the attempt that runs on the survivors (scale-in) or would have
    loss_seen: float                 # epoch seconds: when the failed step ended and the lost nodes were read
    lost_nodes: list[str]
    old: dict
    new: dict | None
    checkpoint_step: int | None      # the newest finished checkpoint: where the trainer resumes
    last_step: int | None            # the last step the lost attempt printed
    reason: str = ""
    downtime_s: float | None = None
    first_step: int | None = None

    @property
    def steps_lost(self) -> int | None:
        if self.last_step is None:
            return None
        return max(0, self.last_step - (self.checkpoint_step or 0))

    def record(self) -> dict:
        from datetime import datetime, timezone
        seen = datetime.fromtimestamp(self.loss_seen, timezone.utc).isoformat(timespec="milliseconds")
        return {"action": self.action, "restart": self.restart, "attempt": self.attempt, "loss_seen": seen,
                "loss_seen_epoch": round(self.loss_seen, 3), "lost_nodes": self.lost_nodes, "old": self.old,
                "new": self.new, "predicted_efficiency": self.new["predicted_efficiency"] if self.new else None,
                "checkpoint_step": self.checkpoint_step, "last_step": self.last_step, "steps_lost": self.steps_lost,
                "first_step": self.first_step, "downtime_s": self.downtime_s, "reason": self.reason}


def records(text: str) -> list[dict]:
    """The transitions file's records; a line cut short (the job died writing it) is skipped."""
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except (ValueError, RecursionError):  # RecursionError: a line of ten thousand [s
            continue
    return out


def line(t: Transition) -> str:
    """The one line of the job's output that says what happened."""
    lost_txt = ", ".join(t.lost_nodes)
    left = t.old["nodes"] - len(t.lost_nodes)
    resume = ("from the start (no finished checkpoint)" if not t.checkpoint_step else
              f"from checkpoint step {t.checkpoint_step}")
    lost_steps = f", {t.steps_lost} step(s) lost" if t.steps_lost is not None else ""
    head = f"transit-launch: node loss: {lost_txt} lost ({left} of {t.old['nodes']} nodes left)"
    if t.action == "requeue":
        return f"{head}; {t.reason}; requeueing the job (scontrol requeue) to wait for {t.old['nodes']} nodes"
    o, n = t.old, t.new
    return (f"{head}; re-planned {o['nodes']} -> {n['nodes']} nodes, dp {o['dp']} -> {n['dp']}, microbatches "
            f"{o['microbatches']} -> {n['microbatches']}, policy {n['policy']}, predicted efficiency "
            f"{n['predicted_efficiency']:.0%}; resuming {resume}{lost_steps}")


@dataclass(frozen=True)
class NodeLossOptions:
    """render/submit --on-node-loss and what the job's re-plans need of the options: the
    model and GPU as typed (the request keeps only what they resolved to)."""
    mode: str = "off"
    checkpoint_dir: str | None = None
    model: str | None = None
    gpu: str | None = None
    gpu_mem: int | None = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise UsageError(f"--on-node-loss {self.mode!r} is not one of {', '.join(MODES)}")
        if self.checkpoint_dir is not None and (not self.checkpoint_dir.strip() or
                                                re.search(r"[\x00-\x1f\x7f]", self.checkpoint_dir)):
            raise UsageError(f"--checkpoint-dir {self.checkpoint_dir!r}: give a directory without control characters")
        if self.checkpoint_dir is not None and self.mode == "off":
            raise UsageError("--checkpoint-dir tells --on-node-loss scale-in where the trainer's step-N checkpoints "
                             "are; add --on-node-loss scale-in")

    @property
    def scale_in(self) -> bool:
        return self.mode == "scale-in"


def check(opts: NodeLossOptions, p, nodes: int, local: bool, titan=None) -> None:
    """What render and submit refuse before a scale-in script is written."""
    if not opts.scale_in:
        return
    if titan is not None:  # its overrides are fixed in the script for the first layout
        raise UsageError("--on-node-loss scale-in does not work with --torchtitan yet: the layout re-planned on the "
                         "survivors would not reach TorchTitan's command-line overrides")
    if local:
        raise UsageError("--on-node-loss scale-in is for sbatch jobs (Slurm finds the lost node); leave out --local")
    if p is None or not opts.model:
        raise UsageError("--on-node-loss scale-in needs --model: the planner chooses the layout on the survivors")
    if p.at(nodes) is None:
        raise UsageError(f"--on-node-loss scale-in: {nodes} node(s) give no valid layout ({p.why_not(nodes)}), "
                         "so there is none to scale in from")


def plan_flags(opts: NodeLossOptions, p, nodes: int) -> list[str]:
    """The plan options as flags for the job's re-plans: the request render or submit made
    (the partition's GPUs per node and DRAM included), with the global batch fixed to the
    one the job starts with, so that every layout keeps it."""
    import os
    from transit_launch.rules import format_size
    req = p.req
    from transit_launch.planning.models import catalog
    # a catalog name stays one (load_model reads the catalog first); a file is named absolutely
    model = opts.model if opts.model in catalog() or not os.path.exists(opts.model) else os.path.abspath(opts.model)
    out = ["--model", model, "--parallel", req.parallel, "--seq-len", str(req.seq_len),
           "--local-batch", str(req.local_batch), "--global-batch", str(global_batch(p, nodes)),
           "--precision", req.precision, "--recompute", req.recompute, "--gpus-per-node", str(req.gpus_per_node),
           "--host-mem", format_size(int(req.host_mem)), "--min-efficiency", repr(req.min_efficiency)]
    from transit_launch.planning.hardware import GPUS
    # the GPU the plan used: as typed, else the profile it resolved to (the partition's GRES type)
    gpu = opts.gpu or (req.gpu.name if req.gpu.name in GPUS else None)
    for flag, v in (("--tp", req.tp), ("--pp", req.pp), ("--ep", req.ep), ("--gpu", gpu)):
        if v is not None:
            out += [flag, str(v)]
    if opts.gpu_mem is not None:
        out += ["--gpu-mem", format_size(opts.gpu_mem)]
    return out


def global_batch(p, nodes: int) -> int:
    """The global batch the job keeps: the one asked for, else what its first layout runs."""
    if p.req.global_batch:
        return p.req.global_batch
    lay = p.at(nodes).layout
    return lay.dp * lay.local_batch


def template_context(opts: NodeLossOptions | None, p, nodes: int, shim_opts, port: int | None, shim, adapter) -> dict:
    """What sbatch.j2 needs for --on-node-loss scale-in: the transit-launch that rendered
    the script (this Python, by absolute path, isolated: the nodes run the same
    installation) and
    the arguments of its `_node-loss next` calls, shell-quoted."""
    import shlex

    from transit_launch.isolated import transit_launch_argv
    from transit_launch.rules import format_size
    if opts is None or not opts.scale_in:
        return {"scale_in": False}
    from transit_launch.preload import inject
    # the shim is named even when this layout runs without it: a scaled-in one may need it
    shim, adapter = shim or inject.shim_path(), adapter or inject.adapter_dir()
    args = plan_flags(opts, p, nodes) + ["--shim", str(shim or ""), "--adapter", str(adapter or "")]
    if port is not None:
        args += ["--port", str(port)]
    if opts.checkpoint_dir:
        args += ["--checkpoint-dir", opts.checkpoint_dir]
    for flag, v in (("--policy", shim_opts.policy), ("--stats", shim_opts.stats), ("--log", shim_opts.log),
                    ("--overlap", shim_opts.overlap)):
        if v is not None:
            args += [flag, v]
    if shim_opts.gpu_budget:
        args += ["--gpu-budget", format_size(shim_opts.gpu_budget)]
    return {"scale_in": True, "launcher": shlex.join(transit_launch_argv()),
            "next_args": shlex.join(args)}
