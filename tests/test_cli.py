"""The CLI as a user runs it: real subprocesses, exit codes, one-line errors."""

import argparse
import json
import os

import pytest

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
    # no --global-batch: one microstep, so no gradients at the loss peak (issue 18's calibration;
    # with the paper's global batch 240 it is 24 GPUs on 6 nodes, tests/test_plan.py)
    assert "Minimum without offloading: 20 GPUs on 5 nodes." in out
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


def test_plan_no_fit_answers(cli):
    rc, out, err = cli("plan", "--model", "llama3-70b", "--global-batch", "16")
    assert rc == 0, err
    assert "No node count up to 1024 serves global batch 16 without offloading" in out
    rc, js, _ = cli("plan", "--model", "llama3-70b", "--global-batch", "16", "--json")
    d = json.loads(js)
    assert d["min_nodes_no_offload"] is None and d["no_fit"].startswith("No node count")
    # dp x local batch must divide 16 at 4 GPUs a node: 4, 2 and 1 nodes, none of them fits
    assert [o["nodes"] for o in d["options"]] == [4, 2, 1] and not any(o["baseline"] for o in d["options"])
    rec = next(o["nodes"] for o in d["options"] if o["recommended"])  # the text says what --json says
    assert "Options with offloading" in out and f"Recommended: {rec} node" in out


def test_plan_plot_writes_png_of_the_json_data(cli, tmp_path):
    mpimg = pytest.importorskip("matplotlib.image", reason="the plot needs matplotlib (the [plot] extra)")
    png = tmp_path / "plan.png"
    rc, out, err = cli(*PAPER, "--json", "--plot", str(png))
    assert rc == 0, err
    assert json.loads(out)["options"]  # --json still printed
    assert err.strip() == f"transit-launch: wrote {png}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = mpimg.imread(str(png)).shape  # decodes: a whole image, not a partial file
    assert width > 600 and height > 300
    assert list(tmp_path.iterdir()) == [png]  # no temporary file left beside it


def test_plot_data_is_the_json(monkeypatch, tmp_path):
    """report.plot draws plan_json's numbers: each bar's stacked terms sum to its total."""
    pytest.importorskip("matplotlib")
    from transit_launch.planning import report
    from transit_launch.planning.hardware import gpu_profile
    from transit_launch.planning.models import load_model
    from transit_launch.planning.plan import Request, plan
    d = report.plan_json(plan(Request(load_model("llama3-70b"), gpu_profile("h100-80gb"), global_batch=240)))
    bars = []
    import matplotlib.axes
    real_bar = matplotlib.axes.Axes.bar
    monkeypatch.setattr(matplotlib.axes.Axes, "bar", lambda self, x, h, **kw: bars.append(list(h)) or real_bar(
        self, x, h, **kw))
    report.plot(d, str(tmp_path / "p.png"))
    sums = [sum(col) for col in zip(*bars)]
    # each of the 8 terms is rounded to 0.01 GB in --json: their sum may differ by 0.04
    assert sums == [pytest.approx(o["per_gpu_gb"]["total"], abs=0.045) for o in d["options"]]
    # the PNG carries the numbers it drew (what keeps docs/plan.png current, tests/test_readme.py):
    # the bars, bottom up, and the options they belong to
    from PIL import Image
    with Image.open(tmp_path / "p.png") as im:
        drawn = json.loads(im.text[report.PLOT_KEY])
    assert bars == [[o["per_gpu_gb"][t] for o in drawn["options"]] for t in report.PLOT_TERMS]
    assert [(o["nodes"], o["recommended"]) for o in drawn["options"]] == [(o["nodes"], o["recommended"])
                                                                         for o in d["options"]]


FAKE_SINFO = """#!/bin/sh
case "$*" in
  *--version*) echo "slurm 22.05.8" ;;
  *-N*) for n in 1 2 3 4 5 6 7 8; do echo "gpu*|n$n|gpu:4|1907348"; done ;;
  *) echo "gpu*" ;;
esac
"""
DOWN_SINFO = "#!/bin/sh\necho 'sinfo: error: Unable to contact slurm controller (connect failure)' >&2\nexit 1\n"


def fake_slurm(tmp_path, sinfo):
    """A PATH whose sinfo answers (or fails) as given, with an sbatch that is never called."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("sinfo", sinfo), ("sbatch", "#!/bin/sh\nexit 99\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def _only_fake_slurm(tmp_path, sinfo):
    """A PATH of the fake sinfo and sbatch alone: no scontrol to ping the controller with
    (the real Slurm's doctor rows: tests/test_doctor_slurm.py, on the lab cluster)."""
    env = fake_slurm(tmp_path, sinfo)
    return dict(env, PATH=env["PATH"].split(os.pathsep)[0])


def test_doctor_slurm_needs_a_controller(cli, tmp_path):
    rc, out, _ = cli("doctor", "--json", env=_only_fake_slurm(tmp_path, DOWN_SINFO))
    slurm = next(c for c in json.loads(out) if c["check"] == "slurm")
    assert rc == 0 and not slurm["ok"] and slurm["status"] == "no answer"
    assert slurm["detail"] == ("Slurm's commands are installed (missing: srun, squeue, scontrol, sacct, scancel), but "
                               "the controller does not answer: sinfo: error: Unable to contact slurm controller "
                               "(connect failure)")


def test_doctor_slurm_ok_when_the_controller_answers(cli, tmp_path):
    rc, out, _ = cli("doctor", "--json", env=_only_fake_slurm(tmp_path, FAKE_SINFO))
    slurm = next(c for c in json.loads(out) if c["check"] == "slurm")
    assert rc == 0 and slurm["ok"] and "slurm 22.05.8, partitions gpu*" in slurm["detail"]


SUBMIT = ["submit", "--model", "llama3-70b", "--dry-run"]
TRAIN = ["--", "python", "train.py"]


@pytest.mark.parametrize("floor", ["0.9", "0.8"])
def test_submit_auto_picks_what_plan_recommends(cli, tmp_path, floor):
    env = fake_slurm(tmp_path, FAKE_SINFO)  # 8 nodes of 4 GPUs and 2000 GB (1907348 MiB)
    rc, out, err = cli(*SUBMIT, "--min-efficiency", floor, *TRAIN, env=env)
    assert rc == 0, err
    rc, plan_out, _ = cli("plan", "--model", "llama3-70b", "--host-mem", "2000GB", "--min-efficiency", floor, "--json")
    nodes = json.loads(plan_out)["recommended"]["nodes"]
    assert f"#SBATCH --nodes={nodes}\n" in out
    assert "transit-launch: partition gpu (8 nodes): 4 GPUs/node, 2000 GB host DRAM/node, h100-80gb" in err
    assert f"transit-launch: {nodes} node(s): fewest nodes with predicted per-GPU efficiency >= " in err


def test_submit_dry_run_off_the_cluster_says_what_it_assumed(cli, tmp_path):
    rc, out, err = cli(*SUBMIT, *TRAIN, env=fake_slurm(tmp_path, DOWN_SINFO))
    assert rc == 0, err
    assert ("transit-launch: assumed 4 GPUs/node, 2000 GB host DRAM/node, h100-80gb (85.5 GB): no Slurm partition "
            "was read (sinfo failed: sinfo: error: Unable to contact") in err
    assert "--gpus-per-node, --host-mem and --gpu set them" in err


def test_explicit_nodes_that_spill_warn_loudly(cli, tmp_path):
    env = fake_slurm(tmp_path, FAKE_SINFO)
    rc, out, err = cli(*SUBMIT, "--nodes", "1", *TRAIN, env=env)
    assert rc == 0 and "#SBATCH --nodes=1\n" in out
    assert "transit-launch: 1 node(s): as asked; " in err
    assert "transit-launch: WARNING: 1 node(s) push " in err and "the plan recommends 3" in err
    rc, _, err = cli("render", "--model", "llama3-70b", "--nodes", "1", *TRAIN)
    assert rc == 0 and "transit-launch: WARNING: 1 node(s) push " in err
    rc, _, err = cli(*SUBMIT, "--nodes", "9", *TRAIN, env=env)
    assert rc == 2 and "--nodes 9: the partition has 8 nodes (gpu)" in err


# --- what a newcomer met (an independent walk through the README from the wheel) ---------

def test_render_local_is_one_node_and_says_what_that_costs(cli):
    rc, out, err = cli("render", "--local", "--model", "llama3-70b", "--global-batch", "240", "--", "python", "t.py")
    assert rc == 0 and "--nnodes 1 " in out
    _, js, _ = cli("plan", "--model", "llama3-70b", "--global-batch", "240", "--json")
    rec = next(o["nodes"] for o in json.loads(js)["options"] if o["recommended"])
    assert rec > 1 and "WARNING: 1 node(s) push" in err and f"the plan recommends {rec}" in err, err
    rc, out, err = cli("render", "--local", "--nodes", "2", "--model", "llama3-70b", "--", "python", "t.py")
    assert rc == 2 and out == "" and "--local renders a command for this one machine" in err


def test_near_miss_model_name_gets_a_suggestion(cli):
    for name in ("Llama3-70b", "llama3_70b", "llama-3-70b"):
        rc, out, err = cli("plan", "--model", name)
        assert rc == 2 and "did you mean 'llama3-70b'?" in err, err


def test_command_without_its_double_dash_gets_a_hint(cli):
    rc, out, err = cli("render", "--model", "llama3-8b", "python", "train.py")
    assert rc == 2 and "a command to run goes after --" in err


def test_one_node_is_singular(cli):
    rc, out, err = cli("plan", "--model", "llama3-8b", "--global-batch", "4")
    assert rc == 0 and "on 1 node." in out and "Recommended: 1 node (" in out and "1 nodes" not in out
    # the recommendation that names the best option below the no-offload minimum (issue 28)
    rc, out, err = cli("plan", "--model", "qwen3-32b")
    assert rc == 0 and "(the best, 1 node, " in out and "1 nodes" not in out, out


# --- issue 28 ------------------------------------------------------------------------------

def _options(parser, path=()):
    """(subcommand path, its parser, action) of every option and positional of the CLI."""
    for act in parser._actions:
        if isinstance(act, argparse._SubParsersAction):
            for name, sub in act.choices.items():
                yield from _options(sub, (*path, name))
        elif not isinstance(act, argparse._HelpAction):
            yield path, parser, act


def _shown(v) -> str:
    """A default as help writes it: 0.9, 1800 (not 1800.0), 0.25,0.5."""
    if isinstance(v, (list, tuple)):
        return ",".join(map(_shown, v))
    return f"{v:g}" if isinstance(v, float) else str(v)


def test_every_option_has_help_and_shows_its_default():
    """`--help` of every subcommand says what each option does; an option with a default
    (other than off/None) says which, as "default VALUE"."""
    from transit_launch.cli import build_parser
    missing, hidden_default = [], []
    for path, parser, act in _options(build_parser()):
        name = " ".join([*path, act.option_strings[-1] if act.option_strings else act.dest])
        text = act.help % {**vars(act), "prog": parser.prog} if act.help else ""
        if not text.strip():
            missing.append(name)
        elif act.default not in (None, False, argparse.SUPPRESS) and f"default {_shown(act.default)}" not in text:
            hidden_default.append(f"{name} (default {act.default!r}): {text}")
    assert not missing, f"options without help: {missing}"
    assert not hidden_default, hidden_default


def test_the_largest_size_is_accepted_as_written(cli):
    """The range message says "to 1TiB" (rules.GPU_BUDGET_MAX, as for --gpu-budget; issue 51:
    999TB planned a GPU): 1TiB itself is accepted, and a GPU of it plans; a byte more is not."""
    rc, out, err = cli("plan", "--model", "llama3-8b", "--gpu-mem", "1TiB")
    assert rc == 0 and "custom-1099.51GB" in out, err
    for size in ("512MiB", "1099511627777B"):
        rc, out, err = cli("plan", "--model", "llama3-70b", "--gpu-mem", size)
        assert rc == 2 and "must be from 1GiB to 1TiB" in err, err


def test_a_budget_in_bytes_needs_its_b_and_reaches_the_job_with_its_unit(cli):
    """--gpu-budget 70 used to export TRANSIT_GPU_BUDGET=70 (bytes); bytes are written with B,
    and the job gets the size in the grammar the shim reads, exactly."""
    rc, out, err = cli("render", "--local", "--nodes", "1", "--policy", "advise", "--gpu-budget", "9766436864B",
                       "--", "python", "t.py")
    assert rc == 0 and " TRANSIT_GPU_BUDGET=9314MiB " in out, (out, err)
    rc, out, err = cli("render", "--local", "--nodes", "1", "--policy", "advise", "--gpu-budget", "70", "--",
                       "python", "t.py")
    assert rc == 2 and out == "" and err.count("\n") == 1 and "'70' has no unit" in err


def test_every_output_shows_the_same_efficiency(cli):
    """The plot labels come from --json; the table's percent must be the same number."""
    rc, out, _ = cli("plan", "--model", "llama3-70b", "--global-batch", "240", "--json")
    opts = json.loads(out)["options"]
    rc, text, _ = cli("plan", "--model", "llama3-70b", "--global-batch", "240")
    rows = {int(l.split()[0]): l for l in text.splitlines() if l.strip() and l.split()[0].isdigit()}
    for o in opts:
        assert f"{o['predicted_efficiency']:.0%}" in rows[o["nodes"]].split(), (o, rows[o["nodes"]])


def test_run_exits_128_plus_the_signal_that_killed_the_command(cli):
    """A command the OOM killer ends (SIGKILL) exits 137 through `run`, as through a shell
    (it was 247, Python's exit of -9); SIGTERM 143, SIGSEGV 139; --json names the signal."""
    import signal
    for sig, want in ((signal.SIGKILL, 137), (signal.SIGTERM, 143), (signal.SIGSEGV, 139)):
        rc, out, err = cli("run", "--policy", "off", "--", "bash", "-c", f"kill -{sig.name[3:]} $$")
        assert rc == want, (sig, rc, err)
    rc, out, _ = cli("run", "--policy", "off", "--json", "--", "bash", "-c", "kill -KILL $$")
    import json
    assert rc == 137 and json.loads(out)["signal"] == "SIGKILL" and json.loads(out)["returncode"] == -9
    rc, _, _ = cli("run", "--policy", "off", "--", "bash", "-c", "exit 3")
    assert rc == 3


def test_plan_render_and_submit_pick_one_node_count_whatever_scale_in_shows(cli, tmp_path):
    """One rule picks the node count (planning/choice.py): --scale-in narrows plan's rows but
    not the choice (issue 51: with --scale-in 0.25 plan showed 5 and 4 nodes and recommended 4,
    where render and submit took 3). Llama3-70B on 4 GPUs a node: 3 nodes at 93% are the
    fewest at >= 90%."""
    env = fake_slurm(tmp_path, FAKE_SINFO)  # 8 nodes of 4 GPUs and 2000 GB
    for shown in ([], ["--scale-in", "0.25"], ["--scale-in", "0.5"]):
        rc, out, err = cli("plan", "--model", "llama3-70b", *shown, "--json")
        assert rc == 0, err
        assert json.loads(out)["recommended"]["nodes"] == 3, shown
        rc, out, err = cli("render", "--model", "llama3-70b", *shown, "--json", *TRAIN)
        assert rc == 0 and json.loads(out)["nodes"] == 3, (shown, err)
        rc, out, err = cli(*SUBMIT, *shown, *TRAIN, env=env)
        assert rc == 0 and "#SBATCH --nodes=3\n" in out, (shown, err)


def test_submit_usage_says_model_or_torchtitan(cli):
    rc, out, _ = cli("submit", "--help")
    assert rc == 0 and out.startswith("usage: transit-launch submit (--model M | --torchtitan JOB.toml) [options]")


def test_status_of_an_array_task_slurm_does_not_know(cli, tmp_path):
    """scontrol 22.05 says "Job 5_1 not found" on stdout (exit 1, nothing on stderr) for an
    array task that is not there (measured on the lab cluster); status said "scontrol failed:
    exit code 1" (issue 51's newcomer trial)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("scontrol", 'echo "Job $4 not found"; exit 1'), ("sacct", "exit 0")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{text}\n")
        (bin_dir / name).chmod(0o755)
    for cmd in ("status", "cancel"):
        rc, out, err = cli(cmd, "5_1", env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
        assert (rc, out, err) == (2, "", "transit-launch: error: no such job 5_1\n"), cmd


def test_the_host_memory_bound_and_a_count_above_the_minimum(cli):
    """--host-mem of exactly 64TiB (the bound, docs/plan.md) is taken; a node count above the
    no-offload minimum, where the estimate fits the GPU (but not with the shim's reserved
    gap), is planned without offloading: no warning of hot data pushed off the GPU."""
    rc, _, err = cli("plan", "--model", "llama3-8b", "--host-mem", "64TiB")
    assert rc == 0, err
    rc, _, err = cli("render", "--model", "llama3-405b", "--gpus-per-node", "4", "--gpu-mem", "70GiB",
                     "--nodes", "513", "--output", "/root/x-%j.out", "--", "python", "train.py")
    assert rc == 0 and "hot data" not in err, err
