"""The plan's predicted efficiency against TorchTitan's measured runs and the shapes suite's
(issue 31): the tables in bench/RESULTS.md, "What the plan predicts", which
tests/test_prediction.py keeps equal to this output. The rows, the fit registry (FIT) and the
target are tests/prediction_records.py's, which tests/test_prediction.py checks.

    python3 bench/prediction.py            # the table in bench/RESULTS.md
    python3 bench/prediction.py --json
"""

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the checkout's package, unless one is installed
    sys.path.insert(0, str(ROOT))

from tests.prediction_records import (TARGET, role, rows, scale_in_at_measured_terms, scale_in_rows,  # noqa: E402
                                      shape_rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rs = rows()
    if a.json:
        print(json.dumps(rs, indent=1))
        return
    from transit_launch.table import table
    body = [[r["file"].replace("titan_steps_", "").removesuffix(".json"), r["run"].replace("TRANSIT_SHIM=", "")[:30],
             r["step"], r["microbatches"], f"{r['budget'] / 1e9:.2f}", f"{r['plan_bytes'] / 1e9:.1f}",
             f"{r['reserved'] / 1e9:.1f}", f"{r['host_bytes'] / 1e9:.1f}",
             f"{r['offload_predicted'] / 1e9:.1f}", f"{100 * r['measured']:.1f}%", f"{100 * r['predicted']:.1f}%",
             f"{100 * r['error']:+.1f}", f"{r['first_step_extra_s']:.1f}", f"{r['warm_up_predicted_s']:.1f}",
             role(r)] for r in rs]
    print(table(["file", "run", "step", "microbatches", "budget GB", "plan's GB", "reserved GB", "on host GB",
                 "plan's offload GB", "measured", "pred. eff", "points", "first step +s", "plan's warm-up s", "role"],
                body))
    new = [r for r in rs if r["new_job"]]
    within = sum(abs(r["error"]) <= TARGET for r in rs)
    print(f"\nworst: {100 * max(abs(r['error']) for r in rs):.1f} points; on jobs no constant was fitted to "
          f"({len(new)} runs): {100 * max(abs(r['error']) for r in new):.1f} points; {within} of {len(rs)} "
          f"within the target of {100 * TARGET:.0f} points")
    sh = shape_rows()
    print("\nthe shapes suite (the examples' trainer, no constant fitted to it):\n")
    print(table(["file", "run", "step", "microbatches", "measured", "pred. eff", "points", "named reason"],
                [[r["file"].removesuffix(".json"), r["run"], r["step"], r["microbatches"], f"{100 * r['measured']:.1f}%",
                  f"{100 * r['predicted']:.1f}%", f"{100 * r['error']:+.1f}", "yes" if r["off_target"] else "-"]
                 for r in sh]))
    print(f"\nworst: {100 * max(abs(r['error']) for r in sh):.1f} points; "
          f"{sum(abs(r['error']) <= TARGET for r in sh)} of {len(sh)} within the target")
    sc = scale_in_rows()
    print("\nthe scale-in 2 -> 1 (the examples' trainer, 2026-11-30's build; the plan's option of one GPU against two):\n")
    print(table(["file", "recompute", "global sequences", "measured", "pred. eff", "points", "1 GPU / 2 unoffloaded",
                 "offload GB plan / shim", "with both measured", "named reason"],
                [[r["file"].removesuffix(".json"), r["recompute"], r["global_sequences"], f"{100 * r['measured']:.1f}%",
                  f"{100 * r['predicted']:.1f}%", f"{100 * r['error']:+.1f}", f"{r['half_off_factor']:.3f}",
                  f"{r['offload_predicted'] / 1e9:.2f} / {r['offload_measured'] / 1e9:.2f}",
                  f"{100 * scale_in_at_measured_terms(r):.1f}%", "yes" if r["off_target"] else "-"] for r in sc]))

if __name__ == "__main__":
    main()
