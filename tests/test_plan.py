"""Node counts, batch divisibility, scale-in options and the recommendation."""

import pytest

from transit_launch.errors import UsageError
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
    p = plan(req())
    for c in p.options:
        assert c.offload == pytest.approx(max(0, c.est.total - H100.memory))
        assert c.host_per_node == pytest.approx(4 * (c.offload + HOST_BYTES_PER_RANK))


def test_small_host_memory_blocks_deep_scale_in():
    p = plan(req(host_mem=300e9))
    fits = {c.nodes: c.fits_host for c in p.options}
    assert fits[5] and fits[4] and not fits[2]
    assert p.recommended.fits_host
    assert p.recommended.nodes > 2


def test_recommendation_is_fewest_good_nodes():
    p = plan(req())
    good = [c for c in p.options if c.fits_host and c.efficiency >= 0.9]
    assert p.recommended.nodes == min(c.nodes for c in good)
    strict = plan(req(min_efficiency=0.9999))
    assert strict.recommended is strict.baseline


def test_hot_spill_is_flagged_and_costs():
    p = plan(req())
    one = next(c for c in p.options if c.nodes == 1)
    assert one.spill > 0 and one.efficiency < 0.9
    assert "hot data" in one.notes[0]


def test_tp_pp_layout_uses_nodes_as_stages():
    p = plan(req(parallel="tp+pp", precision="bf16", local_batch=16, global_batch=None))
    lay = p.baseline.layout
    assert lay.tp == 4 and lay.dp == 1 and lay.pp == p.baseline.nodes


def test_fsdp_ep_picks_intra_node_expert_degree():
    q = load_model("qwen3-30b-a3b")
    p = plan(req(card=q, parallel="fsdp+ep", gpus_per_node=8, local_batch=4, global_batch=None))
    assert p.baseline.layout.ep == 8
