"""The per-GPU estimator, term by term, against hand computations."""

from dataclasses import replace

import pytest

from transit_launch.planning import memory as M
from transit_launch.errors import UsageError
from transit_launch.planning.memory import Layout, estimate
from transit_launch.planning.models import load_model

L8 = load_model("llama3-8b")  # h 4096, 32 layers, q 4096, kv 1024, ffn 14336, vocab 128256


def test_states_mixed_and_bf16():
    e = estimate(L8, Layout(dp=8, microsteps=2))  # accumulation: gradients exist at every phase
    shard = L8.params / 8  # every dimension 0 of llama3-8b divides by 8: no FSDP padding
    assert e.parameters == pytest.approx(shard * 4)
    assert e.gradients == pytest.approx(shard * 4)
    assert e.optimizer == pytest.approx(shard * 8)
    assert e.cold == pytest.approx(shard * 12)  # Adam states + fp32 master weights
    b = estimate(L8, Layout(dp=8, precision="bf16", microsteps=2))
    assert b.states == pytest.approx(e.states / 2)
    assert b.cold == pytest.approx(shard * 4)  # only Adam states are cold in bf16


def test_fp32_states_cold_and_no_gathers():
    """fp32 (TorchTitan with TP or PP and no FSDP): 4 B parameters and gradients, 8 B of Adam,
    no FSDP copies, and only the Adam states are cold (fp32 weights are used every microstep)."""
    e = estimate(L8, Layout(dp=1, tp=2, precision="fp32"))
    shard = (L8.params - L8.hidden) / 2 + L8.hidden  # the final norm is replicated, not split
    assert e.parameters == pytest.approx(shard * 4, rel=1e-3)
    assert e.optimizer == pytest.approx(shard * 8, rel=1e-3)
    assert e.fsdp == 0 and e.cold == e.optimizer
    assert e.peak_phase == "layer backward"


def test_fp32_layer_backward_by_hand():
    """The last stage's layer-0 backward under fp32 PP, term by term: SDPA's math backend's
    score matrices, the attention half recomputed in fp32, the stage's held fp32 logits."""
    card = replace(L8, layers=2)
    lay = Layout(dp=1, pp=2, local_batch=2, precision="fp32")
    e = M.estimate_stage(card, lay, 1)  # stage 1: layer 1 and the output
    s, h = 8192, 4096
    scores = M.ATTENTION_SCORE_COPIES * 32 * s * s * 4  # one sequence a microbatch, 32 heads
    attention = s * (4 * h + 3 * 4096 + 3 * 1024) * 4 * M.BACKWARD_WORKING_FACTOR_FP32
    stored = s * h * 4  # one fp32 checkpoint; one microbatch in flight on the last stage
    assert e.peak_phase == "layer backward"
    assert e.activations == pytest.approx(stored + attention + scores)
    assert e.logits == pytest.approx(s * 128256 * 4)  # held by the schedule through the backward
    assert e.gradients == pytest.approx(e.parameters)  # PP keeps every gradient
    mixed = M.estimate_stage(card, replace(lay, precision="mixed"), 1)
    assert e.tensors > 1.8 * mixed.tensors  # why fp32 must not be estimated as mixed


@pytest.mark.parametrize("asked,dp,tp,pp,runs", [
    ("mixed", 1, 2, 1, "fp32"), ("mixed", 1, 1, 2, "fp32"), ("mixed", 1, 4, 8, "fp32"),
    ("mixed", 1, 1, 1, "mixed"),   # one GPU: torch.autocast
    ("mixed", 2, 4, 1, "mixed"),   # FSDP carries the mixed-precision policy
    ("mixed", 2, 1, 2, "mixed"),
    ("bf16", 1, 4, 2, "bf16"), ("fp32", 8, 1, 1, "fp32"),
])
def test_titan_precision(asked, dp, tp, pp, runs):
    assert M.titan_precision(asked, dp, tp, pp) == runs


def test_activation_terms_by_hand():
    T, h = 2 * 4096, 4096
    lay = Layout(dp=8, local_batch=2, seq_len=4096)
    per_token = 4 * h + 3 * 4096 + 3 * 1024 + 4 * 14336  # norms, q/k/v/rope/attn-out, SwiGLU
    assert M.act_elements_per_token(L8, 0) == per_token
    e = M.estimate_stage(L8, lay, 0)
    stored = 32 * T * h * 2  # one bf16 checkpoint per layer
    logits = T * 128256 * M.LOGITS_BYTES_PER_ELEMENT
    out_weight = (128256 * h + h) * M.OUTPUT_WEIGHT_BYTES_AT_LOSS  # the bf16 output weight, kept after forward
    assert e.peak_phase == "loss"
    assert e.gradients == 0  # one microstep: zero_grad set them to None, backward has not made any yet
    assert e.activations == pytest.approx(stored)
    assert e.logits == pytest.approx(logits)
    assert e.fsdp == pytest.approx(out_weight)
    assert e.comm == M.NCCL_BYTES_PER_COMM
    shard = L8.params / 8  # the states by hand: fp32 master weights and two fp32 Adam moments
    assert e.parameters == pytest.approx(shard * 4) and e.optimizer == pytest.approx(shard * 8)
    torch_bytes = shard * 4 + shard * 8 + stored + logits + out_weight
    assert e.tensors == pytest.approx(torch_bytes)
    overhead = M.CUDA_CONTEXT_BYTES + M.ALLOCATOR_FRAGMENTATION * torch_bytes
    assert e.overhead == pytest.approx(overhead)
    # the whole from the hand-derived terms, not from the estimate's own breakdown
    assert e.total == pytest.approx(torch_bytes + M.NCCL_BYTES_PER_COMM + overhead)


def test_layer_backward_peak_by_hand():
    """llama3-70b on 8 GPUs: the peak is in the first layer's backward, when every later
    layer's gradient exists, one checkpoint is left, and FSDP holds layer 0 in bf16, part of
    its bf16 gradients, the prefetched embedding and layer 1's fp32 reduce-scatter input."""
    l70, T = load_model("llama3-70b"), 8192
    e = M.estimate_stage(l70, Layout(dp=8, seq_len=T), 0)
    assert e.peak_phase == "layer backward"
    layer = l70.layer_params(0)  # every weight's dim 0 divides by 8: no padding
    assert e.gradients == pytest.approx((79 * layer + l70.output_params) / 8 * 4)
    working = T * M.act_elements_per_token(l70, 0) * 2 * M.BACKWARD_WORKING_FACTOR
    assert e.activations == pytest.approx(T * 8192 * 2 + working)
    assert e.fsdp == pytest.approx(layer * (2 + 2 * M.BACKWARD_GRAD_SHARE + 4)
                                   + l70.embedding_params * 2 * (M.FSDP_PREFETCH_LAYERS - 1))


def test_embedding_backward_peak_by_hand():
    """Short sequences on few GPUs: the end of backward, when the 128K x 4096 embedding's
    bf16 gradient and its fp32 copy for the reduce-scatter exist beside all other gradients."""
    e = M.estimate_stage(L8, Layout(dp=2, seq_len=512), 0)
    assert e.peak_phase == "embedding backward"
    assert e.gradients == pytest.approx((L8.params - L8.embedding_params) / 2 * 4)
    assert e.fsdp == pytest.approx(L8.embedding_params * (2 + 4))
    assert e.activations == 0 and e.logits == 0


def test_fsdp_pads_experts_to_whole_rows():
    """FSDP2 chunks dim 0: 16 experts over 32 ranks cost one whole expert per rank."""
    scout = load_model("llama4-scout")
    expert = scout.expert_params
    shard32 = M.layer_shard_params(scout, Layout(dp=32), 0)
    shard16 = M.layer_shard_params(scout, Layout(dp=16), 0)
    assert shard32 > expert  # a whole expert, not half of one
    # and the all-gather buffer holds 32 padded shards: 32 experts' worth, twice the real 16
    gathered = M.unsharded_layer_params(scout, Layout(dp=32), 0)
    assert gathered - M.layer_local_params(scout, Layout(dp=32), 0) == pytest.approx(16 * expert, rel=0.01)
    assert shard16 - shard32 == pytest.approx((scout.layer_params(0) - 16 * expert) / 16
                                              - (scout.layer_params(0) - 16 * expert) / 32, rel=0.01)


def test_no_recompute_stores_every_layer():
    full = estimate(L8, Layout(dp=8, recompute="full", seq_len=4096))
    none = estimate(L8, Layout(dp=8, recompute="none", seq_len=4096))
    assert none.activations == pytest.approx(32 * 4096 * M.act_elements_per_token(L8, 0) * 2)
    assert none.activations > 5 * full.activations


def test_tensor_parallel_divides_activations_and_logits():
    a = M.estimate_stage(L8, Layout(dp=2, seq_len=4096, microsteps=2), 0)
    b = M.estimate_stage(L8, Layout(dp=2, tp=4, seq_len=4096, microsteps=2), 0)
    assert b.activations == pytest.approx(a.activations / 4)
    assert b.logits == pytest.approx(a.logits / 4)
    assert b.states == pytest.approx(a.states / 4, rel=1e-4)  # FSDP pads dim 0 before TP divides


def test_pipeline_stages():
    lay = Layout(dp=1, tp=1, pp=4, local_batch=8, seq_len=4096, precision="bf16")
    first = M.estimate_stage(L8, lay, 0)
    last = M.estimate_stage(L8, lay, 3)
    assert first.logits == 0 and last.logits > 0
    # 1F1B: stage 0 keeps pp microbatches in flight, the last stage one.
    working = 4096 * M.act_elements_per_token(L8, 0) * 2 * M.BACKWARD_WORKING_FACTOR
    assert first.peak_phase == "layer backward"  # no logits on the first stage
    assert first.activations == pytest.approx(8 * 4096 * 4096 * 2 * 4 + working)
    assert last.peak_phase == "loss"
    assert last.activations == pytest.approx(8 * 4096 * 4096 * 2 * 1)
    layer_sum = sum(L8.layer_params(i) for i in range(8))
    assert first.parameters == pytest.approx((layer_sum + L8.embedding_params) * 2)
    # the plan is the worst stage's: here the last, whose logits (one microbatch's 4096 tokens x
    # the 128K vocabulary, 6.3 GB) outweigh the first stage's in-flight activations (1.8 GB more)
    assert last.logits == pytest.approx(6.30e9, rel=0.01) and last.total > first.total
    assert estimate(L8, lay) == last


def test_moe_activations_and_expert_parallel_working_set():
    q = load_model("qwen3-30b-a3b")
    per_token = 4 * 2048 + 3 * 4096 + 3 * 512 + 8 * (2 * 2048 + 4 * 768) + 2 * 128
    assert M.act_elements_per_token(q, 0) == per_token
    routed = 128 * 3 * 2048 * 768
    lay = Layout(dp=8, ep=8)
    assert M.unsharded_layer_params(q, lay, 0) == pytest.approx(q.layer_params(0) - routed + routed / 8)
    assert M.layer_local_params(q, lay, 0) == pytest.approx(q.layer_params(0) - routed + routed / 8)



def test_expert_parallel_gathers_a_ranks_experts_in_the_estimate():
    """The estimate's FSDP term under EP, by hand (qwen3-30b-a3b, dp 8, ep 8: 16 of the 128
    experts a rank, each expert group of one rank, nothing padded). A layer's gathered
    buffer: attention 2 x 4096 x 2048 + 2 x 512 x 2048, norms 2 x 2048 + 2 x 128, router
    128 x 2048, the rank's experts 16 x 3 x 2048 x 768: 94,638,336 elements (the 128 experts'
    623,120,640 less seven eighths of them). The peak is layer 0's backward, the last to run:
    layer 0 gathered in bf16 (2 B), BACKWARD_GRAD_SHARE_MOE of its unsharded gradients (bf16),
    the embedding prefetched (151,936 x 2048 = 311,164,928, bf16) and layer 1's
    reduce-scatter input in fp32 (4 B): 1.30 GB. Planned as if each rank gathered all 128
    experts (the expert degree dropped), the term was 5.71 GB."""
    q = load_model("qwen3-30b-a3b")
    layer = 2 * 4096 * 2048 + 2 * 512 * 2048 + 2 * 2048 + 2 * 128 + 128 * 2048 + 16 * 3 * 2048 * 768
    assert layer == 94_638_336
    e = estimate(q, Layout(dp=8, ep=8))
    assert e.peak_phase == "layer backward"
    assert e.fsdp == pytest.approx(layer * 2 + layer * M.BACKWARD_GRAD_SHARE_MOE * 2 + 311_164_928 * 2 + layer * 4)


@pytest.mark.parametrize("lay,needle", [
    (Layout(dp=1, tp=3), "does not divide"),
    (Layout(dp=1, pp=3), "does not divide llama3-8b's 32 layers"),
    (Layout(dp=2, ep=2), "needs an MoE model"),
    (Layout(dp=1, pp=4, local_batch=2), "at least 4 microbatches"),
    (Layout(dp=1, precision="fp8"), "precision must be"),
])
def test_invalid_layouts(lay, needle):
    with pytest.raises(UsageError, match=needle):
        estimate(L8, lay)


def test_expert_degree_must_divide_experts():
    with pytest.raises(UsageError, match="does not divide qwen3-30b-a3b's 128 experts"):
        estimate(load_model("qwen3-30b-a3b"), Layout(dp=6, ep=3))
