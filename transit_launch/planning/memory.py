"""Per-GPU memory estimate for one training layout (TorchTitan-style FSDP2/TP/PP/EP).

Every term is a formula over the model card and the layout; units are bytes.
Notation: P_s = parameters on the worst pipeline stage, d = FSDP degree, t = TP,
T = tokens of one microbatch (local batch x sequence, or one sequence under PP),
h = hidden, V = vocab.

  parameters   P_s / (d t) x bp        bp = 4 (mixed: fp32 master) | 2 (bf16)
  gradients    P_s / (d t) x bp        sharded gradients in the parameter dtype
  optimizer    P_s / (d t) x 2 x bp    AdamW exp_avg and exp_avg_sq
  activations  stored + working        stored per microbatch in flight:
                 recompute=full: one checkpointed layer input per layer, T h 2 / t
                 recompute=none: every saved tensor of every layer, T A 2 / t
               working (layer-backward phase): the layer being recomputed, T A 2 / t x
               BACKWARD_WORKING_FACTOR. A = saved elements per token of one layer:
                 4h (two RMSNorm inputs and outputs) + 3q + 3kv (q, k before and after
                 RoPE, v, attention output) + 4f (SwiGLU gate, up, silu(gate), product);
                 an MoE layer replaces 4f by top_k (2h + 4 f_e) + 4 f_shared + 2E.
  logits       T V / t x LOGITS_BYTES_PER_ELEMENT (last stage, loss phase)
  fsdp         unsharded working set (only with d > 1 or mixed precision):
                 loss phase: output projection in bf16 plus its bf16 weight gradient
                 layer-backward phase: FSDP_PREFETCH_LAYERS layers gathered in bf16,
                 plus one layer's bf16 gradient and its reduce-dtype copy
  comm         NCCL_BYTES_PER_COMM per process group of more than one rank
  overhead     CUDA_CONTEXT_BYTES + ALLOCATOR_FRAGMENTATION x (all PyTorch bytes)

The peak is the larger of two phases (the loss phase at the end of forward, and the
backward of a layer), so `activations`, `logits` and `fsdp` are reported as they are at
that peak and `peak_phase` says which it was.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from transit_launch.errors import UsageError
from transit_launch.planning.models import ModelCard

# Saved-for-backward tensors of a layer coexist with their gradients while the layer's
# backward runs; about half of them are alive at the worst moment (assumption, to be
# calibrated against torch.cuda.max_memory_reserved on the H200: bench/RESULTS.md).
BACKWARD_WORKING_FACTOR = 1.5
# TorchTitan's loss runs cross-entropy on logits.float(). The peak is in its backward:
# log_softmax's saved fp32 output (4), the fp32 gradient coming in (4) and the fp32
# gradient going out (4). Calibrated on the H200 (bench/RESULTS.md, 2026-11-29): a
# 128K-vocabulary run measured 13.6 B per logit with the allocator's rounding, against
# 10 assumed before (the forward's bf16 + fp32 + fp32, which is not the peak).
LOGITS_BYTES_PER_ELEMENT = 12
# FSDP2 gathers the current layer and prefetches the next one (forward and backward).
FSDP_PREFETCH_LAYERS = 2
# NCCL keeps NCCL_BUFFSIZE (4 MiB) per channel and direction, up to 32 channels on
# NVLink/IB systems, plus LL/LL128 buffers: about 0.5 GB per communicator (assumption).
NCCL_BYTES_PER_COMM = 0.5e9
# CUDA context with lazy module loading (PyTorch's default): about 0.6 GB on Hopper.
CUDA_CONTEXT_BYTES = 0.6e9
# The caching allocator rounds to 2 MiB segments and keeps freed blocks cached; 5% of
# the bytes it manages is a typical gap between reserved and allocated (assumption).
ALLOCATOR_FRAGMENTATION = 0.05

PRECISIONS = ("mixed", "bf16")
RECOMPUTE = ("full", "none")


@dataclass(frozen=True)
class Layout:
    dp: int = 1          # FSDP (dp_shard) degree
    tp: int = 1
    pp: int = 1
    ep: int = 1
    local_batch: int = 1  # sequences per data-parallel rank per microstep
    seq_len: int = 8192
    precision: str = "mixed"
    recompute: str = "full"

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def pp_microbatches(self) -> int:
        """TorchTitan's default pipeline microbatch is one sequence."""
        return self.local_batch if self.pp > 1 else 1

    @property
    def microbatch_tokens(self) -> int:
        return (1 if self.pp > 1 else self.local_batch) * self.seq_len


def validate(card: ModelCard, lay: Layout) -> None:
    """Raise UsageError for degrees that do not divide the model."""
    for name, v in (("dp", lay.dp), ("tp", lay.tp), ("pp", lay.pp), ("ep", lay.ep),
                    ("local batch", lay.local_batch), ("sequence length", lay.seq_len)):
        if v < 1:
            raise UsageError(f"{name} must be a positive integer, got {v}")
    if lay.precision not in PRECISIONS:
        raise UsageError(f"precision must be one of {', '.join(PRECISIONS)}, got {lay.precision!r}")
    if lay.recompute not in RECOMPUTE:
        raise UsageError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {lay.recompute!r}")
    check_degrees(card, lay.tp, lay.pp, lay.ep)
    if lay.ep > 1:
        if (lay.dp * lay.tp) % lay.ep:
            raise UsageError(f"ep={lay.ep} must divide dp x tp = {lay.dp * lay.tp} (experts shard over FSDP/TP ranks)")
    if lay.pp > 1 and lay.local_batch < lay.pp:
        raise UsageError(f"pipeline parallelism pp={lay.pp} needs a local batch of at least {lay.pp} microbatches")


def check_degrees(card: ModelCard, tp: int = 1, pp: int = 1, ep: int = 1) -> None:
    """Degrees must divide what they split: heads (TP), layers (PP), experts (EP)."""
    if card.heads % tp or card.kv_heads % tp:
        raise UsageError(f"tp={tp} does not divide {card.name}'s {card.heads} attention heads "
                         f"and {card.kv_heads} key/value heads")
    if card.layers % pp:
        raise UsageError(f"pp={pp} does not divide {card.name}'s {card.layers} layers")
    if ep > 1:
        if not card.moe:
            raise UsageError(f"ep={ep} needs an MoE model; {card.name} is dense")
        if card.moe.experts % ep:
            raise UsageError(f"ep={ep} does not divide {card.name}'s {card.moe.experts} experts")


def stage_layers(card: ModelCard, pp: int, k: int) -> range:
    per = card.layers // pp
    return range(k * per, (k + 1) * per)


def act_elements_per_token(card: ModelCard, i: int) -> int:
    """Saved-for-backward bf16 elements per token of layer i (see module docstring)."""
    h = card.hidden
    attn = 4 * h + 3 * card.q_dim + 3 * card.kv_dim
    if card.is_moe_layer(i):
        m = card.moe
        return attn + m.top_k * (2 * h + 4 * m.expert_ffn) + 4 * m.shared_experts * m.shared_ffn + 2 * m.experts
    return attn + 4 * card.ffn


def unsharded_layer_params(card: ModelCard, lay: Layout, i: int) -> float:
    """Elements one GPU holds when FSDP gathers layer i: TP-sharded dense weights, and
    with EP the local experts whole."""
    if card.is_moe_layer(i):
        routed = card.moe.experts * card.expert_params
        dense_part = card.layer_params(i) - routed
        experts = routed / lay.ep if lay.ep > 1 else routed / lay.tp
        return dense_part / lay.tp + experts
    return card.layer_params(i) / lay.tp


@dataclass
class Estimate:
    parameters: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    fsdp: float
    comm: float
    overhead: float
    peak_phase: str
    stage: int
    cold: float  # optimizer states (+ fp32 master params): touched once per optimizer step

    @property
    def total(self) -> float:
        return (self.parameters + self.gradients + self.optimizer + self.activations
                + self.logits + self.fsdp + self.comm + self.overhead)

    @property
    def states(self) -> float:
        return self.parameters + self.gradients + self.optimizer

    def breakdown(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("peak_phase", "stage", "cold")}
        d["total"] = self.total
        return d


def comm_groups(lay: Layout) -> int:
    return sum(x > 1 for x in (lay.dp, lay.tp, lay.pp, lay.ep))


def estimate_stage(card: ModelCard, lay: Layout, k: int) -> Estimate:
    bp = 4 if lay.precision == "mixed" else 2
    layers = stage_layers(card, lay.pp, k)
    first, last = k == 0, k == lay.pp - 1
    p_stage = (sum(card.layer_params(i) for i in layers)
               + (card.embedding_params if first else 0) + (card.output_params if last else 0))
    shard = p_stage / (lay.dp * lay.tp)
    params, grads, optim = shard * bp, shard * bp, shard * 2 * bp

    T = lay.microbatch_tokens
    in_flight = min(lay.pp - k, lay.pp_microbatches) if lay.pp > 1 else 1
    widest = max(act_elements_per_token(card, i) for i in layers)
    if lay.recompute == "full":
        stored = len(layers) * T * card.hidden * 2 / lay.tp
    else:
        stored = sum(act_elements_per_token(card, i) for i in layers) * T * 2 / lay.tp
    stored *= in_flight
    working = T * widest * 2 / lay.tp * BACKWARD_WORKING_FACTOR
    logits = T * card.vocab / lay.tp * LOGITS_BYTES_PER_ELEMENT if last else 0.0

    gathers = lay.dp > 1 or lay.precision == "mixed"
    rbytes = 4 if lay.precision == "mixed" else 2  # TorchTitan reduces gradients in fp32 under mixed
    biggest_layer = max(unsharded_layer_params(card, lay, i) for i in layers)
    out_unsharded = card.output_params / lay.tp if last else 0.0
    fsdp_loss = out_unsharded * (2 + 2) if gathers else 0.0
    fsdp_bwd = (biggest_layer * (FSDP_PREFETCH_LAYERS * 2 + 2 + rbytes)) if gathers else 0.0

    loss_phase = logits + fsdp_loss
    bwd_phase = working + fsdp_bwd
    if loss_phase >= bwd_phase:
        phase, act, lg, fs = "loss", stored, logits, fsdp_loss
    else:
        phase, act, lg, fs = "layer backward", stored + working, 0.0, fsdp_bwd

    torch_bytes = params + grads + optim + act + lg + fs
    overhead = CUDA_CONTEXT_BYTES + ALLOCATOR_FRAGMENTATION * torch_bytes
    comm = NCCL_BYTES_PER_COMM * comm_groups(lay)
    cold = optim + (params if lay.precision == "mixed" else 0.0)
    return Estimate(params, grads, optim, act, lg, fs, comm, overhead, phase, k, cold)


def estimate(card: ModelCard, lay: Layout) -> Estimate:
    """The worst pipeline stage's estimate."""
    validate(card, lay)
    return max((estimate_stage(card, lay, k) for k in range(lay.pp)), key=lambda e: e.total)
