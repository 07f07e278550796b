"""Variant B of the shim (an experiment, not committed): the background fill only writes
the regions' pages; the allocation that takes one registers it (no second write)."""
import sys
from pathlib import Path
d = Path(sys.argv[1])
def sub(f, old, new):
    p = d / f; s = p.read_text(); assert old in s, (f, old); p.write_text(s.replace(old, new, 1))
sub("prefill.c", "cudaError_t err = tr_real.host_register(p, len, cudaHostRegisterPortable | cudaHostRegisterMapped);",
    "cudaError_t err = cudaSuccess;")
sub("prefill.c", "*ready = r->st == R_READY;", "*ready = r->st == R_READY ? 2 : 0;")
sub("prefill.c", "            if (!at_exit) {\n                cudaError_t pending", "            if (0) {\n                cudaError_t pending")
sub("hoststate.c", "    if (!ready) {\n        tr_host_fill(", "    if (ready != 1) {\n        if (!ready) tr_host_fill(")
sub("hoststate.c", "    tr_count.host_state_prefill_used += pooled;", "    tr_count.host_state_prefill_used += pooled;\n    if (ready == 2) tr_count.host_state_prefill_ready -= 0;")
