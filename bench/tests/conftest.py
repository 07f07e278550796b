"""bench's own tests: the harness (suites, runner, index), the bench scripts' logic on
made-up input and their reports on the records, bench's documents against its records
(RESULTS.md, LOG.md, results/INDEX.md) and its probes' builds, without a GPU. They import
bench's modules (bench/ and bench/probes/ on sys.path); tests/ never does. tests.conftest's
guard (the installed package, not the source tree, under .ci/test) applies here too."""

import sys

from tests.conftest import ROOT

for d in (ROOT / "bench", ROOT / "bench" / "probes"):
    if str(d) not in sys.path:
        sys.path.insert(0, str(d))
