"""`plan` and `models`, and the model/layout/hardware options that render and submit share."""

from __future__ import annotations

import json
import sys

from transit_launch.errors import UsageError
from transit_launch.argtypes import finite_float, fractions, output_file, positive_int, size
from transit_launch.planning.hardware import DEFAULT_GPUS_PER_NODE, GPUS, gpu_profile
from transit_launch.planning.plan import DEFAULT_HOST_MEM, PRECISIONS, PRESETS, RECOMPUTE


def add_plan_args(p, model_required=True):
    g = p.add_argument_group("model and layout")
    g.add_argument("--model", required=model_required,
                   help="catalog name (see `transit-launch models`), a model card .toml or a HF config.json")
    g.add_argument("--parallel", choices=PRESETS, default=None,
                   help="parallelism preset (default fsdp; explicit --tp/--pp/--ep refine it)")
    g.add_argument("--tp", type=positive_int("--tp"), metavar="N",
                   help="tensor-parallel degree (default: 1, or under fsdp+tp and tp+pp the largest that divides "
                        "the heads and the GPUs per node); without --parallel it means fsdp+tp")
    g.add_argument("--pp", type=positive_int("--pp"), metavar="N",
                   help="pipeline stages (default: 1, or under tp+pp every GPU left after tp); without --parallel "
                        "it means tp+pp")
    g.add_argument("--ep", type=positive_int("--ep"), metavar="N",
                   help="expert-parallel degree of an MoE model (default: 1, or under fsdp+ep the largest that "
                        "divides the experts and dp x tp, at most the GPUs per node); without --parallel it means "
                        "fsdp+ep")
    g.add_argument("--seq-len", type=positive_int("--seq-len"), default=8192, metavar="TOKENS",
                   help="tokens per sequence (default 8192)")
    g.add_argument("--local-batch", type=positive_int("--local-batch"), default=1,
                   help="sequences per data-parallel rank per microstep (microbatches under PP; default 1)")
    g.add_argument("--global-batch", type=positive_int("--global-batch"),
                   help="sequences per optimizer step; only node counts whose data-parallel degree divides it are valid")
    g.add_argument("--precision", choices=PRECISIONS, default="mixed",
                   help="mixed: fp32 params/grads/Adam with bf16 compute (TorchTitan default; TorchTitan runs "
                        "it as fp32 for TP/PP without FSDP, and the plan says so); bf16: everything bf16; "
                        "fp32: no mixed precision (default mixed)")
    g.add_argument("--recompute", choices=RECOMPUTE, default="full",
                   help="activation checkpointing: full keeps one checkpoint per layer and recomputes the rest in "
                        "backward; none keeps every saved tensor (default full)")
    h = p.add_argument_group("hardware")
    h.add_argument("--gpu", default=None, help=f"GPU profile: {', '.join(GPUS)} (default h100-80gb)")
    h.add_argument("--gpu-mem", type=size, help="GPU memory size, overriding the profile's (e.g. 40GB)")
    h.add_argument("--gpus-per-node", type=positive_int("--gpus-per-node"), default=None,
                   help=f"GPUs per node (default {DEFAULT_GPUS_PER_NODE})")
    h.add_argument("--host-mem", type=size, help=f"host DRAM per node (default {DEFAULT_HOST_MEM / 1e9:.0f}GB)")
    p.add_argument("--scale-in", type=fractions("--scale-in"), metavar="FRACTIONS",
                   help="node reductions to show, e.g. 0.25,0.5 (default: every valid node count below the minimum)")
    p.add_argument("--min-efficiency", type=finite_float("--min-efficiency"), default=0.9,
                   help="predicted per-GPU efficiency the recommendation must keep (default 0.9)")


def request(a, gpus_per_node: int | None = None, host_mem: float | None = None):
    """The plan.Request of parsed options; gpus_per_node and host_mem are the defaults a
    caller knows better (a Slurm partition's), explicit options still win."""
    from transit_launch.planning.models import load_model
    from transit_launch.planning.plan import Request
    parallel = a.parallel or ("fsdp+ep" if a.ep else "tp+pp" if a.pp else "fsdp+tp" if a.tp else "fsdp")
    return Request(card=load_model(a.model), gpu=gpu_profile(a.gpu, a.gpu_mem),
                   gpus_per_node=a.gpus_per_node or gpus_per_node or DEFAULT_GPUS_PER_NODE,
                   host_mem=a.host_mem or host_mem or DEFAULT_HOST_MEM,
                   parallel=parallel, tp=a.tp, pp=a.pp, ep=a.ep, seq_len=a.seq_len,
                   local_batch=a.local_batch, global_batch=a.global_batch, precision=a.precision,
                   recompute=a.recompute, scale_in=tuple(a.scale_in) if a.scale_in else None,
                   min_efficiency=a.min_efficiency)


def cmd_plan(a, command):
    from transit_launch.planning import choice, report
    from transit_launch.planning.plan import plan
    if a.measure_layers and not a.measure:  # it would change nothing: the formula has no layer count to cut
        raise UsageError(f"--measure-layers {a.measure_layers} sets the depth --measure runs at; add --measure")
    if a.plot:
        report.require_plot_backend()  # before the work, like the path check at parsing
    p = plan(request(a))
    for w in choice.layout_warnings(p.req):  # also under --json (its "warnings"): a person runs it too
        print(f"transit-launch: WARNING: {w}", file=sys.stderr)
    if a.measure:
        rc = cmd_measure(a, p)
    else:
        rc = 0
        print(json.dumps(report.plan_json(p), indent=2) if a.json else report.plan_text(p, all_rows=a.all))
    if a.plot:
        report.plot(report.plan_json(p), a.plot)
        print(f"transit-launch: wrote {a.plot}", file=sys.stderr)
    return rc


def cmd_measure(a, p):
    """--measure: the plan's minimum layout without offloading (where none serves the
    request, its recommended layout with offloading), measured on the CPU (planning/measure.py)."""
    from transit_launch.planning import measure, measure_report
    target = p.baseline or p.recommended
    if target is None:
        raise UsageError("--measure: the plan has no layout to measure")
    lay, card = target.layout, p.req.card
    c = measure_report.compare(card, lay, measure.measure(card, lay, a.measure_layers))
    print(json.dumps(c, indent=2) if a.json else measure_report.text(c))
    return 0


def cmd_models(a, command):
    from transit_launch.planning import report
    from transit_launch.planning.models import catalog
    cards = catalog()
    print(json.dumps([c.summary() for c in cards.values()], indent=2) if a.json else report.models_text(cards))
    return 0


def register(sub):
    from transit_launch.planning import report
    sp = sub.add_parser("plan", help="per-GPU memory, minimum nodes without offloading, scale-in options")
    add_plan_args(sp)
    sp.add_argument("--json", action="store_true", help="machine-readable output (every row)")
    sp.add_argument("--all", action="store_true",
                    help=f"show every node count in the table (without it, a plan of more than "
                         f"{report.MAX_FULL_ROWS} rows shows the rows to decide between and says how many it left out)")
    sp.add_argument("--plot", type=output_file((".png",)), metavar="FILE.png",
                    help="also draw each option's per-GPU memory terms against the GPU (needs matplotlib)")
    sp.add_argument("--measure", action="store_true",
                    help="also run one training step of the minimum layout on the CPU under FakeTensorMode "
                         "(needs torch) and print measured peaks beside the formula's")
    sp.add_argument("--measure-layers", type=positive_int("--measure-layers"), metavar="N",
                    help="with --measure: truncate the model to N layers (default: full depth)")
    sp.set_defaults(func=cmd_plan)

    sp = sub.add_parser("models", help="the model catalog")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(func=cmd_models)
