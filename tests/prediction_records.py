"""The plan's predicted efficiency against TorchTitan's measured runs (issue 31), as data:
every advise run of bench/results/**/titan_steps_*.json (TorchTitan 0.2.2 unchanged, Llama3-8B
dimensions at 16 layers, seq 8192, local batch 1, one H200, bench/titan_steps.py) against
its own file's no-offload run, and what `plan` predicts for that job at that budget
(`--gpu h200-141gb --gpu-mem <budget> --gpus-per-node 1 --global-batch <microbatches>`).
FIT names the runs each constant of planning/plan.py was set from; the others are held out.
A run is named by its file's path under bench/results/ and its run name. Both of advise's
steps are points: streamed (the default since 2026-12-02) and in place (TRANSIT_OVERLAP_STEP=0,
and every run before), told apart by the adapter's own line.
tests/test_prediction.py checks the rows; bench/prediction.py prints them as RESULTS.md's table."""

import json
import statistics
from dataclasses import replace
from pathlib import Path

from transit_launch.rules import ENV

from tests.frozen import RESULTS

ROOT = Path(__file__).resolve().parent.parent
# (file, run) -> the constants of planning/plan.py fitted to it
D1, D2 = "2026-12-01/", "2026-12-02/"
FIT = {
    (D1 + "titan_steps_populate_2026-12-01.json", "advise"): ("STATE_LINK_SHARE", "SHIM_RESERVED_GAP"),
    (D1 + "titan_steps_accum16_masterroom_2026-12-01.json", "advise"): ("STATE_LINK_SHARE",),
    (D1 + "titan_steps_accum1_masterroom_2026-12-01.json", "advise"): ("SHIM_RESERVED_GAP", "WARMUP_STATE_RATE"),
    (D2 + "torchtitan/titan_steps_accum16_stream.json", "advise:TRANSIT_OVERLAP_STEP=stream"): ("STREAM_LINK_SHARE",),
    (D2 + "torchtitan-3/titan_steps_accum16_stream.json", "advise"): ("STREAM_LINK_SHARE",),
    (D2 + "torchtitan-8/titan_steps_accum8_stream.json", "advise"): ("WARMUP_PINNED_RATE",),
}
# runs of a shim or adapter build that is not main's: their first steps differ (up to 2x), their
# steady steps do not (within 0.5%, LOG.md "TorchTitan's first steps under advise")
OTHER_BUILD = {
    (D1 + "titan_steps_accum4_hostpop_2026-12-01.json", "advise"):
        "new host-placed allocations populated on the host at once (measured slower, not kept)",
    (D1 + "titan_steps_accum4_hostpop_2026-12-01.json", "advise:STATE_OFF=0.5"): "the same build",
    (D1 + "titan_steps_accum4_hostpop_2026-12-01.json", "advise:STATE_OFF=0"): "the same build",
    (D1 + "titan_steps_populate_2026-12-01.json", "advise"): "before new device allocations were populated",
    (D1 + "titan_steps_populate_2026-12-01.json", "advise:TRANSIT_SHIM=/tmp/populate/libtransit.so"):
        "before the master weights' room",
    (D1 + "titan_steps_accum16_populate_2026-12-01.json", "advise"): "before the master weights' room",
    (D1 + "titan_steps_accum1_populate_2026-12-01.json", "advise"): "before the master weights' room",
    **{(D2 + f, run): "the streamed step before its state was pinned on huge pages (b56e1be): pinning ran at "
       "2.2-8 GB/s, not 11-16" for f, run in (
           ("torchtitan/titan_steps_accum16_stream.json", "advise:TRANSIT_OVERLAP_STEP=stream"),
           ("torchtitan/titan_steps_accum1_stream.json", "advise:TRANSIT_OVERLAP_STEP=stream"),
           ("torchtitan-3/titan_steps_accum16_stream.json", "advise"),
           ("torchtitan-3/titan_steps_accum1_stream.json", "advise:STATE_OFF=0.5"),
           ("torchtitan-4/titan_steps_accum1_stream.json", "advise:STATE_OFF=0.5"),
           ("torchtitan-5/titan_steps_accum16_stream.json", "advise"),
           ("torchtitan-5/titan_steps_accum1_stream.json", "advise:STATE_OFF=0.5"))},
    **{(D2 + f, "advise"): "the streamed step's state pinned on huge pages, before its pages were written in "
       "the background (acb8a2c): 36.3 GB pinned in 3.4 s on the first step" for f in (
           "torchtitan-6/titan_steps_accum16_stream.json",)},
    (D2 + "torchtitan-6/titan_steps_accum1_stream.json", "advise:STATE_OFF=0.5"):
        "the same build: 15.8 GB pinned in 0.96 s",
    **{(D2 + f, run): why for f, run, why in (
        ("torchtitan-9/titan_steps_accum1_stream.json", "advise:STATE_OFF=0.5",
         "the pre-fill that wrote only what a waiting slice needed (07a7d09): 15.8 GB pinned in 1.08 s"),
        ("torchtitan-9/titan_steps_accum2_stream.json", "advise", "the same build: 36.3 GB pinned in 1.74 s"),
        ("torchtitan-10/titan_steps_accum1_stream.json", "advise:STATE_OFF=0.5",
         "the pre-fill kept near the slices with 15 writers (9dc1cdc): 15.8 GB pinned in 0.69 s"),
        ("torchtitan-10/titan_steps_accum2_stream.json", "advise", "the same build: 36.3 GB pinned in 2.82 s"))},
}
# runs of builds whose steady steps are not main's, left out of the points; what they measured
# is in LOG.md ("The optimizer state made in pinned host memory", "The streamed step by default")
NOT_ADVISE = {
    (D2 + "titan_steps_accum16_hoststate_2026-12-02.json", "advise"):
        "the adapter marked the state under plain advise (no longer): 1.26 GB of it stayed on the GPU and hot data "
        "went to the host, 4 points slower",
    (D2 + "titan_steps_accum1_hoststate_2026-12-02.json", "advise"): "the same build",
    (D2 + "titan_steps_accum16_stream_2026-12-02.json", "advise:TRANSIT_OVERLAP_STEP=stream"): "the same build",
    (D2 + "titan_steps_accum1_stream_2026-12-02.json", "advise:TRANSIT_OVERLAP_STEP=stream"): "the same build",
    (D2 + "torchtitan-2/titan_steps_accum16_stream.json", "advise"):
        "the default that kept state with no room spare: hot data went to the host, and a parameter with part of "
        "its state pinned turned streaming off, 5 points slower",
    (D2 + "torchtitan-2/titan_steps_accum1_stream.json", "advise:STATE_OFF=0.5"): "the same build",
    (D2 + "torchtitan-4/titan_steps_accum16_stream.json", "advise"):
        "the build before regions were cut at the grain and embedding tables hinted sparse: 1.1 GB over the budget "
        "sent the whole 2.1 GB output projection zero-copy, 4 points slower",
}
# the adapter's line at exit, for the records made before its counters reached the stats report
STREAMED = "optimizer steps streamed through the copy engines"
# points past the target, each with its measured reason; tests/test_prediction.py checks the reason
OFF_TARGET = {
    (D2 + "torchtitan-2/titan_steps_accum1_stream.json", "advise:TRANSIT_OVERLAP_STEP=0+STATE_OFF=0.5"):
        "the plan offloads 15.2 GB where the shim placed 13.5 GB on the host: at one microbatch the shim's cache "
        "reserved 3% over the plan's estimate, not the fitted SHIM_RESERVED_GAP",
    (D2 + "torchtitan-3/titan_steps_accum1_stream.json", "advise:TRANSIT_OVERLAP_STEP=0+STATE_OFF=0.5"):
        "the same job",
    (D2 + "torchtitan-4/titan_steps_accum1_stream.json", "advise:TRANSIT_OVERLAP_STEP=0+STATE_OFF=0.5"):
        "the same job",
    (D2 + "torchtitan-5/titan_steps_accum1_stream.json", "advise:TRANSIT_OVERLAP_STEP=0+STATE_OFF=0.5"):
        "the same job",
    (D2 + "torchtitan-6/titan_steps_accum1_stream.json", "advise:TRANSIT_OVERLAP_STEP=0+STATE_OFF=0.5"):
        "the same job",
    (D2 + "torchtitan-7/titan_steps_accum1_stream.json", "advise:TRANSIT_OVERLAP_STEP=0+STATE_OFF=0.5"):
        "the same job",
    (D2 + "torchtitan-7/titan_steps_accum1_stream.json", "advise:STATE_OFF=0.5"):
        "the same job streamed: the plan offloads 17.5 GB where the shim pinned 15.8 GB (the same 3% reserved "
        "gap, not SHIM_RESERVED_GAP's 5%); 2.0 points in the call before, 3.5 in this one",
    **{(D2 + f"torchtitan-{n}/titan_steps_accum1_stream.json", run): "the same job" + streamed
       for n in (9, 10, 11) for run, streamed in (("advise:TRANSIT_OVERLAP_STEP=0+STATE_OFF=0.5", ""),
                                              ("advise:STATE_OFF=0.5", " streamed"))},
}
OVERLAP_ENV = ENV["OVERLAP_STEP"]  # a run overlapping its step with backward (the retired 1, staged) is not a point
TARGET = 0.03  # issue 31: within 3 points of the measured per-GPU TFLOPS ratio
# a named exception may not drift without bound: past it, its reason no longer explains it
OFF_TARGET_AT_MOST = 2 * TARGET


def _steady(xs):
    return statistics.median(xs[2:])


def points(paths=None):
    """Each advise run with its own file's reference: what was measured."""
    paths = sorted(RESULTS.glob("**/titan_steps_*.json")) if paths is None else paths
    for path in sorted(paths, key=lambda p: Path(p).name):
        d = json.loads(Path(path).read_text())
        ref = next((r for r in d["runs"] if r["name"] == "ref" and r.get("optimizer_s")), None)
        for r in d["runs"]:
            key = (Path(path).resolve().relative_to(RESULTS).as_posix(), r["name"])
            if r["policy"] != "advise" or not r.get("optimizer_s") or ref is None or key in NOT_ADVISE \
                    or r["env"].get(OVERLAP_ENV, "0") not in ("0", "stream"):
                continue
            stats = r["stats"][0]
            step = "streamed" if _streamed(r, stats) else "in place"
            yield {"file": key[0], "run": r["name"], "step": step, "layers": d["layers"], "microbatches": d["accum"],
                   "seq_len": d["seq_len"], "budget": r["budget"], "measured": _steady(ref["step_s"]) / _steady(r["step_s"]),
                   "host_bytes": stats["host_placed_bytes"] + stats.get("host_state_bytes", 0), "reserved": r["max_reserved"],
                   "state_s": _steady(r["optimizer_s"]) - _steady(ref["optimizer_s"]),
                   "first_step_extra_s": r["optimizer_s"][0] - ref["optimizer_s"][0],
                   "fit": FIT.get(key, ()), "other_build": OTHER_BUILD.get(key), "pool_off": "TRANSIT_STATE_POOL" in r["env"],
                   "off_target": OFF_TARGET.get(key), "warm_up_overstated": WARM_UP_OVERSTATED.get(key)}


def _streamed(run, stats) -> bool:
    """Whether the run's step streamed: the adapter's counters in the stats report, or its line
    in a record older than them."""
    if "adapter" in stats:
        return stats["adapter"].get("mode") == "stream"
    return any(STREAMED in line for line in run.get("adapter_lines", []))


def predict(pt):
    """What `plan` says of the point's job at its budget: the candidate (with its warm-up)."""
    return evaluate_one_gpu(request_of(pt))


def evaluate_one_gpu(req):
    """`plan`'s candidate for a request on one GPU, the layout it would pick there."""
    from transit_launch.planning.plan import evaluate, layout_for
    return evaluate(req, 1, layout_for(req, 1))


# points whose first step made the state well inside the plan's stated warm-up (under half of
# it): the plan's warm-up is an upper bound there, not an estimate
WARM_UP_OVERSTATED = {
    (D2 + "torchtitan-2/titan_steps_accum1_stream.json", "advise:TRANSIT_OVERLAP_STEP=0+STATE_OFF=0.5"):
        "half the state offloaded at one microbatch: 13.5 GB made on the host in 3.4 s, 4 GB/s",
    (D2 + "torchtitan-3/titan_steps_accum1_stream.json", "advise:TRANSIT_OVERLAP_STEP=0+STATE_OFF=0.5"):
        "the same job",
    (D2 + "torchtitan-4/titan_steps_accum1_stream.json", "advise:TRANSIT_OVERLAP_STEP=0+STATE_OFF=0.5"):
        "the same job in place: 13.5 GB in 3.7 s",
    (D2 + "torchtitan-6/titan_steps_accum1_stream.json", "advise:TRANSIT_OVERLAP_STEP=0+STATE_OFF=0.5"):
        "the same job in place: 13.5 GB in 3.7 s",
    (D2 + "torchtitan-7/titan_steps_accum1_stream.json", "advise:TRANSIT_OVERLAP_STEP=0+STATE_OFF=0.5"):
        "the same job in place: 13.5 GB in 3.7 s",
}


def efficiency_at_offload(req, c, offload):
    """The plan's efficiency for candidate c of request req with `offload` bytes off the GPU in
    place of its own: what the step-time model gives when the memory model is taken out."""
    from transit_launch.planning.efficiency import efficiency_of, host_terms
    return efficiency_of(host_terms(req, replace(c, offload=offload)))


def predict_at_measured_offload(pt):
    """The plan's efficiency for the point with the bytes the shim placed on the host in place of
    the plan's offload."""
    req = request_of(pt)
    return efficiency_at_offload(req, evaluate_one_gpu(req), pt["host_bytes"])


def request_of(pt):
    from transit_launch.planning.hardware import gpu_profile
    from transit_launch.planning.models import load_model
    from transit_launch.planning.plan import Request
    card = replace(load_model("llama3-8b"), layers=pt["layers"])
    return Request(card=card, gpu=gpu_profile("h200-141gb", memory=pt["budget"]), gpus_per_node=1,
                   seq_len=pt["seq_len"], global_batch=pt["microbatches"],
                   overlap="stream" if pt["step"] == "streamed" else "0")


def rows(paths=None):
    out = []
    for pt in points(paths):
        c = predict(pt)
        out.append(dict(pt, predicted=c.efficiency, offload_predicted=c.offload, warm_up_predicted_s=c.warm_up_s,
                        plan_bytes=c.est.total, error=c.efficiency - pt["measured"]))
    fitted = {(r["microbatches"], r["budget"]) for r in out if r["fit"]}
    for r in out:  # a held-out run of a job some fit run also ran (another lease) is weaker evidence
        r["new_job"] = not r["fit"] and (r["microbatches"], r["budget"]) not in fitted
    return out


def role(r):
    if r["fit"]:
        return "fit: " + ", ".join(r["fit"])
    return "held out" if r["new_job"] else "held out (a fit run's job, another run)"


# --- the examples' trainer in shapes no constant was fitted to (bench/ `shapes` suite) ---------

# shape runs past the target, each with the term of the plan that is off and why; the test
# (tests/test_prediction.py) checks each kind of reason against the run's own measurements:
# "link": the state moved faster than the link share the plan assumes (STATE_LINK_SHARE);
# "compute": the plan's compute time (ASSUMED_MFU) is well under the reference's measured step,
#   its host-link time is the run's extra time over the reference (the compute term alone is
#   off), and the reference's step in its place brings the plan within the target;
# "offload": the plan offloads more than the shim did (the streamed step's pinned state, all of
#   it when the adapter stepped no parameter in place, plus what the shim placed on the host),
#   and the shim's bytes in its place bring the plan within the target.
# A point may be explained by more than one kind (on the wide shape the plan's compute is
# 0.77-0.82 of the measured at every point, and the first entry's link share also holds): each
# entry names one, and that one's check must hold.
SHAPES_OFF_TARGET = {
    (D2 + "shapes/shapes_wide.json", "advise-plain", 4): (
        "link", "the step in place read and wrote the state zero-copy at 0.94 of the host link, not the 0.84 "
        "(STATE_LINK_SHARE) measured under TorchTitan: the plan is pessimistic"),
    ("2026-12-06/shapes/shapes_wide_16_8_2.json", "advise", 2): (
        "compute", "the wide Linears ran at about 0.81 of the plan's assumed MFU (0.246 s without offloading "
        "against the plan's 0.199 s), so the same state time is a smaller share of the step: the plan is "
        "pessimistic; its state time is right (0.147 s measured over the reference, 0.142 s planned)"),
    ("2026-12-06/shapes-by-hand/shapes_wide_ffn_16_2.json", "advise", 16): (
        "offload", "the plan has the 256 MiB ring push 0.39 GB of parameters to the host, read twice every "
        "microbatch; the shim placed 0.21 GB there: the plan is pessimistic, more so with more microbatches"),
    ("2026-12-06/shapes-by-hand/shapes_wide_ffn_8.json", "advise", 8): ("offload", "the same"),
}


def shape_offload_measured(run):
    """The bytes a shapes run had off the GPU: what the shim placed on the host, plus the
    streamed step's pinned state when the adapter says it stepped no parameter in place (all of
    the AdamW state, 8 bytes a parameter, pinned); None where the record cannot tell."""
    host = run["shim"]["host_placed_bytes"]
    if run["name"] == "advise-plain":
        return host  # the state in place: managed memory the shim placed on the host
    said = " ".join(run.get("adapter_log") or [])
    return host + 8 * run["params"] if " 0 parameters stepped in place" in said else None


def shape_rows(paths=None):
    """Each advise run of the shapes suite (bench/offload.py's records) against its own point's
    no-offload run, with what `plan` predicts for the trainer's model (tests/example_trainer.py's
    card, tied where the run tied its embeddings) at that budget, seq, batch and microbatches, and
    the plan again with the reference's measured step as its compute time and with the bytes
    measured off the GPU as its offload (the two terms the named reasons are about)."""
    from tests.example_trainer import trainer_card, trainer_flags
    from transit_launch.planning.hardware import gpu_profile
    from transit_launch.planning.efficiency import efficiency_of, host_terms
    from transit_launch.planning.plan import Request

    out = []
    for path in paths or sorted(RESULTS.glob("*/shapes*/shapes_*.json")):  # every call's folder (shapes, shapes-2, ...)
        d = json.loads(Path(path).read_text())
        ref = {r["accum"]: r for r in d["runs"] if r["name"] == "reference" and r["rc"] == 0}
        model = d["model"]
        card = trainer_card(trainer_flags(model))
        card = replace(card, tied_embeddings="--tie-embeddings" in model.split())
        for r in d["runs"]:
            if r["policy"] != "advise" or r["rc"] != 0 or r["accum"] not in ref:
                continue
            step = "in place" if r["name"] == "advise-plain" else "streamed"
            req = Request(card=card, gpu=gpu_profile("h200-141gb", memory=r["budget_bytes"]), gpus_per_node=1,
                          seq_len=d["seq_len"], local_batch=d["batch"],
                          global_batch=d["batch"] * r["accum"], overlap="0" if step == "in place" else "stream")
            c = evaluate_one_gpu(req)
            terms = host_terms(req, c)
            key = (str(Path(path).relative_to(RESULTS)), r["name"], r["accum"])
            ref_s = ref[r["accum"]]["median_step_s"]
            measured = ref_s / r["median_step_s"]
            off = shape_offload_measured(r)
            at_off = None if off is None else efficiency_at_offload(req, c, off)
            shim = r["shim"]
            out.append({"file": key[0], "run": r["name"], "microbatches": r["accum"], "step": step,
                        "measured": measured, "predicted": c.efficiency, "error": c.efficiency - measured,
                        "host_bytes": shim["host_placed_bytes"],  # managed bytes on the host (the state, in place)
                        "extra_s": r["median_step_s"] - ref_s, "ref_s": ref_s, "compute_s": terms["compute_s"],
                        "host_s": terms["state_s"] + terms["master_reads_s"] + terms["spill_s"],
                        "at_ref_compute": efficiency_of(dict(terms, compute_s=ref_s)),
                        "offload_predicted": c.offload, "offload_measured": off, "at_measured_offload": at_off,
                        "off_target": SHAPES_OFF_TARGET.get(key)})
    return out


# --- the 2 -> 1 scale-in (bench/ `scale-in` suite, the examples' trainer on two H200s) --------

SCALE_IN = "2026-11-30/scale_in_matrix_2026-11-30.json"
# each point past the target, with its measured reasons; tests/test_prediction.py checks that the
# two measured terms in place of the plan's bring it within the target
SCALE_IN_OFF_TARGET = {
    **{(SCALE_IN, "full", g): "pessimistic: one GPU ran 3.5-3.9% faster per GPU than two without offloading "
       "(the two's FSDP collectives), which the plan does not model" for g in (4, 8)},
    **{(SCALE_IN, "none", g): "pessimistic: the same, and the plan offloads 6.1 GB where the shim placed 2.6 GB "
       "(its estimate 2.2% over this trainer's reserved peak, then TorchTitan's reserved gap on top)"
       for g in (4, 8)},
}


def scale_in_rows(path=RESULTS / SCALE_IN):
    """Each recompute and global batch of the scale-in matrix: the one-GPU advise layout's per-GPU
    TFLOPS against the two-GPU layout without offloading (the mean of the repeats), what `plan`
    predicts for its one-node option (the trainer's card, the emulated GPU as the budget, one GPU a
    node, the step in place as advise ran it then), and the two terms measured beside it: the
    one-GPU layout without offloading against the two (`half-off`) and the bytes offloaded."""
    from tests.example_trainer import trainer_card, trainer_flags
    from transit_launch.planning.hardware import gpu_profile
    from transit_launch.planning.plan import Request, plan

    d = json.loads(Path(path).read_text())
    out = []
    for rc, flags in (("ac", ""), ("noac", "--no-recompute")):
        for g in sorted({r["global_sequences"] for r in d["runs"] if r["recompute"] == rc}):
            runs = {lay: [r for r in d["runs"] if r["recompute"] == rc and r["global_sequences"] == g
                          and r["layout"] == lay and r["rc"] == 0] for lay in ("full", "half-off", "half-advise")}
            tflops = {lay: statistics.mean(r["tflops_per_gpu"] for r in rs) for lay, rs in runs.items()}
            adv = runs["half-advise"][0]
            recompute = "full" if rc == "ac" else "none"
            req = Request(card=trainer_card(trainer_flags(flags)), gpu=gpu_profile("h200-141gb", memory=d["budgets"][rc]),
                          gpus_per_node=1, seq_len=d["seq_len"], local_batch=d["batch"], global_batch=g,
                          recompute=recompute, overlap="0")
            p = plan(req)
            (c,) = [c for c in p.options if c.nodes == 1]
            measured = tflops["half-advise"] / tflops["full"]
            out.append({"file": Path(path).relative_to(RESULTS).as_posix(), "recompute": recompute,
                        "global_sequences": g, "baseline_gpus": p.baseline.layout.gpus, "measured": measured,
                        "predicted": c.efficiency, "error": c.efficiency - measured,
                        "half_off_factor": tflops["half-off"] / tflops["full"],
                        "offload_predicted": c.offload, "offload_measured": adv["offloaded_gb_per_gpu"][0] * 1e9,
                        "request": req, "candidate": c,
                        "off_target": SCALE_IN_OFF_TARGET.get((SCALE_IN, recompute, g))})
    return out


def scale_in_at_measured_terms(r):
    """The plan's efficiency for a scale-in point with its two measured terms in place: the bytes
    the shim offloaded for the plan's, and the one GPU's speed without offloading against the two."""
    from transit_launch.planning.efficiency import efficiency_of, host_terms
    c = replace(r["candidate"], offload=r["offload_measured"])  # (a copy: the row keeps the plan's)
    return efficiency_of(host_terms(r["request"], c)) * r["half_off_factor"]


# --overlap host (issue 50): TorchTitan 0.2.2 unchanged at 10 layers, one microbatch, its clipping,
# the streamed default and host in one file of one H100 lease (16 host cores) whose link ran
# slower than the plan's profile (the streamed step's own rate is taken from the same file).
# HOST_STEP_RATE_PER_CORE and WARMUP_HOST_RATE are set from it; no held-out host run yet.
HOST_FIT = "2026-12-06/host-step/titan_accum1_host_14.json"
HOST_FIT_CORES = 16
HOST_RUN, STREAM_RUN = "advise:TRANSIT_OVERLAP_STEP=host", "advise"
# Held out (2026-12-07, another H100 machine, 16 cores, the split's calibrated share): file ->
# None where the plan is within TARGET at the run's link and offload, else why it is not
HOST_HELD_OUT = {
    "2026-12-07/host-step/titan_accum8_host_17.json": None,
    "2026-12-07/host-step/titan_accum1_host_17.json":
        "the plan serves the state at the link's rate plus the CPU's; at one microbatch the host run was "
        "slower than the streamed one of the same file (44.6% against 48.1%) where the plan has it faster: "
        "its cost on the GPU's side, beside the streamed step's copies, is not in the model "
        "(bench/LOG.md, \"The host path at last measured: CPU-bound, and the share\")",
}


def host_fit(path=None):
    """What the fit file measured: the link's rate in state bytes a second (the streamed run's
    state over its step's extra seconds), the host run's state (the streamed share's pinned
    bytes, and the CPU's by the adapter's share of the offloaded bytes) and its step's extra
    seconds, the adopt's seconds, and the measured efficiency of the host run."""
    d = json.loads((RESULTS / (path or HOST_FIT)).read_text())
    runs = {r["name"]: r for r in d["runs"]}
    ref, stream, host = runs["ref"], runs[STREAM_RUN], runs[HOST_RUN]
    extra = lambda r: _steady(r["optimizer_s"]) - _steady(ref["optimizer_s"])  # noqa: E731
    counters = host["stats"][0]["adapter"]
    streamed = host["stats"][0]["host_state_bytes"]
    state = streamed / (1 - counters["share"])
    return {"link": stream["stats"][0]["host_state_bytes"] / extra(stream), "state": state, "state_s": extra(host),
            "cpu_state": state - streamed, "adopt_s": counters["adopt_s"], "budget": host["budget"],
            "layers": d["layers"], "microbatches": d["accum"], "seq_len": d["seq_len"],
            "measured": _steady(ref["step_s"]) / _steady(host["step_s"]),
            "measured_stream": _steady(ref["step_s"]) / _steady(stream["step_s"])}
