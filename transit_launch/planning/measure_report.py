"""`plan --measure` output: the measured peak per term beside the formula's."""

from __future__ import annotations

from dataclasses import replace

from transit_launch.planning.measure import Measured
from transit_launch.planning.memory import Estimate, Layout, estimate
from transit_launch.planning.models import ModelCard
from transit_launch.table import table


def gb(nbytes: float) -> float:
    return round(nbytes / 1e9, 4)  # JSON keeps 4 decimals; a toy model's terms are a few MB

FORMULA_TERMS = {  # measured term -> the formula's terms it covers
    "parameters": ("parameters",),
    "gradients": ("gradients",),
    "optimizer": ("optimizer",),
    "fsdp": ("fsdp",),
    "activations+logits": ("activations", "logits"),
}
NOTES = {"fsdp": "gathered weights, their bf16 gradients (formula) / fp32 reduce buffers",
         "activations+logits": "checkpoints, the layer being recomputed, loss buffers"}


def formula_for(card: ModelCard, lay: Layout, m: Measured) -> Estimate:
    """The formula at the measured depth (a truncated run is compared with a truncated card)."""
    return estimate(replace(card, layers=m.layers) if m.layers != card.layers else card, lay)


def compare(card: ModelCard, lay: Layout, m: Measured) -> dict:
    e = formula_for(card, lay, m)
    bd = e.breakdown()
    terms = {t: {"formula_gb": gb(sum(bd[f] for f in fs)), "measured_gb": gb(m.terms[t])}
             for t, fs in FORMULA_TERMS.items()}
    return {"model": card.name, "layers": m.layers, "layout": {"dp": lay.dp, "local_batch": lay.local_batch,
                                                               "seq_len": lay.seq_len, "microsteps": lay.microsteps},
            "terms": terms, "formula_tensors_gb": gb(e.tensors), "measured_gb": gb(m.total),
            "error": (e.tensors - m.total) / m.total, "formula_total_gb": gb(e.total),
            "formula_phase": e.peak_phase, "measured_phase": m.phase, "measured_where": m.where,
            "measured_kinds_gb": {k: gb(v) for k, v in m.kinds.items() if v}, "seconds": round(m.seconds, 1),
            "model_source": m.model}


def text(c: dict) -> str:
    lay = c["layout"]
    rows = [[t, f"{v['formula_gb']:.2f}", f"{v['measured_gb']:.2f}", NOTES.get(t, "")] for t, v in c["terms"].items()]
    rows.append(["total (tensors)", f"{c['formula_tensors_gb']:.2f}", f"{c['measured_gb']:.2f}",
                 f"formula {100 * c['error']:+.1f}%"])
    return "\n".join([
        f"{c['model']} ({c['layers']} layers), dp{lay['dp']}, seq {lay['seq_len']}, local batch {lay['local_batch']}, "
        f"{lay['microsteps']} microstep(s): one training step under FakeTensorMode + FSDPMemTracker "
        f"({c['seconds']} s, {c['model_source']})",
        f"peak: formula in the {c['formula_phase']} phase, measured in the {c['measured_phase']} phase "
        f"({c['measured_where']})",
        "",
        table(["term", "formula GB", "measured GB", ""], rows, "lrrl"),
        "",
        f"The plan's total adds the CUDA context, NCCL buffers and allocator slack: {c['formula_total_gb']:.2f} GB.",
    ])
