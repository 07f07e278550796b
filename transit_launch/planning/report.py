"""Plans, catalogs and checks as tables for people and JSON for programs."""

from __future__ import annotations

import textwrap

from transit_launch.planning import choice, memory
from transit_launch.planning import efficiency
from transit_launch.planning import plan as planmod
from transit_launch.planning.plan import Candidate, Plan
from transit_launch.table import table
from transit_launch.units import gb, n_nodes

TERMS = ("parameters", "gradients", "optimizer", "activations", "logits", "fsdp", "comm", "overhead")
TERM_NOTES = {
    "parameters": "sharded master weights",
    "gradients": "sharded gradients",
    "optimizer": "AdamW exp_avg + exp_avg_sq",
    "activations": "saved for backward at the peak",
    "logits": "logits and loss buffers",
    "fsdp": "unsharded FSDP working set",
    "comm": "NCCL buffers",
    "overhead": "CUDA context + allocator",
}


# A table of more rows shows only the rows to decide between (--all shows every row): a
# long search (Llama4-Scout under fsdp: 1,024 rows, 900 of them under 5%) buries the answer.
MAX_FULL_ROWS = 12


def layout_str(lay: memory.Layout) -> str:
    return lay.name


def layout_json(lay: memory.Layout) -> dict:
    return {"gpus": lay.gpus, "dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "ep": lay.ep,
            "local_batch": lay.local_batch, "seq_len": lay.seq_len, "precision": lay.precision,
            "recompute": lay.recompute}


def precision_note(p: Plan) -> str | None:
    """Why some rows are estimated in another precision than the one asked for, or None."""
    if all(c.layout.precision == p.req.precision for c in p.rows):
        return None
    return (f"TorchTitan has no {p.req.precision} precision for TP/PP without FSDP: "
            "those layouts run, and are estimated, in fp32 (note fp32).")


def traffic_ratio(p: Plan, c: Candidate) -> float | None:
    base = p.reference.traffic.inter
    if base == 0:
        return 1.0 if c.traffic.inter == 0 else None
    return round(c.traffic.inter / base, 3)


def _option_json(p: Plan, c: Candidate) -> dict:
    return {
        "nodes": c.nodes, "gpus": c.layout.gpus, "layout": layout_json(c.layout),
        "baseline": c is p.baseline, "recommended": c is p.recommended,
        "per_gpu_total_gb": gb(c.est.total),
        "per_gpu_gb": {k: gb(v) for k, v in c.est.breakdown().items()},
        "oversubscription": round(c.est.total / p.req.gpu.memory, 3),
        "offload_gb_per_gpu": gb(c.offload),
        "cold_gb_per_gpu": gb(c.est.cold),
        "hot_spill_gb_per_gpu": gb(c.spill),
        "host_gb_per_node": gb(c.host_per_node),
        "fits_host": c.fits_host,
        "traffic_ratio": traffic_ratio(p, c),
        "inter_node_gb_per_node_per_microstep": gb(c.traffic.inter),
        "inter_node_gb_per_node_per_step": gb(c.traffic.inter * c.microsteps),
        "microsteps": c.microsteps,
        "predicted_efficiency": c.efficiency,
        # the first step's extra seconds: the optimizer state made in host memory (WARMUP_STATE_RATE)
        "predicted_warm_up_s": round(c.warm_up_s, 1),
        "notes": c.notes,
    }


def _other_json(p: Plan) -> dict | None:
    alt = planmod.other_layout(p)
    if alt is None:
        return None
    preset, c = alt
    return {"parallel": preset, "nodes": c.nodes, "gpus": c.layout.gpus, "layout": layout_json(c.layout),
            "offload": c.est.total > p.req.gpu.memory, "predicted_efficiency": c.efficiency}


def plan_json(p: Plan) -> dict:
    """Everything the table shows, for programs (and for the plot, which draws from this):
    every row, whatever the table leaves out."""
    req, b, ref = p.req, p.baseline, p.reference
    return {
        "model": req.card.name,
        "params": req.card.params,
        "active_params": req.card.active_params,
        "gpu": {"name": req.gpu.name, "memory_gb": gb(req.gpu.memory), "capacity_gb": gb(req.gpu.physical)},
        "gpus_per_node": req.gpus_per_node,
        "host_gb_per_node": gb(req.host_mem),
        "host_cores_per_node": req.host_cores,
        "parallel": req.parallel,
        "global_batch": req.global_batch,
        "min_efficiency": req.min_efficiency,  # what the recommendation must keep
        "precision": req.precision,  # as asked; each layout's precision is what TorchTitan runs
        "precision_note": precision_note(p),
        "min_gpus_no_offload": b.layout.gpus if b else None,
        "min_nodes_no_offload": b.nodes if b else None,
        "no_fit": p.no_fit or None,
        # the baseline, or without one the option with the most nodes: what the next keys
        # describe and what traffic_ratio compares against
        "reference_nodes": ref.nodes,
        "layout": layout_json(ref.layout),
        "per_gpu_gb": {k: gb(v) for k, v in ref.est.breakdown().items()},
        "peak_phase": ref.est.peak_phase,
        "traffic_gb_per_node_per_microstep": {"inter": gb(ref.traffic.inter), "intra": gb(ref.traffic.intra),
                                              **{k: gb(v) for k, v in ref.traffic.by_kind.items()}},
        "options": [_option_json(p, c) for c in p.rows],
        "recommended": {"nodes": p.recommended.nodes, "gpus": p.recommended.layout.gpus,
                        "offload": p.needs_offload(p.recommended.nodes), "reason": p.reason},
        "assumptions": {"mfu": efficiency.ASSUMED_MFU, "state_link_share": efficiency.STATE_LINK_SHARE,
                        "shim_reserved_gap": efficiency.SHIM_RESERVED_GAP,
                        "warm_up_state_gb_s": gb(efficiency.WARMUP_STATE_RATE),
                        "warm_up_pinned_gb_s": gb(efficiency.WARMUP_PINNED_RATE),
                        "host_bytes_per_rank_gb": gb(planmod.HOST_BYTES_PER_RANK),
                        "host_usable_fraction": planmod.HOST_USABLE_FRACTION,
                        "host_link_gb_s": gb(req.gpu.host_link)},
        # another preset that keeps --min-efficiency where this plan does not, or on fewer nodes
        "other_layout": _other_json(p),
        "warnings": choice.layout_warnings(req),
    }


def decision_rows(p: Plan) -> tuple[list[Candidate], list[str]]:
    """(rows, why): the rows the table shows by default, in table order, and what each kind
    of row is, for the line under the table. Every row when there are few (or --scale-in
    chose them); else the minimum without offloading (or, without one, the row the traffic
    column compares with), the fewest nodes predicted as fast as without offloading, the
    recommendation and its neighbours, the fewest that keep hot data on the GPU, and the
    last (fewest nodes) that fits host DRAM."""
    rows = p.rows
    if len(rows) <= MAX_FULL_ROWS or p.req.scale_in is not None:
        return rows, []
    picked, why = set(), []

    def pick(what: str, cands: list) -> None:
        cands = [c for c in cands if c is not None]
        if cands:
            picked.update(id(c) for c in cands)
            why.append(f"{what} ({', '.join(str(c.nodes) for c in cands)})")

    def fewest(cond):
        return min((c for c in p.options if cond(c)), key=lambda c: c.nodes, default=None)

    pick("the minimum without offloading" if p.baseline else "the most nodes, what traffic compares with",
         [p.reference])
    pick("the fewest predicted as fast as without offloading",
         [fewest(lambda c: choice.servable(c) and c.efficiency >= choice.AS_FAST)])
    i = next(k for k, c in enumerate(rows) if c is p.recommended)
    pick("the recommendation and its neighbours", rows[max(0, i - 1):i + 2])
    pick("the fewest that keep hot data on the GPU", [fewest(choice.servable)])
    pick("the last that fits host DRAM", [fewest(lambda c: c.fits_host)])
    return [c for c in rows if id(c) in picked], why


def plan_text(p: Plan, all_rows: bool = False) -> str:
    """The plan for people; all_rows (--all) shows every row, else decision_rows picks."""
    req, b, card, ref = p.req, p.baseline, p.req.card, p.reference
    head = [
        f"{card.name}: {card.params / 1e9:.2f} B parameters"
        + (f" ({card.active_params / 1e9:.2f} B active)" if card.moe else "")
        + f", {req.parallel}, {req.gpu.name} ({gb(req.gpu.memory):.1f} GB), {req.gpus_per_node} GPUs/node, "
        f"{gb(req.host_mem):.0f} GB host/node",
        f"seq {req.seq_len}, local batch {req.local_batch}, global batch {req.global_batch or 'any'}, "
        f"{req.precision} precision, recompute {req.recompute}",
        *filter(None, [precision_note(p)]),
        "",
    ]
    if b:
        head.append(f"Per-GPU memory without offloading at the minimum ({n_nodes(b.nodes)}, {b.layout.gpus} GPUs, "
                    f"{layout_str(b.layout)}), peak in the {b.est.peak_phase} phase:")
    else:
        head += [p.no_fit, "",
                 f"Per-GPU memory at {n_nodes(ref.nodes)} ({ref.layout.gpus} GPUs, {layout_str(ref.layout)}), "
                 f"peak in the {ref.est.peak_phase} phase:"]
    bd = ref.est.breakdown()
    rows = [[t, f"{gb(bd[t]):.2f}", TERM_NOTES[t]] for t in TERMS] + [["total", f"{gb(bd['total']):.2f}", ""]]
    out = head + [table(["term", "GB", ""], rows, "lrl"), ""]
    if b:
        out += [f"Minimum without offloading: {b.layout.gpus} GPUs on {n_nodes(b.nodes)}.", ""]
    shown, why = (p.rows, []) if all_rows else decision_rows(p)
    rows = []
    for c in shown:
        rows.append([
            c.nodes, c.layout.gpus, layout_str(c.layout), f"{gb(c.est.total):.1f}",
            f"{c.est.total / req.gpu.memory:.2f}", f"{gb(c.offload):.1f}",
            f"{gb(c.host_per_node):.0f}" + ("" if c.fits_host else " !"),
            f"{traffic_ratio(p, c):.2f}" if traffic_ratio(p, c) is not None else "-",
            f"{c.efficiency:.0%}",
            "; ".join((["baseline"] if c is b else []) + (["recommended"] if c is p.recommended else [])
                      + c.notes),
        ])
    if p.options:
        out.append("Scale-in options (host DRAM as GPU memory, advise policy):" if b else
                   "Options with offloading (host DRAM as GPU memory, advise policy):")
    out.append(table(["nodes", "GPUs", "layout", "GB/GPU", "oversub", "offload GB/GPU", "host GB/node",
                      "traffic", "pred. eff", "note"], rows, "rrlrrrrrrl"))
    if why:
        out += textwrap.wrap(f"{len(p.rows) - len(shown)} of {len(p.rows)} rows left out (--all shows every row); "
                             f"shown, by nodes: {'; '.join(why)}.", 100)
    out += ["",
            f"Recommended: {n_nodes(p.recommended.nodes)} ({p.recommended.layout.gpus} GPUs): {p.reason}.",
            *_warm_up_text(p),
            *_other_text(p),
            f"traffic = per-node inter-node bytes per microstep relative to {'the baseline' if b else f'{n_nodes(ref.nodes)}'}"
            "; pred. eff = predicted",
            "per-GPU TFLOPS relative to no offloading (compute vs. PCIe only). --json for programs."]
    return "\n".join(out)


def _warm_up_text(p: Plan) -> list[str]:
    """The start-up cost of the recommendation, when it offloads: its first step makes the
    optimizer state in host memory (measured within a factor of 2: bench/RESULTS.md)."""
    c = p.recommended
    if not c.offload:
        return []
    about = f"about {c.warm_up_s:.0f} s" if c.warm_up_s >= 0.5 else "under a second"
    return [f"Its first step takes {about} more than a steady one (the optimizer state made in host memory; "
            "`transit-launch run` reports the measured one)."]


def _other_text(p: Plan) -> list[str]:
    """One line when another preset serves the job better (plan.other_layout)."""
    alt = planmod.other_layout(p)
    if alt is None:
        return []
    preset, c = alt
    req, cur = p.req, p.recommended

    def how(cand, offloads):
        return f"at {cand.efficiency:.0%} predicted efficiency" if offloads else "without offloading"

    there = f"--parallel {preset} on {n_nodes(c.nodes)} ({layout_str(c.layout)}) {how(c, c.est.total > req.gpu.memory)}"
    here = f"{req.parallel}'s {n_nodes(cur.nodes)} {how(cur, p.needs_offload(cur.nodes))}"
    if choice.meets_floor(req, cur, p.needs_offload(cur.nodes)):
        return [f"Fewer nodes with another layout: {there}, against {here}."]
    return [f"Another layout keeps --min-efficiency {choice._pct(req.min_efficiency)}: {there}, against {here}."]


def plan_comment(p: Plan, nodes: int, policy: str | None = None) -> list[str]:
    """The script's comment on its plan; policy: the job's shim policy (off offloads nothing)."""
    c = p.at(nodes)
    minimum = (f"no-offload minimum {n_nodes(p.baseline.nodes)} ({p.baseline.layout.gpus} GPUs)" if p.baseline else
               f"no node count up to {p.req.max_nodes} fits without offloading")
    lines = [f"Plan: {p.req.card.name}, {p.req.parallel}, {p.req.gpu.name}; {minimum}."]
    if c and policy == "off":
        lines.append(f"This job: {n_nodes(nodes)}, {layout_str(c.layout)}, {gb(c.est.total):.1f} GB per GPU, "
                     + (f"{off_overflow(p, c)}." if off_overflow(p, c) else "no offloading (policy off)."))
    elif c:
        lines.append(f"This job: {n_nodes(nodes)}, {layout_str(c.layout)}, {gb(c.est.total):.1f} GB per GPU, "
                     f"offload {gb(c.offload):.1f} GB per GPU, predicted efficiency {c.efficiency:.0%}.")
    else:
        lines.append(f"This job: {n_nodes(nodes)} (not a planned option for these settings).")
    return lines


def off_overflow(p: Plan, c) -> str | None:
    """Why candidate c cannot run under policy off (nothing offloaded), or None."""
    over = c.est.total - p.req.gpu.memory
    if over <= 0:
        return None
    return (f"{gb(over):.1f} GB more than the {p.req.gpu.name}'s {gb(p.req.gpu.memory):.1f} GB, and policy off "
            "offloads nothing: the job runs out of GPU memory")


def models_text(cards: dict) -> str:
    rows = []
    for c in cards.values():
        kind = f"MoE {c.moe.experts}x top-{c.moe.top_k}" + (" +shared" if c.moe.shared_experts else "") if c.moe else "dense"
        rows.append([c.name, f"{c.params / 1e9:.2f}", f"{c.active_params / 1e9:.2f}", c.layers, c.hidden,
                     f"{c.heads}/{c.kv_heads}", c.vocab, kind])
    return table(["model", "params B", "active B", "layers", "hidden", "heads/kv", "vocab", "kind"], rows,
                 "lrrrrrrl")


# --- plot ------------------------------------------------------------------------------

# Cold terms (read once a step, what advise serves from the host first) in blues, hot ones
# (used every microstep) in warm colours, fixed overheads in greys.
TERM_COLORS = {"parameters": "#9ecae1", "optimizer": "#3182bd", "gradients": "#fdae6b", "activations": "#e6550d",
               "logits": "#a63603", "fsdp": "#fd8d3c", "comm": "#bdbdbd", "overhead": "#737373"}


def require_plot_backend():
    from transit_launch.output_files import require_matplotlib
    return require_matplotlib("--plot")


# the stack, bottom up: advise's order of keeping data on the GPU
PLOT_TERMS = ("overhead", "comm", "logits", "activations", "fsdp", "gradients", "parameters", "optimizer")
# the PNG text chunk that holds what the picture was drawn from (plot_data), so that a
# picture can be checked against today's plan without comparing pixels (tests/test_readme.py
# keeps docs/plan.png current that way)
PLOT_KEY = "transit-launch plan"


def plot_data(d: dict) -> dict:
    """What plot draws of plan_json's d, and nothing else."""
    return {"model": d["model"], "parallel": d["parallel"], "gpus_per_node": d["gpus_per_node"],
            "gpu": {k: d["gpu"][k] for k in ("name", "memory_gb", "capacity_gb")},
            "options": [{"nodes": o["nodes"], "layout": o["layout"], "baseline": o["baseline"],
                         "recommended": o["recommended"], "predicted_efficiency": o["predicted_efficiency"],
                         "per_gpu_gb": {t: o["per_gpu_gb"][t] for t in (*PLOT_TERMS, "total")}}
                        for o in d["options"]]}


def plot(d: dict, path: str) -> None:
    """Stacked bars of each option's per-GPU memory terms (plan_json's options, the same
    numbers --json prints) against the GPU memory the plan sizes against and, when
    --gpu-mem emulates a smaller GPU, the part's own capacity. The stack follows advise's
    order of keeping data on the GPU (overheads and hot data first, then fp32 master
    weights, then optimizer states), so what stands above the line is what it serves from
    host DRAM. Drawn from plot_data(d) alone, which the PNG carries as its PLOT_KEY text."""
    import json

    from transit_launch.output_files import save_figure
    plt = require_plot_backend()
    drawn = plot_data(d)
    opts, gpu = drawn["options"], drawn["gpu"]
    x = list(range(len(opts)))
    fig, ax = plt.subplots(figsize=(max(8.0, 1.0 * len(opts) + 4), 4.8))
    bottom = [0.0] * len(opts)
    for term in PLOT_TERMS:
        vals = [o["per_gpu_gb"][term] for o in opts]
        ax.bar(x, vals, bottom=bottom, color=TERM_COLORS[term], label=term, width=0.7)
        bottom = [b + v for b, v in zip(bottom, vals)]
    emulated = gpu["capacity_gb"] != gpu["memory_gb"]
    ax.axhline(gpu["memory_gb"], color="black", lw=1.5,
               label=f"GPU {'budget (--gpu-mem)' if emulated else 'memory'} {gpu['memory_gb']:.1f} GB")
    if emulated:
        ax.axhline(gpu["capacity_gb"], color="black", lw=1, ls="--", label=f"GPU capacity {gpu['capacity_gb']:.1f} GB")
    for i, o in enumerate(opts):
        tag = "no offload" if o["baseline"] else f"{o['predicted_efficiency']:.0%}"
        ax.annotate(tag + (" *" if o["recommended"] else ""), (i, o["per_gpu_gb"]["total"]), ha="center",
                    va="bottom", fontsize=8, fontweight="bold" if o["recommended"] else "normal",
                    xytext=(0, 3), textcoords="offset points",
                    bbox=dict(facecolor="white", edgecolor="none", pad=0.5, alpha=0.8))
    ax.set_xticks(x, [f"{o['nodes']} node{'s' if o['nodes'] > 1 else ''}\n{layout_str_json(o['layout'])}"
                      for o in opts], fontsize=8)
    ax.set_ylabel("GB per GPU at the peak")
    ax.set_ylim(0, max(bottom + [gpu["capacity_gb"]]) * 1.12)
    ax.set_title(f"{drawn['model']}, {drawn['parallel']}, {drawn['gpus_per_node']} x {gpu['name']} per node\n"
                 "above the line: served from host DRAM; label: predicted efficiency, * recommended", fontsize=9)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    save_figure(fig, path, dpi=100, metadata={PLOT_KEY: json.dumps(drawn, sort_keys=True)})


def layout_str_json(lay: dict) -> str:
    return layout_str(memory.Layout(**{k: v for k, v in lay.items() if k != "gpus"}))
