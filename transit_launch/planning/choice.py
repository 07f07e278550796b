"""Which node count to run on, and what to say about it. One rule decides: plan's
recommendation is what render uses and what `submit --nodes auto` submits (submit only
narrows the search to the partition's nodes). Also the warnings for a node count the user
chose, and the answers when no valid node count fits without offloading.

Candidates are plan.Candidate; this module only reads them (plan.py does the search)."""

from __future__ import annotations

from transit_launch.units import gb, n_nodes

# Predicted efficiency that rounds to 100%: as fast as without offloading. In the no-fit
# case more nodes than the first such option would only add rows.
AS_FAST = 0.995


def servable(c) -> bool:
    """Offloading serves this node count: hot data stays on the GPU (only cold state, read
    once a step, leaves it) and the offloaded state fits the node's DRAM."""
    return c.fits_host and not c.spill


def recommend(req, baseline, options) -> tuple[object, str]:
    """(candidate, why): the fewest nodes that offloading serves at predicted per-GPU
    efficiency >= req.min_efficiency; else the no-offload minimum; else (no layout fits
    without offloading) the servable option predicted fastest."""
    ok = [c for c in options if servable(c)]
    good = [c for c in ok if c.efficiency >= req.min_efficiency]
    floor = _pct(req.min_efficiency)
    if good:
        c = min(good, key=lambda c: c.nodes)
        return c, (f"fewest nodes with predicted per-GPU efficiency >= {floor} ({c.efficiency:.0%}) and host "
                   f"DRAM to spare ({gb(c.host_per_node):.0f} of {gb(req.host_mem):.0f} GB per node)")
    if baseline is not None:
        if not options:
            return baseline, "no fewer nodes can run this layout, and it fits without offloading"
        if not ok:
            return baseline, (f"no fewer nodes fit host DRAM ({gb(req.host_mem):.0f} GB per node) without pushing "
                              "hot data off the GPU: run without offloading")
        best = max(ok, key=lambda c: (c.efficiency, -c.nodes))
        return baseline, (f"no fewer nodes keep predicted per-GPU efficiency >= {floor} (the best, "
                          f"{n_nodes(best.nodes)}, {_under(best.efficiency, req.min_efficiency)}): run without "
                          "offloading")
    best = max(ok, key=lambda c: (c.efficiency, -c.nodes))
    return best, (f"nothing fits without offloading and no option reaches predicted efficiency >= {floor}; "
                  f"this one is predicted fastest ({best.efficiency:.0%})")


def _pct(fraction: float) -> str:
    return f"{round(fraction * 100, 2):g}%"  # 0.999 is 99.9%, not a rounded 100%


def _under(fraction: float, floor: float) -> str:
    """An efficiency below the floor, in whole percent unless that rounds up to the floor's
    (89.84% against 90%, not "90% is below 90%")."""
    return _pct(fraction) if round(fraction * 100) >= floor * 100 else f"{fraction:.0%}"


def explain(p, nodes: int) -> tuple[str, list[str]]:
    """For a node count the user chose (render/submit --nodes): what it means, and warnings
    when it pushes hot data off the GPU, overfills host DRAM or falls below the efficiency
    floor."""
    rec = f"the plan recommends {p.recommended.nodes} ({p.reason})"
    c = p.at(nodes)
    if c is None:
        return "as asked", [f"{nodes} node(s) give no valid {p.req.parallel} layout for these settings "
                            f"({p.why_not(nodes)}); {rec}"]
    why = (f"as asked; {gb(c.est.total):.1f} GB per GPU, offload {gb(c.offload):.1f} GB per GPU, "
           f"predicted efficiency {c.efficiency:.0%}")
    if nodes == p.recommended.nodes:  # its shortfalls are the plan's own reason, not a warning against it
        return f"{why}; the plan recommends it ({p.reason})", []
    warnings = []
    if c.spill:
        warnings.append(f"{nodes} node(s) push {gb(c.spill):.1f} GB of hot data per GPU (gradients, activations) "
                        f"off the GPU: it migrates in every microstep (predicted efficiency {c.efficiency:.0%}); "
                        f"{rec}")
    if not c.fits_host:
        warnings.append(f"{nodes} node(s) need {gb(c.host_per_node):.0f} GB of host DRAM per node, more than "
                        f"the node's {gb(p.req.host_mem):.0f} GB allow; {rec}")
    if not warnings and c.efficiency < p.req.min_efficiency:
        warnings.append(f"{nodes} node(s): predicted efficiency {_under(c.efficiency, p.req.min_efficiency)} is below "
                        f"--min-efficiency {_pct(p.req.min_efficiency)}; {rec}")
    return why, warnings


# --- no valid node count fits without offloading -------------------------------------

def _serves(req) -> str:
    return f"global batch {req.global_batch}" if req.global_batch else "this model"


def _pp_advice(pp_hint) -> str:
    n, batch = pp_hint
    return (f"tp+pp needs a local batch of at least pp (one microbatch per stage): with --local-batch {batch}, "
            f"{n_nodes(n)} fit without offloading")


def no_layout(req, rejected: dict, pp_hint) -> str:
    """No node count gives a layout at all."""
    why = max(rejected, key=lambda k: len(rejected[k])) if rejected else ""
    text = (f"no node count up to {req.max_nodes} gives a {req.parallel} layout that serves {_serves(req)} with "
            f"local batch {req.local_batch} on {req.gpus_per_node} GPUs per node")
    return text + (f": {_pp_advice(pp_hint)}" if pp_hint else f" ({why})" if why else "")


def no_fit(req, valid: list, free_minimum, pp_hint) -> str:
    """Why nothing fits without offloading, for the head of the plan: the largest layout's
    need, and what would fit otherwise (the global batch, the pipeline's local batch or
    the node limit are what stand in the way)."""
    big = valid[-1]
    text = (f"No node count up to {req.max_nodes} serves {_serves(req)} without offloading: at "
            f"{n_nodes(big.nodes)} a GPU needs {gb(big.est.total):.1f} of its {gb(req.gpu.memory):.1f} GB.")
    if pp_hint:
        return text + " " + _pp_advice(pp_hint)[0].upper() + _pp_advice(pp_hint)[1:] + "."
    if free_minimum is not None:
        lay = free_minimum.layout
        if req.global_batch and req.global_batch % (lay.dp * lay.local_batch):
            return text + (f" {n_nodes(free_minimum.nodes)} would fit, but their dp {lay.dp} x local batch "
                           f"{lay.local_batch} does not divide global batch {req.global_batch}.")
        if free_minimum.nodes > req.max_nodes:
            return text + f" Without offloading it needs {n_nodes(free_minimum.nodes)}."
    return text


def unservable(req, valid: list, pp_hint) -> str:
    """Neither without offloading nor with it: what to change."""
    big = valid[-1]  # the most nodes: the least per GPU
    where = (f"at {big.nodes} node(s) ({_layout(big)}), " + ("the only valid layout" if len(valid) == 1 else
             f"the most nodes of a valid layout up to {req.max_nodes}"))
    if not big.spill and not big.fits_host:
        return (f"{req.card.name} does not fit on {req.gpu.name} without offloading, and with it host DRAM is too "
                f"small: {where}, the offloaded state needs {gb(big.host_per_node):.0f} GB per node of the "
                f"{gb(req.host_mem):.0f} GB given (--host-mem)")
    hot = big.est.total - big.est.cold
    advice = []
    if pp_hint:
        advice.append(_pp_advice(pp_hint))
    if req.recompute == "none":
        advice.append("use --recompute full")
    if big.layout.tp == 1 and req.gpus_per_node > 1:
        advice.append("use --parallel fsdp+tp (tensor parallelism splits activations and logits)")
    advice.append("lower --seq-len" + (" or --local-batch" if req.local_batch > 1 and big.layout.pp == 1 else ""))
    bd = big.est.breakdown()
    term = max(("activations", "logits", "fsdp"), key=lambda k: bd[k])
    return (f"{req.card.name} does not fit on {req.gpu.name}, not even with offloading: {where}, data used in "
            f"every microstep needs {gb(hot):.1f} GB per GPU of its {gb(req.gpu.memory):.1f} GB ({term} "
            f"{gb(bd[term]):.1f} GB); " + "; or ".join(advice))


def _layout(c) -> str:
    return c.layout.name


# --- what else the plan should say ---------------------------------------------------------

def meets_floor(req, c, offloads: bool) -> bool:
    """Whether candidate c is a good answer: it fits without offloading, or offloading serves
    it at predicted efficiency >= --min-efficiency (what recommend looks for)."""
    return not offloads or (servable(c) and c.efficiency >= req.min_efficiency)


def policy_for(p, nodes: int, policy: str | None) -> str:
    """The shim's policy for a job of `nodes` nodes of plan p: the one asked for, else
    advise below the no-offload minimum and off at or above it (or without a plan)."""
    return policy or ("advise" if p and p.needs_offload(nodes) else "off")


def layout_warnings(req) -> list[str]:
    """What the plan's numbers do not show about the layout asked for."""
    g, tp = req.gpus_per_node, req.tp or 1
    if tp > g:  # plan() allows a multiple of the node's GPUs
        return [f"--tp {tp} spans {tp // g} nodes of {g} GPUs: every layer's tensor-parallel collectives cross "
                f"the network (the traffic column counts them, pred. eff does not); --tp {g} or less keeps them "
                "inside a node"]
    return []
