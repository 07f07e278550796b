"""python3 -m bench: run a benchmark suite and file its results.

    python3 -m bench --list                       # the suites: what each measures, GPUs, minutes, carry
    python3 -m bench SUITE [--gpus N] [--only STEP,...] [--dry-run]
    python3 -m bench SUITE --out "$OUT"           # on a lent GPU machine: results into $OUT, with run.json
    python3 -m bench --file-in DIR                # file such a run under bench/results/<date>/ and INDEX.md

Without --out the results go to bench/results/<date>/<suite>/ and an entry is appended to
bench/results/INDEX.md. The suites are bench/harness/suites.py; one-off investigations
are bench/probes/ and run by hand.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python3 bench` or from elsewhere: the checkout's bench and package
    sys.path.insert(0, str(ROOT))

from bench.harness.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
