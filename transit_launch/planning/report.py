"""Plans, catalogs and checks as tables for people and JSON for programs."""

from __future__ import annotations

from transit_launch.planning import memory
from transit_launch.planning import plan as planmod
from transit_launch.planning.plan import Candidate, Plan
from transit_launch.table import table
from transit_launch.units import gb

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


def layout_str(lay: memory.Layout) -> str:
    parts = [f"{k}{v}" for k, v in (("dp", lay.dp), ("tp", lay.tp), ("pp", lay.pp), ("ep", lay.ep)) if v > 1]
    return "x".join(parts) or "dp1"


def layout_json(lay: memory.Layout) -> dict:
    return {"gpus": lay.gpus, "dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "ep": lay.ep,
            "local_batch": lay.local_batch, "seq_len": lay.seq_len, "precision": lay.precision,
            "recompute": lay.recompute}


def traffic_ratio(p: Plan, c: Candidate) -> float | None:
    base = p.baseline.traffic.inter
    if base == 0:
        return 1.0 if c.traffic.inter == 0 else None
    return round(c.traffic.inter / base, 3)


def _reason(p: Plan) -> str:
    r = p.recommended
    if r is p.baseline:
        return (f"no scale-in option keeps predicted per-GPU efficiency >= {p.req.min_efficiency:.0%} "
                "with enough host DRAM: run without offloading")
    return (f"fewest nodes with predicted per-GPU efficiency >= {p.req.min_efficiency:.0%} "
            f"({r.efficiency:.0%}) and host DRAM to spare ({gb(r.host_per_node):.0f} of "
            f"{gb(p.req.host_mem):.0f} GB per node)")


def _option_json(p: Plan, c: Candidate) -> dict:
    return {
        "nodes": c.nodes, "gpus": c.layout.gpus, "layout": layout_json(c.layout),
        "per_gpu_total_gb": gb(c.est.total),
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
        "predicted_efficiency": round(c.efficiency, 3),
        "notes": c.notes,
    }


def plan_json(p: Plan) -> dict:
    req, b = p.req, p.baseline
    return {
        "model": req.card.name,
        "params": req.card.params,
        "active_params": req.card.active_params,
        "gpu": {"name": req.gpu.name, "memory_gb": gb(req.gpu.memory)},
        "gpus_per_node": req.gpus_per_node,
        "host_gb_per_node": gb(req.host_mem),
        "parallel": req.parallel,
        "global_batch": req.global_batch,
        "layout": layout_json(b.layout),
        "min_gpus_no_offload": b.layout.gpus,
        "min_nodes_no_offload": b.nodes,
        "per_gpu_gb": {k: gb(v) for k, v in b.est.breakdown().items()},
        "peak_phase": b.est.peak_phase,
        "traffic_gb_per_node_per_microstep": {"inter": gb(b.traffic.inter), "intra": gb(b.traffic.intra),
                                              **{k: gb(v) for k, v in b.traffic.by_kind.items()}},
        "options": [_option_json(p, c) for c in p.options],
        "recommended": {"nodes": p.recommended.nodes, "gpus": p.recommended.layout.gpus,
                        "offload": p.recommended is not b, "reason": _reason(p)},
        "assumptions": {"mfu": planmod.ASSUMED_MFU, "host_bytes_per_rank_gb": gb(planmod.HOST_BYTES_PER_RANK),
                        "host_usable_fraction": planmod.HOST_USABLE_FRACTION,
                        "host_link_gb_s": gb(req.gpu.host_link)},
    }


def plan_text(p: Plan) -> str:
    req, b, card = p.req, p.baseline, p.req.card
    head = [
        f"{card.name}: {card.params / 1e9:.2f} B parameters"
        + (f" ({card.active_params / 1e9:.2f} B active)" if card.moe else "")
        + f", {req.parallel}, {req.gpu.name} ({gb(req.gpu.memory):.1f} GB), {req.gpus_per_node} GPUs/node, "
        f"{gb(req.host_mem):.0f} GB host/node",
        f"seq {req.seq_len}, local batch {req.local_batch}, global batch {req.global_batch or 'any'}, "
        f"{req.precision} precision, recompute {req.recompute}",
        "",
        f"Per-GPU memory without offloading at the minimum ({b.nodes} nodes, {b.layout.gpus} GPUs, "
        f"{layout_str(b.layout)}), peak in the {b.est.peak_phase} phase:",
    ]
    bd = b.est.breakdown()
    rows = [[t, f"{gb(bd[t]):.2f}", TERM_NOTES[t]] for t in TERMS] + [["total", f"{gb(bd['total']):.2f}", ""]]
    out = head + [table(["term", "GB", ""], rows, "lrl"), ""]
    out.append(f"Minimum without offloading: {b.layout.gpus} GPUs on {b.nodes} nodes.")
    out.append("")
    rows = []
    for c in [b] + p.options:
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
        out.append("Scale-in options (host DRAM as GPU memory, advise policy):")
    out.append(table(["nodes", "GPUs", "layout", "GB/GPU", "oversub", "offload GB/GPU", "host GB/node",
                      "traffic", "pred. eff", "note"], rows, "rrlrrrrrrl"))
    out += ["",
            f"Recommended: {p.recommended.nodes} nodes ({p.recommended.layout.gpus} GPUs): {_reason(p)}.",
            "traffic = per-node inter-node bytes per microstep relative to the baseline; pred. eff = predicted",
            "per-GPU TFLOPS relative to no offloading (compute vs. PCIe only). --json for programs."]
    return "\n".join(out)


def plan_comment(p: Plan, nodes: int) -> list[str]:
    c = next((c for c in [p.baseline] + p.options if c.nodes == nodes), None)
    lines = [f"Plan: {p.req.card.name}, {p.req.parallel}, {p.req.gpu.name}; no-offload minimum "
             f"{p.baseline.nodes} nodes ({p.baseline.layout.gpus} GPUs)."]
    if c:
        lines.append(f"This job: {nodes} nodes, {layout_str(c.layout)}, {gb(c.est.total):.1f} GB per GPU, "
                     f"offload {gb(c.offload):.1f} GB per GPU, predicted efficiency {c.efficiency:.0%}.")
    else:
        lines.append(f"This job: {nodes} nodes (not a planned option for these settings).")
    return lines


def models_text(cards: dict) -> str:
    rows = []
    for c in cards.values():
        kind = f"MoE {c.moe.experts}x top-{c.moe.top_k}" + (" +shared" if c.moe.shared_experts else "") if c.moe else "dense"
        rows.append([c.name, f"{c.params / 1e9:.2f}", f"{c.active_params / 1e9:.2f}", c.layers, c.hidden,
                     f"{c.heads}/{c.kv_heads}", c.vocab, kind])
    return table(["model", "params B", "active B", "layers", "hidden", "heads/kv", "vocab", "kind"], rows,
                 "lrrrrrrl")


def doctor_text(checks: list[dict]) -> str:
    return table(["check", "status", "detail"],
                 [[c["check"], "ok" if c["ok"] else "missing", c["detail"]] for c in checks], "lll")
