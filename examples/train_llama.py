"""A small Llama-style trainer: RMSNorm, RoPE, grouped-query attention (SDPA), SwiGLU.

FSDP2 (fully_shard, bf16 compute with fp32 master weights and fp32 gradient reduction:
TorchTitan's mixed precision), full activation checkpointing, AdamW, synthetic tokens
(seeded, no downloads). Runs on one GPU, under torchrun on many, or on CPU with gloo
(DDP, fp32) so that bandwidth sweeps can be shown without GPUs.

One JSON line per step on stdout: step, loss, step_time, tokens_per_s, tflops (model
FLOPs per GPU: 6 x non-embedding parameters x tokens / step time, attention excluded),
max_reserved_gb and, with --clip, grad_norm (the total gradient norm before clipping); a
final {"summary": ...} line.

--clip MAX_NORM clips the gradients' total norm before every optimizer step
(torch.nn.utils.clip_grad_norm_ on FSDP2's DTensors, DDP's or plain parameters; DeepSpeed's
own gradient_clipping). --tie-embeddings shares one matrix between the token embedding and
the output projection: counted once in "params" (and in the AdamW state), and in
"flop_params" as the output projection, whose matmul it still is.

With --global-batch the run no longer depends on the world size: the tokens of every
sequence come from (seed, global step, sequence index), the microbatches per step are
global batch / (world x --batch), and the loss printed is the mean over the global
batch. With --checkpoint-dir it saves model and optimizer through
torch.distributed.checkpoint (DCP) every --checkpoint-every steps into step-N/, as
TorchTitan does, and resumes from the newest complete one (its .metadata, which DCP
writes last) on whatever world size it is started with: what a job that lost a node
needs to continue on the survivors (transit-launch --on-node-loss scale-in). A save is
written into a temporary directory (.step-N.*.tmp), synced and renamed to step-N/, so a
save cut short never leaves a step-N/; a resume removes the temporary ones left behind.

    python examples/train_llama.py --steps 20
    torchrun --nproc-per-node 2 examples/train_llama.py --device cpu --steps 5
"""

import argparse
import contextlib
import gc
import json
import math
import os
import resource
import secrets
import socket
import shutil
import statistics
import sys
import time

def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Defaults: a 1.0 B-parameter model whose states (16 GB) dominate its memory, as in
    # LLM training with recomputation.
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=7168)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch", type=int, default=2, help="sequences per rank per microbatch")
    p.add_argument("--accum", type=int, default=1,
                   help="microbatches per optimizer step (gradient accumulation): tokens per step grow, "
                        "activation memory does not")
    p.add_argument("--global-batch", type=int, default=None, metavar="SEQUENCES",
                   help="sequences per optimizer step over all ranks: microbatches = this / (world x --batch), and "
                        "the data order depends on the step and the sequence only (not on the world size)")
    p.add_argument("--checkpoint-dir", default=None,
                   help="save DCP checkpoints here (step-N/) and resume from the newest complete one")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="STEPS",
                   help="with --checkpoint-dir: save every this many steps, and after the last (default 0: only after "
                        "the last)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--no-recompute", action="store_true", help="keep all activations (no checkpointing)")
    p.add_argument("--foreach", action="store_true", help="foreach AdamW instead of fused")
    p.add_argument("--dp", choices=("auto", "fsdp", "ddp"), default="auto",
                   help="data parallelism: FSDP2 (auto on GPUs) or DDP (auto on CPU ranks); FSDP2 runs on CPU "
                        "ranks too (gloo), for its collectives (all-gather, reduce-scatter) without a GPU")
    p.add_argument("--cpu-offload", action="store_true",
                   help="FSDP2 CPUOffloadPolicy(pin_memory=True), what TorchTitan's enable_cpu_offload does")
    p.add_argument("--engine", choices=("fsdp", "deepspeed", "torchao-offload"), default="fsdp",
                   help="deepspeed: the same model under DeepSpeed ZeRO (bf16), see --zero; torchao-offload: "
                        "one GPU, bf16 autocast over fp32 weights, torchao's CPUOffloadOptimizer (fused CPU AdamW)")
    p.add_argument("--zero", choices=("offload", "infinity", "twinflow", "zenflow"), default="offload",
                   help="offload: ZeRO-Offload (stage 2, optimizer on the CPU); infinity: ZeRO-Infinity "
                        "(stage 3, parameters and optimizer on the CPU); twinflow: ZeRO-Offload++ (stage 3, "
                        "--offload-ratio of the optimizer on the CPU, the rest stepped on the GPU); zenflow: "
                        "ZenFlow (stage 2 offload; the top-k gradient columns stepped on the GPU every step, "
                        "the rest on the CPU every 4 steps, overlapped: a different update rule)")
    p.add_argument("--offload-ratio", type=float, default=0.75,
                   help="twinflow: the share of the optimizer's subgroups stepped on the CPU")
    p.add_argument("--comm-profile", type=int, default=0, metavar="STEP",
                   help="profile this step with torch.profiler and report the bytes its collectives moved")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels (memory-efficient attention, cuBLAS workspace config), for A/B runs")
    p.add_argument("--clip", type=float, default=0.0, metavar="MAX_NORM",
                   help="clip the gradients' total (L2) norm to this before each optimizer step, and print it per "
                        "step as grad_norm (default 0: no clipping)")
    p.add_argument("--tie-embeddings", action="store_true",
                   help="the output projection shares the token embedding's matrix (one parameter)")
    a = p.parse_args()
    if a.clip < 0 or not math.isfinite(a.clip):
        p.error(f"--clip takes a norm > 0 (0: off), got {a.clip}")
    if a.clip and a.engine == "torchao-offload":
        # its CPU optimizer steps on host copies of the gradients, made during backward: clipping
        # the GPU's gradients afterwards would not reach the step
        p.error("--clip does not apply to --engine torchao-offload (its CPU AdamW steps on gradients copied "
                "to the host during backward)")
    return a


def refusal(a, device: str) -> str | None:
    """The one line that refuses flags a run on `device` cannot take (exit 2), or None."""
    if a.engine != "fsdp" and device != "cuda":
        return f"--engine {a.engine} needs a GPU"
    if not 0.0 <= a.offload_ratio <= 1.0:
        return f"--offload-ratio must be between 0 and 1, got {a.offload_ratio}"
    if a.cpu_offload and device != "cuda":
        return "--cpu-offload needs a GPU (it offloads from one)"
    if a.checkpoint_every < 0 or (a.checkpoint_every and not a.checkpoint_dir):
        return "--checkpoint-every takes a step count >= 0 and needs --checkpoint-dir"
    if a.checkpoint_dir and a.engine != "fsdp":
        return f"--checkpoint-dir saves FSDP2/DDP state (DCP); --engine {a.engine} has its own"
    return None


if __name__ == "__main__":  # the flags' refusals before torch's import (2 s of CPU); main() repeats them
    _a = parse()
    _why = refusal(_a, _a.device) if _a.device != "auto" else None  # auto: torch finds the device
    if _why:
        print(_why, file=sys.stderr)
        raise SystemExit(2)

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint


def rope(x, cos, sin):
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # bf16 under FSDP mixed precision
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.heads, self.kv_heads, self.hd = a.heads, a.kv_heads, a.dim // a.heads
        # flash attention's backward accumulates with atomics: the math kernel for A/B runs
        self.sdpa = [SDPBackend.MATH] if a.deterministic else [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
        # TorchTitan's norm (nn.RMSNorm): it saves its input and a per-token rstd for backward
        self.attn_norm, self.ffn_norm = nn.RMSNorm(a.dim, eps=1e-5), nn.RMSNorm(a.dim, eps=1e-5)
        self.wq = nn.Linear(a.dim, a.heads * self.hd, bias=False)
        self.wk = nn.Linear(a.dim, a.kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(a.dim, a.kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(a.heads * self.hd, a.dim, bias=False)
        self.w1 = nn.Linear(a.dim, a.ffn, bias=False)
        self.w3 = nn.Linear(a.dim, a.ffn, bias=False)
        self.w2 = nn.Linear(a.ffn, a.dim, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(b, s, self.heads, self.hd)
        k = self.wk(h).view(b, s, self.kv_heads, self.hd)
        v = self.wv(h).view(b, s, self.kv_heads, self.hd)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        with sdpa_kernel(self.sdpa):
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True, enable_gqa=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.recompute = not a.no_recompute
        self.tok = nn.Embedding(a.vocab, a.dim)
        self.blocks = nn.ModuleList(Block(a) for _ in range(a.layers))
        self.norm = nn.RMSNorm(a.dim, eps=1e-5)
        self.out = nn.Linear(a.dim, a.vocab, bias=False)
        self.tied = a.tie_embeddings
        if self.tied:  # one Parameter under both names, with the projection's initialization
            self.tok.weight = self.out.weight
        hd = a.dim // a.heads
        freqs = 1.0 / (500000.0 ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.outer(torch.arange(a.seq_len).float(), freqs)
        self.register_buffer("cos", ang.cos()[None, :, None, :], persistent=False)
        self.register_buffer("sin", ang.sin()[None, :, None, :], persistent=False)

    def forward(self, tokens):
        x = self.tok(tokens)
        for blk in self.blocks:
            if self.recompute and self.training:
                x = checkpoint(blk, x, self.cos, self.sin, use_reentrant=False)
            else:
                x = blk(x, self.cos, self.sin)
        return self.out(self.norm(x))


def init_dist(device):
    if "RANK" not in os.environ:  # single process: a world of one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0))


def collective_bytes(prof):
    """The collectives of one profiled step, from the c10d operator events the dispatcher
    records for every backend (NCCL and gloo alike): {op: {calls, buffer_bytes}}, where a
    call's buffer is its largest tensor argument (all-gather output, reduce-scatter input,
    the all-reduced tensors)."""
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as fh:
            trace = json.load(fh)
    width = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4,
             "unsigned char": 1, "signed char": 1, "bool": 1}

    def nbytes(dims, dtype):
        if dims and isinstance(dims[0], list):  # a tensor list
            return sum(nbytes(d, dtype) for d in dims)
        return math.prod(dims) * width.get(dtype, 0) if dims else 0

    out = {}
    for ev in trace.get("traceEvents", []):
        name, args = ev.get("name", ""), ev.get("args") or {}
        if not name.startswith("c10d::") or "barrier" in name or "Input Dims" not in args:
            continue
        types = args.get("Input type", [])
        sizes = [nbytes(d, types[i] if i < len(types) else "") for i, d in enumerate(args["Input Dims"])]
        if types and types[0] == "TensorList":  # allreduce_ and friends do not name the dtype:
            sizes[0] = nbytes(args["Input Dims"][0], "float")  # DDP reduces fp32 gradients
        c = out.setdefault(name, {"calls": 0, "buffer_bytes": 0})
        c["calls"] += 1
        c["buffer_bytes"] += max(sizes, default=0)
    return out


def data_parallel(a, device):
    return a.dp if a.dp != "auto" else ("fsdp" if device == "cuda" else "ddp")


def build_fsdp(a, model, device, world):
    """FSDP2 with TorchTitan's mixed precision (or DDP); returns (model, optimizer)."""
    if data_parallel(a, device) == "fsdp":
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
        # with CPU offload FSDP2 keeps the sharded parameters (and so the optimizer) on the host
        model = model if a.cpu_offload or device == "cpu" else model.cuda()
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        off = CPUOffloadPolicy(pin_memory=True) if a.cpu_offload else OffloadPolicy()
        for blk in model.blocks:
            fully_shard(blk, mp_policy=mp, offload_policy=off)
        # the embedding and the output projection stay in the root's unit: a tied pair is one
        # parameter there (never shard tok or out on their own)
        fully_shard(model, mp_policy=mp, offload_policy=off)
        if a.cpu_offload:
            model.cos, model.sin = model.cos.cuda(), model.sin.cuda()
    elif world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    # fused AdamW also has a CPU kernel: the fastest step torch offers for offloaded states
    fused = device == "cuda" and not a.foreach
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1, fused=fused or None,
                            foreach=a.foreach or None)
    return model, opt


def deepspeed_config(a):
    """The DeepSpeed configuration of --zero (a pure function: tests check it without DeepSpeed)."""
    zero = {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "overlap_comm": True, "contiguous_gradients": True}
    if a.zero == "infinity":
        zero = {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                "offload_param": {"device": "cpu", "pin_memory": True}, "overlap_comm": True,
                "contiguous_gradients": True}
    elif a.zero == "twinflow":
        # ZeRO-Offload++ Twin-Flow: the last `ratio` of the optimizer's subgroups on the CPU,
        # the others on the GPU (stage3.py's subgroup_to_device); 5e7-element subgroups give
        # the ratio about 20 steps on the 1.0 B model instead of DeepSpeed's one 1e9 subgroup
        zero = {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True, "ratio": a.offload_ratio},
                "sub_group_size": 50_000_000, "overlap_comm": True, "contiguous_gradients": True}
    elif a.zero == "zenflow":
        # ZenFlow as DeepSpeed's tutorial configures it (5% of the gradient columns stepped on
        # the GPU each step, the rest accumulated and stepped on the CPU every 4 steps, overlapped
        # with the next steps' compute), but with the columns reselected every 4 steps: "auto"
        # selects once per epoch, and a trainer without a DeepSpeed dataloader has no epoch
        zero["zenflow"] = {"topk_ratio": 0.05, "select_strategy": "step", "select_interval": 4,
                           "update_interval": 4, "full_warm_up_rounds": 0, "overlap_step": True}
    cfg = {"train_micro_batch_size_per_gpu": a.batch, "gradient_accumulation_steps": a.accum,
           # ZenFlow's CPU Adam is outside ZeRO's tested list (its example config sets this too)
           **({"zero_allow_untested_optimizer": True} if a.zero == "zenflow" else {}),
           "bf16": {"enabled": True}, "zero_optimization": zero, "gradient_clipping": a.clip,
           "optimizer": {"type": "AdamW", "params": {"lr": a.lr, "weight_decay": 0.1, "betas": [0.9, 0.999],
                                                      "eps": 1e-8}},
           "steps_per_print": 1 << 30, "wall_clock_breakdown": False}
    return cfg


def build_deepspeed(a, model):
    """DeepSpeed ZeRO-Offload (stage 2), ZeRO-Infinity (stage 3, parameters on the CPU too),
    Twin-Flow or ZenFlow (deepspeed_config), bf16 with fp32 master weights and Adam states in
    host memory, DeepSpeed's CPU Adam; returns (engine, the optimizer it uses)."""
    import deepspeed
    cfg = deepspeed_config(a)
    deepspeed.init_distributed(dist_backend="nccl")
    try:
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        return engine, "DeepSpeedCPUAdam"
    except Exception as e:  # noqa: BLE001 - its CPU Adam is JIT-compiled and needs a compiler and headers
        if a.zero in ("twinflow", "zenflow"):
            raise  # both need DeepSpeed's own CPU Adam: no fallback measures them
        print(f"DeepSpeed's CPU Adam is unavailable ({type(e).__name__}: {str(e)[:200]}); "
              "falling back to torch's AdamW on the CPU", file=sys.stderr)
    del cfg["optimizer"]
    cfg["zero_force_ds_cpu_optimizer"] = False
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    return engine, "torch.optim.AdamW (cpu)"


def build_torchao_offload(a, model):
    """torchao's CPUOffloadOptimizer as its README runs it: one GPU, no FSDP (it hooks each
    parameter's post-accumulate-grad, which FSDP2's sharded parameters never fire), fused CPU
    AdamW; gradients freed once copied out where accumulation allows (offload_gradients)."""
    from torchao.optim import CPUOffloadOptimizer
    opt = CPUOffloadOptimizer(model.cuda().parameters(), torch.optim.AdamW, offload_gradients=a.accum == 1,
                              lr=a.lr, weight_decay=0.1)
    return model, opt


def sequence(a, step: int, index: int):
    """Sequence `index` of global step `step`: seq_len + 1 tokens from (seed, step, index)
    only, so every world size reads the same global batch."""
    g = torch.Generator().manual_seed(((a.seed * 1_000_003 + step) * 1_000_003 + index) % 2**63)
    return torch.randint(0, a.vocab, (a.seq_len + 1,), generator=g)


def global_microbatches(a, step: int, rank: int, world: int):
    """This rank's microbatches of a global step: microbatch m holds sequences
    m*world*batch + rank*batch .. + batch; with equal microbatches the mean of the ranks'
    mean losses is the global batch's mean loss, whatever the split."""
    return [torch.stack([sequence(a, step, m * world * a.batch + rank * a.batch + k) for k in range(a.batch)])
            for m in range(a.accum)]


def complete_checkpoints(root: str) -> list[int]:
    """Steps of the checkpoints under root that DCP finished (step-N/.metadata, its
    completion marker): a save cut short by a lost node leaves no step-N/ (save_checkpoint
    renames it into place when complete) and the one before it is used; a step-N/ without
    .metadata (another writer's, cut short) is ignored."""
    steps = []
    for d in os.listdir(root) if os.path.isdir(root) else ():
        if d.startswith("step-") and d[5:].isdigit() and os.path.isfile(os.path.join(root, d, ".metadata")):
            steps.append(int(d[5:]))
    return sorted(steps)


def checkpoint_state(a, model, opt, step: int) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict
    msd, osd = get_state_dict(model, opt)
    # what the data order and the global batch depend on: a resume under other settings is refused
    return {"model": msd, "optim": osd, "train": {"step": step, "seed": a.seed, "global_batch": a.global_batch,
                                                  "batch": a.batch, "seq_len": a.seq_len, "vocab": a.vocab}}


# Test-only (tests/test_node_loss.py): "STEP:PATH" makes the save of step STEP stop inside
# the write, once: every shard is in the temporary directory and .metadata is not; the
# coordinator writes PATH (JSON: the step and the directory) and waits there to be killed.
# It stands in for a write that is slow at that point; a PATH that exists disarms it.
PAUSE_SAVE_ENV = "TRAIN_LLAMA_TEST_PAUSE_SAVE"
PAUSE_SAVE_S = 120
TMP_SUFFIX = ".tmp"


def _pause_in_save(step: int, tmp: str) -> None:
    spec = os.environ.get(PAUSE_SAVE_ENV, "")
    at, _, path = spec.partition(":")
    if not path or at != str(step) or os.path.exists(path):
        return
    with open(path + TMP_SUFFIX, "w") as f:
        json.dump({"step": step, "tmp": tmp, "pid": os.getpid()}, f)
    os.rename(path + TMP_SUFFIX, path)
    time.sleep(PAUSE_SAVE_S)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _new_dir(root: str, prefix: str) -> str:
    """A directory of a name nothing else uses, with the umask's mode (as DCP's own)."""
    path = os.path.join(root, f"{prefix}{secrets.token_hex(6)}{TMP_SUFFIX}")
    os.mkdir(path)
    return path


def save_checkpoint(a, model, opt, step: int, rank: int, world: int) -> None:
    """DCP's save into a temporary directory rank 0 names (a fresh one: a lost attempt's
    is never written into again), then rank 0 syncs it and renames it to step-N: step-N/
    exists only complete. DCP fsyncs every file it writes; the renames are synced here."""
    import torch.distributed.checkpoint as dcp
    root = a.checkpoint_dir
    name = [None]
    if rank == 0:
        os.makedirs(root, exist_ok=True)
        name[0] = _new_dir(root, f".step-{step}.")
    if world > 1:
        dist.broadcast_object_list(name, src=0)
    tmp = name[0]

    class Writer(dcp.FileSystemWriter):
        def finish(self, metadata, results):  # the coordinator, once every rank's shards are written
            _pause_in_save(step, tmp)
            super().finish(metadata, results)

    dcp.save(checkpoint_state(a, model, opt, step), storage_writer=Writer(tmp))
    if rank == 0:  # dcp.save returns on every rank after .metadata is in place
        _fsync_dir(tmp)
        final = os.path.join(root, f"step-{step}")
        if os.path.exists(final):  # not made by this trainer's saves (they never redo a finished step)
            aside = _new_dir(root, f".step-{step}.old.")
            os.rename(final, os.path.join(aside, "step"))
            shutil.rmtree(aside)
        os.rename(tmp, final)
        _fsync_dir(root)


def remove_partial_saves(root: str) -> None:
    """The temporary directories of saves cut short (a lost node); rank 0, before a resume."""
    for d in os.listdir(root) if os.path.isdir(root) else ():
        if d.startswith(".step-") and d.endswith(TMP_SUFFIX):
            shutil.rmtree(os.path.join(root, d), ignore_errors=True)


def resume(a, model, opt, rank: int, world: int) -> int:
    """Loads the newest complete checkpoint onto this world size (DCP reshards); returns
    its step (0: none). Rank 0 chooses it and tells the others: ranks that listed the
    directory themselves could see different steps (a lost attempt's writer finishing its
    rename between their listings) and then run different steps' collectives."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict
    chosen = [None]
    if rank == 0:
        remove_partial_saves(a.checkpoint_dir)
        chosen[0] = complete_checkpoints(a.checkpoint_dir)
    if world > 1:
        dist.broadcast_object_list(chosen, src=0)
    steps = chosen[0]
    if not steps:
        return 0
    state = checkpoint_state(a, model, opt, 0)
    dcp.load(state, checkpoint_id=os.path.join(a.checkpoint_dir, f"step-{steps[-1]}"))
    train = state["train"]
    for k in ("seed", "global_batch", "batch", "seq_len", "vocab"):
        if train[k] != getattr(a, k.replace("-", "_")):
            raise SystemExit(f"checkpoint step-{steps[-1]} was made with --{k.replace('_', '-')} {train[k]}, "
                             f"not {getattr(a, k)}: its data order would not continue")
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return train["step"]


def main():
    a = parse()
    device = a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    why = refusal(a, device)
    if why:
        print(why, file=sys.stderr)
        return 2
    if a.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    rank, world, local = init_dist(device)
    if a.global_batch is not None:
        if a.accum != 1 or a.global_batch < 1 or a.global_batch % (world * a.batch):
            if rank == 0:
                print(f"--global-batch {a.global_batch} must be a multiple of world {world} x --batch {a.batch} "
                      "(and replaces --accum)", file=sys.stderr)
            return 2
        a.accum = a.global_batch // (world * a.batch)
    if device == "cuda":
        torch.cuda.set_device(local)
    torch.manual_seed(a.seed)
    model = Llama(a)
    n_params = sum(p.numel() for p in model.parameters())  # a tied matrix once (parameters() removes duplicates)
    # the embedding's lookup is no matmul, the output projection is: tied, the one matrix counts
    n_flop_params = n_params - (0 if model.tied else model.tok.weight.numel())
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    engine = opt = None
    optimizer_impl = "torch.optim.AdamW"
    if a.engine == "deepspeed":
        engine, optimizer_impl = build_deepspeed(a, model)
        model = engine
    elif a.engine == "torchao-offload":
        if world > 1:
            print("--engine torchao-offload runs on one GPU (torchao: single-GPU training)", file=sys.stderr)
            return 2
        model, opt = build_torchao_offload(a, model)
        optimizer_impl = "torchao CPUOffloadOptimizer (fused CPU AdamW)"
    else:
        model, opt = build_fsdp(a, model, device, world)
    gen = torch.Generator().manual_seed(a.seed * 1000 + rank)
    first = 1
    if a.checkpoint_dir:
        first = resume(a, model, opt, rank, world) + 1
        if rank == 0:
            print(json.dumps({"resumed": first - 1, "world": world, "accum": a.accum}), flush=True)
    tokens_per_step = a.batch * a.seq_len * a.accum
    # without FSDP's mixed precision, autocast gives the same bf16 compute over fp32 weights
    autocast = torch.autocast("cuda", torch.bfloat16) if a.engine == "torchao-offload" else contextlib.nullcontext()
    times, losses = [], []
    comm = None
    for step in range(first, a.steps + 1):
        if a.global_batch is not None:
            micro = [m.to(device) for m in global_microbatches(a, step, rank, world)]
        else:
            micro = [torch.randint(0, a.vocab, (a.batch, a.seq_len + 1), generator=gen).to(device)
                     for _ in range(a.accum)]
        prof = None
        if step == a.comm_profile:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
            prof.__enter__()
        t0 = time.perf_counter()
        total = 0.0
        norm = None
        for data in micro:
            with autocast:
                logits = model(data[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, a.vocab), data[:, 1:].reshape(-1))
            del logits
            if engine is not None:
                engine.backward(loss)  # scales by 1/accum itself
                engine.step()          # steps the optimizer at the accumulation boundary only
            else:
                (loss / a.accum if a.accum > 1 else loss).backward()
            total = total + loss.detach()
        if engine is not None and a.clip:
            norm = engine.get_global_grad_norm()  # DeepSpeed clips in its step (gradient_clipping)
        elif a.clip:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        if a.global_batch is not None and world > 1:  # the global batch's mean, not rank 0's share
            total = total.clone()
            dist.all_reduce(total)
            total = total / world
        loss_v = (total / a.accum).item()  # synchronizes: the step's time is complete here
        dt = time.perf_counter() - t0
        if norm is not None:  # read after the step's time: no synchronization inside the step
            if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor (the ranks' partial norms reduced)
                norm = norm.full_tensor()
            norm = float(norm)
        if prof is not None:
            prof.__exit__(None, None, None)
            comm = collective_bytes(prof)
        times.append(dt)
        losses.append(loss_v)
        rec = {"step": step, "loss": loss_v, "step_time": dt, "t_end": time.time(),
               "tokens_per_s": tokens_per_step / dt, "tflops": 6 * n_flop_params * tokens_per_step / dt / 1e12}
        if device == "cuda":
            rec["max_reserved_gb"] = torch.cuda.max_memory_reserved() / 1e9
        if a.clip:
            rec["grad_norm"] = norm
        if rank == 0:
            print(json.dumps(rec), flush=True)
        if not math.isfinite(loss_v):
            print("loss is not finite", file=sys.stderr)
            return 1
        if a.checkpoint_dir and (step == a.steps or (a.checkpoint_every and step % a.checkpoint_every == 0)):
            save_checkpoint(a, model, opt, step, rank, world)
    steady = times[3:] if len(times) > 5 else times[1:] or times or [0.0]  # none: resumed after the last step
    med = statistics.median(steady)
    summ = {"params": n_params, "flop_params": n_flop_params, "tokens_per_step": tokens_per_step,
            "world": world, "device": device, "engine": f"zero-{a.zero}" if a.engine == "deepspeed" else a.engine,
            "dp": {"fsdp": data_parallel(a, device), "deepspeed": "zero"}.get(a.engine, "none"),
            "cpu_offload": a.cpu_offload, "optimizer": optimizer_impl, "accum": a.accum, "seq_len": a.seq_len, "batch": a.batch,
            "tied_embeddings": a.tie_embeddings, "clip": a.clip,
            "median_step_time": med, "step_time_spread": (max(steady) - min(steady)) / med if med else 0.0,
            "tflops_per_gpu": 6 * n_flop_params * tokens_per_step / med / 1e12 if med else 0.0, "losses": losses,
            # what the collectives carry (fp32): DDP all-reduces every gradient each step
            # and broadcasts parameters and buffers from rank 0 once
            "grad_bytes": 4 * n_params, "broadcast_bytes": 4 * n_params + buffer_bytes,
            # peak resident host memory of this process (pinned buffers included once touched)
            "host_peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9}
    if comm is not None:
        summ["comm_profile"] = comm
    if device == "cuda":
        summ["max_reserved_gb"] = torch.cuda.max_memory_reserved() / 1e9
        summ["max_allocated_gb"] = torch.cuda.max_memory_allocated() / 1e9
    if rank == 0:
        print(json.dumps({"summary": summ}), flush=True)
    # Every collective done and the process group's threads gone while Python still runs: a
    # gloo worker freeing its last work during interpreter shutdown needs the GIL, cannot get
    # it, and aborts the rank ("terminate called without an active exception")
    dist.barrier()
    dist.destroy_process_group()
    del model, opt
    gc.collect()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
