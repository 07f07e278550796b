"""The traffic model against the paper's section 4.2 observations and hand counts."""

import pytest

from transit_launch.planning.memory import Layout
from transit_launch.planning.models import load_model
from transit_launch.planning.traffic import _ring, per_node

L70 = load_model("llama3-70b")


def test_ring_by_hand():
    # 8 ranks, 4 per node, 1 GB buffer: one boundary link per node carries 7/8 GB each way.
    inter, intra = _ring(8, 4, 4, 1e9)
    assert inter == pytest.approx(2 * 7 / 8 * 1e9)
    assert intra == pytest.approx(2 * 3 * 7 / 8 * 1e9)
    assert _ring(4, 4, 4, 1e9)[0] == 0  # a ring inside one node never touches the NIC
    assert _ring(1, 1, 4, 1e9) == (0.0, 0.0)


def test_fsdp_bytes_by_hand():
    t = per_node(L70, Layout(dp=24), 4)
    payload = L70.params * (2 + 2 + 4)  # bf16 all-gather forward and backward, fp32 reduce-scatter
    assert t.inter == pytest.approx(2 * 23 / 24 * payload)
    assert t.by_kind["fsdp"] == pytest.approx(t.inter)


def test_fsdp_tp_drops_a_third_from_4_to_2_nodes():
    four = per_node(L70, Layout(dp=4, tp=4), 4).inter
    two = per_node(L70, Layout(dp=2, tp=4), 4).inter
    assert 1 - two / four == pytest.approx(1 / 3, abs=0.03)


def test_full_fsdp_drops_only_gradually():
    six = per_node(L70, Layout(dp=24), 4).inter
    four = per_node(L70, Layout(dp=16), 4).inter
    three = per_node(L70, Layout(dp=12), 4).inter
    assert six > four > three
    assert 1 - three / six < 0.1


def test_tp_pp_roughly_invariant():
    lays = [Layout(dp=1, tp=4, pp=n, local_batch=16, precision="bf16") for n in (8, 5, 4)]
    vals = [per_node(L70, lay, 4) for lay in lays]
    assert all(v.by_kind.get("fsdp", 0) == 0 and v.by_kind["tp"] == 0 for v in vals)  # TP stays in the node
    assert max(v.inter for v in vals) / min(v.inter for v in vals) < 1.1
    # activations of one sequence, 4 transfers per microbatch at an interior stage
    assert vals[0].inter == pytest.approx(16 * 4 * 8192 * 8192 * 2)


def test_expert_parallel_all_to_all_leaves_node_only_beyond_it():
    q = load_model("qwen3-30b-a3b")
    inside = per_node(q, Layout(dp=8, ep=4), 4).by_kind.get("ep", 0)
    across = per_node(q, Layout(dp=8, ep=8), 4).by_kind["ep"]
    assert inside == 0 and across > 0
