"""The adapter's hooks in a rank of a CPU job, installed as sitecustomize.py installs them
under the shim, on a stand-in for the shim's API (no shim on a CPU machine). Loaded by the
rank drivers of tests/test_adapter_fsdp2_ranks.py and tests/test_torchtitan_config.py from
this file (their ranks do not import the tests package)."""

import importlib.util
import os
import sys


def install(adapter: str, mode: str):
    """mode "default" (TRANSIT_OVERLAP_STEP unset: advise's streamed step, every
    state "pinned" by the stand-in; the CPU stands in for the GPU, a state's own memory its
    home) or "host" (TRANSIT_OVERLAP_STEP=host with a budget that holds no state: every
    parameter's update on the host path). Returns the adapter's hooks."""
    import torch.optim.optimizer  # noqa: F401 (loaded: the module whose hooks the adapter takes)

    if mode == "host":
        os.environ["TRANSIT_OVERLAP_STEP"] = "host"
    else:
        os.environ.pop("TRANSIT_OVERLAP_STEP", None)
    sys.path.insert(0, adapter)
    spec = importlib.util.spec_from_file_location("transit_site", os.path.join(adapter, "sitecustomize.py"))
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)

    class Api:
        HOT, MASTER, OPTIMIZER, SPARSE = 0, 1, 2, 3
        def since(self, version): return True
        def policy(self): return "advise"
        def hint(self, ptr, size, kind): return 0
        def iteration(self): return 0
        def adapter_attach(self): return None
        def apply(self): return None
        def device_alloc(self, size): return 0
        def device_free(self, ptr): return -1
        def state_alloc(self, on): return False
        def host_state(self, ptr, size): return mode == "default"
        def state_on_host(self): return None

    if mode == "default":
        import transit_staging
        transit_staging.Staging._homeable = staticmethod(lambda t: t.is_contiguous())
    hooks = site._Hooks(Api())
    if mode == "host":  # the budget's room for state, asked of the shim's stats on a GPU: none
        hooks.overlap.host.room = lambda device: 0  # (the split's host step; its share is 1 without a GPU)
    hooks.register(sys.modules["torch.optim.optimizer"])
    return hooks
