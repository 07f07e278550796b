"""`plan` and `models`, and the model/layout/hardware options that render and submit share."""

from __future__ import annotations

import json
import sys

from transit_launch.errors import UsageError
from transit_launch.argtypes import finite_float, fractions, output_file, overlap_mode, positive_int, size
from transit_launch.planning.hardware import DEFAULT_GPUS_PER_NODE, GPUS, gpu_profile
from transit_launch.planning import titan_config
from transit_launch.planning.plan import DEFAULT_HOST_CORES, DEFAULT_HOST_MEM, PRECISIONS, PRESETS, RECOMPUTE
from transit_launch.rules import format_size

# What a request gets for an option given neither on the command line nor by a TorchTitan config.
DEFAULTS = {"seq_len": 8192, "local_batch": 1, "precision": "mixed", "recompute": "full"}


def add_plan_args(p, model_required=True):
    g = p.add_argument_group("model and layout")
    g.add_argument("--model", help="catalog name (see `transit-launch models`), a model card .toml or a HF config.json"
                   + (" (this or --torchtitan is required)" if model_required else ""))
    g.add_argument("--torchtitan", metavar="JOB.toml",
                   help="a TorchTitan job config: model, flavor, sequence length, batch sizes, parallelism degrees, "
                        "precision and activation checkpointing come from it, read by TorchTitan's own classes "
                        f"(needs torchtitan=={titan_config.VERSION}); the options below override it, and render and "
                        "submit pass the planned layout to TorchTitan as its own overrides")
    g.add_argument("--parallel", choices=PRESETS, default=None,
                   help="parallelism preset (default fsdp; explicit --tp/--pp/--ep refine it)")
    g.add_argument("--tp", type=positive_int(), metavar="N",
                   help="tensor-parallel degree (default: 1, or under fsdp+tp and tp+pp the largest that divides "
                        "the heads and the GPUs per node); without --parallel it means fsdp+tp")
    g.add_argument("--pp", type=positive_int(), metavar="N",
                   help="pipeline stages (default: 1, or under tp+pp every GPU left after tp); without --parallel "
                        "it means tp+pp")
    g.add_argument("--ep", type=positive_int(), metavar="N",
                   help="expert-parallel degree of an MoE model (default: 1, or under fsdp+ep the largest that "
                        "divides the experts and dp x tp, at most the GPUs per node); without --parallel it means "
                        "fsdp+ep")
    g.add_argument("--seq-len", type=positive_int(), metavar="TOKENS",
                   help=f"tokens per sequence (default {DEFAULTS['seq_len']})")
    g.add_argument("--local-batch", type=positive_int(),
                   help=f"sequences per data-parallel rank per microstep (microbatches under PP; default "
                        f"{DEFAULTS['local_batch']})")
    g.add_argument("--global-batch", type=positive_int(),
                   help="sequences per optimizer step; only node counts whose data-parallel degree divides it are valid")
    g.add_argument("--precision", choices=PRECISIONS,
                   help="mixed: fp32 params/grads/Adam with bf16 compute (TorchTitan default; TorchTitan runs "
                        "it as fp32 for TP/PP without FSDP, and the plan says so); bf16: everything bf16; "
                        "fp32: no mixed precision (default mixed)")
    g.add_argument("--recompute", choices=RECOMPUTE,
                   help="activation checkpointing: full keeps one checkpoint per layer and recomputes the rest in "
                        "backward; none keeps every saved tensor (default full)")
    h = p.add_argument_group("hardware")
    h.add_argument("--gpu", default=None, help=f"GPU profile: {', '.join(GPUS)} (default h100-80gb)")
    h.add_argument("--gpu-mem", type=size, help="GPU memory a rank may use, overriding the profile's (e.g. 40GB): the shim's budget "
                        "(TRANSIT_GPU_BUDGET, which bounds PyTorch's reserved bytes, not its allocated ones)")
    h.add_argument("--gpus-per-node", type=positive_int(), default=None,
                   help=f"GPUs per node (default {DEFAULT_GPUS_PER_NODE})")
    h.add_argument("--host-mem", type=size, help=f"host DRAM per node (default {DEFAULT_HOST_MEM / 1e9:.0f}GB)")
    h.add_argument("--host-cores", type=positive_int(), default=None,
                   help=f"CPU cores per node the job's ranks share, for --overlap host's CPU update (default "
                        f"{DEFAULT_HOST_CORES}; submit: the job's CPUs)")
    p.add_argument("--scale-in", type=fractions("--scale-in"), metavar="FRACTIONS",
                   help="node reductions to show, e.g. 0.25,0.5 (default: every valid node count below the minimum)")
    p.add_argument("--min-efficiency", type=finite_float(), default=0.9,
                   help="predicted per-GPU efficiency the recommendation must keep (default 0.9)")


def titan_job(a):
    """The TitanJob of --torchtitan (None without it), loaded once per parsed command line:
    render and submit need it again for the job's command (which says its notes)."""
    if getattr(a, "torchtitan", None) is None:
        return None
    if a.model is not None:
        raise UsageError("--torchtitan reads the model from the TorchTitan config; leave out --model")
    if not hasattr(a, "_titan_job"):
        from dataclasses import replace
        job = titan_config.load(a.torchtitan)
        # a selective (or memory-budget) mode stays the job's unless --recompute says otherwise
        a._titan_job = replace(job, keep_ac=getattr(a, "recompute", None) is None and job.ac_mode not in ("full", "none"))
    return a._titan_job


def request(a, gpus_per_node: int | None = None, host_mem: float | None = None, gpu: str | None = None,
            host_cores: int | None = None):
    """The plan.Request of parsed options; gpus_per_node, host_mem, gpu (a profile's name)
    and host_cores are the defaults a caller knows better (a Slurm partition's, the job's
    CPUs), explicit options still win, over a --torchtitan config's values too."""
    from transit_launch.planning.models import load_model
    from transit_launch.planning.plan import Request
    job = titan_job(a)
    if job is None and a.model is None:
        raise UsageError("the following arguments are required: --model (or --torchtitan JOB.toml)")
    given = {k: getattr(job, k) for k in ("tp", "pp", "ep", "global_batch", *DEFAULTS)} if job else {}
    v = {k: getattr(a, k) if getattr(a, k) is not None else given.get(k, DEFAULTS.get(k))
         for k in ("tp", "pp", "ep", "global_batch", *DEFAULTS)}
    parallel = a.parallel or ("fsdp+ep" if v["ep"] else "tp+pp" if v["pp"] else "fsdp+tp" if v["tp"] else "fsdp")
    name = a.gpu if a.gpu is not None else gpu  # '' is a typo, refused, not the default
    # one budget: the GPU memory the plan assumes is the budget the job gets (render and
    # submit take --gpu-budget too: either one sets both; two different ones are refused)
    budget = getattr(a, "gpu_budget", None)
    if budget and a.gpu_mem and budget != a.gpu_mem:
        raise UsageError(f"--gpu-mem {format_size(a.gpu_mem)} and --gpu-budget {format_size(budget)} differ: the plan "
                         "would cost one GPU and the job run on another; give one of them")
    if budget and not a.gpu_mem:  # the budget is the plan's GPU memory: of the GPU named (or the default)
        part = gpu_profile(name)
        if budget > part.memory:
            raise UsageError(f"--gpu-budget {format_size(budget)} is more than the GPU has: {part.name} has "
                             f"{part.memory / 1e9:.2f} GB (a budget emulates a smaller GPU; --gpu names the GPU)")
        name = part.name
    gpu_mem = a.gpu_mem or budget
    return Request(card=job.card if job else load_model(a.model), gpu=gpu_profile(name, gpu_mem),
                   gpus_per_node=a.gpus_per_node or gpus_per_node or DEFAULT_GPUS_PER_NODE,
                   host_mem=a.host_mem or host_mem or DEFAULT_HOST_MEM,
                   host_cores=a.host_cores or host_cores or DEFAULT_HOST_CORES, parallel=parallel,
                   scale_in=tuple(a.scale_in) if a.scale_in else None, min_efficiency=a.min_efficiency,
                   overlap=getattr(a, "overlap", None), **v)


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
        job = titan_job(a)
        if a.json:
            out = report.plan_json(p)
            if job:
                out["torchtitan"] = titan_json(job, p)
            print(json.dumps(out, indent=2))
        else:
            print(report.plan_text(p, all_rows=a.all) + (titan_text(job, p, a.torchtitan) if job else ""))
    if a.plot:
        report.plot(report.plan_json(p), a.plot)
        print(f"transit-launch: wrote {a.plot}", file=sys.stderr)
    return rc


def titan_json(job, p) -> dict:
    return {"config": job.path, "model": job.model, "flavor": job.flavor, "notes": list(job.notes),
            "recommended_overrides": titan_config.overrides(p.req, p.recommended.layout, job.keep_ac)}


def titan_text(job, p, given: str) -> str:
    """What render and submit tell TorchTitan for the recommended node count (the config
    named as the user gave it: the job gets its absolute path)."""
    from transit_launch.units import n_nodes
    lines = [f"TorchTitan {job.model} {job.flavor} from {given}; render and submit pass it the layout of the "
             f"recommended {n_nodes(p.recommended.nodes)}:"]
    lines += [f"  {o}" for o in titan_config.overrides(p.req, p.recommended.layout, job.keep_ac)]
    lines += [f"Note: {n}" for n in job.notes]
    return "\n\n" + "\n".join(lines)


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
    from transit_launch.rules import OVERLAP_MODES
    sp.add_argument("--overlap", choices=OVERLAP_MODES, type=overlap_mode,
                    help="plan for render/submit/run's --overlap (default: advise's, stream, which moves only the "
                         "state the budget cannot hold and pays the staging ring from it); 0 plans the step in "
                         "place")
    sp.add_argument("--json", action="store_true", help="machine-readable output (every row)")
    sp.add_argument("--all", action="store_true",
                    help=f"show every node count in the table (without it, a plan of more than "
                         f"{report.MAX_FULL_ROWS} rows shows the rows to decide between and says how many it left out)")
    sp.add_argument("--plot", type=output_file((".png",)), metavar="FILE.png",
                    help="also draw each option's per-GPU memory terms against the GPU (needs matplotlib)")
    sp.add_argument("--measure", action="store_true",
                    help="also run one training step of the minimum layout on the CPU under FakeTensorMode "
                         "(needs torch) and print measured peaks beside the formula's")
    sp.add_argument("--measure-layers", type=positive_int(), metavar="N",
                    help="with --measure: truncate the model to N layers (default: full depth)")
    sp.set_defaults(func=cmd_plan)

    sp = sub.add_parser("models", help="the model catalog")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(func=cmd_models)
