"""examples/train_llama.py on CPU ranks (gloo): FSDP2 there moves what the planner's FSDP
traffic model counts (bf16 all-gathers, fp32 reduce-scatters), and flags that need a
GPU fail with one line."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import NEEDS_TORCH, NO_TORCH, ROOT

TRAINER = ROOT / "examples" / "train_llama.py"
MODEL = ["--device", "cpu", "--dim", "128", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn", "256",
         "--vocab", "1024", "--seq-len", "32", "--steps", "3"]
pytestmark = pytest.mark.skipif(NO_TORCH, reason=NEEDS_TORCH)


def summary(out: str) -> dict:
    return next(json.loads(line)["summary"] for line in out.splitlines() if line.startswith('{"summary'))


def test_fsdp2_on_cpu_ranks_moves_bf16_gathers_and_fp32_reduce_scatters():
    torchrun = [sys.executable, "-m", "torch.distributed.run"]  # whether or not its script is on PATH
    res = subprocess.run([*torchrun, "--standalone", "--nproc-per-node", "2", str(TRAINER), *MODEL, "--dp", "fsdp",
                          "--comm-profile", "2"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    s = summary(res.stdout)
    assert (s["dp"], s["world"]) == ("fsdp", 2)
    comm, n = s["comm_profile"], s["params"]
    assert set(comm) == {"c10d::_allgather_base_", "c10d::_reduce_scatter_base_"}
    # every gradient reduce-scattered once a step in fp32 (mixed precision: reduce_dtype fp32)
    assert comm["c10d::_reduce_scatter_base_"]["buffer_bytes"] == 4 * n
    # parameters all-gathered in bf16: once for the root (FSDP2 keeps it unsharded until
    # backward), twice for each block (re-gathered for backward)
    gathered = comm["c10d::_allgather_base_"]["buffer_bytes"]
    assert 2 * n < gathered < 2 * 2 * n
    assert comm["c10d::_allgather_base_"]["calls"] == 1 + 2 * 2  # root + two blocks, forward and backward


def test_ddp_stays_the_cpu_default():
    # one intra-op thread (tests/test_example_trainer_shapes.py's train says why)
    res = subprocess.run([sys.executable, str(TRAINER), *MODEL], capture_output=True, text=True, timeout=300,
                         cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert summary(res.stdout)["dp"] == "ddp"


def test_cpu_offload_without_a_gpu_is_one_clear_error():
    res = subprocess.run([sys.executable, str(TRAINER), *MODEL, "--cpu-offload"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert res.returncode == 2
    assert res.stderr.strip() == "--cpu-offload needs a GPU (it offloads from one)"


@pytest.mark.parametrize("flags, line", [
    (["--engine", "torchao-offload"], "--engine torchao-offload needs a GPU"),
    (["--engine", "deepspeed", "--zero", "zenflow"], "--engine deepspeed needs a GPU"),
    (["--offload-ratio", "1.5"], "--offload-ratio must be between 0 and 1, got 1.5"),
])
def test_peer_engines_refuse_what_cannot_run_in_one_line(flags, line):
    # the offloading peers of bench/offload.py: checked before any process group starts
    res = subprocess.run([sys.executable, str(TRAINER), *MODEL, "--device", "cpu", *flags], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 2
    assert res.stderr.strip() == line


def test_deepspeed_configs_of_the_peers(monkeypatch):
    """What bench/offload.py's DeepSpeed peers hand to deepspeed.initialize (DeepSpeed and a
    GPU are not here: the configuration is a pure function of the flags)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("train_llama", TRAINER)
    trainer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trainer)

    def config(*flags):
        monkeypatch.setattr(sys, "argv", ["train_llama.py", "--engine", "deepspeed", *flags])
        return trainer.deepspeed_config(trainer.parse())

    off = config("--accum", "3")
    assert off["zero_optimization"]["stage"] == 2 and off["gradient_accumulation_steps"] == 3
    assert off["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert "zero_allow_untested_optimizer" not in off and "zenflow" not in off["zero_optimization"]
    inf = config("--zero", "infinity")["zero_optimization"]
    assert inf["stage"] == 3 and inf["offload_param"]["device"] == "cpu"
    twin = config("--zero", "twinflow", "--offload-ratio", "0.5")["zero_optimization"]
    assert (twin["stage"], twin["offload_optimizer"]["ratio"], twin["sub_group_size"]) == (3, 0.5, 50_000_000)
    assert "offload_param" not in twin  # Twin-Flow keeps the parameters on the GPU
    zen = config("--zero", "zenflow")
    assert zen["zero_allow_untested_optimizer"] is True  # else DeepSpeed's sanity check refuses ZenFlow's Adam
    z = zen["zero_optimization"]
    assert z["stage"] == 2 and z["offload_optimizer"]["device"] == "cpu" and z["overlap_comm"]
    assert z["zenflow"]["select_interval"] >= z["zenflow"]["update_interval"]  # ZenFlow refuses less


def _free_ports(n):
    """n distinct free TCP ports on the loopback (held open together while chosen)."""
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for sk in socks:
            sk.bind(("127.0.0.1", 0))
        return [sk.getsockname()[1] for sk in socks]
    finally:
        for sk in socks:
            sk.close()


def test_ranks_exit_cleanly_with_the_shim_preloaded(built):
    """The shim in every rank, as transit-launch injects it, on CPU ranks. Before the trainer
    ended its collectives and process group while Python still ran, a gloo worker freeing its
    last work during interpreter shutdown aborted a rank ("terminate called without an active
    exception") in about a third of such runs; a library exporting only the CUDA runtime's
    symbols the shim exports did it too, an empty preloaded library did not. Eight runs of two
    ranks, every rank exits 0; four at a time, each rank started as torchrun starts it (its
    environment: RANK, WORLD_SIZE, LOCAL_RANK, the rendezvous on a port of its own) without
    torchrun's own agent process, which the exit under test is not in (a third of the
    processes, each importing torch: most of the test's time)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSIT_")}
    env.update(LD_PRELOAD=str(built["shim"]), TRANSIT_POLICY="advise", OMP_NUM_THREADS="1", WORLD_SIZE="2",
               MASTER_ADDR="127.0.0.1")
    cmd = [sys.executable, str(TRAINER), "--device", "cpu",
           "--dim", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn", "128",
           "--vocab", "256", "--seq-len", "64", "--steps", "5", "--comm-profile", "3"]
    for wave in range(2):
        runs = [[subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                  env={**env, "MASTER_PORT": str(port), "RANK": str(r), "LOCAL_RANK": str(r)})
                 for r in range(2)] for port in _free_ports(4)]
        try:
            errs = [[rank.communicate(timeout=300)[1] for rank in ranks] for ranks in runs]
        finally:
            for rank in (x for ranks in runs for x in ranks):
                if rank.poll() is None:
                    rank.kill()
                    rank.wait()
        for i, (ranks, err) in enumerate(zip(runs, errs)):
            for r, (rank, e) in enumerate(zip(ranks, err)):
                assert rank.returncode == 0, f"run {4 * wave + i + 1}, rank {r}: " + e[:2000]
