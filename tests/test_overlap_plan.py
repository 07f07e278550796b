"""The plan's --overlap (issue 28): checked as the CLI checks it, a retired mode (serial, 1,
staged: docs/retired-experiments.md) said as retired, from the CLI and from Python."""

import pytest


def test_overlap_is_checked_as_the_cli_checks_it(cli):
    rc, out, err = cli("plan", "--model", "llama3-70b", "--overlap", "sideways")
    assert rc == 2 and out == "" and "invalid choice: 'sideways'" in err and err.count("\n") == 1


def test_the_plans_request_says_a_retired_mode_as_the_cli_does():
    """plan.Request from Python: a retired mode (serial, 1, staged) gets the CLI's words, an unknown
    word its own."""
    from transit_launch.errors import UsageError
    from transit_launch.planning.hardware import GPUS
    from transit_launch.planning.models import load_model
    from transit_launch.planning.plan import Request

    card, gpu = load_model("llama3-8b"), GPUS["h200-141gb"]
    for mode in ("serial", "1", "staged"):
        with pytest.raises(UsageError, match=rf"overlap '{mode}' is retired \(docs/retired-experiments.md\)"):
            Request(card=card, gpu=gpu, overlap=mode)
    with pytest.raises(UsageError, match="overlap 'fast' is not one of 0, stream, host"):
        Request(card=card, gpu=gpu, overlap="fast")
