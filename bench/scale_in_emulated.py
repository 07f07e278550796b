"""N -> N/2 emulated on one GPU (issue 27's scale-in goal while two GPUs are not lent): the per-GPU
rate of TorchTitan's 1-GPU layout against its 2-GPU layout's, from bench/titan_steps.py records
of one device call.

FSDP over two GPUs halves each rank's parameters, gradients and AdamW state (16 -> 8 bytes a
parameter), so a rank of the 2-GPU layout fits a GPU of the single-GPU run's peak reserved less
8 bytes a parameter (and FSDP's gather buffers): titan_steps' own budget (`--budget 0`) or less.
At a global batch of B microbatches the 1-GPU layout is then the single-GPU run at B microbatches
under that budget (`advise`, the default of its build). A rank of the 2-GPU layout runs B/2
microbatches' forward and backward and steps half the state, plus its collectives: one GPU at
B/2 without offloading (`ref`) less half its optimizer step is at most that rank's step, up to
the gradient norm's pass over half the gradients (a few ms). So 2 x (t_ref(B/2) - opt_ref / 2) /
t_advise(B) is at most what two real GPUs would show: a lower bound of the goal's ratio, to
those few ms.

Pairs come only from one call, run one after the other on one GPU: a harness run's folder (its
run.json; steps.json must put both steps on the same GPU, as with one GPU, since lanes on two GPUs
run side by side), or a by-hand call named in BY_HAND. Steady steps are titan_steps' (the median
after the first two).

    python3 bench/scale_in_emulated.py            # the table in bench/RESULTS.md
    python3 bench/scale_in_emulated.py --json
"""

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from titan_steps import steady  # its report's steady rule

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


# By-hand folders that hold several calls: the file-name prefix each call's records share
# (bench/results/INDEX.md names the scripts; each ran its titan_steps commands one after another).
BY_HAND = {"2026-12-04/first-step-fill": ("ab_", "abc_", "ad_"), "2026-12-04/fill-writers": ("w_", "h_"),
           "2026-12-06/titan-head": ("hd_",)}


def call_of(root, path):
    """(call, GPU index or None) of a record, or None where its call cannot be told."""
    folder = path.parent.relative_to(root).as_posix()
    if (path.parent / "run.json").is_file():
        m = re.search(r"accum(\d+)", path.name)
        try:
            steps = json.loads((path.parent / "steps.json").read_text())
            gpu = next(s.get("gpu") for s in steps if s.get("step") == f"accum{m.group(1)}")
        except (OSError, ValueError, StopIteration, AttributeError):
            return None
        return folder, gpu
    prefix = next((p for p in BY_HAND.get(folder, ()) if path.name.startswith(p)
                   and re.fullmatch(r"accum\d+\.json", path.name[len(p):])), None)
    return (f"{folder}/{prefix}", None) if prefix else None


def records(root=RESULTS):
    """(call, GPU, accum, record, path) of every TorchTitan step record under root whose call is known."""
    for path in sorted(root.rglob("*accum*.json")):
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        call = call_of(root, path)
        if call and isinstance(d, dict) and isinstance(d.get("runs"), list) and isinstance(d.get("accum"), int):
            yield call[0], call[1], d["accum"], d, path.relative_to(root)


def ok(run, name):
    return run.get("name") == name and run.get("rc", 0) == 0 and len(run.get("step_s") or []) >= 3 \
        and len(run.get("optimizer_s") or []) >= 3


def rows(root=RESULTS):
    """One row for each default run at B microbatches whose call also ran no offloading at B/2."""
    calls = {}
    for call, gpu, accum, d, rel in records(root):
        calls.setdefault(call, {})[(accum, d.get("model"), d.get("layers"))] = (d, rel, gpu)
    out = []
    for call, by in sorted(calls.items()):
        for (accum, model, layers), (d, rel, gpu) in sorted(by.items()):
            half = by.get((accum // 2, model, layers)) if accum % 2 == 0 else None
            if not half or half[2] != gpu:  # side by side on two GPUs: not one after the other
                continue
            refs = [(steady(r["step_s"]), steady(r["optimizer_s"])) for r in half[0]["runs"] if ok(r, "ref")]
            if not refs:
                continue
            t_ref, opt_ref = statistics.median(t for t, _ in refs), statistics.median(o for _, o in refs)
            rank = t_ref - opt_ref / 2  # a 2-GPU rank steps half the state
            for r in d["runs"]:
                if ok(r, "advise"):
                    t = steady(r["step_s"])
                    out.append({"call": call, "model": model, "layers": layers, "global_microbatches": accum,
                                "ref_file": str(half[1]), "file": str(rel), "ref_half_s": round(t_ref, 3),
                                "ref_half_optimizer_s": round(opt_ref, 3), "advise_s": round(t, 3),
                                "ratio": round(2 * rank / t, 4)})
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
    print(table(["call", "model, layers", "global microbatches", "no offload at half s (its optimizer s)",
                 "the default s", "per GPU, 1 GPU / 2 (at least)"],
                [[r["call"], f"{r['model']}, {r['layers']}", r["global_microbatches"],
                  f"{r['ref_half_s']:.3f} ({r['ref_half_optimizer_s']:.3f})", f"{r['advise_s']:.3f}",
                  f"{100 * r['ratio']:.1f}%"] for r in rs]))


if __name__ == "__main__":
    main()
