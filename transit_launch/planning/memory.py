"""Per-GPU memory estimate for one training layout (TorchTitan-style FSDP2/TP/PP/EP).

Every term is a formula over the model card and the layout; units are bytes.
Notation: P_s = parameters on the worst pipeline stage, d = FSDP degree, t = TP,
T = tokens of one microbatch (local batch x sequence, or one sequence under PP),
h = hidden, V = vocab.

  parameters   P_s / (d t) x bp        bp = 4 (mixed: fp32 master; fp32) | 2 (bf16)
  gradients    the sharded gradients (parameter dtype) that exist at the peak: none in
               the loss phase of a single microbatch (TorchTitan's zero_grad sets them to
               None), those of the layers after i in layer i's backward; all of them with
               gradient accumulation or PP microbatches
  optimizer    P_s / (d t) x 2 x bp    AdamW exp_avg and exp_avg_sq
  activations  stored + working        stored per microbatch in flight (ba = compute
               dtype: 2 under mixed and bf16, 4 under fp32):
                 recompute=full: one checkpointed layer input per layer, T h ba / t
                 recompute=none: every saved tensor of every layer, T A ba / t
               working (layer-backward phase): the layer being recomputed, T A ba / t x
               BACKWARD_WORKING_FACTOR(_MOE); under fp32 also SDPA's math backend's
               score matrices, ATTENTION_SCORE_COPIES x b (heads / t) s^2 x 4 (b
               sequences of length s a microbatch). A = saved elements per token of one layer:
                 4h (two RMSNorm inputs and outputs) + 3q + 3kv (q, k before and after
                 RoPE, v, attention output) + 4f (SwiGLU gate, up, silu(gate), product);
                 an MoE layer replaces 4f by top_k (2h + 4 f_e) + 4 f_shared + 2E.
  logits       T V / t x LOGITS_BYTES_PER_ELEMENT (last stage, loss phase); under fp32
               with PP also T V / t x 4 in the last stage's layer backward (the schedule
               holds the microbatch's logits until its backward ends)
  fsdp         unsharded working set (only with d > 1 or mixed precision):
                 loss phase: output projection in the gather dtype (bf16; fp32 under fp32)
                 layer-backward phase (layer i): i and the prefetched next layer gathered
                 (FSDP pads dim 0 to d x ceil(rows / d)), a share of i's unsharded
                 gradients, and the previous layer's reduce-scatter input (fp32 under mixed)

Precisions (DTYPES): mixed is TorchTitan's default (fp32 parameters, bf16 compute through
FSDP2's MixedPrecisionPolicy or, on one GPU, torch.autocast); bf16 is training.dtype
bfloat16; fp32 is what TorchTitan 0.2.2 runs when mixed precision is asked for with TP or
PP but no FSDP (titan_precision).
  comm         NCCL_BYTES_PER_COMM per process group of more than one rank
  overhead     CUDA_CONTEXT_BYTES + ALLOCATOR_FRAGMENTATION x (all PyTorch bytes)

The peak is the largest of the loss phase and the backward of each layer, so
`gradients`, `activations`, `logits` and `fsdp` are reported as they are at that peak and
`peak_phase` says which it was. Sharded states are padded like FSDP2 pads them. The
constants below were set from the measured mode (`plan --measure`, planning/measure.py)
and the H200; each names its measurement.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

from transit_launch.errors import UsageError
from transit_launch.planning.models import ModelCard

# Measured-mode rows cited below: bench/results/2026-11-30/planner_fidelity_2026-11-30.json (written by
# bench/planner_fidelity.py: TorchTitan's layer structure under FakeTensorMode +
# FSDPMemTracker at full depth); "working set" lines are that script's output.
#
# The backward of layer i (full recompute): its saved tensors are recomputed and live
# beside their gradients and part of the layer's bf16 weight gradients. Working set =
# FACTOR x T A 2 B (in activations) + GRAD_SHARE x the layer's bf16 gradients (in fsdp):
# the least-squares pair over every measured layer-backward peak, printed by
# `python3 bench/planner_fidelity.py --report` ("working set" lines). Dense rows:
# llama3-405b lb1 dp392, qwen3-32b lb1 dp8, llama3-70b lb1 dp8 (residuals <= 0.08 GB).
# Before: 1.5 and all of the layer's bf16 gradients, both assumed.
BACKWARD_WORKING_FACTOR = 1.35
BACKWARD_GRAD_SHARE = 0.20
# MoE rows: qwen3-30b-a3b lb1 dp8, llama4-scout lb1 dp64 and dp16, lb2 dp32, and the
# toy-moe card of the CI test (bench/cards/toy-moe.toml). Residuals: +0.06, -0.36, -0.36,
# +0.98, -0.01 GB: Qwen3's top-8 routing costs more per token than Llama4's top-1 with a
# shared expert, which one pair cannot tell apart (at most 0.7% of those rows' totals).
BACKWARD_WORKING_FACTOR_MOE = 1.40
BACKWARD_GRAD_SHARE_MOE = 0.585
# TorchTitan's loss runs cross-entropy on logits.float(). The peak is in its backward:
# log_softmax's saved fp32 output (4), the fp32 gradient coming in (4) and the fp32
# gradient going out (4). Measured: the examples' trainer on the H200 (bench/RESULTS.md,
# 2026-11-29, 128K vocabulary: 13.6 B per logit with the allocator's rounding) and the
# measured mode (llama3-8b lb1/lb4, qwen3-30b-a3b lb4 rows: Temp = 8 B and 4 B of
# Activation per logit at the loss peak, bf16 logits already freed by TorchTitan's `del pred`).
LOGITS_BYTES_PER_ELEMENT = 12
# At the loss peak the output projection is gathered in bf16 ([norm, output] are not
# resharded after forward); its gradient does not exist yet (measured: "Unsharded Param"
# = 2 B x vocab x hidden in every loss-phase row; 4 B, weight + gradient, was assumed).
# Under fp32 with FSDP the gather is fp32 (Dtypes.gather; not measured).
OUTPUT_WEIGHT_BYTES_AT_LOSS = 2
# FSDP2 gathers the current layer and prefetches the next one (forward and backward):
# measured "All Gather" = one layer (or the embedding at layer 0) in bf16 (qwen3-32b lb1).
FSDP_PREFETCH_LAYERS = 2
# NCCL keeps NCCL_BUFFSIZE (4 MiB) per channel and direction, up to 32 channels on
# NVLink/IB systems, plus LL/LL128 buffers: about 0.5 GB per communicator (assumption).
NCCL_BYTES_PER_COMM = 0.5e9
# CUDA context with lazy module loading (PyTorch's default): about 0.6 GB on Hopper.
CUDA_CONTEXT_BYTES = 0.6e9
# Slack over the tensors for the caching allocator's rounding and fragmentation. Not the
# gap between max_memory_reserved and max_memory_allocated on an unconstrained GPU: that
# is 8-56% in TorchTitan's H200 runs (bench/results/2026-11-30/titan_memory_2026-11-30.json on main,
# 1.08x-1.56x, largest under FSDP2, whose all-gather and reduce-scatter streams keep their
# own cached blocks), memory the allocator frees and retries with when it runs short (the
# 2-layer 405B run allocated 106 GB and finished inside the 141 GB card with one retry).
# The bound that matters: TorchTitan ran llama3-70b at dp24 (gb240) on 80 GB H100s in the
# TRANSIT paper, where the measured mode counts 72.81 GB of tensors (fidelity table): context,
# NCCL and slack fit in the remaining 12.7 GB of the 85.5 GB card, which the reserved gap
# (1.35x under FSDP2: 25 GB) would not have; 5% (3.6 GB) + 1.1 GB does.
ALLOCATOR_FRAGMENTATION = 0.05



@dataclass(frozen=True)
class Dtypes:
    """Bytes per element of each kind of tensor under one precision."""
    state: int    # parameters, gradients, each AdamW state
    compute: int  # activations: checkpoints, the recomputed layer, logits held by PP
    gather: int   # FSDP2's unsharded parameters and gradients
    reduce: int   # FSDP2's reduce-scatter input


# mixed: fp32 states, bf16 compute and gathers, fp32 reduce (TorchTitan's defaults,
# training.mixed_precision_param / _reduce). bf16: training.dtype bfloat16, everything bf16.
# fp32: no mixed precision at all (TorchTitan with TP or PP and no FSDP: titan_precision).
DTYPES = {"mixed": Dtypes(4, 2, 2, 4), "bf16": Dtypes(2, 2, 2, 2), "fp32": Dtypes(4, 4, 4, 4)}
PRECISIONS = tuple(DTYPES)
RECOMPUTE = ("full", "none")

# fp32 attention: TorchTitan 0.2.2 runs F.scaled_dot_product_attention under
# sdpa_kernel([CUDNN_ATTENTION, FLASH_ATTENTION, MATH]) (torchtitan/models/attention.py,
# ScaledDotProductAttentionWrapper.__init__, lines 171-178); cuDNN and flash take only
# fp16/bf16, so fp32 falls to MATH, which materialises the b x heads x s x s scores. In a
# layer's recomputed backward the saved softmax output, its gradient and two more
# score-sized buffers of the backward are live at once: measured 4 copies (llama3-8b tp2 rows of
# bench/results/2026-11-30/titan_memory_2026-11-30.json, 16 local heads: recompute 4.56 GB and
# backward_autograd 14.82 GB at the peak, 4 x 4.29 GB of them scores; pp2 rows, 32
# heads: recompute 8.99 and forward_no_python_frame 29.0 GB, 4 x 8.59 GB of them scores).
ATTENTION_SCORE_COPIES = 4
# Beside them, the recomputed attention half of the layer (T x attention elements x 4 B / t)
# times this factor: least squares over the same four rows, printed by
# `python3 bench/planner_fidelity.py --report` ("fp32 layer backward" lines). Residuals:
# tp2 -0.26 GB (likely sequence parallelism's gathered inputs, which the formula does not split
# out), pp2 +0.18 GB; both under 1% of the rows' totals.
BACKWARD_WORKING_FACTOR_FP32 = 1.15


@dataclass(frozen=True)
class Layout:
    dp: int = 1          # FSDP (dp_shard) degree
    tp: int = 1
    pp: int = 1
    ep: int = 1
    local_batch: int = 1  # sequences per data-parallel rank per microstep
    microsteps: int = 1   # gradient accumulation steps per optimizer step
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

    @property
    def name(self) -> str:
        """dp8, dp4xtp2, ...: the degrees above 1 (dp1 when none is)."""
        parts = [f"{k}{v}" for k, v in (("dp", self.dp), ("tp", self.tp), ("pp", self.pp), ("ep", self.ep)) if v > 1]
        return "x".join(parts) or "dp1"


def validate(card: ModelCard, lay: Layout) -> None:
    """Raise UsageError for degrees that do not divide the model."""
    for name, v in (("dp", lay.dp), ("tp", lay.tp), ("pp", lay.pp), ("ep", lay.ep),
                    ("local batch", lay.local_batch), ("sequence length", lay.seq_len),
                    ("microsteps", lay.microsteps)):
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


def attention_elements_per_token(card: ModelCard) -> int:
    """Saved elements per token of a layer's norms and attention: two RMSNorm inputs and
    outputs, q and k before and after RoPE, v, the attention output."""
    return 4 * card.hidden + 3 * card.q_dim + 3 * card.kv_dim


def act_elements_per_token(card: ModelCard, i: int) -> int:
    """Saved-for-backward elements per token of layer i (see module docstring)."""
    h = card.hidden
    attn = attention_elements_per_token(card)
    if card.is_moe_layer(i):
        m = card.moe
        return attn + m.top_k * (2 * h + 4 * m.expert_ffn) + 4 * m.shared_experts * m.shared_ffn + 2 * m.experts
    return attn + 4 * card.ffn


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
    def tensors(self) -> float:
        """What PyTorch allocates at the peak (the measured mode's Total): no CUDA context,
        NCCL buffers or allocator slack."""
        return self.total - self.comm - self.overhead

    @property
    def states(self) -> float:
        return self.parameters + self.gradients + self.optimizer

    def breakdown(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("peak_phase", "stage", "cold")}
        d["total"] = self.total
        return d


def comm_groups(lay: Layout) -> int:
    return sum(x > 1 for x in (lay.dp, lay.tp, lay.pp, lay.ep))


def _shard(rows: int, row_elems: float, d: int) -> float:
    """Elements one rank holds of a (rows x row_elems) parameter: FSDP2 chunks dim 0 and
    pads every shard to the first chunk's ceil(rows / d) rows."""
    return -(-rows // d) * row_elems


def layer_tensors(card: ModelCard, lay: Layout, i: int) -> list[tuple[int, float, int, int]]:
    """Layer i's weights as (rows of the sharded dim, elements per row, FSDP degree, TP
    degree). With EP, a rank holds E / ep experts, FSDP-sharded over the dp x tp / ep ranks
    that share them (TorchTitan 0.2.2, llama4/infra/parallelize.py)."""
    return list(_kind_tensors(card, lay.dp, lay.tp, lay.ep, card.is_moe_layer(i)))


@functools.lru_cache(maxsize=4096)
def _kind_tensors(card: ModelCard, d: int, t: int, ep: int, moe: bool) -> tuple[tuple[int, float, int, int], ...]:
    """layer_tensors of a layer of this kind (MoE or dense) under these degrees: made once, as a
    plan asks it for every layer of thousands of layouts."""
    h = card.hidden
    dense = [(card.q_dim, h), (card.kv_dim, h), (card.kv_dim, h), (h, card.q_dim), (h, 1), (h, 1)]
    if card.qk_norm:
        dense += [(card.head_dim, 1), (card.head_dim, 1)]
    out = []
    if moe:
        m = card.moe
        dense.append((m.experts, h))  # router gate
        if m.shared_experts:
            f = m.shared_ffn * m.shared_experts
            dense += [(f, h), (f, h), (h, f)]
        if ep > 1:  # TorchTitan's llama4 apply_fsdp: the experts get their own FSDP group
            local, de = m.experts // ep, max(1, d * t // ep)
            if de * ep > m.experts:  # ... sharded on dim 1 when dim 0 would pad
                out += [(m.expert_ffn, local * h, de, 1)] * 2 + [(h, local * m.expert_ffn, de, 1)]
            else:
                out += [(local, h * m.expert_ffn, de, 1)] * 3
        else:
            out += [(m.experts, h * m.expert_ffn, d, t)] * 3
    else:
        dense += [(card.ffn, h), (card.ffn, h), (h, card.ffn)]
    return tuple((r, e, d, t) for r, e in dense) + tuple(out)


@functools.lru_cache(maxsize=4096)
def _kind_sums(card: ModelCard, d: int, t: int, ep: int, moe: bool) -> tuple[float, float, float]:
    """(shard, local, unsharded) elements of a layer of this kind: the three sums below."""
    ts = _kind_tensors(card, d, t, ep, moe)
    return (sum(_shard(r, e, dd) / tt for r, e, dd, tt in ts), sum(r * e / tt for r, e, dd, tt in ts),
            sum(dd * _shard(r, e, dd) / tt for r, e, dd, tt in ts))


def _sums(card: ModelCard, lay: Layout, i: int) -> tuple[float, float, float]:
    return _kind_sums(card, lay.dp, lay.tp, lay.ep, card.is_moe_layer(i))


def layer_shard_params(card: ModelCard, lay: Layout, i: int) -> float:
    """Elements of layer i on one rank: FSDP2 chunks dim 0 and pads every shard to the first
    chunk's ceil(rows / d) rows (16 experts over 32 ranks: a whole expert per rank)."""
    return _sums(card, lay, i)[0]


def layer_local_params(card: ModelCard, lay: Layout, i: int) -> float:
    """Elements of layer i's weights as its forward uses them on one rank (TP- and
    EP-sharded, unpadded): the size of its unsharded gradients."""
    return _sums(card, lay, i)[1]


def unsharded_layer_params(card: ModelCard, lay: Layout, i: int) -> float:
    """Elements of the buffer FSDP2 all-gathers for layer i: d padded shards, so 16 experts
    over 64 ranks gather 64 experts' worth (measured: llama4-scout, dp 64, "Unsharded Param"
    16.48 GB, bench/results/2026-11-30/planner_fidelity_2026-11-30.json)."""
    return _sums(card, lay, i)[2]


def titan_precision(precision: str, dp: int, tp: int, pp: int) -> str:
    """The precision TorchTitan 0.2.2 really trains in when `precision` is asked for.

    Mixed precision comes only from FSDP2 (dp_shard > 1) or, with no other parallelism, from
    torch.autocast; with TP or PP and no FSDP it is switched off and training runs in fp32
    (torchtitan/distributed/utils.py, maybe_enable_amp, lines 243-263: "Mixed precision
    training with TP or PP is only supported when FSDP/HSDP/CP is enabled"; llama3's
    parallelize.py line 125 applies fully_shard, which carries MixedPrecisionPolicy, only
    when parallel_dims.fsdp_enabled). Measured: the tp2 and pp2 rows of
    bench/results/2026-11-30/titan_memory_2026-11-30.json ran fp32 (their `mixed_precision` field)."""
    if precision == "mixed" and dp == 1 and (tp > 1 or pp > 1):
        return "fp32"
    return precision


def estimate_stage(card: ModelCard, lay: Layout, k: int) -> Estimate:
    dt = DTYPES[lay.precision]
    bp, ba = dt.state, dt.compute
    layers = list(stage_layers(card, lay.pp, k))
    first, last = k == 0, k == lay.pp - 1
    d, t, h = lay.dp, lay.tp, card.hidden
    emb = _shard(card.vocab, h, d) / t if first else 0.0
    out = (_shard(h, 1, d) + (0 if card.tied_embeddings else _shard(card.vocab, h, d) / t)) if last else 0.0
    kinds = [card.is_moe_layer(i) for i in layers]
    sums = {m: _kind_sums(card, d, t, lay.ep, m) for m in set(kinds)}  # (shard, local, unsharded) per kind
    per_layer = [sums[m][0] for m in kinds]
    gathered = [sums[m][2] for m in kinds]
    shard = sum(per_layer) + emb + out
    params, optim = shard * bp, shard * 2 * bp
    # TorchTitan's zero_grad sets gradients to None, so one microbatch's backward creates
    # them layer by layer (measured: bench/results/2026-11-30/planner_fidelity_2026-11-30.json, every
    # loss-phase row has no sharded gradients); with accumulation or pipeline microbatches
    # the earlier microbatches' gradients are there the whole time.
    grads_alive = lay.microsteps > 1 or lay.pp > 1

    T = lay.microbatch_tokens
    in_flight = min(lay.pp - k, lay.pp_microbatches) if lay.pp > 1 else 1
    score = score_matrix_bytes(card, lay)
    if lay.recompute == "full":
        stored = [T * h * ba / t for _ in layers]
    else:  # every layer's saved tensors; under fp32 also its softmax output (not measured)
        stored = [act_elements_per_token(card, i) * T * ba / t + score for i in layers]
    others = (in_flight - 1) * sum(stored)  # earlier microbatches still waiting for backward

    gathers = lay.dp > 1 or lay.precision == "mixed"
    gbytes, rbytes = dt.gather, dt.reduce  # TorchTitan reduces gradients in fp32 under mixed
    phases = []
    if last:
        logits = T * card.vocab / t * LOGITS_BYTES_PER_ELEMENT
        out_weight = card.output_params / t * (gbytes if lay.precision == "fp32" else OUTPUT_WEIGHT_BYTES_AT_LOSS) \
            if gathers else 0.0
        grads = shard * bp if grads_alive else 0.0
        phases.append(("loss", grads, others + sum(stored), logits, out_weight))
    # fp32: the recomputed layer's score matrices, the saved softmax among them unless stored
    scores = (ATTENTION_SCORE_COPIES - (lay.recompute == "none")) * score
    held_logits = pp_held_logits(card, lay) if last else 0.0
    for pos in range(len(layers) - 1, -1, -1):
        i = layers[pos]
        done = sum(per_layer[pos + 1:]) + out  # gradients of the layers whose backward ran
        grads = shard * bp if grads_alive else done * bp
        moe = kinds[pos]
        working = working_set(card, lay, i) + scores
        grad_bytes = gbytes * (BACKWARD_GRAD_SHARE_MOE if moe else BACKWARD_GRAD_SHARE)  # unsharded weight gradients
        act = others + sum(stored[:pos + 1]) + working
        # FSDP2 in layer i's backward: i gathered, the next layer to run (i - 1, or the
        # embedding) prefetched, and the reduce-scatter input of the layer before (i + 1,
        # or the output projection) in the reduce dtype, which FSDP2 frees only when the next
        # reduce-scatter is issued (measured: "All Gather" and "Reduce Scatter" rows of
        # bench/results/2026-11-30/planner_fidelity_2026-11-30.json, qwen3-32b and llama3-405b).
        nxt = gathered[pos - 1] if pos else (card.embedding_params / t if first else 0.0)
        prev = gathered[pos + 1] if pos + 1 < len(layers) else (card.output_params / t if last else 0.0)
        fs = (gathered[pos] * gbytes + sums[moe][1] * grad_bytes
              + nxt * gbytes * (FSDP_PREFETCH_LAYERS - 1) + prev * rbytes if gathers else 0.0)
        phases.append(("layer backward", grads, act, held_logits, fs))
    if first and gathers:
        # the end of backward: the embedding's unsharded gradient and its reduce-dtype copy,
        # every other gradient made (measured: llama3-8b lb1 seq 2048 dp8, "Unsharded Grad"
        # 1.05 GB = 2 B x vocab x hidden, Temp 2.36 GB, in the root's final callback)
        grads = shard * bp if grads_alive else (shard - emb) * bp
        phases.append(("embedding backward", grads, others, 0.0, card.embedding_params / t * (gbytes + rbytes)))
    phase, grads, act, lg, fs = max(phases, key=lambda p: sum(p[1:]))

    torch_bytes = params + grads + optim + act + lg + fs
    overhead = CUDA_CONTEXT_BYTES + ALLOCATOR_FRAGMENTATION * torch_bytes
    comm = NCCL_BYTES_PER_COMM * comm_groups(lay)
    # what offload can move: the AdamW states, and under mixed the fp32 master weights,
    # which only the optimizer step touches (fp32 and bf16 compute with the weights themselves)
    cold = optim + (params if lay.precision == "mixed" else 0.0)
    return Estimate(params, grads, optim, act, lg, fs, comm, overhead, phase, k, cold)


def working_set(card: ModelCard, lay: Layout, i: int) -> float:
    """Recomputed tensors of layer i live at its backward peak, besides score matrices.
    Under fp32 the peak is SDPA's math backward, after the MLP's backward freed the MLP's
    tensors, so only the attention half counts (BACKWARD_WORKING_FACTOR_FP32)."""
    T, ba = lay.microbatch_tokens, DTYPES[lay.precision].compute
    if lay.precision == "fp32":
        return T * attention_elements_per_token(card) * ba / lay.tp * BACKWARD_WORKING_FACTOR_FP32
    factor = BACKWARD_WORKING_FACTOR_MOE if card.is_moe_layer(i) else BACKWARD_WORKING_FACTOR
    return T * act_elements_per_token(card, i) * ba / lay.tp * factor


def score_matrix_bytes(card: ModelCard, lay: Layout) -> float:
    """Bytes of one microbatch's attention scores (b x heads / t x s x s) as SDPA's math
    backend makes them: fp32 only (bf16 runs flash or cuDNN attention, which keep no s x s
    matrix)."""
    if lay.precision != "fp32":
        return 0.0
    sequences = lay.microbatch_tokens // lay.seq_len
    return sequences * card.heads / lay.tp * lay.seq_len ** 2 * DTYPES["fp32"].compute


def pp_held_logits(card: ModelCard, lay: Layout) -> float:
    """Under PP the last stage's logits stay referenced through the microbatch's whole
    backward: torch.distributed.pipelining's stage.backward_one_chunk pops
    (stage_output, inputs) from fwd_cache and holds them while it runs backward. Measured
    in fp32 only: the pp2 rows of bench/results/2026-11-30/titan_memory_2026-11-30.json, the last
    stage (rank 1) peaks 4.07 GB above the first with the same states, one microbatch's
    8192 x 128,256 fp32 logits being 4.20 GB. Mixed precision with FSDP and PP would hold
    bf16 logits the same way; no such run was measured and the term is not counted there."""
    if lay.precision != "fp32" or lay.pp == 1:
        return 0.0
    return lay.microbatch_tokens * card.vocab / lay.tp * DTYPES["fp32"].compute


def estimate(card: ModelCard, lay: Layout) -> Estimate:
    """The worst pipeline stage's estimate."""
    validate(card, lay)
    return max((estimate_stage(card, lay, k) for k in range(lay.pp)), key=lambda e: e.total)
