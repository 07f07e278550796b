"""Where the room is in one step of host_step.py's FSDP2 points, without the shim: PyTorch's
allocated bytes at each block's forward pre-hook and backward hook, at the end of the forward,
the backward, the step and zero_grad; the peak allocated and reserved. The question: does
backward free room for the optimizer state as its gradients become final (issue 50's early
copies)? One GPU, one process (NCCL, world size 1).

    python3 bench/probes/room_probe.py --out room.json clip wide-clip
"""

import argparse
import json
import os
import sys
from pathlib import Path


def fail(text):
    """One line and exit 2: the probe's arguments or machine, not a result."""
    print(f"room_probe: {text}", file=sys.stderr)
    sys.exit(2)


def main(argv=None):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from host_step import POINTS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="the JSON file written")
    ap.add_argument("points", nargs="*", help=f"host_step.py's points: {', '.join(POINTS)}")
    a = ap.parse_args(argv)
    bad = [p for p in a.points if p not in POINTS]
    if not a.out or not a.points or bad:
        fail(f"unknown point {bad[0]!r} (one of {', '.join(POINTS)})" if bad else
             "--out FILE and at least one point are needed")
    try:
        import torch
    except ImportError:
        fail("PyTorch is needed")
    if not torch.cuda.is_available():
        fail("a GPU is needed (torch.cuda.is_available() is False)")
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29518")
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
    out = {}
    for point in a.points:
        dim, ffn, blocks, tokens, _micro, clip = POINTS[point]
        model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(dim, ffn, bias=False), torch.nn.GELU(),
                                                          torch.nn.Linear(ffn, dim, bias=False))
                                      for _ in range(blocks)]).to(dev)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for b in model:
            fully_shard(b, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        trace = []

        def mark(name, trace=trace):
            return lambda *_: trace.append((name, round(torch.cuda.memory_allocated(dev) / 1e9, 2)))
        for i, b in enumerate(model):
            b.register_forward_pre_hook(mark(f"f{i}"))
            b.register_full_backward_hook(mark(f"b{i}"))
        for _ in range(4):  # the last step's trace is kept
            trace.clear()
            torch.cuda.reset_peak_memory_stats(dev)
            loss = model(torch.randn(tokens, dim, device=dev, dtype=torch.bfloat16)).float().pow(2).mean()
            mark("fwd_end")()
            loss.backward()
            mark("bwd_end")()
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            mark("step_end")()
            opt.zero_grad()
            mark("zero")()
            torch.cuda.synchronize()
        out[point] = {"trace": trace, "peak_alloc": torch.cuda.max_memory_allocated(dev) / 1e9,
                      "peak_reserved": torch.cuda.max_memory_reserved(dev) / 1e9,
                      "reserved": torch.cuda.memory_reserved(dev) / 1e9,
                      "state_GB": 8 * sum(p.numel() for p in model.parameters()) / 1e9}
        del model, opt, loss
        torch.cuda.empty_cache()
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
