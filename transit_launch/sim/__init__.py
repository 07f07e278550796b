"""Cluster simulator: replay GPU job traces with and without scale-in (section 4.3 of the
TRANSIT paper). trace: loading; synth: synthetic traces and presets; cluster: racks,
nodes and placement; jobs: eligibility and stretch rules; efficiency: per-GPU efficiency
of a scaled-in job; scheduler: FIFO with Slurm's backfill over a heapq event loop
(backfill: one pass; waiting: the queue, indexed by GPUs); metrics: what operators read;
compare: scenarios against their references; bands: the headlines over the efficiency
curves, replayed by reruns."""
