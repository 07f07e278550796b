"""bench/common.py: what every bench script that runs a policy goes through."""

import pytest

import common


def test_a_policy_run_without_the_shim_is_refused_not_measured_as_the_reference(monkeypatch, capsys):
    # `transit-launch run` warns and runs the job bare when it has no shim; a bench run would then
    # record the reference's speed under the policy's name (a GPU call whose tree lost its build did)
    monkeypatch.setenv("TRANSIT_SHIM", "")
    monkeypatch.setattr(common, "gpu_here", lambda: True)
    with pytest.raises(SystemExit) as e:
        common.transit("advise", ["python3", "train.py"], "/tmp/stats", 10**9)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no libtransit.so to measure advise" in err[0] and "TRANSIT_SHIM is set empty" in err[0]


def test_with_a_shim_the_command_runs_under_transit_launch(monkeypatch, tmp_path):
    monkeypatch.setenv("TRANSIT_SHIM", str(tmp_path / "libtransit.so"))
    cmd = common.transit("advise", ["python3", "train.py"], "/tmp/stats", 10**9)
    assert cmd[1:] == ["-m", "transit_launch", "run", "--policy", "advise", "--stats", "/tmp/stats",
                       "--gpu-budget", "1GB", "--", "python3", "train.py"]
    # the reference and `off` need no shim
    monkeypatch.setenv("TRANSIT_SHIM", "")
    assert common.transit("off", ["true"])[-4:] == ["--policy", "off", "--", "true"]


def test_host_memory_reads_the_peak_resident_bytes():
    held = bytearray(96 * 2**20)  # 96 MiB written: resident
    got = common.host_memory()
    assert held[-1] == 0 and got["host_peak_rss"] >= 96 * 2**20  # bytes, not the kernel's KiB
    assert got["host_peak_rss"] < 64 * 2**30


@pytest.mark.parametrize("policy", ["base", "prefetch", "advise"])
def test_a_policy_run_without_a_budget_is_refused_too(monkeypatch, capsys, policy):
    # bench/torchtitan_check.py runs a policy with no budget by default: the shim is needed all the same
    monkeypatch.setenv("TRANSIT_SHIM", "")
    monkeypatch.setattr(common, "gpu_here", lambda: True)
    with pytest.raises(SystemExit) as e:
        common.transit(policy, ["python3", "train.py"], "/tmp/stats")
    assert e.value.code == 2 and f"no libtransit.so to measure {policy}" in capsys.readouterr().err


def test_without_a_gpu_a_policy_run_needs_no_shim(monkeypatch):
    # the bench's plumbing on CPU ranks (bench/tests' scale-in and shapes runs): nothing to place
    monkeypatch.setenv("TRANSIT_SHIM", "")
    monkeypatch.setattr(common, "gpu_here", lambda: False)
    assert common.transit("advise", ["true"])[-5:] == ["run", "--policy", "advise", "--", "true"]
