"""Where a run's reserved GPU memory comes from, by CUDA stream and by the code that
allocated it: the examples' trainer run in this process under
torch.cuda.memory._record_memory_history, summarized at exit (issue 20: the overlapped
step reserved 0.53 GB more than advise; PyTorch's caching allocator keeps one pool per
stream, so an allocation made on a side stream cannot reuse the compute stream's free blocks).

    python3 -m transit_launch run --policy advise -- \\
        python3 bench/probes/memory_streams.py --out advise.json -- --seq-len 8192 --accum 1 --steps 6
"""

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: common.py
from common import run_trainer_here, split_trainer_args


def frames(block, k=4):
    """The innermost Python frames of a block's allocation that are not torch internals."""
    out = []
    for f in block.get("frames", []):
        name = f.get("filename", "")
        if name.endswith(".py") and "/torch/" not in name:
            out.append(f"{Path(name).name}:{f.get('line')}:{f.get('name')}")
        elif name.endswith(".py") and not out and ("/optim/" in name or "/fsdp/" in name):
            out.append(f"{Path(name).name}:{f.get('line')}:{f.get('name')}")
        if len(out) >= k:
            break
    return " < ".join(out) or "?"


def summarize(snap):
    streams = collections.defaultdict(lambda: {"segments": 0, "reserved": 0, "allocated": 0})
    by_site = collections.Counter()
    for seg in snap["segments"]:
        s = streams[hex(seg["stream"])]
        s["segments"] += 1
        s["reserved"] += seg["total_size"]
        s["allocated"] += seg["allocated_size"]
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                by_site[(hex(seg["stream"]), frames(b))] += b["size"]
    # the largest allocation sites seen in the trace on streams other than the busiest one
    traced = collections.Counter()
    for dev in snap.get("device_traces", []):
        for e in dev:
            if e["action"] == "segment_alloc":
                traced[(hex(e["stream"]), frames(e))] += e["size"]
    return {"by_stream": dict(streams),
            "live_by_site": [{"stream": k[0], "site": k[1], "bytes": v} for k, v in by_site.most_common(25)],
            "segment_allocs_by_site": [{"stream": k[0], "site": k[1], "bytes": v} for k, v in traced.most_common(25)]}


def main():
    argv, extra = split_trainer_args(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="then -- and examples/train_llama.py's flags")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("memory_streams: no GPU (it records the CUDA caching allocator)", file=sys.stderr)
        sys.exit(2)
    torch.cuda.memory._record_memory_history(max_entries=200000)

    def dump():
        snap = torch.cuda.memory._snapshot()
        res = summarize(snap)
        res["max_reserved_gb"] = torch.cuda.max_memory_reserved() / 1e9
        res["max_allocated_gb"] = torch.cuda.max_memory_allocated() / 1e9
        Path(a.out).write_text(json.dumps(res, indent=1))
        for k, v in res["by_stream"].items():
            print(f"memory_streams: stream {k}: {v['segments']} segments, {v['reserved'] / 1e9:.2f} GB reserved, "
                  f"{v['allocated'] / 1e9:.2f} GB allocated", file=sys.stderr)
        for r in res["segment_allocs_by_site"][:10]:
            print(f"memory_streams: segments {r['bytes'] / 1e9:.3f} GB on {r['stream']} from {r['site']}",
                  file=sys.stderr)

    rc = run_trainer_here(extra)
    dump()  # also after a failed run: what it allocated until then
    return rc


if __name__ == "__main__":
    sys.exit(main())
