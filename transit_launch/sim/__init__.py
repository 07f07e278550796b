"""Cluster simulator: replay GPU job traces with and without scale-in (section 4.3 of the
TRANSIT paper). trace: loading and synthesis; cluster: racks, nodes and placement;
scheduler: FIFO with EASY backfill over a heapq event loop; metrics: what operators read."""
