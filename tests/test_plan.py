"""Node counts, batch divisibility, scale-in options and the recommendation."""

import re

import pytest

from transit_launch.errors import UsageError
from transit_launch.planning import report
from transit_launch.planning.hardware import gpu_profile
from transit_launch.planning.models import load_model
from transit_launch.planning.plan import HOST_BYTES_PER_RANK, Request, plan

L70 = load_model("llama3-70b")
H100 = gpu_profile("h100-80gb")


def req(**kw):
    base = dict(card=L70, gpu=H100, gpus_per_node=4, seq_len=8192, local_batch=1, global_batch=240)
    base.update(kw)
    return Request(**base)


def test_paper_minimum_llama3_70b_fsdp():
    p = plan(req())
    assert (p.baseline.nodes, p.baseline.layout.gpus) == (6, 24)
    assert p.baseline.est.total <= H100.memory
    assert [c.nodes for c in p.options] == [5, 4, 3, 2, 1]
    assert all(c.offload > 0 for c in p.options)


def test_fsdp_tp_minimum_is_four_nodes():
    p = plan(req(parallel="fsdp+tp", global_batch=None))
    assert p.baseline.layout.tp == 4 and p.baseline.nodes == 4


def test_only_node_counts_that_divide_the_global_batch():
    # 5 GPUs per node: dp = 5n must divide 250, so n is 1, 2, 5, 10, ...; 24 GPUs fit
    # without offloading, so the minimum is 5 nodes (25 GPUs), not 24 GPUs' 4.8.
    p = plan(req(global_batch=250, gpus_per_node=5))
    assert all(250 % c.layout.dp == 0 for c in [p.baseline] + p.options)
    assert p.baseline.nodes == 5
    assert [c.nodes for c in p.options] == [2, 1]
    # 200 sequences: dp = 4n divides it for n = 1, 2, 5, 10; 5 nodes (20 GPUs) do not fit,
    # so the minimum jumps to 10 nodes.
    p = plan(req(global_batch=200))
    assert (p.baseline.nodes, [c.nodes for c in p.options]) == (10, [5, 2, 1])


def test_no_valid_node_count():
    with pytest.raises(UsageError, match="serves global batch 7"):
        plan(req(global_batch=7))


def test_model_that_never_fits():
    with pytest.raises(UsageError, match="logits"):
        plan(req(card=load_model("llama4-scout"), parallel="fsdp+ep", local_batch=4, global_batch=None))


def test_scale_in_fractions_pick_valid_counts():
    p = plan(req(scale_in=(0.25, 0.5)))
    # 6 * 0.75 = 4.5 -> round -> 4 (banker's rounding), 6 * 0.5 = 3
    assert [c.nodes for c in p.options] == [4, 3]


def test_offload_and_host_accounting():
    """Physical bounds, not the formula (which tests/test_prediction.py checks against the
    shim's measured host bytes): at least what does not fit the GPU leaves it, and a node's
    host DRAM holds its four ranks' offload and their own process memory."""
    p = plan(req())
    for c in p.options:
        assert c.offload >= c.est.total - H100.memory > 0
        assert c.host_per_node >= 4 * (c.offload + HOST_BYTES_PER_RANK) - 1


def test_small_host_memory_blocks_deep_scale_in():
    p = plan(req(host_mem=300e9))
    fits = {c.nodes: c.fits_host for c in p.options}
    assert fits[5] and fits[4] and not fits[2]
    assert p.recommended.fits_host
    assert p.recommended.nodes > 2


def _cand(nodes, eff, fits=True, spill=0.0):
    """A candidate with hand-chosen numbers: the rule is tested apart from the planner's."""
    from types import SimpleNamespace
    return SimpleNamespace(nodes=nodes, efficiency=eff, fits_host=fits, spill=spill, host_per_node=100e9)


def test_recommendation_rule_on_hand_made_options():
    """The fewest nodes at or above the floor, among those that fit host DRAM and keep hot
    data on the GPU; else the no-offload baseline; else, with no baseline, the fastest."""
    from transit_launch.planning.choice import recommend
    base = _cand(6, 1.0)
    opts = [_cand(5, 0.97), _cand(4, 0.93), _cand(3, 0.91, fits=False), _cand(2, 0.95, spill=1e9), _cand(1, 0.4)]
    assert recommend(req(min_efficiency=0.9), base, opts)[0].nodes == 4  # 3 misses host DRAM, 2 spills hot data
    assert recommend(req(min_efficiency=0.95), base, opts)[0].nodes == 5
    assert recommend(req(min_efficiency=0.3), base, opts)[0].nodes == 1
    c, why = recommend(req(min_efficiency=0.99), base, opts)
    assert c is base and "the best, 5 nodes, 97%" in why
    c, why = recommend(req(min_efficiency=0.99), None, opts)
    assert c.nodes == 5 and "predicted fastest (97%)" in why


def test_recommendation_is_fewest_good_nodes():
    """On the planner's own llama3-70b options: the recommendation is at or above the floor
    and every fewer node count is not (the rule itself: the hand-made test above); a floor
    nothing reaches falls back to the baseline."""
    p = plan(req())
    assert p.recommended.efficiency >= 0.9 and p.recommended.fits_host
    assert all(o.efficiency < 0.9 or not o.fits_host for o in p.options if o.nodes < p.recommended.nodes)
    strict = plan(req(min_efficiency=0.9999))
    assert strict.recommended is strict.baseline


def test_hot_spill_is_flagged_and_costs():
    p = plan(req())
    one = next(c for c in p.options if c.nodes == 1)
    assert one.spill > 0 and one.efficiency < 0.9
    assert any("hot data" in n for n in one.notes)


def test_tp_pp_layout_uses_nodes_as_stages():
    p = plan(req(parallel="tp+pp", precision="bf16", local_batch=16, global_batch=None))
    lay = p.baseline.layout
    assert lay.tp == 4 and lay.dp == 1 and lay.pp == p.baseline.nodes


def test_mixed_without_fsdp_is_planned_as_torchtitan_runs_it():
    """TorchTitan switches mixed precision off for TP or PP without FSDP: the plan estimates
    those layouts in fp32, marks them and says why; layouts with FSDP stay mixed."""
    p = plan(req(parallel="tp+pp", local_batch=8, global_batch=None))
    assert p.req.precision == "mixed"
    assert {c.layout.precision for c in p.rows} == {"fp32"}
    assert all(any("fp32 (TorchTitan" in n for n in c.notes) for c in p.rows)
    d = report.plan_json(p)
    assert d["precision"] == "mixed" and "fp32" in d["precision_note"]
    assert {o["layout"]["precision"] for o in d["options"]} == {"fp32"}
    assert d["precision_note"] in report.plan_text(p)
    # fsdp+tp: one node is tp4 with dp 1 (fp32), two nodes put FSDP over them (mixed)
    p = plan(req(parallel="fsdp+tp", global_batch=None, local_batch=1))
    by_nodes = {c.nodes: c.layout for c in p.rows}
    assert by_nodes[1].dp == 1 and by_nodes[1].precision == "fp32"
    assert by_nodes[2].dp == 2 and by_nodes[2].precision == "mixed"
    # fp32 and bf16 asked for are kept, and a plain FSDP plan has no note
    assert {c.layout.precision for c in plan(req(parallel="tp+pp", precision="bf16", local_batch=16,
                                                  global_batch=None)).rows} == {"bf16"}
    p = plan(req())
    assert {c.layout.precision for c in p.rows} == {"mixed"} and report.plan_json(p)["precision_note"] is None
    assert "fp32" not in report.plan_text(p)


def test_fsdp_ep_picks_intra_node_expert_degree():
    q = load_model("qwen3-30b-a3b")
    p = plan(req(card=q, parallel="fsdp+ep", gpus_per_node=8, local_batch=4, global_batch=None))
    assert p.baseline.layout.ep == 8


# --- no valid node count fits without offloading: plan still answers ----------------------

def test_no_fit_answers_with_offload_options():
    # dp = 4n must divide 16: 1, 2 or 4 nodes, and 4 nodes need 86.8 GB a GPU of 85.5; the
    # no-offload minimum (5 nodes with the calibrated planner) does not divide the batch
    p = plan(req(global_batch=16))
    assert p.baseline is None and p.reference.nodes == 4
    assert [c.nodes for c in p.options] == [4, 2, 1]
    assert all(c.offload > 0 for c in p.options)
    assert "5 nodes would fit, but their dp 20 x local batch 1 does not divide global batch 16" in p.no_fit
    good = [c for c in p.options if c.fits_host and not c.spill and c.efficiency >= 0.9]
    assert p.recommended is min(good, key=lambda c: c.nodes)
    assert p.needs_offload(4) and p.needs_offload(p.recommended.nodes)


def test_partition_smaller_than_the_minimum_is_a_no_fit_case():
    p = plan(req(max_nodes=4))  # submit on a partition of 4 nodes: the minimum is 5
    assert p.baseline is None and max(c.nodes for c in p.options) <= 4
    assert "Without offloading it needs 5 nodes." in p.no_fit


def test_no_fit_refused_only_when_offloading_cannot_serve():
    with pytest.raises(UsageError, match="host DRAM is too small"):
        plan(req(global_batch=16, host_mem=40e9))  # 4 nodes offload 45 GB a node
    # tp+pp with the default local batch of 1: only one node can run (pp = 1), and the right
    # advice is the local batch the pipeline needs, found by trying it
    # (TorchTitan runs tp+pp in fp32: 8 nodes of one microbatch each, not the 4 of bf16 compute)
    with pytest.raises(UsageError, match="with --local-batch 8, 8 nodes fit without offloading"):
        plan(req(parallel="tp+pp", global_batch=None))
    p = plan(req(parallel="tp+pp", global_batch=None, local_batch=8))
    assert p.baseline.nodes == 8


# --- one rule picks the node count: plan, render and submit --nodes auto ----------------

def test_recommend_honours_min_efficiency():
    """The rule's words, checked on the plan's own JSON at several floors: the recommended row
    keeps the floor (at or above it) and offloading serves it (hot data on the GPU, state in
    host DRAM), and no row of fewer nodes does both; above every option, no offloading."""
    def rows(floor):
        d = report.plan_json(plan(req(global_batch=None, min_efficiency=floor)))  # one microstep a step
        return d["recommended"]["nodes"], {o["nodes"]: o for o in d["options"]}

    def serves(o):
        return o["baseline"] or (o["hot_spill_gb_per_gpu"] == 0 and o["fits_host"])

    _, table = rows(0.9)
    # each option's own efficiency is a floor too: reached exactly, it counts
    exact = [o["predicted_efficiency"] for o in table.values() if not o["baseline"] and serves(o)]
    seen, below_next = set(), 0
    for floor in (0.3, 0.5, 0.9, 0.95, 0.999, *exact):
        rec, table = rows(floor)
        assert table[rec]["recommended"] and serves(table[rec]) and table[rec]["predicted_efficiency"] >= floor
        fewer = [n for n, o in table.items() if n < rec and serves(o) and o["predicted_efficiency"] >= floor]
        assert fewer == [], (floor, rec, fewer)
        if rec - 1 in table and serves(table[rec - 1]):
            assert table[rec - 1]["predicted_efficiency"] < floor
            below_next += 1
        seen.add(rec)
    # the floors reach different rows, the baseline among them, and several have a servable
    # row of one node fewer under the floor (the 1-node option pushes hot data off the GPU)
    assert len(seen) >= 4 and any(table[n]["baseline"] for n in seen) and below_next >= 3


def test_explicit_nodes_explained_and_warned():
    from transit_launch.planning.choice import explain
    p = plan(req(global_batch=None))
    why, warnings = explain(p, 3)
    assert why.startswith("as asked;") and "predicted efficiency" in why and warnings == []
    why, warnings = explain(p, 1)
    assert any("of hot data per GPU (gradients, activations) off the GPU" in w for w in warnings)
    assert all("the plan recommends 3" in w for w in warnings)
    _, warnings = explain(p, 2)  # 86% < 90%
    assert len(warnings) == 1 and "below --min-efficiency 90%" in warnings[0]
    _, warnings = explain(plan(req(host_mem=300e9)), 2)
    assert any("GB of host DRAM per node" in w for w in warnings)
    _, warnings = explain(plan(req()), 7)  # dp 28 does not divide 240
    assert "give no valid fsdp layout" in warnings[0] and "does not divide the global batch" in warnings[0]
    _, warnings = explain(p, 8)  # more than needed: no offload, nothing to warn about
    assert warnings == [] and not p.needs_offload(8)


@pytest.mark.parametrize("change,needle", [
    (dict(gpus_per_node=1000), "no node has more than 64 GPUs"),
    (dict(gpus_per_node=True), "--gpus-per-node must be a positive integer"),
    (dict(host_mem=1000), "--host-mem must be at least 1GiB"),
    (dict(host_mem=float("inf")), "--host-mem must be at least 1GiB"),
    (dict(min_efficiency=float("nan")), "--min-efficiency must lie in"),
    (dict(min_efficiency="high"), "--min-efficiency must lie in"),
    (dict(card="llama3-70b"), "needs a ModelCard and a GPU"),
    (dict(max_nodes=0), "--max-nodes must be a positive integer"),
])
def test_request_checks_for_python_callers(change, needle):
    with pytest.raises(UsageError, match=re.escape(needle)):
        req(**change)


def test_a_budget_just_above_the_estimate_still_offloads_the_reserved_gap():
    """The budget bounds reserved bytes: a rank whose estimate fits by less than the shim's
    reserved gap (5% over the estimate, measured under TorchTitan) still has that much placed on
    the host, so the plan offloads it there too, not 0 (issue 31's audit)."""
    from transit_launch.planning.plan import evaluate, layout_for
    r = req(global_batch=None, overlap="0")  # plain advise: what is over the budget is placed on the host
    lay = layout_for(r, 6)
    est = evaluate(r, 6, lay).est.total
    offload = {}
    for overlap in ("0", None):  # None: the default, whose streamed step pins state by the shim's rule
        tight = req(global_batch=None, overlap=overlap, gpu=gpu_profile("h100-80gb", memory=int(est * 1.02)))
        roomy = req(global_batch=None, overlap=overlap, gpu=gpu_profile("h100-80gb", memory=int(est * 1.06)))
        offload[overlap] = evaluate(tight, 6, lay).offload
        assert offload[overlap] > 0.02 * est and evaluate(roomy, 6, lay).offload == 0
    assert offload["0"] == pytest.approx(est * 0.03, rel=1e-6)  # 1.05 - 1.02 of it


def test_scale_in_shows_rows_but_does_not_change_the_recommendation():
    """--scale-in picks the rows shown; the node count comes from every count below the
    minimum, as for render and submit without it (issue 51: `--scale-in 0.25` showed 5 and 4
    nodes and recommended 4 where the plan recommends 3). Llama3-70B, 4 GPUs a node, any
    global batch: 3 nodes are the fewest at >= 90% (93%; 2 nodes: 81%), 5 the minimum."""
    full = plan(req(global_batch=None))
    assert (full.baseline.nodes, full.recommended.nodes) == (5, 3)
    for fractions, shown in (((0.25,), [4, 3]), ((0.5,), [3, 2]), ((0.75,), [3, 1])):
        p = plan(req(global_batch=None, scale_in=fractions))
        assert p.recommended.nodes == 3 and p.reason == full.reason, fractions
        assert [c.nodes for c in p.options] == shown, fractions  # the fraction's row, and the recommended one


def test_the_no_offload_minimum_offloads_nothing():
    """A row that runs without offloading shows 0 offloaded and 100% (issue 51). Llama3-70B at
    2048 tokens on 16 GPUs needs 83.7 GB of the H100's 85.5 GB: it fits, but under the shim its
    5% reserved gap (87.9 GB) would be over the GPU, which the rows showed as 5.2 GB offloaded
    at 95%. Without offloading the job runs with policy off (no shim), where PyTorch's
    allocator frees its cache and retries."""
    p = plan(req(global_batch=None, seq_len=2048))
    b = p.baseline
    assert b.nodes == 4 and 83.6e9 < b.est.total <= H100.memory < 1.05 * b.est.total
    assert (b.offload, b.spill, b.efficiency, b.warm_up_s) == (0.0, 0.0, 1.0, 0.0)
    assert b.host_per_node == 4 * HOST_BYTES_PER_RANK  # only the ranks' own memory
    assert p.at(5).offload == 0.0 and p.at(5).efficiency == 1.0  # more nodes than the minimum: no offload either
    row = next(o for o in report.plan_json(p)["options"] if o["baseline"])
    assert (row["offload_gb_per_gpu"], row["predicted_efficiency"]) == (0.0, 1.0)


def test_an_efficiency_just_under_the_floor_is_not_rounded_up_to_it():
    """89.84% against a floor of 90% is said as 89.84%, not "90% is below 90%"; one that is
    plainly under keeps whole percent."""
    from transit_launch.planning.choice import _under

    assert _under(0.8984, 0.9) == "89.84%" and _under(0.83, 0.9) == "83%" and _under(0.8949, 0.9) == "89%"
