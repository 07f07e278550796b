"""Per-node collective traffic for one microstep (one local batch on every data-parallel
rank), split into inter-node (NIC) and intra-node (NVLink) bytes, sent plus received.

Ranks are laid out as TorchTitan builds its device mesh: [pp, dp, tp] with tp innermost
and nodes holding consecutive ranks; expert-parallel groups are consecutive ranks inside
dp x tp. Collectives are NCCL rings. A ring of d ranks moving a buffer of S bytes
(all-gather output or reduce-scatter input) carries (d-1)/d x S on every link; with r of
its ranks on each node it leaves a node over exactly one link, so per node it sends
(g/r) x (d-1)/d x S over the network (g GPUs per node, g/r such rings touch a node) and
receives as much. This reproduces the paper's section 4.2: FSDP+TP of Llama3-70B drops
by a third from 4 to 2 nodes ((1/2)/(3/4)), full FSDP only gradually ((N-1)/N), and
TP+PP stays flat (point-to-point activations per stage do not depend on node count).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transit_launch.planning.memory import DTYPES, Layout, stage_layers
from transit_launch.planning.models import ModelCard


@dataclass
class Traffic:
    inter: float = 0.0  # bytes per node per microstep over the network (tx + rx)
    intra: float = 0.0  # bytes per node per microstep inside the node (tx + rx)
    by_kind: dict = field(default_factory=dict)  # kind -> inter-node bytes

    def add(self, kind: str, inter: float, intra: float) -> None:
        self.inter += inter
        self.intra += intra
        self.by_kind[kind] = self.by_kind.get(kind, 0.0) + inter


def _ring(d: int, r: int, g: int, payload: float) -> tuple[float, float]:
    """(inter, intra) bytes per node, tx + rx, for rings of d ranks with r per node."""
    if d <= 1:
        return 0.0, 0.0
    r = max(1, min(r, d))
    per_link = (d - 1) / d * payload
    rings = g / r
    inter = 2 * rings * per_link if d > r else 0.0
    intra = 2 * rings * (r - 1) * per_link if d > r else 2 * rings * r * per_link
    return inter, intra


def per_node(card: ModelCard, lay: Layout, gpus_per_node: int) -> Traffic:
    g = gpus_per_node
    tr = Traffic()
    layers = stage_layers(card, lay.pp, 0)
    dt = DTYPES[lay.precision]  # gathers, reduce-scatters (fp32 under mixed) and activations
    gathers = 1 if lay.pp > 1 else 2  # FSDP2 re-gathers in backward unless PP keeps params
    mb = lay.pp_microbatches  # microbatches per microstep on one pipeline

    # FSDP: dense weights over dp (stride tp); routed experts over dp*tp/ep (stride ep).
    p_stage = sum(card.layer_params(i) for i in layers)
    p_stage += card.embedding_params + (card.output_params if lay.pp == 1 else 0)
    routed = sum(card.moe.experts * card.expert_params for i in layers if card.is_moe_layer(i)) if card.moe else 0
    if lay.ep > 1:
        dense, experts = p_stage - routed, routed
    else:
        dense, experts = p_stage, 0
    per_param = gathers * dt.gather + dt.reduce
    r_dp = max(1, g // lay.tp)
    tr.add("fsdp", *_ring(lay.dp, r_dp, g, dense / lay.tp * per_param))
    if lay.ep > 1:
        efsdp = lay.dp * lay.tp // lay.ep
        tr.add("fsdp", *_ring(efsdp, max(1, g // lay.ep), g, experts / lay.ep * per_param))

    # TP with sequence parallelism: per layer 2 all-gathers and 2 reduce-scatters of the
    # hidden states forward, as many backward, and again in the recomputed forward.
    T = lay.microbatch_tokens
    passes = 3 if lay.recompute == "full" else 2
    tp_payload = len(layers) * 4 * passes * T * card.hidden * dt.compute * mb
    tr.add("tp", *_ring(lay.tp, min(lay.tp, g), g, tp_payload))

    # PP: every rank sends its slice of the activations forward and of their gradients
    # backward, per microbatch. Reported for the busiest node: an interior stage sends and
    # receives both (4 transfers); with pp = 2 both stages are end stages (2 transfers).
    if lay.pp > 1:
        transfers = 4 if lay.pp > 2 else 2
        per_rank = transfers * T * card.hidden * dt.compute / lay.tp * mb
        stage_ranks = lay.gpus // lay.pp
        crossing = min(1.0, stage_ranks / g)
        tr.add("pp", g * per_rank * crossing, g * per_rank * (1 - crossing))

    # EP all-to-all: dispatch and combine of top_k copies of every token, forward,
    # backward and recomputed forward; a uniform router sends (ep - r)/ep off-node.
    if lay.ep > 1:
        moe_layers = sum(card.is_moe_layer(i) for i in layers)
        per_rank = moe_layers * 2 * passes * (T / lay.tp) * card.moe.top_k * card.hidden * dt.compute * mb
        r = min(lay.ep, g)
        off = (lay.ep - r) / lay.ep
        tr.add("ep", 2 * g * per_rank * off, 2 * g * per_rank * (1 - off))
    return tr
