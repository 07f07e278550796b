"""TorchTitan's decoder, small: what `plan --measure` runs when TorchTitan is not importable.

The structure follows TorchTitan 0.2.2 (the release measured on the H200) tensor for tensor,
because the measured mode counts the tensors a training step allocates, not FLOPs:
torchtitan/models/llama3/model/model.py (RMSNorm, complex RoPE in fp32, GQA attention
through SDPA with enable_gqa, SwiGLU), qwen3/model/model.py (per-head q/k RMSNorm) and
moe/moe.py + moe/utils.py (TokenChoiceTopKRouter in fp32, TokenReorderer, the
grouped-GEMM experts behind indices_padding_wrapper with TOKEN_GROUP_ALIGN_SIZE_M = 8,
shared experts, the unsort and combine). Weights are never initialised: the model is
built on the meta device and measured under FakeTensorMode.

Requires torch; import it only after checking that torch is importable.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from transit_launch.planning.models import ModelCard

ALIGN = 8  # TorchTitan's TOKEN_GROUP_ALIGN_SIZE_M for bf16 grouped GEMMs (moe/utils.py)
ROPE_THETA = 500000.0  # the value only sets the table's contents, not its size


class _FusedRMSNorm(torch.autograd.Function):
    """What CUDA's fused rms_norm keeps for backward (the input and an fp32 rstd per row),
    computed without fp32 copies of the input. On the CPU, nn.RMSNorm decomposes into
    elementwise ops that save two fp32 copies; the H200 runs the fused kernel."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        sq = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
        rstd = torch.rsqrt(sq.square_().div_(x.shape[-1]).add_(eps))
        ctx.save_for_backward(x, weight, rstd)
        return torch.mul(x, rstd.to(x.dtype)).mul_(weight)

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        xhat = x * rstd.to(x.dtype)
        grad_w = (grad * xhat).sum(dim=tuple(range(grad.dim() - 1)))
        gw = grad * weight
        dot = torch.bmm(gw.reshape(-1, 1, x.shape[-1]), xhat.reshape(-1, x.shape[-1], 1)).view(*x.shape[:-1], 1)
        xhat.mul_(dot.div_(x.shape[-1]))
        gw.sub_(xhat)
        del xhat
        return gw.mul_(rstd.to(x.dtype)), grad_w, None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x):
        return _FusedRMSNorm.apply(x, self.weight, self.eps)


def rope_table(head_dim: int, seq_len: int) -> torch.Tensor:
    freqs = 1.0 / (ROPE_THETA ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(seq_len).float(), freqs)
    return torch.polar(torch.ones_like(angles), angles)  # complex64, (seq, head_dim / 2)


def apply_rope(xq: torch.Tensor, xk: torch.Tensor, freqs: torch.Tensor):
    q = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    k = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    f = freqs[: xq.shape[1]].view(1, xq.shape[1], 1, -1)
    return torch.view_as_real(q * f).flatten(3).type_as(xq), torch.view_as_real(k * f).flatten(3).type_as(xk)


class Attention(nn.Module):
    def __init__(self, c: ModelCard):
        super().__init__()
        self.head_dim = c.head_dim
        self.wq = nn.Linear(c.hidden, c.q_dim, bias=c.qkv_bias)
        self.wk = nn.Linear(c.hidden, c.kv_dim, bias=c.qkv_bias)
        self.wv = nn.Linear(c.hidden, c.kv_dim, bias=c.qkv_bias)
        self.wo = nn.Linear(c.q_dim, c.hidden, bias=False)
        self.q_norm = RMSNorm(c.head_dim) if c.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim) if c.qk_norm else None

    def forward(self, x, freqs):
        bs, seq, _ = x.shape
        xq = self.wq(x).view(bs, seq, -1, self.head_dim)
        xk = self.wk(x).view(bs, seq, -1, self.head_dim)
        xv = self.wv(x).view(bs, seq, -1, self.head_dim)
        if self.q_norm is not None:
            xq, xk = self.q_norm(xq), self.k_norm(xk)
        xq, xk = apply_rope(xq, xk, freqs)
        gqa = xq.shape[2] != xk.shape[2]
        out = F.scaled_dot_product_attention(xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2),
                                             is_causal=True, enable_gqa=gqa)
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def _padded_permutation(counts: torch.Tensor, sorted_experts: torch.Tensor, n: int, max_len: int):
    """TorchTitan's generate_permute_indices without its Triton kernel: every expert's rows
    start at a multiple of ALIGN (at least ALIGN rows per expert); padding rows point at
    the zero row n."""
    sizes = torch.clamp((counts + ALIGN - 1) // ALIGN * ALIGN, min=ALIGN)
    ends = torch.cumsum(sizes, 0)
    start_padded, start = ends - sizes, torch.cumsum(counts, 0) - counts
    dest = start_padded[sorted_experts] + torch.arange(n, device=counts.device) - start[sorted_experts]
    perm = torch.full((max_len,), n, dtype=torch.long, device=counts.device)
    perm[dest] = torch.arange(n, device=counts.device)
    return perm, ends.to(torch.int32)


class GroupedExperts(nn.Module):
    def __init__(self, dim: int, hidden: int, experts: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(experts, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(experts, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(experts, hidden, dim))

    def forward(self, x, counts, sorted_experts):
        w1, w2, w3 = (w.to_local() if hasattr(w, "to_local") else w for w in (self.w1, self.w2, self.w3))
        n, experts = x.shape[0], w1.shape[0]
        max_len = (n + experts * ALIGN + ALIGN - 1) // ALIGN * ALIGN
        perm, offsets = _padded_permutation(counts, sorted_experts, n, max_len)
        shape = (n + 1, x.shape[-1])
        xp = torch.vstack((x, x.new_zeros((x.shape[-1],))))[perm, :]
        h = F.silu(torch._grouped_mm(xp.bfloat16(), w1.bfloat16().transpose(-2, -1), offs=offsets))
        h = h * torch._grouped_mm(xp.bfloat16(), w3.bfloat16().transpose(-2, -1), offs=offsets)
        out = torch._grouped_mm(h, w2.bfloat16().transpose(-2, -1), offs=offsets).type_as(x)
        unpermuted = out.new_empty(shape)
        unpermuted[perm, :] = out
        return unpermuted[:-1]


class MoE(nn.Module):
    """Qwen3-MoE: softmax scores, normalised top-k, scores applied after the experts;
    Llama4: sigmoid, top-1, scores applied before, one shared expert (TorchTitan's MoEArgs)."""

    def __init__(self, c: ModelCard):
        super().__init__()
        m = c.moe
        self.top_k, self.experts_n = m.top_k, m.experts
        self.softmax = self.score_after = c.family.startswith("qwen3")
        self.gate = nn.Linear(c.hidden, m.experts, bias=False)
        self.experts = GroupedExperts(c.hidden, m.expert_ffn, m.experts)
        self.shared_experts = FeedForward(c.hidden, m.shared_ffn * m.shared_experts) if m.shared_experts else None
        self.register_buffer("expert_bias", torch.zeros(m.experts), persistent=True)
        self.register_buffer("tokens_per_expert", torch.zeros(m.experts), persistent=False)

    def forward(self, x):
        bs, seq, dim = x.shape
        x = x.view(-1, dim)
        scores = self.gate(x).float()
        scores = F.softmax(scores, dim=1) if self.softmax else torch.sigmoid(scores)
        _, chosen = torch.topk(scores + self.expert_bias, k=self.top_k, dim=-1, sorted=False)
        top = scores.gather(1, chosen)
        if self.softmax:  # route_norm
            top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
        flat = chosen.view(-1)
        counts = torch.histc(flat.float(), bins=self.experts_n, min=0, max=self.experts_n)
        with torch.no_grad():
            self.tokens_per_expert.add_(counts)
        order = torch.argsort(flat, stable=True)
        routed = x[order // self.top_k]
        if not self.score_after:
            routed = (routed.float() * top.view(-1)[order].reshape(-1, 1)).to(x.dtype)
        routed = self.experts(routed, counts.long(), flat[order])
        out = self.shared_experts(x) if self.shared_experts is not None else None
        unsorted = torch.zeros((bs * seq * self.top_k, dim), dtype=routed.dtype, device=routed.device)
        unsorted[order] = routed
        unsorted = unsorted.reshape(-1, self.top_k, dim)
        if self.score_after:
            experts = torch.bmm(top.reshape(-1, 1, self.top_k), unsorted.float()).to(x.dtype).squeeze(1)
        else:
            experts = unsorted.sum(dim=1)
        return (experts if out is None else out + experts).reshape(bs, seq, dim)


class Block(nn.Module):
    def __init__(self, c: ModelCard, i: int):
        super().__init__()
        self.attention = Attention(c)
        self.attention_norm = RMSNorm(c.hidden)
        self.ffn_norm = RMSNorm(c.hidden)
        self.mlp = MoE(c) if c.is_moe_layer(i) else FeedForward(c.hidden, c.ffn)

    def forward(self, x, freqs):
        h = x + self.attention(self.attention_norm(x), freqs)
        return h + self.mlp(self.ffn_norm(h))


class Decoder(nn.Module):
    def __init__(self, c: ModelCard, layers: int, seq_len: int):
        super().__init__()
        self.tok_embeddings = nn.Embedding(c.vocab, c.hidden)
        self.register_buffer("freqs_cis", rope_table(c.head_dim, seq_len), persistent=False)
        self.layers = nn.ModuleDict({str(i): Block(c, i) for i in range(layers)})
        self.norm = RMSNorm(c.hidden)
        self.output = nn.Linear(c.hidden, c.vocab, bias=False)
        if c.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis)
        return self.output(self.norm(h))


def cross_entropy_loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """TorchTitan's loss (components/loss.py): fp32 cross-entropy, sum reduction."""
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1), reduction="sum", ignore_index=-100)
