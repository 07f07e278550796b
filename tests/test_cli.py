"""The CLI as a user runs it: real subprocesses, exit codes, one-line errors."""

import json

PAPER = ["plan", "--model", "llama3-70b", "--parallel", "fsdp", "--gpu", "h100-80gb", "--gpus-per-node", "4",
         "--seq-len", "8192", "--local-batch", "1", "--global-batch", "240"]


def test_plan_json_paper_configuration(cli):
    rc, out, err = cli(*PAPER, "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["min_gpus_no_offload"] == 24 and d["min_nodes_no_offload"] == 6
    for key in ("model", "params", "layout", "per_gpu_gb", "options", "recommended"):
        assert key in d
    assert set(d["per_gpu_gb"]) >= {"parameters", "gradients", "optimizer", "activations", "logits", "fsdp",
                                    "comm", "overhead", "total"}
    for opt in d["options"]:
        assert set(opt) >= {"nodes", "gpus", "offload_gb_per_gpu", "host_gb_per_node", "fits_host",
                            "traffic_ratio", "per_gpu_gb", "baseline", "recommended"}
        assert opt["gpus"] == 4 * opt["nodes"]
        assert opt["per_gpu_gb"]["total"] == opt["per_gpu_total_gb"]
    # the baseline is listed like the table lists it: first, flagged, without offload
    assert [o["nodes"] for o in d["options"]] == [6, 5, 4, 3, 2, 1]
    base = d["options"][0]
    assert base["baseline"] and base["offload_gb_per_gpu"] == 0 and base["per_gpu_gb"] == d["per_gpu_gb"]
    assert [o["nodes"] for o in d["options"] if o["recommended"]] == [d["recommended"]["nodes"]]


def test_plan_json_and_table_show_the_same_rows(cli):
    rc, out, _ = cli(*PAPER, "--json")
    rc2, table, _ = cli(*PAPER)
    assert rc == rc2 == 0
    rows = [line.split() for line in table.split("Scale-in options")[1].splitlines()[3:] if line.strip()]
    rows = [r for r in rows if r[0].isdigit()]
    assert [int(r[0]) for r in rows] == [o["nodes"] for o in json.loads(out)["options"]]


def test_plan_table_default_command(cli):
    rc, out, err = cli("plan", "--model", "llama3-70b")
    assert rc == 0, err
    assert "Minimum without offloading: 24 GPUs on 6 nodes." in out
    assert "Recommended:" in out and "parameters" in out and err == ""


def test_models_lists_catalog(cli):
    rc, out, _ = cli("models")
    assert rc == 0 and "qwen3-30b-a3b" in out and "MoE 128x top-8" in out
    rc, out, _ = cli("models", "--json")
    assert {m["name"] for m in json.loads(out)} >= {"llama3-8b", "llama3-70b", "llama3-405b", "llama4-scout",
                                                     "qwen3-32b", "qwen3-30b-a3b"}


def test_unsupported_config_json(cli, write_json):
    path = write_json({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    rc, _, err = cli("plan", "--model", str(path))
    assert rc == 2 and "unsupported architecture" in err and len(err.strip().splitlines()) == 1


def test_doctor_runs_anywhere(cli):
    rc, out, err = cli("doctor", "--json")
    assert rc == 0, err
    checks = {c["check"]: c for c in json.loads(out)}
    assert {"host memory", "shim", "spank.h", "c compiler", "torch"} <= set(checks)
    assert checks["host memory"]["ok"] and checks["host memory"]["total"] > 0
    assert any(k.startswith("gpu") or k == "gpu" for k in checks)
    assert any(k == "slurm" for k in checks)
    rc, out, _ = cli("doctor")
    assert rc == 0 and "check" in out.splitlines()[0]
