"""What `--overlap staged` costs, in the plan (issue 28): the staging keeps a second copy of
the optimizer state in pinned host memory and stages it through a ring of plain device
memory out of the GPU budget (transit_staging.py), so the plan counts both, and a layout
whose host copy does not fit is flagged, not recommended, and warned about in render."""

import json

import pytest



def _plan(cli, *extra):
    rc, out, err = cli("plan", "--model", "llama3-70b", "--json", *extra)
    assert rc == 0, err
    return {o["nodes"]: o for o in json.loads(out)["options"]}


def test_staged_adds_the_state_copy_to_host_dram_and_the_ring_to_the_offload(cli):
    plain, staged = _plan(cli, "--overlap", "0"), _plan(cli, "--overlap", "staged")
    # by hand, against the step in place: AdamW keeps 8 bytes a parameter, sharded over the GPUs; 4 GPUs a node; the ring
    # is 256 MiB of each GPU's budget, so it adds to what leaves the GPU
    params = 70.55e9
    for nodes in (4, 3, 2):
        a, b = plain[nodes], staged[nodes]
        state = 8 * params / (4 * nodes)
        assert b["offload_gb_per_gpu"] * 1e9 - a["offload_gb_per_gpu"] * 1e9 == \
            pytest.approx(256 * 2**20, abs=0.02e9)
        extra_host = (b["host_gb_per_node"] - a["host_gb_per_node"]) * 1e9
        assert abs(extra_host - 4 * (state + 256 * 2**20)) / extra_host < 0.01, (nodes, extra_host)
        assert any("pinned copy" in n for n in b["notes"]) and not any("pinned copy" in n for n in a["notes"])
    assert staged[5]["offload_gb_per_gpu"] == 0 and staged[5]["host_gb_per_node"] == plain[5]["host_gb_per_node"]


def test_a_host_copy_that_does_not_fit_is_flagged_and_warned(cli):
    plain, staged = _plan(cli, "--host-mem", "512GB"), _plan(cli, "--host-mem", "512GB", "--overlap", "staged")
    assert plain[2]["fits_host"] and not staged[2]["fits_host"]
    assert "host DRAM too small" in staged[2]["notes"]
    rc, _, err = cli("render", "--model", "llama3-70b", "--overlap", "staged", "--host-mem", "512GB", "--nodes", "2",
                     "--", "python", "t.py")
    assert rc == 0 and "WARNING: 2 node(s) need" in err and "more than the node's 512 GB allow" in err, err
    rc, _, err = cli("render", "--model", "llama3-70b", "--host-mem", "512GB", "--nodes", "2", "--", "python", "t.py")
    assert rc == 0 and "WARNING: 2 node(s) need" not in err, err


def test_overlap_is_checked_as_the_cli_checks_it(cli):
    rc, out, err = cli("plan", "--model", "llama3-70b", "--overlap", "sideways")
    assert rc == 2 and out == "" and "invalid choice: 'sideways'" in err and err.count("\n") == 1


def test_the_plans_request_says_a_retired_mode_as_the_cli_does():
    """plan.Request from Python: the retired `serial` gets the CLI's words, an unknown word its own."""
    from transit_launch.errors import UsageError
    from transit_launch.planning.hardware import GPUS
    from transit_launch.planning.models import load_model
    from transit_launch.planning.plan import Request

    card, gpu = load_model("llama3-8b"), GPUS["h200-141gb"]
    with pytest.raises(UsageError, match=r"overlap 'serial' is retired \(docs/retired-experiments.md\)"):
        Request(card=card, gpu=gpu, overlap="serial")
    with pytest.raises(UsageError, match="overlap 'fast' is not one of 0, 1, staged, stream, host"):
        Request(card=card, gpu=gpu, overlap="fast")
