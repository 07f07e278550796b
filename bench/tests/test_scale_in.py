"""bench/scale_in.py, issue 8's scale-in harness, without the GPUs it is meant for: the
emulated GPU it picks from the planner, and its whole plumbing (torchrun, the trainer's
collective profile, the planner's prediction, the shim's stats) on CPU ranks."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import NEEDS_TORCH, NO_TORCH, ROOT

SCRIPT = str(ROOT / "bench" / "scale_in.py")


def budget(*args):
    res = subprocess.run([sys.executable, SCRIPT, "--print-budget", *args], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    return int(res.stdout)


def planner(gpus, seq):
    from tests.example_trainer import trainer_layout
    from transit_launch.planning import memory
    return memory.estimate(*trainer_layout(f"--seq-len {seq} --batch 2", gpus)).total


@pytest.mark.parametrize("gpus,seq", [(2, 8192), (4, 8192), (8, 8192), (2, 4096)])
def test_emulated_gpu_fits_the_full_layout_and_not_the_scaled_in_one(gpus, seq):
    b = budget("--gpus", str(gpus), "--seq-len", str(seq))
    full, half = planner(gpus, seq), planner(gpus // 2, seq)
    assert full * 1.10 <= b < half  # 10%: the planner's calibrated error
    assert b % 2**28 == 0


def test_layouts_too_close_for_an_emulated_gpu_are_one_error_line():
    # a tiny model: the CUDA context dominates, so 8 and 4 GPUs differ by less than 10%
    res = subprocess.run([sys.executable, SCRIPT, "--print-budget", "--gpus", "8", "--model",
                          "--dim 64 --layers 1 --heads 4 --kv-heads 2 --ffn 128 --vocab 256", "--seq-len", "64"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.startswith("scale_in: the planner puts 8 and 4 GPUs too close")
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(NO_TORCH, reason=NEEDS_TORCH)
def test_scale_in_plumbing_on_cpu_ranks(tmp_path):
    out = tmp_path / "si.json"
    res = subprocess.run([sys.executable, SCRIPT, "--gpus", "2", "--device", "cpu", "--model",
                          "--dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 --vocab 256", "--seq-len", "64",
                          "--batch", "1", "--steps", "5", "--warmup", "2", "--emulated-gpu", "1GB", "--timeout", "120",
                          "--out", str(out)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})  # the 1-rank run too: two threads only wait
    # the head holds the first rank's own error (a CPU rank's SIGABRT at exit under the shim,
    # since fixed in the trainer: tests/test_trainer.py::test_ranks_exit_cleanly_with_the_shim_preloaded;
    # the tail alone showed only torchrun's summary)
    assert res.returncode == 0, res.stderr[:3000] + "\n...\n" + res.stderr[-1500:]
    d = json.loads(out.read_text())
    full, half = d["full"], d["scaled_in"]
    assert (full["gpus"], full["accum"], full["policy"]) == (2, 1, "off")
    assert (half["gpus"], half["accum"], half["policy"]) == (1, 2, "advise")  # same global batch
    assert len(full["losses"]) == len(half["losses"]) == 5 and full["tflops_per_gpu"] > 0
    # the collectives torch.profiler saw on rank 0 against the planner's prediction
    assert full["sent_gb_per_gpu_measured"] > 0
    assert full["sent_gb_per_gpu_measured"] == pytest.approx(full["sent_gb_per_gpu_planner"], rel=0.05)
    assert half["sent_gb_per_gpu_measured"] == half["sent_gb_per_gpu_planner"] == 0  # one rank sends nothing
    assert "% of the full layout's" in res.stdout


def test_scale_in_matrix_runs_the_host_layout_with_its_switch(monkeypatch):
    """bench/scale_in_matrix.py's half-host layout: N/2 GPUs, twice the microbatches,
    advise under the emulated GPU, and TRANSIT_OVERLAP_STEP=host in the trainer's
    environment (the host update path on the scale-in layout); a misspelt layout is refused."""
    import importlib
    from types import SimpleNamespace
    matrix = importlib.import_module("scale_in_matrix")
    seen = {}

    def fake_run(cmd, run_env, timeout):
        seen.update(cmd=cmd, env=run_env)
        return "", "", 1
    monkeypatch.setattr(matrix, "run", fake_run)
    a = SimpleNamespace(model="", seq_len=1024, batch=2, steps=3, device="cpu", timeout=10, gpus=2)
    div, factor, policy, extra = matrix.LAYOUTS["half-host"]
    r = matrix.run_layout(a, ("ac", 1), "half-host", a.gpus // div, factor * 1, policy, 10**9, None, extra)
    assert seen["env"]["TRANSIT_OVERLAP_STEP"] == "host" and seen["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    cmd = seen["cmd"]
    assert cmd[cmd.index("--policy") + 1] == "advise" and cmd[cmd.index("--gpu-budget") + 1] == "1GB"
    assert cmd[cmd.index("--nproc-per-node") + 1] == "1" and cmd[cmd.index("--accum") + 1] == "2"
    assert r["env"] == {"TRANSIT_OVERLAP_STEP": "host"} and r["rc"] == 1
    assert "TRANSIT_OVERLAP_STEP" not in matrix.LAYOUTS["half-advise"][3]
    monkeypatch.setattr(sys, "argv", ["scale_in_matrix.py", "--layouts", "full,half-staged", "--device", "cpu"])
    assert matrix.main() == 2


def test_scale_in_matrix_raises_the_emulated_gpu_to_the_full_layouts_peak(monkeypatch):
    """The full layout ran on the emulated card, so `auto` must be at least its measured peak:
    the planner's 16.91 GB against a measured 18.48 GB (issue 20's first half-staged run) made a
    'scale-in' whose full layout did not fit. A fitting or failed run changes nothing."""
    import importlib
    matrix = importlib.import_module("scale_in_matrix")
    budgets = {"ac": 16911433728}
    assert matrix.fit_full(budgets, "ac", {"rc": 0, "max_reserved_gb": 16.0}) is None
    assert matrix.fit_full(budgets, "ac", {"rc": 1, "max_reserved_gb": 30.0}) is None
    assert budgets == {"ac": 16911433728}
    raised = matrix.fit_full(budgets, "ac", {"rc": 0, "max_reserved_gb": 18.47590912})
    assert raised == budgets["ac"] == 69 * 2**28 and raised >= 18.47590912e9 and raised - 2**28 < 18.47590912e9
    assert budgets["ac_planner_size"] == 16911433728
    assert matrix.fit_full(budgets, "ac", {"rc": 0, "max_reserved_gb": 18.47590912}) is None  # fits now


def test_scale_in_matrix_report_marks_a_full_layout_over_the_emulated_gpu(tmp_path, monkeypatch, capsys):
    import importlib
    import json
    matrix = importlib.import_module("scale_in_matrix")
    run = {"recompute": "ac", "rc": 0, "median_step_s": 1.0, "max_reserved_gb": 18.5, "offloaded_gb_per_gpu": [0],
           "sent_gb_per_gpu_measured": 0, "emulated_gpu_bytes": 16911433728}
    runs = [dict(run, layout="full", accum=1, tflops_per_gpu=200.0, fits_emulated_gpu=False),
            dict(run, layout="half-advise", accum=2, tflops_per_gpu=150.0),
            # another call's runs under a larger emulated GPU: compared among themselves only
            dict(run, layout="full", accum=1, tflops_per_gpu=210.0, fits_emulated_gpu=True, emulated_gpu_bytes=19595788288),
            dict(run, layout="half-advise", accum=2, tflops_per_gpu=189.0, emulated_gpu_bytes=19595788288)]
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"runs": runs}))
    matrix.report([str(f)])
    out = capsys.readouterr().out
    assert ("scaled-in 75.0% of full per GPU (emulated GPU 16.91 GB) [the full layout's peak was over the emulated GPU"
            in out)
    assert "scaled-in 90.0% of full per GPU (emulated GPU 19.60 GB)\n" in out
    runs = runs[:2]
    runs[0]["fits_emulated_gpu"] = True
    f.write_text(json.dumps({"runs": runs}))
    matrix.report([str(f)])
    assert "over the emulated GPU" not in capsys.readouterr().out
