"""bench's own tests: the harness (suites, runner, index) and the bench scripts' logic on
made-up input, without a GPU. They import bench's modules (bench/ and bench/probes/ on
sys.path); tests/ never does. tests.conftest's guard (the installed package, not the
source tree, under .ci/test) applies here too."""

import sys

from tests.conftest import ROOT

for d in (ROOT / "bench", ROOT / "bench" / "probes"):
    if str(d) not in sys.path:
        sys.path.insert(0, str(d))
