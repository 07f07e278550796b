"""The fake runtime's residency model on its own (tests/fakecuda/fake_cudart.c, no shim):
the budget checks of tests/test_shim*.py read this model's answer, so each of its rules is
checked here against a hand derivation of what the rule says the pages do; where the H200
answered the case (bench/results/2026-12-01/cuda_error_probe_2026-12-01.json), the test reads the
expected answer from that file. 4 KiB pages; MiB sizes keep the arithmetic exact."""

import json
import shutil

import pytest

from tests.conftest import CUDA_INC
from tests.frozen import RESULTS
from tests.test_shim import run

PROBE = json.loads((RESULTS / "2026-12-01" / "cuda_error_probe_2026-12-01.json").read_text())
PROBE_MANAGED = 256 * (1 << 20)  # bench/probes/cuda_error_probe.c's MANAGED
# its registered-memory cases, added since (issue 33), from the call that first ran them
PROBE_REGISTER = json.loads((RESULTS / "2026-12-02" / "shapes" / "cuda_error_probe.json").read_text())

MiB, PAGE = 1 << 20, 4096
ADV_PREFERRED, ADV_UNSET_PREFERRED, ADV_ACCESSED_BY = 3, 4, 5
DEV, HOST = 1, 2
ERR_INVALID_VALUE = 1

pytestmark = pytest.mark.skipif(CUDA_INC is None or not shutil.which("cc"),
                                reason="needs a C compiler and the CUDA runtime headers (cuda_runtime_api.h)")


def uvm(built, size, *ops, env=None):
    """Runs `app uvm` without the shim; each op's residency as a dict."""
    res, out, calls = run(built, "uvm", size, *ops, preload=False, env=env)
    assert res.returncode == 0 and out["managed"] == "0", res.stderr
    steps = []
    for i in range(len(ops)):
        steps.append({k.split("_", 1)[1]: int(v) for k, v in out.items() if k.startswith(f"step{i}_")})
    return steps


def test_nothing_is_resident_until_prefetched_or_touched(built):
    [s] = uvm(built, 8 * MiB, "info")
    assert s["dev"] == s["host"] == 0 and s["err"] == 0


def test_prefetch_moves_pages_whatever_the_advice(built):
    """Preferred location host does not stop a prefetch to the device (docs)."""
    s = uvm(built, 8 * MiB, f"advise:0:{8 * MiB}:{ADV_PREFERRED}:{HOST}", f"prefetch:0:{2 * MiB}:{DEV}",
            f"prefetch:{MiB}:{MiB}:{HOST}")
    assert (s[0]["dev"], s[0]["host"]) == (0, 0)  # advice moves nothing
    assert (s[1]["dev"], s[1]["host"]) == (2 * MiB, 0)
    assert (s[2]["dev"], s[2]["host"]) == (MiB, MiB) and s[2]["device_peak"] == 2 * MiB


def test_prefetch_ranges_round_out_to_pages(built):
    """[100, 100 + 5000) covers pages 0 and 1: 8 KiB."""
    [s] = uvm(built, 8 * MiB, f"prefetch:100:5000:{DEV}")
    assert s["dev"] == 2 * PAGE


def test_a_touch_of_host_preferred_pages_maps_them(built):
    """Preferred host, resident on the host (prefetched) or nowhere yet: a kernel's touch
    reads them through a mapping; nothing reaches the device (on the H200 a device-side
    write took no device memory in either case)."""
    for case in ("first_touch_preferred_host", "touch_host_resident_preferred_host"):
        assert PROBE[case]["err"] == 0 and PROBE[case]["free_after_a"] == PROBE[case]["free_before"]
    s = uvm(built, 8 * MiB, f"advise:0:{8 * MiB}:{ADV_PREFERRED}:{HOST}", f"advise:0:{8 * MiB}:{ADV_ACCESSED_BY}:{DEV}",
            f"prefetch:0:{4 * MiB}:{HOST}", f"touch:0:{8 * MiB}")
    t = s[3]
    assert (t["dev"], t["host"], t["zero_copy"], t["migrated"], t["first_touch"]) == (0, 8 * MiB, 8 * MiB, 0, 0)


def test_a_touch_migrates_host_pages_without_host_preference(built):
    """On the host, no preferred location (or the device's): the fault migrates them (on
    the H200 the write took the allocation's bytes of device memory)."""
    h200 = PROBE["touch_host_resident_no_advice"]
    assert h200["free_before"] - h200["free_after_a"] == PROBE_MANAGED
    s = uvm(built, 8 * MiB, f"prefetch:0:{4 * MiB}:{HOST}", f"touch:0:{4 * MiB}",
            f"prefetch:0:{MiB}:{HOST}", f"advise:0:{MiB}:{ADV_UNSET_PREFERRED}:{HOST}", f"touch:0:{MiB}")
    assert (s[1]["dev"], s[1]["host"], s[1]["migrated"]) == (4 * MiB, 0, 4 * MiB)
    assert (s[4]["dev"], s[4]["migrated"], s[4]["zero_copy"]) == (4 * MiB, 5 * MiB, 0)


def test_first_touch_populates_on_the_device(built):
    s = uvm(built, 8 * MiB, f"touch:{MiB}:{2 * MiB}", f"touch:0:{8 * MiB}")
    assert (s[0]["dev"], s[0]["first_touch"]) == (2 * MiB, 2 * MiB)
    assert (s[1]["dev"], s[1]["first_touch"], s[1]["migrated"]) == (8 * MiB, 8 * MiB, 0)


def test_memgetinfo_keeps_the_chunks_of_pages_that_left_the_device(built):
    """As the H200 answered: 256 MiB prefetched to the device took 256 MiB of free memory,
    and the prefetch back to the host gave none of it back (cudaFree did: the next case
    started from the same free memory)."""
    h200 = PROBE["memgetinfo_managed_resident"]
    assert h200["free_before"] - h200["free_after_a"] == PROBE_MANAGED == h200["free_before"] - h200["free_after_b"]
    assert PROBE["first_touch_preferred_host"]["free_before"] == h200["free_before"]
    total = 64 * MiB
    s = uvm(built, 8 * MiB, "info", f"prefetch:0:{3 * MiB}:{DEV}", "info", f"prefetch:0:{3 * MiB}:{HOST}", "info",
            f"plain:{5 * MiB}", "info", env={"FAKE_GPU_MEM": str(total)})
    assert [s[i]["free"] for i in (0, 2, 4, 6)] == [total, total - 3 * MiB, total - 3 * MiB, total - 8 * MiB]
    assert (s[4]["dev"], s[4]["host"]) == (0, 3 * MiB)  # what is resident is another matter than what is free
    assert s[6]["device_peak"] == 5 * MiB  # resident at its peak: the plain 5 MiB (3 MiB managed before)


def test_a_full_device_keeps_pages_on_the_host(built):
    s = uvm(built, 8 * MiB, f"plain:{6 * MiB}", f"prefetch:0:{4 * MiB}:{DEV}", env={"FAKE_GPU_MEM": str(8 * MiB)})
    assert (s[1]["dev"], s[1]["host"], s[1]["device_peak"]) == (2 * MiB, 2 * MiB, 8 * MiB)


def test_refusals_and_zero_bytes_as_the_h200_answered(built):
    """Advice and prefetches past the allocation's end are refused and move nothing;
    cudaMallocManaged(0) succeeds with NULL (the docs say it is refused; the H200 did not)."""
    assert PROBE["prefetch_past_end"] == ERR_INVALID_VALUE and PROBE["managed_zero"] == 0
    assert PROBE["managed_zero_ptr_null"] is True
    s = uvm(built, 8 * MiB, f"prefetch:{4 * MiB}:{8 * MiB}:{DEV}", f"advise:{8 * MiB}:{PAGE}:{ADV_PREFERRED}:{HOST}",
            "zero")
    assert s[0]["err"] == s[1]["err"] == ERR_INVALID_VALUE and s[0]["dev"] == 0
    assert (s[2]["err"], s[2]["ptr_null"]) == (PROBE["managed_zero"], 1)


def test_unmanaged_memory_is_refused_as_the_h200_refused_it(built):
    """Advice and prefetches over plain device memory and plain host memory: the H200
    refused all four with cudaErrorInvalidValue; so does the fake, and counts them."""
    want = [PROBE[k] for k in ("advise_device", "prefetch_device", "advise_host", "prefetch_host")]
    s = uvm(built, MiB, "advise-plain", "prefetch-plain", "advise-stack", "prefetch-stack")
    assert [x["err"] for x in s] == want == [ERR_INVALID_VALUE] * 4


def test_cpu_writes_populate_on_the_host_and_bring_device_pages_back(built):
    """fake_cudart_host_write (the CPU's writes, which the fake's unmapped memory cannot
    take): untouched pages are populated on the host, device-resident ones migrate there;
    a kernel's later touch of host-preferred pages maps them."""
    s = uvm(built, 8 * MiB, f"prefetch:0:{2 * MiB}:{DEV}", f"hostwrite:0:{4 * MiB}",
            f"advise:0:{8 * MiB}:{ADV_PREFERRED}:{HOST}", f"touch:0:{4 * MiB}")
    assert (s[1]["dev"], s[1]["host"]) == (0, 4 * MiB)
    assert (s[3]["dev"], s[3]["zero_copy"], s[3]["migrated"], s[3]["first_touch"]) == (0, 4 * MiB, 0, 0)


def test_registered_host_memory_answers_as_the_h200_did(built):
    """cudaHostRegister and its neighbours (the shim's pinned optimizer state) on the fake,
    in the probe's order: each answer is the H200's, read from the probe's record; 256 MiB
    registered take none of the device's free bytes there and here."""
    res, out, _ = run(built, "hostreg", preload=False)
    assert res.returncode == 0, res.stderr
    keys = ("host_register_null", "host_register_zero", "host_register", "host_register_twice",
            "host_register_cudafree", "host_unregister", "host_unregister_again")
    assert {k: int(out[k]) for k in keys} == {k: PROBE_REGISTER[k] for k in keys}
    assert PROBE_REGISTER["host_register_free_before"] == PROBE_REGISTER["host_register_free_after"]
    assert int(out["host_register_free_change"]) == 0
