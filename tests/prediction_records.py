"""The plan's predicted efficiency against TorchTitan's measured runs (issue 31), as data:
every advise run of bench/results/*/titan_steps_*.json (TorchTitan 0.2.2 unchanged, Llama3-8B
dimensions at 16 layers, seq 8192, local batch 1, one H200, bench/titan_steps.py) against
its own file's no-offload run, and what `plan` predicts for that job at that budget
(`--gpu h200-141gb --gpu-mem <budget> --gpus-per-node 1 --global-batch <microbatches>`).
FIT names the runs each constant of planning/plan.py was set from; the others are held out.
tests/test_prediction.py checks the rows; bench/prediction.py prints them as RESULTS.md's table."""

import json
import statistics
from dataclasses import replace
from pathlib import Path

from transit_launch.rules import ENV

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
# (file, run) -> the constants of planning/plan.py fitted to it
FIT = {
    ("titan_steps_populate_2026-12-01.json", "advise"): ("STATE_LINK_SHARE", "SHIM_RESERVED_GAP"),
    ("titan_steps_accum16_masterroom_2026-12-01.json", "advise"): ("STATE_LINK_SHARE",),
    ("titan_steps_accum1_masterroom_2026-12-01.json", "advise"): ("SHIM_RESERVED_GAP",),
}
# runs of a shim or adapter build that is not main's: their first steps differ (up to 2x), their
# steady steps do not (within 0.5%, RESULTS.md "TorchTitan's first steps under advise")
OTHER_BUILD = {
    ("titan_steps_accum4_hostpop_2026-12-01.json", "advise"):
        "new host-placed allocations populated on the host at once (measured slower, not kept)",
    ("titan_steps_accum4_hostpop_2026-12-01.json", "advise:STATE_OFF=0.5"): "the same build",
    ("titan_steps_accum4_hostpop_2026-12-01.json", "advise:STATE_OFF=0"): "the same build",
    ("titan_steps_populate_2026-12-01.json", "advise"): "before new device allocations were populated",
    ("titan_steps_populate_2026-12-01.json", "advise:TRANSIT_SHIM=/tmp/populate/libtransit.so"):
        "before the master weights' room",
    ("titan_steps_accum16_populate_2026-12-01.json", "advise"): "before the master weights' room",
    ("titan_steps_accum1_populate_2026-12-01.json", "advise"): "before the master weights' room",
}
# runs that are not plain advise as main runs it, left out of the points: the plan predicts
# advise; what they measured is in RESULTS.md "The optimizer state made in pinned host memory"
NOT_ADVISE = {
    ("titan_steps_accum16_hoststate_2026-12-02.json", "advise"):
        "the adapter marked the state under plain advise (no longer): 1.26 GB of it stayed on the GPU and hot data "
        "went to the host, 4 points slower",
    ("titan_steps_accum1_hoststate_2026-12-02.json", "advise"): "the same build",
}
OVERLAP_ENV = ENV["OVERLAP_STEP"]  # a run with a step mode of its own is not advise's either
TARGET = 0.03  # issue 31: within 3 points of the measured per-GPU TFLOPS ratio


def _steady(xs):
    return statistics.median(xs[2:])


def points(paths=None):
    """Each advise run with its own file's reference: what was measured."""
    paths = sorted(RESULTS.glob("**/titan_steps_*.json")) if paths is None else paths
    for path in sorted(paths, key=lambda p: Path(p).name):
        d = json.loads(Path(path).read_text())
        ref = next((r for r in d["runs"] if r["name"] == "ref" and r.get("optimizer_s")), None)
        for r in d["runs"]:
            key = (Path(path).name, r["name"])
            if r["policy"] != "advise" or not r.get("optimizer_s") or ref is None or key in NOT_ADVISE \
                    or OVERLAP_ENV in r["env"]:
                continue
            stats = r["stats"][0]
            yield {"file": key[0], "run": r["name"], "layers": d["layers"], "microbatches": d["accum"],
                   "seq_len": d["seq_len"], "budget": r["budget"], "measured": _steady(ref["step_s"]) / _steady(r["step_s"]),
                   "host_bytes": stats["host_placed_bytes"] + stats.get("host_state_bytes", 0), "reserved": r["max_reserved"],
                   "state_s": _steady(r["optimizer_s"]) - _steady(ref["optimizer_s"]),
                   "first_step_extra_s": r["optimizer_s"][0] - ref["optimizer_s"][0],
                   "fit": FIT.get(key, ()), "other_build": OTHER_BUILD.get(key), "pool_off": "TRANSIT_STATE_POOL" in r["env"]}


def predict(pt):
    """What `plan` says of the point's job at its budget: the candidate (with its warm-up)."""
    from transit_launch.planning.hardware import gpu_profile
    from transit_launch.planning.models import load_model
    from transit_launch.planning.plan import Request, evaluate, layout_for
    card = replace(load_model("llama3-8b"), layers=pt["layers"])
    req = Request(card=card, gpu=gpu_profile("h200-141gb", memory=pt["budget"]), gpus_per_node=1,
                  seq_len=pt["seq_len"], global_batch=pt["microbatches"])
    return evaluate(req, 1, layout_for(req, 1))


def rows(paths=None):
    out = []
    for pt in points(paths):
        c = predict(pt)
        out.append(dict(pt, predicted=c.efficiency, offload_predicted=c.offload, warm_up_predicted_s=c.warm_up_s,
                        error=c.efficiency - pt["measured"]))
    fitted = {(r["microbatches"], r["budget"]) for r in out if r["fit"]}
    for r in out:  # a held-out run of a job some fit run also ran (another lease) is weaker evidence
        r["new_job"] = not r["fit"] and (r["microbatches"], r["budget"]) not in fitted
    return out


def role(r):
    if r["fit"]:
        return "fit: " + ", ".join(r["fit"])
    return "held out" if r["new_job"] else "held out (a fit run's job, another run)"
