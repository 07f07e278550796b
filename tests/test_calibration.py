"""The planner against measured H200 peaks (bench/results/*/calibration_*.json: the example
trainer's torch.cuda.max_memory_reserved, bench/calibrate.py --measure; read from their frozen
copies, tests/frozen.py). Issue 7 asks for at least four runs within 10%; a change to the
estimator's constants that breaks that fails here, without a GPU. (bench/offload.py --report
over the recorded gate is bench's own: bench/tests/test_offload_report.py.)

All six runs are held out: no constant of planning/memory.py was fitted to them (the
backward factors were fitted to TorchTitan's measured mode, tests/fidelity_records.py
FITTED). The 128K-vocabulary run confirmed LOGITS_BYTES_PER_ELEMENT, which is derived from
three fp32 tensors (12 bytes; 13.6 measured with the allocator's rounding), not set by it."""

import json

import pytest

from tests.frozen import RESULTS

from tests.example_trainer import planner_estimate, trainer_flags

# Measured with the trainer's nn.RMSNorm (the earlier calibration_2026-11-29.json predates it:
# its hand-written norm kept two fp32 copies of the input, which the planner does not model).
MEASURED = RESULTS / "2026-11-29" / "calibration_2026-11-29b.json"


def runs():
    return [r for r in json.loads(MEASURED.read_text())["runs"] if r["summary"]]


@pytest.mark.parametrize("run", runs(), ids=lambda r: r["name"])
def test_planner_within_five_percent_of_measured_allocation(run):
    """The formula's tensors (total less CUDA context, NCCL and allocator slack) against
    torch.cuda.max_memory_allocated: within 1.7% on all six runs since gradients are counted
    only once created (issue 18). max_memory_reserved sits 19-33% above max_allocated in these
    runs: the caching allocator keeps the loss phase's freed fp32 blocks while backward
    allocates gradients, on an H200 that never ran short. Near capacity the allocator
    frees its cache and retries instead, so the planner's margin over the tensors is
    ALLOCATOR_FRAGMENTATION, not that gap."""
    est, _ = planner_estimate(run["flags"])
    measured = run["summary"]["max_allocated_gb"] * 1e9
    assert abs(est.tensors - measured) <= 0.05 * measured, (est.tensors / 1e9, measured / 1e9)


def test_enough_calibration_points():
    ok = runs()
    assert len(ok) >= 4
    assert {"none", "full"} <= {trainer_flags(r["flags"])["recompute"] for r in ok}
    assert len({trainer_flags(r["flags"])["seq-len"] for r in ok}) >= 2
