"""Which jobs scale-in touches, and how much of a scaled-in job's time stretches.

Eligible: a job of more than one node whose type is a training run. Evaluation and
debugging jobs are not: they hold no optimizer state for TRANSIT to offload, and an
evaluation sweep is sized by its deadline, not its memory. Jobs of no recorded type
(generic CSVs, synthetic traces) are eligible, as in the paper.

Stretched: a job that ran to completion did a fixed amount of work, and so (an
assumption) did a cancelled one: users stop a run on what it has done (a loss, a
checkpoint), which fewer nodes take longer to reach. A failed, timed-out or node-failed
job ended at an event (a crash, the time limit, a node) that fewer nodes do not postpone,
so its time to that end is replayed as recorded; it still holds fewer nodes, since
scale-in is decided at submission."""

from __future__ import annotations

# ACME's job types (lower-cased; Seren's tables spell evaluation both ways)
INELIGIBLE_TYPES = frozenset({"evaluation", "eval", "debug"})
# ACME's end states other than COMPLETED (its README: TIMEOUT and NODE_FAIL count as failed)
ENDED_BY_EVENT = frozenset({"failed", "timeout", "node_fail"})


def eligible_type(job_type: str) -> bool:
    return job_type.strip().lower() not in INELIGIBLE_TYPES


def stretches(state: str) -> bool:
    return state.strip().lower() not in ENDED_BY_EVENT


def scaled_nodes(nodes: int, reduction: float) -> int:
    """Nodes after giving up `reduction` of them, rounded to the nearest node (halves
    up, so 25% of 2 or 3 nodes is one node, not none), never below one."""
    removed = int(nodes * reduction + 0.5 + 1e-9)
    return max(1, nodes - removed)
