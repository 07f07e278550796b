"""Which parameters the forward reads only in part: an nn.Embedding's (or EmbeddingBag's)
table, read by a gather of the step's rows, where no other module uses it. Under a GPU
budget such a table is the cheapest master weight to serve zero-copy from the host: a
microbatch reads its rows, where a Linear's weight is read whole (bench/LOG.md,
"The streamed step by default"). The adapter hints them SPARSE (shim/transit_api.h), which
advise gives the GPU after the dense master weights.

How: from the first optimizer's creation to its first step a global forward pre-hook sees
every module call (forward and recomputation) and records whose parameters it held; then
it is removed. A parameter seen only as an embedding's weight is sparse. Not seen: a table
that another module's forward reads through the functional API (F.linear(h, emb.weight)
with no tie by attribute): it would be served as sparse; a tie by attribute (output.weight =
embedding.weight) is seen. A DTensor parameter (FSDP2, TP) is never sparse: FSDP reads the
whole local shard at every unshard.
"""

import weakref


def _sparse_module(m):
    import torch.nn as nn

    return isinstance(m, (nn.Embedding, nn.EmbeddingBag))


class SparseReads:
    def __init__(self):
        self.handle = None
        # id() -> weak reference (a WeakSet compares tensors with ==, elementwise)
        self.sparse = {}  # parameters held as an embedding's table
        self.dense = {}   # parameters some other module holds
        self.done = False

    def start(self):
        """Watch module calls until finish() (the first optimizer step)."""
        from torch.nn.modules import module

        if self.handle is None and not self.done:
            self.handle = module.register_module_forward_pre_hook(self._seen)

    def _seen(self, m, args):
        params = m._parameters.values()
        if _sparse_module(m):
            w = m._parameters.get("weight")
            if w is not None:
                self.sparse.setdefault(id(w), weakref.ref(w))
            params = [p for n, p in m._parameters.items() if n != "weight"]
        for p in params:
            if p is not None:
                self.dense.setdefault(id(p), weakref.ref(p))

    def finish(self):
        """The first step came: stop watching; the parameters read only in part, as a set of ids."""
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
        self.done = True
        return self.result()

    def result(self):
        return {i for i, ref in self.sparse.items()
                if i not in self.dense and (p := ref()) is not None and not hasattr(p, "to_local")}
