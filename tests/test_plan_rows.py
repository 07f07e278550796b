"""plan's answer is not buried (issue 28, item 5): a long plan shows the rows a person
decides between and says how many it left out, --all shows every row, --json keeps
every row, another preset that serves better gets one line, and a TP group wider than
a node gets a warning. Every expectation is derived from --json (every row), not from
the code that picks the rows."""

import json
import re

import pytest

# one xdist worker runs the module: _RUNS's plans (llama4-scout's take seconds each) are then made
# once, not once per worker that gets one of its tests
pytestmark = pytest.mark.xdist_group("plan-rows")
_RUNS = {}


def run(cli, *args):
    """The CLI's (rc, stdout, stderr), once per argument list (a 1024-row plan takes seconds)."""
    if args not in _RUNS:
        _RUNS[args] = cli("plan", *args)
    return _RUNS[args]


def table_rows(out: str) -> dict[int, str]:
    """nodes -> line of the options table."""
    block = re.split(r"^(?:Scale-in options|Options with offloading).*$", out, flags=re.M)[1]
    lines = block.split("\n\n")[0].splitlines()[2:]  # after the header and its rule
    return {int(line.split()[0]): line for line in lines if re.match(r"\s*\d+\s+\d+\s", line)}


def decision_nodes(opts: list[dict]) -> set[int]:
    """The rows to decide between, from --json alone: the first row (the minimum without
    offloading, or the reference), the recommendation and its neighbours, the fewest nodes
    at 100% that keep hot data on the GPU, the fewest that keep hot data on the GPU, and
    the fewest that fit host DRAM."""
    i = next(k for k, o in enumerate(opts) if o["recommended"])
    keep = {opts[0]["nodes"]} | {o["nodes"] for o in opts[max(0, i - 1):i + 2]}
    served = [o for o in opts[1:] if o["fits_host"] and o["hot_spill_gb_per_gpu"] == 0]
    for group in (served, [o for o in served if round(o["predicted_efficiency"] * 100) == 100],
                  [o for o in opts[1:] if o["fits_host"]]):
        if group:
            keep.add(min(o["nodes"] for o in group))
    return keep


@pytest.mark.parametrize("model,total", [("llama4-scout", 1024), ("llama3-405b", 98)])
def test_long_plan_shows_the_decision_rows(cli, model, total):
    rc, out, err = run(cli, "--model", model)
    rc_j, js, _ = run(cli, "--model", model, "--json")
    assert rc == rc_j == 0 and err == "", err
    d = json.loads(js)
    opts = d["options"]
    # --json keeps every row: Llama4-Scout under fsdp never fits without offloading, so every
    # node count up to 1024 is an option; Llama3-405B fits from 98 nodes down to 1
    assert len(opts) == total and [o["nodes"] for o in opts] == list(range(total, 0, -1))
    rows = table_rows(out)
    want = decision_nodes(opts)
    assert set(rows) == want, (sorted(rows), sorted(want))
    rec = d["recommended"]["nodes"]
    assert "recommended" in rows[rec] and f"{next(o for o in opts if o['recommended'])['predicted_efficiency']:.0%}" in rows[rec]
    # bounded: the head (about 20 lines), the rows shown, a few lines under the table
    assert len(out.splitlines()) <= 22 + len(want) + 8 < 50
    flat = " ".join(out.split())
    assert f"{total - len(want)} of {total} rows left out (--all shows every row)" in flat


@pytest.mark.parametrize("model", ["llama4-scout", "llama3-405b"])
def test_all_shows_every_row_as_the_full_table(cli, model):
    rc, full, err = run(cli, "--model", model, "--all")
    _, out, _ = run(cli, "--model", model)
    opts = json.loads(run(cli, "--model", model, "--json")[1])["options"]
    assert rc == 0 and err == ""
    rows = table_rows(full)
    assert list(rows) == [o["nodes"] for o in opts]  # every row, in the JSON's order
    for o in opts:
        assert f"{o['predicted_efficiency']:.0%}" in rows[o["nodes"]].split()
    assert "rows left out" not in full
    # the shortened table's rows are the full table's rows, cell for cell (only widths differ)
    assert all(rows[n].split() == line.split() for n, line in table_rows(out).items())
    # apart from the table (and the line that says what it left out) the two are the same text
    head, tail = full.split("\nnodes  GPUs")[0], full.split(rows[opts[-1]["nodes"]])[1]
    assert out.startswith(head) and out.endswith(tail.split("\n\n", 1)[1])


def test_short_plan_is_unchanged_by_all(cli):
    args = ("--model", "llama3-70b", "--global-batch", "240")
    rc, out, _ = run(cli, *args)
    _, full, _ = run(cli, *args, "--all")
    assert rc == 0 and out == full and len(table_rows(out)) == 6 and "left out" not in out


def test_other_layout_that_keeps_the_floor_gets_one_line(cli):
    """Llama4-Scout: fsdp's best is 4 nodes at 72%; fsdp+ep keeps 90% on 6 nodes."""
    _, out, _ = run(cli, "--model", "llama4-scout")
    d = json.loads(run(cli, "--model", "llama4-scout", "--json")[1])
    ep = json.loads(run(cli, "--model", "llama4-scout", "--parallel", "fsdp+ep", "--json")[1])
    rec = next(o for o in d["options"] if o["recommended"])
    ep_rec = next(o for o in ep["options"] if o["recommended"])
    assert rec["predicted_efficiency"] < 0.9 <= ep_rec["predicted_efficiency"]
    lines = [line for line in out.splitlines() if "--parallel fsdp+ep" in line]
    assert lines == [f"Another layout keeps --min-efficiency 90%: --parallel fsdp+ep on {ep_rec['nodes']} nodes "
                     f"(dp{ep_rec['layout']['dp']}xep{ep_rec['layout']['ep']}) at "
                     f"{ep_rec['predicted_efficiency']:.0%} predicted efficiency, against fsdp's "
                     f"{rec['nodes']} nodes at {rec['predicted_efficiency']:.0%} predicted efficiency."]
    assert d["other_layout"]["parallel"] == "fsdp+ep" and d["other_layout"]["nodes"] == ep_rec["nodes"]
    # the other way round there is nothing better: fsdp never keeps 90% on fewer nodes
    _, ep_out, _ = run(cli, "--model", "llama4-scout", "--parallel", "fsdp+ep")
    assert "another layout" not in ep_out.lower() and ep["other_layout"] is None


def test_no_other_layout_line_when_none_is_better(cli):
    # Llama3-70B, global batch 240: fsdp keeps 99% on 2 nodes; neither fsdp+tp nor tp+pp
    # serves it on 1 node (its JSON says so)
    _, out, _ = run(cli, "--model", "llama3-70b", "--global-batch", "240")
    for preset in ("fsdp+tp", "tp+pp"):
        rc, js, _ = cli("plan", "--model", "llama3-70b", "--global-batch", "240", "--parallel", preset,
                        "--local-batch", "8" if preset == "tp+pp" else "1", "--json")
        if rc == 0:
            assert json.loads(js)["recommended"]["nodes"] >= 2
    assert "another layout" not in out.lower()


def test_tp_across_nodes_is_warned(cli):
    rc, out, err = cli("plan", "--model", "llama3-70b", "--tp", "8")
    assert rc == 0
    assert err.splitlines() == ["transit-launch: WARNING: --tp 8 spans 2 nodes of 4 GPUs: every layer's "
                                "tensor-parallel collectives cross the network (the traffic column counts them, "
                                "pred. eff does not); --tp 4 or less keeps them inside a node"]
    rc, js, err_j = cli("plan", "--model", "llama3-70b", "--tp", "8", "--json")
    assert rc == 0 and json.loads(js)["warnings"] == [err.splitlines()[0].split("WARNING: ", 1)[1]]
    assert err_j == err
    rc, _, err = cli("plan", "--model", "llama3-70b", "--tp", "8", "--gpus-per-node", "2")
    assert rc == 0 and "--tp 8 spans 4 nodes of 2 GPUs" in err, err
    for tp, g in (("4", "4"), ("2", "4"), ("8", "8")):  # inside one node: no warning
        rc, _, err = cli("plan", "--model", "llama3-70b", "--tp", tp, "--gpus-per-node", g)
        assert rc == 0 and err == "", (tp, g, err)
