"""N -> N/2 emulated on one GPU (issue 27's scale-in goal while two GPUs are not lent): the per-GPU
rate of TorchTitan's 1-GPU layout against its 2-GPU layout's, from bench/titan_steps.py records
of one device call.

FSDP over two GPUs halves each rank's parameters, gradients and AdamW state (16 -> 8 bytes a
parameter), so a rank of the 2-GPU layout fits a GPU of the single-GPU run's peak reserved less
8 bytes a parameter: titan_steps' own budget (`--budget 0`). At a global batch of B microbatches
the 1-GPU layout is then the single-GPU run at B microbatches under that budget (`advise`, the
default of its build); a rank of the 2-GPU layout runs B/2, and one GPU at B/2 without offloading
(`ref`) bounds its rate from above (it has no collectives; on two H200s the examples' trainer ran
3.2-4.1% slower a GPU than on one, bench/RESULTS.md "Scale-in 2 -> 1"). So 2 x t_ref(B/2) /
t_advise(B) is at most what two real GPUs would show: a lower bound of the goal's ratio.

Pairs come only from one call: records in one folder whose names differ only in their accum
number (the harness's titan_steps_accum16_stream.json and titan_steps_accum8_stream.json; a
by-hand call's w_accum1.json and w_accum2.json). Steady steps are titan_steps' (the median after
the first two).

    python3 bench/scale_in_emulated.py            # the table in bench/RESULTS.md
    python3 bench/scale_in_emulated.py --json
"""

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def steady(run):
    s = sorted(run["step_s"][2:])  # as bench/titan_steps.py's report
    return s[len(s) // 2]


def records(root=RESULTS):
    """(folder, call key, accum, record) of every TorchTitan step record under root."""
    for path in sorted(root.rglob("*accum*.json")):
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and isinstance(d.get("runs"), list) and isinstance(d.get("accum"), int):
            rel = path.relative_to(root)
            yield str(rel.parent), re.sub(r"accum\d+", "accum", rel.name), d["accum"], d, rel


def ok(run, name):
    return run.get("name") == name and run.get("rc", 0) == 0 and len(run.get("step_s") or []) >= 3


def rows(root=RESULTS):
    """One row for each default run at B microbatches whose call also ran no offloading at B/2."""
    calls = {}
    for folder, key, accum, d, rel in records(root):
        calls.setdefault((folder, key), {})[(accum, d.get("model"), d.get("layers"))] = (d, rel)
    out = []
    for (folder, key), by in sorted(calls.items()):
        for (accum, model, layers), (d, rel) in sorted(by.items()):
            half = by.get((accum // 2, model, layers)) if accum % 2 == 0 else None
            if not half:
                continue
            refs = [steady(r) for r in half[0]["runs"] if ok(r, "ref")]
            if not refs:
                continue
            t_ref = statistics.median(refs)
            for r in d["runs"]:
                if ok(r, "advise"):
                    out.append({"call": f"{folder}/{key}", "model": model, "layers": layers, "global_microbatches": accum,
                                "ref_file": str(half[1]), "file": str(rel), "ref_half_s": round(t_ref, 3),
                                "advise_s": round(steady(r), 3), "ratio": round(2 * t_ref / steady(r), 4)})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rs = rows()
    if a.json:
        print(json.dumps(rs, indent=1))
        return
    if str(ROOT) not in sys.path:  # the checkout's package, unless one is installed
        sys.path.insert(0, str(ROOT))
    from transit_launch.table import table
    print(table(["call", "model, layers", "global microbatches", "no offload at half, 1 GPU s", "the default s",
                 "per GPU, 1 GPU / 2 (at least)"],
                [[r["call"], f"{r['model']}, {r['layers']}", r["global_microbatches"], f"{r['ref_half_s']:.3f}",
                  f"{r['advise_s']:.3f}", f"{100 * r['ratio']:.1f}%"] for r in rs]))


if __name__ == "__main__":
    main()
