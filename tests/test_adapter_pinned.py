"""transit_staging.pinned: the host memory the adapter pins (the host path's copies of
parameters and gradients, the homes of a state given back) in its exact size on huge pages, as
the shim pins the state (shim/hoststate.c), instead of torch's pinned cache (each block rounded
up to a power of two, small pages). No GPU here: the CUDA runtime's register and unregister are
stand-ins, and the test checks the calls made and the memory's life."""

import gc
import importlib

import pytest

from tests.conftest import NEEDS_TORCH, NO_TORCH

pytestmark = pytest.mark.skipif(NO_TORCH, reason=NEEDS_TORCH)
MIB = 2**20


@pytest.fixture
def runtime(monkeypatch):
    """cudaHostRegister / cudaHostUnregister stand-ins, recording their calls."""
    import torch

    st = importlib.import_module("transit_staging")
    calls = []

    class Success:  # torch's cudaError.success: a pybind enum, truthy as every object, 0 as an int
        def __int__(self):
            return 0

    class Cudart:
        @staticmethod
        def cudaHostRegister(addr, nbytes, flags):
            calls.append(("register", addr, nbytes, flags))
            return Success()

        @staticmethod
        def cudaHostUnregister(addr):
            calls.append(("unregister", addr))
            return 0

    monkeypatch.setattr(torch.cuda, "cudart", lambda: Cudart)
    return st, calls


def test_a_large_buffer_is_exact_huge_page_aligned_and_unpinned_after_its_last_view(runtime):
    import torch

    st, calls = runtime
    # 1,500,001 floats, 6,000,004 B: three huge pages
    t = st.pinned((1_500_001,), torch.float32)
    assert t.shape == (1_500_001,) and t.dtype == torch.float32 and t.device.type == "cpu"
    [(what, addr, nbytes, flags)] = calls
    assert what == "register" and addr == t.data_ptr() and addr % (2 * MIB) == 0
    assert nbytes == 6 * MIB  # 6,000,004 B in whole 2 MiB pages, not the next power of two (8 MiB)
    assert flags == 3  # portable and mapped: kernels reach it at the same address (home_of's CUDA view)
    t.fill_(1.5)
    view = t[-10:].view(torch.int32)  # a view outlives the tensor it came from
    del t
    gc.collect()
    assert len(calls) == 1  # still in use: still pinned
    assert view.view(torch.float32).sum().item() == 15.0
    del view
    gc.collect()
    assert calls[1:] == [("unregister", addr)]


def test_a_small_buffer_takes_whole_pages(runtime):
    import torch

    st, calls = runtime
    t = st.pinned((3, 5), torch.bfloat16)  # 30 B
    assert t.shape == (3, 5) and t.dtype == torch.bfloat16 and t.data_ptr() % 4096 == 0
    assert calls[0][2] == 4096
    t.zero_()
    assert t.float().abs().sum().item() == 0.0


def test_a_refused_registration_falls_back_to_torchs_pinned_memory(runtime, monkeypatch):
    import torch

    st, calls = runtime
    made = []
    monkeypatch.setattr(torch.cuda, "cudart", lambda: type("Refusing", (), {
        "cudaHostRegister": staticmethod(lambda a, n, f: 2),  # cudaErrorMemoryAllocation
        "cudaHostUnregister": staticmethod(lambda a: calls.append(("unregister", a)))}))
    real_empty = torch.empty

    def empty(*a, **k):
        made.append(k.get("pin_memory"))
        return real_empty(*a, **{key: v for key, v in k.items() if key != "pin_memory"})
    monkeypatch.setattr(torch, "empty", empty)
    t = st.pinned((8,), torch.float32)
    assert t.shape == (8,) and made[-1] is True  # torch's pinned allocator took it
    del t
    gc.collect()
    assert calls == []  # nothing registered, nothing to unregister


def test_an_empty_tensor_pins_nothing(runtime):
    import torch

    st, calls = runtime
    t = st.pinned((0, 4), torch.float32)
    assert t.shape == (0, 4) and t.dtype == torch.float32 and calls == []
