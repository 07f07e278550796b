"""The plan's cost model of --overlap host (issue 50): the state served at the link's rate plus
the CPU's, the CPU's a rate per host core shared by the node's ranks, its constants what the
one recorded TorchTitan host run measured (tests/prediction_records.py HOST_FIT), the host
DRAM it holds, and the cores it is given (--host-cores, a job's CPUs)."""

from dataclasses import replace

import pytest

from tests import prediction_records as records
from transit_launch.planning import efficiency
from transit_launch.planning.hardware import gpu_profile
from transit_launch.planning.models import load_model
from transit_launch.planning.plan import HOST_COPY_PER_STATE_BYTE, Request

FIT = records.host_fit()


def _req(mode, **kw):
    """The fit run's job as the plan sees it: its budget, one GPU, the lease's 16 cores."""
    card = replace(load_model("llama3-8b"), layers=FIT["layers"])
    kw = {"gpu": gpu_profile("h100-80gb", memory=FIT["budget"]), "gpus_per_node": 1,
          "host_cores": records.HOST_FIT_CORES, **kw}
    return Request(card=card, seq_len=FIT["seq_len"], global_batch=FIT["microbatches"], overlap=mode, **kw)


def _at_lease_link(mode):
    """The request with the host link the fit file's streamed run measured, not the profile's."""
    gpu = replace(gpu_profile("h100-80gb", memory=FIT["budget"]), host_link=FIT["link"] / efficiency.STREAM_LINK_SHARE)
    return _req(mode, gpu=gpu)


def test_the_cpus_rate_a_core_is_what_the_fit_run_measured():
    """The host run's state over its step's extra seconds, less the link's rate of the streamed
    run of the same lease, over the lease's cores."""
    cpu = FIT["state"] / FIT["state_s"] - FIT["link"]
    assert efficiency.HOST_STEP_RATE_PER_CORE == pytest.approx(cpu / records.HOST_FIT_CORES, rel=0.02)


def test_the_host_warm_up_rate_is_what_the_fit_runs_adopt_took():
    assert efficiency.WARMUP_HOST_RATE == pytest.approx(FIT["cpu_state"] / FIT["adopt_s"], rel=0.02)


def test_the_fit_run_is_reproduced_at_its_leases_link_and_its_offload():
    """The step-time model at the link and offloaded bytes the run measured is within the
    target; both steps of the file, the streamed one on its constant fitted elsewhere."""
    for mode, measured in (("host", FIT["measured"]), ("stream", FIT["measured_stream"])):
        req = _at_lease_link(mode)
        c = records.evaluate_one_gpu(req)
        assert abs(records.efficiency_at_offload(req, c, FIT["state"]) - measured) <= records.TARGET, mode


def test_the_plans_own_offload_puts_the_host_run_at_the_targets_edge():
    """With its own memory model the plan offloads less state than the job moved at one
    microbatch (as for the streamed step's OFF_TARGET runs), which puts host 3 points over."""
    req = _at_lease_link("host")
    c = records.evaluate_one_gpu(req)
    assert c.offload < FIT["state"]
    assert 0 < c.efficiency - FIT["measured"] <= records.OFF_TARGET_AT_MOST


def test_host_is_faster_than_the_stream_by_the_cpus_share_and_more_with_more_cores():
    stream, host = records.evaluate_one_gpu(_req("stream")), records.evaluate_one_gpu(_req("host"))
    more = records.evaluate_one_gpu(_req("host", host_cores=64))
    shared = records.evaluate_one_gpu(_req("host", host_cores=4))  # fewer cores for this GPU
    assert stream.efficiency < shared.efficiency < host.efficiency < more.efficiency
    rate = efficiency.state_rate(_req("host"))
    assert efficiency.host_share(_req("host")) == pytest.approx(
        efficiency.HOST_STEP_RATE_PER_CORE * records.HOST_FIT_CORES / rate)
    assert efficiency.host_share(_req("stream")) == 0 and efficiency.host_share(_req("0")) == 0


def test_host_holds_the_cpus_parameter_copies_in_host_dram():
    stream, host = records.evaluate_one_gpu(_req("stream")), records.evaluate_one_gpu(_req("host"))
    assert host.offload == stream.offload
    copies = efficiency.host_share(_req("host")) * min(host.offload, host.est.optimizer) * HOST_COPY_PER_STATE_BYTE
    assert host.host_per_node - stream.host_per_node == pytest.approx(copies)
    assert any(n.startswith("host: ") and "updated by the CPU" in n for n in host.notes)


def test_the_cli_plans_host_and_takes_the_cores(cli):
    rc, out, err = cli("plan", "--model", "llama3-70b", "--overlap", "host", "--json")
    assert rc == 0, err
    rc, few, err = cli("plan", "--model", "llama3-70b", "--overlap", "host", "--host-cores", "8", "--json")
    assert rc == 0, err
    import json
    eff = lambda o: [r["predicted_efficiency"] for r in json.loads(o)["options"] if r["offload_gb_per_gpu"]]  # noqa: E731
    assert eff(out) and all(a > b for a, b in zip(eff(out), eff(few)))
    assert json.loads(out)["host_cores_per_node"] == 112 and json.loads(few)["host_cores_per_node"] == 8
    for bad in ("0", "-3", "x", "5000"):
        rc, out, err = cli("plan", "--model", "llama3-70b", "--host-cores", bad)
        assert rc == 2 and out == "" and err.count("\n") == 1 and "--host-cores" in err, (bad, err)
