"""`transit-launch report DIR` on stats files the real shim wrote under the fake CUDA
runtime (tests/fakecuda): per rank and per node, the plan's prediction beside them (left by
the rendered script's own line), and one line for bad input."""

import json
import shutil
import subprocess

import pytest

from tests.test_shim import GB, run
from transit_launch.preload import build as shimbuild

pytestmark = pytest.mark.skipif(shimbuild.find_header("cuda_runtime_api.h") is None or not shutil.which("cc"),
                                reason="needs a C compiler and the CUDA runtime headers (cuda_runtime_api.h)")


def job_stats(built, d, extra=None):
    """Three ranks of two nodes, as a job's processes write them: rank 0 and 2 under a 3 GB
    budget allocate 1+1+2 GB (the 2 GB one does not fit: placed on the host, read
    zero-copy), rank 1 under 5 GB keeps all 4 GB on the GPU."""
    for rank, node, budget in ((0, "nA", "3GB"), (1, "nA", "5GB"), (2, "nB", "3GB")):
        res, _, _ = run(built, "alloc", GB, GB, 2 * GB, env={"TRANSIT_GPU_BUDGET": budget, "TRANSIT_STATS": str(d),
                                                             "RANK": str(rank), "SLURMD_NODENAME": node, **(extra or {})})
        assert res.returncode == 0, res.stderr
    return sorted(p.name for p in d.iterdir())


def test_ranks_and_nodes_of_a_stats_directory(built, cli, tmp_path):
    d = tmp_path / "stats"
    d.mkdir()
    assert job_stats(built, d) == ["transit-rank0.json", "transit-rank1.json", "transit-rank2.json"]
    rc, out, err = cli("report", "--json", str(d))
    assert rc == 0, err
    r = json.loads(out)
    assert [(x["rank"], x["node"], x["budget_gb"], x["on_gpu_peak_gb"], x["offloaded_gb"], x["budget_held"])
            for x in r["ranks"]] == [(0, "nA", 3.0, 2.0, 2.0, True), (1, "nA", 5.0, 4.0, 0.0, True),
                                     (2, "nB", 3.0, 2.0, 2.0, True)]
    assert [x["paths"] for x in r["ranks"]] == [["zero-copy"], [], ["zero-copy"]]
    assert [(n["node"], n["ranks"], n["on_gpu_peak_gb"], n["offloaded_gb"]) for n in r["nodes"]] == [
        ("nA", 2, 4.0, 2.0), ("nB", 1, 2.0, 2.0)]
    assert r["plan"] is None and r["measured"]["offloaded_gb_per_rank"] == round(4 / 3, 2)
    rc, out, err = cli("report", str(d))
    assert rc == 0, err
    assert "Per rank:" in out and "Per node:" in out and "No plan's prediction" in out
    row = next(line for line in out.splitlines() if line.startswith("   2  nB"))
    assert row.split()[3:9] == ["advise", "3.0", "yes", "2.0", "2.0", "zero-copy"], row


def test_the_rendered_scripts_prediction_is_set_beside_the_job(built, cli, tmp_path):
    """A rendered script exports the plan's prediction (TRANSIT_PLAN); the shim of each rank
    copies it into its report (its own writer: the script writes no file), and the report
    sets it beside what the ranks measured."""
    d = tmp_path / "stats"
    d.mkdir()
    rc, script, err = cli("render", "--model", "llama3-8b", "--nodes", "2", "--gpus-per-node", "2", "--gpu-budget",
                          "40GB", "--stats", str(d), "--inject", "script", "--", "python", "train.py")
    assert rc == 0, err
    line = next(ln for ln in script.splitlines() if ln.startswith("export TRANSIT_PLAN="))
    res = subprocess.run(["bash", "-c", f"{line}; printf %s \"$TRANSIT_PLAN\""], capture_output=True, text=True)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    job_stats(built, d, {"TRANSIT_PLAN": res.stdout})
    rc, out, err = cli("report", "--json", str(d))
    assert rc == 0, err
    r = json.loads(out)
    comment = next(ln for ln in script.splitlines() if ln.startswith("# This job:"))
    # the script's own comment says the same plan: offload and efficiency
    assert f"offload {r['plan']['offload_gb_per_gpu']:.1f} GB per GPU" in comment, comment
    assert f"predicted efficiency {r['plan']['predicted_efficiency']:.0%}" in comment, comment
    assert (r["plan"]["nodes"], r["plan"]["gpus"], r["plan"]["policy"]) == (2, 4, "advise")
    rc, out, err = cli("report", str(d))
    assert rc == 0 and "Plan beside the job:" in out, err
    offload = next(ln for ln in out.splitlines() if ln.startswith("offload GB per GPU")).split()
    assert offload[-2:] == [str(r["plan"]["offload_gb_per_gpu"]), "1.33"], offload


def test_no_prediction_under_policy_off_or_without_a_plan(cli):
    """A job without the shim has no report to carry the prediction; --model-less render
    has no plan to predict from."""
    rc, script, err = cli("render", "--model", "llama3-8b", "--nodes", "2", "--policy", "off",
                          "--inject", "script", "--", "python", "train.py")
    assert rc == 0 and "TRANSIT_PLAN" not in script, err
    rc, script, err = cli("render", "--nodes", "2", "--inject", "script", "--", "python", "train.py")
    assert rc == 0 and "TRANSIT_PLAN" not in script, err


def one_line_error(cli, *args):
    rc, out, err = cli("report", *args)
    assert rc == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_bad_input_is_one_line(built, cli, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    assert "not a directory" in one_line_error(cli, str(f))
    assert "not a directory" in one_line_error(cli, str(tmp_path / "absent"))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no stats files" in one_line_error(cli, str(empty))
    d = tmp_path / "stats"
    d.mkdir()
    job_stats(built, d)
    (d / "transit-rank3.json").write_text('{"pid": 1,')
    assert "transit-rank3.json: not a readable JSON file" in one_line_error(cli, str(d))
    (d / "transit-rank3.json").write_text(json.dumps({"pid": 1, "policy": "advise"}))
    assert ("transit-rank3.json: not a stats file of the shim (missing or wrong: passthrough, budget_bytes, "
            in one_line_error(cli, str(d)))
    (d / "transit-rank3.json").unlink()
    job_stats(built, d, {"TRANSIT_PLAN": '{"nodes": 2}'})  # an object the shim carries, not a prediction
    assert 'transit-rank0.json: its "plan" is not the plan\'s prediction' in one_line_error(cli, str(d))


def test_a_node_sums_its_ranks_and_holds_its_budget_only_if_all_do(built, cli, tmp_path):
    """A node's offload is its ranks' sum and its budget is held only if every rank's is: two
    ranks of nA both offload 2 GB (3 GB budgets: 4.0 GB on the node), and a third rank's
    report, edited to have placed 4 GB on the GPU under its 3 GB budget, makes nA's "no"
    while nB's stays "yes". A rank that is not an integer (true) is one error line."""
    d = tmp_path / "stats"
    d.mkdir()
    for rank, node in ((0, "nA"), (1, "nA"), (2, "nB")):
        res, _, _ = run(built, "alloc", GB, GB, 2 * GB, env={"TRANSIT_GPU_BUDGET": "3GB", "TRANSIT_STATS": str(d),
                                                             "RANK": str(rank), "SLURMD_NODENAME": node})
        assert res.returncode == 0, res.stderr
    over = json.loads((d / "transit-rank0.json").read_text())
    over.update(rank=3, device_placed_peak_bytes=4 * GB)
    (d / "transit-rank3.json").write_text(json.dumps(over))
    rc, out, err = cli("report", "--json", str(d))
    assert rc == 0, err
    nodes = {n["node"]: n for n in json.loads(out)["nodes"]}
    assert (nodes["nA"]["ranks"], nodes["nA"]["offloaded_gb"], nodes["nA"]["budget_held"]) == (3, 6.0, False)
    assert (nodes["nB"]["ranks"], nodes["nB"]["offloaded_gb"], nodes["nB"]["budget_held"]) == (1, 2.0, True)
    over["rank"] = True
    (d / "transit-rank3.json").write_text(json.dumps(over))
    assert "transit-rank3.json: not a stats file of the shim (missing or wrong: rank)" in one_line_error(cli, str(d))


def test_each_ranks_optimizer_step_and_warm_up_are_shown(built, cli, tmp_path):
    """The adapter's counters reach the report as each stats file's "adapter" object (the
    shim copies what transit_adapter_stats gave it; here written into the files as it
    would): the text says per rank which step ran and what it moved, --json keeps the
    object; a rank without an adapter shows "-"."""
    d = tmp_path / "stats"
    d.mkdir()
    job_stats(built, d)
    adapters = {0: {"mode": "stream", "steps": 9, "streamed_params": 48, "slices": 96},
                1: {"mode": "host", "host_params": 12, "share": 0.34, "steps": 9, "stream": {"streamed_params": 36}}}
    for rank, adapter in adapters.items():
        f = d / f"transit-rank{rank}.json"
        f.write_text(json.dumps({**json.loads(f.read_text()), "adapter": adapter}))
    rc, out, err = cli("report", "--json", str(d))
    assert rc == 0, err
    assert [r["adapter"] for r in json.loads(out)["ranks"]] == [adapters[0], adapters[1], None]
    rc, out, err = cli("report", str(d))
    assert rc == 0, err
    rows = {line.split()[0]: line for line in out.splitlines() if line[:4].strip() in {"0", "1", "2"}}
    assert rows["0"].endswith("stream: 9 steps, 48 params"), rows
    assert rows["1"].endswith("host: 12 params on the CPU (share 0.34), 36 streamed"), rows
    assert rows["2"].rstrip().endswith("-"), rows


def test_a_rank_whose_step_ran_in_place_says_so():
    """sitecustomize sends mode "0" for every process without a streamed or host step (the
    opt-out, or a policy without a default step): the report reads it as the step in place;
    a mode it does not know is shown as it came."""
    from transit_launch.report import step_taken
    assert step_taken({"mode": "0", "steps": 0}) == "in place"
    assert step_taken({"mode": "later"}) == "later"
    assert step_taken(None) == "-"
